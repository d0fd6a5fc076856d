package sim

import "testing"

// TestAllocBoundTiny checks the relaxation's optimum on one 2-GPU node,
// worked by hand, and that it is never below the best real placement
// (given in the comment of each case).
func TestAllocBoundTiny(t *testing.T) {
	specs := []NodeSpec{{Name: "a", CPUMilli: 8000, MemMiB: 1024, GPUs: 2, Model: "T4"}}
	pod := func(cpu int64, gpus int, milli int64) Pod {
		return Pod{CPUMilli: cpu, MemMiB: 1, GPUs: gpus, GPUMilli: milli}
	}
	cases := []struct {
		name string
		wl   []Pod
		want float64
	}{
		// Best real: 810 on each GPU, 81 %. The cut at a = 300 counts an
		// 810 share as a whole GPU: 1000·x810 + 300·x300 ≤ 2000 with
		// x300 ≤ 2 gives x810 = 1.4, (1.4·810 + 600)/2000 = 86.7 %.
		{"slivers", []Pod{pod(1000, 1, 810), pod(1000, 1, 810), pod(1000, 1, 300), pod(1000, 1, 300)}, 86.7},
		// Best real: one GPU (50 %); CPU alone allows 8/6 of a GPU pod.
		{"cpu", []Pod{pod(6000, 1, 1000), pod(6000, 1, 1000)}, 100.0 * 4 / 6},
		// Without the cut the GPU capacity alone would allow 100 %: two
		// 600 shares cannot share a GPU, a 400 fills next to one.
		{"pairs", []Pod{pod(100, 1, 600), pod(100, 1, 600), pod(100, 1, 600), pod(100, 1, 400)}, 80},
		// Everything fits.
		{"fits", []Pod{pod(1000, 2, 1000)}, 100},
		// A model the node does not have.
		{"model", []Pod{{CPUMilli: 1000, MemMiB: 1, GPUs: 1, GPUMilli: 1000, GPUSpec: "V100"}}, 0},
	}
	for _, c := range cases {
		got, err := AllocBound(specs, c.wl, 1000)
		if err != nil {
			t.Fatal(c.name, err)
		}
		if got < c.want-1e-6 || got > c.want+1e-6 {
			t.Errorf("%s: bound %.4f%%, want %.4f%%", c.name, got, c.want)
		}
	}
}

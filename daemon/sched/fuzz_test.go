package sched

import "testing"

// FuzzPlace feeds arbitrary requests to the engine on the MIG node: it must
// never panic, and a committed placement never over-commits the node.
func FuzzPlace(f *testing.F) {
	f.Add(int64(1000), int64(1024), 1, int64(500), 0, "", 0, "", "best-effort")
	f.Add(int64(8000), int64(4096), 2, int64(1000), 2, "", 0, "", "single-numa-node")
	f.Add(int64(0), int64(0), 0, int64(0), 0, "3g.20gb", 3, "fft", "restricted")
	f.Add(int64(-1), int64(1), 9, int64(2000), -3, "x", -1, "", "bogus")
	f.Fuzz(func(t *testing.T, cpu, mem int64, gpus int, milli int64, cores int, mig string, slices int, bit, topo string) {
		n := migNode()
		e := NewEngine(Options{Seed: 1, Explain: 2})
		req := Request{ID: "f", CPUMilli: cpu, MemMiB: mem, GPUs: gpus, GPUMilli: milli, ExclusiveCores: cores, MIGProfile: mig, MIGSlices: slices, Bitstream: bit, Topology: TopologyPolicy(topo)}
		for range 3 {
			d, err := e.Place(&req, []*Node{n})
			_ = d.Explain()
			if err != nil {
				return
			}
			if err := e.Commit(&req, &d.Assignment, []*Node{n}); err != nil {
				t.Fatalf("placed decision does not commit: %v", err)
			}
			if n.CPUFreeMilli < 0 || n.MemFreeMiB < 0 || n.FreeCores[0] < 0 || n.FreeCores[1] < 0 {
				t.Fatalf("over-committed: %+v", n)
			}
			for _, g := range n.GPUs {
				if g.MilliFree < 0 || (g.MemMiB > 0 && g.MemFreeMiB < 0) {
					t.Fatalf("gpu over-committed: %+v", g)
				}
			}
		}
	})
}

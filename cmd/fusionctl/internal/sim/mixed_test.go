package sim

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/daemon/sched"
)

// A node list may give one node several GPU models ("MODEL:COUNT" parts
// joined by "+"): the engine's node then names each GPU's model, a pod
// asking for a model gets a GPU of it, and the bound and the power model
// count each model's GPUs.
func TestMixedNodeList(t *testing.T) {
	const csv = "sn,cpu_milli,memory_mib,gpu,model\nmixed,64000,262144,3,H100:1+L4:2\nplain,64000,262144,2,T4\n"
	specs, err := ReadNodes(strings.NewReader(csv))
	if err != nil {
		t.Fatal(err)
	}
	if g := specs[0].Groups(); !slices.Equal(g, []ModelCount{{"H100", 1}, {"L4", 2}}) {
		t.Fatalf("groups %v", g)
	}
	nodes := BuildNodes(specs)
	if m := []string{nodes[0].ModelOf(0), nodes[0].ModelOf(1), nodes[0].ModelOf(2)}; !slices.Equal(m, []string{"H100", "L4", "L4"}) {
		t.Fatalf("per-GPU models %v", m)
	}
	if nodes[1].ModelOf(1) != "T4" || !nodes[1].Homogeneous() || nodes[0].Homogeneous() {
		t.Fatal("a one-model node must stay one model")
	}
	e := sched.NewEngine(sched.Options{Seed: 1, Explain: 2})
	for _, tc := range []struct {
		spec string
		gpus int
		node string
		want []int
	}{{"L4", 1, "mixed", []int{1}}, {"H100", 1, "mixed", []int{0}}, {"L4", 2, "mixed", []int{1, 2}}, {"T4", 2, "plain", []int{0, 1}}} {
		p := Pod{Name: tc.spec, CPUMilli: 1000, MemMiB: 1024, GPUs: tc.gpus, GPUMilli: sched.MilliPerGPU, GPUSpec: tc.spec}
		req := p.Request()
		d, err := e.Place(&req, BuildNodes(specs))
		if err != nil {
			t.Fatalf("%s×%d: %v", tc.spec, tc.gpus, err)
		}
		if d.Assignment.Node != tc.node || !slices.Equal(d.Assignment.GPUs, tc.want) {
			t.Fatalf("%s×%d: %s gpus %v, want %s %v\n%s", tc.spec, tc.gpus, d.Assignment.Node, d.Assignment.GPUs, tc.node, tc.want, d.Explain())
		}
	}
	// Three GPUs of one model exist nowhere: the bound counts no node
	// that could hold such a pod.
	three := &Pod{CPUMilli: 1000, MemMiB: 1024, GPUs: 3, GPUMilli: sched.MilliPerGPU, GPUSpec: "L4|H100"}
	if specs[0].canHold(three) {
		t.Fatal("the mixed node holds three GPUs of one model")
	}
	if !specs[0].canHold(&Pod{CPUMilli: 1000, GPUs: 2, GPUMilli: sched.MilliPerGPU, GPUSpec: "L4"}) {
		t.Fatal("the mixed node cannot hold its two L4s")
	}
	power, err := PowerModel(specs, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, p := range power {
		count[p.Model] = p.GPUs
	}
	if count["H100"] != 1 || count["L4"] != 2 || count["T4"] != 2 {
		t.Fatalf("power model counts %v", count)
	}
	for _, bad := range []string{"H100:1+L4:1", "H100:1+H100:2", "H100:0+L4:3", "H100+L4:2", ":3"} {
		_, err := ReadNodes(strings.NewReader("sn,cpu_milli,memory_mib,gpu,model\nn,1,1,3," + bad + "\n"))
		if !errors.Is(err, ErrBadTrace) || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("model column %q: %v, want a bad-trace error naming the line", bad, err)
		}
	}
}

package sched

import "testing"

// migNode is an 8-GPU node: GPUs 0-3 on NUMA 0, 4-7 on NUMA 1, NVLink
// pairs (0,1),(2,3),(4,5),(6,7) plus (0,2),(1,3); GPU 7 in MIG mode with
// a free 1-slice instance at slice 0; two FPGA regions.
func migNode() *Node {
	n := NewNode("mig", 64000, 512*1024, 8, "A100")
	n.FreeCores = []int{16, 16}
	for i := range n.GPUs {
		n.GPUs[i].NUMA = i / 4
		n.GPUs[i].MemMiB, n.GPUs[i].MemFreeMiB = 40960, 40960
	}
	n.NVLink = [][2]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {0, 2}, {1, 3}}
	n.GPUs[7].MIG = &MIG{TotalSlices: 7, ReconfigCost: 500, Instances: []MIGInstance{{Profile: "1g.5gb", Start: 0, Slices: 1}}}
	n.FPGAs = []FPGARegion{{Bitstream: "aes", ProgramMs: 900, NUMA: 0}, {ProgramMs: 300, NUMA: 1}}
	return n
}

func TestFilterRules(t *testing.T) {
	tests := []struct {
		name  string
		req   Request
		setup func(*Node)
		want  FilterReason
	}{
		{"fits", Request{CPUMilli: 1000, MemMiB: 1024, GPUs: 1, GPUMilli: 1000}, nil, Fits},
		{"cpu", Request{CPUMilli: 65000}, nil, ReasonCPU},
		{"cpu counts exclusive cores", Request{CPUMilli: 60000, ExclusiveCores: 5}, nil, ReasonCPU},
		{"memory", Request{MemMiB: 600 * 1024}, nil, ReasonMemory},
		{"cores", Request{ExclusiveCores: 33}, func(n *Node) { n.CPUFreeMilli, n.CPUMilli = 1<<20, 1<<20 }, ReasonCores},
		{"gpu model", Request{GPUs: 1, GPUMilli: 1000, GPUModels: []string{"H100"}}, nil, ReasonGPUModel},
		{"gpu model allowed", Request{GPUs: 1, GPUMilli: 1000, GPUModels: []string{"H100", "A100"}}, nil, Fits},
		{"whole gpus", Request{GPUs: 8, GPUMilli: 1000}, nil, ReasonGPUs},
		{"gpu share", Request{GPUs: 1, GPUMilli: 500}, func(n *Node) {
			for i := range 7 {
				n.GPUs[i].MilliFree = 400
			}
		}, ReasonGPUShare},
		{"gpu memory", Request{GPUs: 1, GPUMilli: 100, GPUMemMiB: 50000}, nil, ReasonGPUMemory},
		{"mig existing", Request{MIGProfile: "1g.5gb", MIGSlices: 1}, nil, Fits},
		{"mig creatable", Request{MIGProfile: "3g.20gb", MIGSlices: 3}, nil, Fits},
		// The 1g instance is idle: a 7g instance destroys it; in use, it
		// blocks the 7g.
		{"mig over an idle instance", Request{MIGProfile: "7g.40gb", MIGSlices: 7}, nil, Fits},
		{"mig full", Request{MIGProfile: "7g.40gb", MIGSlices: 7}, func(n *Node) { n.GPUs[7].MIG.Instances[0].InUse = true }, ReasonMIG},
		{"fpga", Request{Bitstream: "aes"}, func(n *Node) { n.FPGAs[0].Busy, n.FPGAs[1].Busy = true, true }, ReasonFPGA},
		{"single numa", Request{GPUs: 4, GPUMilli: 1000, Topology: TopologySingleNUMANode}, func(n *Node) { n.GPUs[0].MilliFree = 0 }, ReasonTopology},
		{"single numa ok", Request{GPUs: 3, GPUMilli: 1000, ExclusiveCores: 4, Topology: TopologySingleNUMANode}, func(n *Node) { n.GPUs[0].MilliFree = 0 }, Fits},
		{"restricted spans when it must", Request{GPUs: 6, GPUMilli: 1000, Topology: TopologyRestricted}, nil, Fits},
		{"restricted refuses a needless span", Request{GPUs: 4, GPUMilli: 1000, Topology: TopologyRestricted}, func(n *Node) { n.GPUs[0].MilliFree, n.GPUs[4].MilliFree = 0, 0 }, ReasonTopology},
		{"best-effort spans", Request{GPUs: 4, GPUMilli: 1000, Topology: TopologyBestEffort}, func(n *Node) { n.GPUs[0].MilliFree, n.GPUs[4].MilliFree = 0, 0 }, Fits},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := migNode()
			if tc.setup != nil {
				tc.setup(n)
			}
			if got := Filter(&tc.req, n); got != tc.want {
				t.Fatalf("Filter = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	bad := []Request{
		{CPUMilli: -1},
		{GPUs: 1, GPUMilli: 1500},
		{GPUs: 2, GPUMilli: 500},
		{GPUs: 1},
		{MIGProfile: "1g.5gb"},
		{Topology: "sideways"},
	}
	for i, r := range bad {
		if r.Validate() == nil {
			t.Errorf("request %d %+v validated", i, r)
		}
	}
	ok := Request{CPUMilli: 1, GPUs: 2, GPUMilli: 1000, Topology: TopologyRestricted}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestFilterKeepsSharedCores(t *testing.T) {
	n := migNode()
	n.FreeCores, n.KeepSharedCores = []int{2, 2}, 1
	if got := Filter(&Request{ExclusiveCores: 3}, n); got != Fits {
		t.Errorf("3 of 4 cores with 1 kept shared: %q", got)
	}
	if got := Filter(&Request{ExclusiveCores: 4}, n); got != ReasonCores {
		t.Errorf("all 4 cores with 1 kept shared: %q, want %q", got, ReasonCores)
	}
}

func TestPickCoresWithoutDevicesTakesTheFreestNode(t *testing.T) {
	n := migNode()
	n.FreeCores = []int{3, 5}
	a, _ := assign(&Request{ExclusiveCores: 2}, n, 0, -1)
	if len(a.Cores) != 1 || a.Cores[1] != 2 {
		t.Errorf("cores %v: want both on node 1, the one with most free", a.Cores)
	}
	n.FreeCores = []int{4, 4}
	if a, _ := assign(&Request{ExclusiveCores: 2}, n, 0, -1); len(a.Cores) != 1 || a.Cores[0] != 2 {
		t.Errorf("cores %v: want node 0 on a tie", a.Cores)
	}
}

// A single-numa-node job's GPUs come from the node that also has its
// cores, not from the best-linked GPUs elsewhere.
func TestSingleNUMAGPUsFollowTheCores(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  Request
	}{
		{"whole", Request{GPUs: 2, GPUMilli: 1000, ExclusiveCores: 4, Topology: TopologySingleNUMANode}},
		{"shared", Request{GPUs: 1, GPUMilli: 300, ExclusiveCores: 4, Topology: TopologySingleNUMANode}},
		{"restricted", Request{GPUs: 2, GPUMilli: 1000, ExclusiveCores: 4, Topology: TopologyRestricted}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := migNode()
			n.FreeCores = []int{2, 16} // node 0 (the best NVLink) lacks cores
			if r := Filter(&tc.req, n); r != Fits {
				t.Fatalf("Filter = %q", r)
			}
			a, _ := assign(&tc.req, n, 0, -1)
			for _, g := range a.GPUs {
				if n.GPUs[g].NUMA != 1 {
					t.Errorf("GPU %d on NUMA %d, cores %v: want GPUs on node 1 with the cores", g, n.GPUs[g].NUMA, a.Cores)
				}
			}
			if len(a.Cores) != 1 || a.Cores[1] != 4 {
				t.Errorf("cores %v: want 4 on node 1", a.Cores)
			}
		})
	}
}

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
		{"mig full", Request{MIGProfile: "7g.40gb", MIGSlices: 7}, nil, ReasonMIG},
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

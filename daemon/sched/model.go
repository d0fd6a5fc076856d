package sched

import (
	"errors"
	"fmt"
	"slices"
)

// MilliPerGPU is the number of milli-GPU units in one whole GPU.
const MilliPerGPU = 1000

// Sentinel errors callers branch on.
var (
	// ErrUnschedulable means no node passed the filter.
	ErrUnschedulable = errors.New("sched: no node can host the request")
	// ErrInvalidRequest means the request is malformed.
	ErrInvalidRequest = errors.New("sched: invalid request")
	// ErrDoesNotFit means an assignment no longer fits the node it targets.
	ErrDoesNotFit = errors.New("sched: assignment does not fit node")
)

// Class is the kind of work a job is; it selects the default QoS tier and
// the engine's weight Profile. It is the one definition of the job class:
// daemon/api re-exports it for the wire (a JSON string).
type Class string

// Job classes.
const (
	ClassTraining  Class = "training"
	ClassInference Class = "inference"
	ClassBatch     Class = "batch"
	ClassService   Class = "service"
)

// Classes lists every valid class.
var Classes = []Class{ClassTraining, ClassInference, ClassBatch, ClassService}

// Tier is a job's QoS tier. It is the one definition of the tier: daemon/api
// re-exports it for the wire and the job records (a JSON string), and package
// cgroups names its tier cgroups after it. The engine orders tiers by Rank: a
// job may only preempt jobs of a strictly lower rank. The zero value ranks as
// best effort.
type Tier string

// QoS tiers, from most to least protected.
const (
	TierGuaranteed Tier = "guaranteed"
	TierBurstable  Tier = "burstable"
	TierBestEffort Tier = "besteffort"
)

// Tiers lists every valid tier, from most to least protected.
var Tiers = []Tier{TierGuaranteed, TierBurstable, TierBestEffort}

// Rank orders tiers for preemption and scoring: best effort (and the zero
// tier) 0, burstable 1, guaranteed 2.
func (t Tier) Rank() int {
	switch t {
	case TierGuaranteed:
		return 2
	case TierBurstable:
		return 1
	}
	return 0
}

// Valid reports whether t is one of the tiers.
func (t Tier) Valid() bool { return slices.Contains(Tiers, t) }

// TopologyPolicy is how strictly a job's CPUs, memory and devices must share
// a NUMA node (the vocabulary of kubelet's Topology Manager). It is the one
// definition of the policy; daemon/api re-exports it.
type TopologyPolicy string

// Topology policies.
const (
	TopologyNone           TopologyPolicy = "none"
	TopologyBestEffort     TopologyPolicy = "best-effort"
	TopologyRestricted     TopologyPolicy = "restricted"
	TopologySingleNUMANode TopologyPolicy = "single-numa-node"
)

// TopologyPolicies lists every valid topology policy.
var TopologyPolicies = []TopologyPolicy{TopologyNone, TopologyBestEffort, TopologyRestricted, TopologySingleNUMANode}

// MIGInstance is one MIG GPU instance on a GPU: a run of Slices compute
// slices starting at Start.
type MIGInstance struct {
	Profile string `json:"profile"`
	Start   int    `json:"start"`
	Slices  int    `json:"slices"`
	InUse   bool   `json:"in_use"`
}

// MIG is the MIG state of a MIG-enabled GPU.
type MIG struct {
	// TotalSlices is the number of compute slices (7 on A100/H100).
	TotalSlices int `json:"total_slices"`
	// Instances are the instances that exist now (free or in use).
	Instances []MIGInstance `json:"instances,omitempty"`
	// ReconfigCost is the cost of creating a new instance on idle slices,
	// in the same unit as FPGA programming time (milliseconds). A new
	// instance that first destroys idle instances costs one more
	// ReconfigCost per instance destroyed (MIGPick.Cost).
	ReconfigCost float64 `json:"reconfig_cost"`
	// Starts maps a profile to the slices a new instance of it may start
	// at (NVIDIA's placements, as the driver reports them); a profile not
	// in it may start at any multiple of its slices.
	Starts map[string][]int `json:"starts,omitempty"`
}

// GPU is one physical GPU of a node.
type GPU struct {
	// Model names the GPU's model; "" means the node's GPUModel. A node
	// whose GPUs are all of one model needs only Node.GPUModel; a host
	// with several models (an H100 beside two L4s) names each GPU's.
	Model string `json:"model,omitempty"`
	// MilliFree is the unallocated share of the GPU, 0..MilliPerGPU.
	MilliFree int64 `json:"milli_free"`
	// MemMiB and MemFreeMiB are the GPU memory and its unallocated part;
	// zero MemMiB means memory is not tracked.
	MemMiB     int64 `json:"mem_mib,omitempty"`
	MemFreeMiB int64 `json:"mem_free_mib,omitempty"`
	// NUMA is the NUMA node the GPU is attached to.
	NUMA int `json:"numa"`
	// MIG is non-nil when the GPU is in MIG mode; such a GPU is only
	// allocated by MIG profile.
	MIG *MIG `json:"mig,omitempty"`
	// PerfPerWatt is the relative performance per watt (0..1, 1 = best in
	// the fleet); IdleWatts is the cost of waking it when it is idle.
	PerfPerWatt float64 `json:"perf_per_watt,omitempty"`
	IdleWatts   float64 `json:"idle_watts,omitempty"`
	// Load is the live utilisation 0..1 as telemetry reports it.
	Load float64 `json:"load,omitempty"`
	// PowerW is the measured power draw in watts, 0 when not measured;
	// with IdleWatts it tells how deeply idle the GPU is (its wake cost).
	PowerW float64 `json:"power_w,omitempty"`
	// MPS is set for a GPU shared through CUDA MPS, whose control daemon
	// runs one server per user and makes a second user's clients wait
	// until the first user's server exits: its shares belong to one user
	// at a time, ShareOwner (the Request.Owner of the shares it holds, ""
	// while it holds none).
	MPS        bool   `json:"mps,omitempty"`
	ShareOwner string `json:"share_owner,omitempty"`
}

// ownerFits reports whether a share of milli for owner may go on g: any
// whole-GPU request, any GPU but an MPS one serving another owner.
func (g *GPU) ownerFits(owner string, milli int64) bool {
	return !g.MPS || milli >= MilliPerGPU || g.ShareOwner == "" || g.ShareOwner == owner
}

// FPGARegion is one reconfigurable region of an FPGA.
type FPGARegion struct {
	Bitstream string `json:"bitstream,omitempty"`
	// ProgramMs estimates programming a new bitstream into the region.
	ProgramMs float64 `json:"program_ms"`
	Busy      bool    `json:"busy"`
	NUMA      int     `json:"numa"`
}

// Node is a host's capacity and current allocation, as plain values.
type Node struct {
	Name string `json:"name"`
	// CPUMilli/MemMiB are the allocatable totals, the Free fields what is
	// left. They are plain int64 (millicores, MiB), not the daemon's
	// resource vector (api.NodeResources): the engine imports nothing and
	// filters and scores on these fields in its hot loop.
	CPUMilli     int64 `json:"cpu_milli"`
	CPUFreeMilli int64 `json:"cpu_free_milli"`
	MemMiB       int64 `json:"mem_mib"`
	MemFreeMiB   int64 `json:"mem_free_mib"`
	// FreeCores is the number of whole cores free for exclusive use on each
	// NUMA node (index = NUMA node). Exclusive cores are also counted in
	// CPUFreeMilli (1000 each).
	FreeCores []int `json:"free_cores,omitempty"`
	// KeepSharedCores is how many of the free cores exclusive use must
	// leave (the shared pool's minimum: the daemon, burstable and
	// best-effort work run there). Filter refuses a request for exclusive
	// cores that would take them.
	KeepSharedCores int `json:"keep_shared_cores,omitempty"`
	// GPUModel is the model of every GPU whose own Model is empty (all
	// of them on a node of one model). ModelOf is a GPU's model.
	GPUModel string `json:"gpu_model,omitempty"`
	GPUs     []GPU  `json:"gpus,omitempty"`
	// NVLink lists GPU index pairs connected by NVLink.
	NVLink [][2]int     `json:"nvlink,omitempty"`
	FPGAs  []FPGARegion `json:"fpgas,omitempty"`
	// Load is the host's live CPU load 0..1.
	Load float64 `json:"load,omitempty"`
	// NUMALoad is the live CPU load 0..1 of each NUMA node's CPUs (index =
	// NUMA node); nil when not measured (Load stands for every node).
	NUMALoad []float64 `json:"numa_load,omitempty"`
	// Version changes on every Apply/Release so scorers may cache per state.
	Version uint64 `json:"-"`
}

// NewNode returns a node with everything free: gpus whole GPUs of the
// given model, all on NUMA node 0.
func NewNode(name string, cpuMilli, memMiB int64, gpus int, model string) *Node {
	n := &Node{Name: name, CPUMilli: cpuMilli, CPUFreeMilli: cpuMilli, MemMiB: memMiB, MemFreeMiB: memMiB, GPUModel: model}
	n.GPUs = make([]GPU, gpus)
	for i := range n.GPUs {
		n.GPUs[i].MilliFree = MilliPerGPU
	}
	return n
}

// Clone returns a deep copy of n.
func (n *Node) Clone() *Node {
	c := *n
	c.FreeCores = slices.Clone(n.FreeCores)
	c.NUMALoad = slices.Clone(n.NUMALoad)
	c.GPUs = slices.Clone(n.GPUs)
	for i := range c.GPUs {
		if m := c.GPUs[i].MIG; m != nil {
			mc := *m
			mc.Instances = slices.Clone(m.Instances)
			c.GPUs[i].MIG = &mc
		}
	}
	c.NVLink = slices.Clone(n.NVLink)
	c.FPGAs = slices.Clone(n.FPGAs)
	return &c
}

// ModelOf is GPU i's model: its own, else the node's GPUModel.
func (n *Node) ModelOf(i int) string {
	if m := n.GPUs[i].Model; m != "" {
		return m
	}
	return n.GPUModel
}

// Homogeneous reports whether every GPU of n is of one model.
func (n *Node) Homogeneous() bool {
	for i := 1; i < len(n.GPUs); i++ {
		if n.ModelOf(i) != n.ModelOf(0) {
			return false
		}
	}
	return true
}

// GPUMilliFree is the total unallocated milli-GPU on the node (MIG GPUs
// excluded).
func (n *Node) GPUMilliFree() int64 {
	var t int64
	for i := range n.GPUs {
		if n.GPUs[i].MIG == nil {
			t += n.GPUs[i].MilliFree
		}
	}
	return t
}

// FullyFreeGPUs counts the non-MIG GPUs with nothing allocated.
func (n *Node) FullyFreeGPUs() int {
	c := 0
	for i := range n.GPUs {
		if n.GPUs[i].MIG == nil && n.GPUs[i].MilliFree == MilliPerGPU {
			c++
		}
	}
	return c
}

// Request is what a job asks for.
type Request struct {
	ID       string `json:"id"`
	Class    Class  `json:"class,omitempty"`
	Tier     Tier   `json:"tier,omitempty"`
	Priority int    `json:"priority,omitempty"`
	// CPUMilli is shared CPU; ExclusiveCores are whole cores on top of it.
	CPUMilli       int64 `json:"cpu_milli"`
	ExclusiveCores int   `json:"exclusive_cores,omitempty"`
	MemMiB         int64 `json:"mem_mib"`
	// GPUs is the number of GPUs; GPUMilli the share of each (MilliPerGPU
	// for whole GPUs; below that the request is for one shared GPU).
	GPUs      int   `json:"gpus,omitempty"`
	GPUMilli  int64 `json:"gpu_milli,omitempty"`
	GPUMemMiB int64 `json:"gpu_mem_mib,omitempty"`
	// MIGProfile (e.g. "1g.10gb") with MIGSlices compute slices asks for
	// one MIG instance instead of GPUs.
	MIGProfile string `json:"mig_profile,omitempty"`
	MIGSlices  int    `json:"mig_slices,omitempty"`
	// Bitstream asks for one FPGA region holding (or programmed with) it.
	Bitstream string `json:"bitstream,omitempty"`
	// Owner names the job's user (shares of two owners never meet on an
	// MPS GPU); "" is no one in particular (admission, a peer's view).
	Owner string `json:"owner,omitempty"`
	// GPUModels, when set, restricts the GPU models allowed. The GPUs of
	// one request are always of one model (a node with several models
	// gives a multi-GPU request the GPUs of one of them).
	GPUModels []string       `json:"gpu_models,omitempty"`
	Topology  TopologyPolicy `json:"topology,omitempty"`
}

// Validate reports a malformed request.
func (r *Request) Validate() error {
	switch {
	case r.CPUMilli < 0 || r.MemMiB < 0 || r.GPUs < 0 || r.GPUMilli < 0 || r.ExclusiveCores < 0 || r.GPUMemMiB < 0:
		return fmt.Errorf("%w: negative quantity", ErrInvalidRequest)
	case r.GPUMilli > MilliPerGPU:
		return fmt.Errorf("%w: gpu_milli %d above %d", ErrInvalidRequest, r.GPUMilli, MilliPerGPU)
	case r.GPUs > 1 && r.GPUMilli != MilliPerGPU:
		return fmt.Errorf("%w: a multi-GPU request must ask for whole GPUs", ErrInvalidRequest)
	case r.GPUs > 0 && r.GPUMilli == 0:
		return fmt.Errorf("%w: gpus without gpu_milli", ErrInvalidRequest)
	case r.MIGProfile != "" && (r.MIGSlices <= 0 || r.GPUs > 0):
		return fmt.Errorf("%w: MIG profile needs mig_slices and no whole GPUs", ErrInvalidRequest)
	}
	switch r.Topology {
	case "", TopologyNone, TopologyBestEffort, TopologyRestricted, TopologySingleNUMANode:
	default:
		return fmt.Errorf("%w: unknown topology policy %q", ErrInvalidRequest, r.Topology)
	}
	return nil
}

// Shared reports whether the request is for a fraction of one GPU.
func (r *Request) Shared() bool { return r.GPUs == 1 && r.GPUMilli < MilliPerGPU }

// GPUMilliTotal is the request's total milli-GPU.
func (r *Request) GPUMilliTotal() int64 { return int64(r.GPUs) * r.GPUMilli }

// ModelAllowed reports whether the request accepts GPU model m.
func (r *Request) ModelAllowed(m string) bool {
	return len(r.GPUModels) == 0 || slices.Contains(r.GPUModels, m)
}

// MIGPick is the MIG part of an assignment.
type MIGPick struct {
	GPU    int  `json:"gpu"`
	Start  int  `json:"start"`
	Slices int  `json:"slices"`
	Create bool `json:"create"` // a new instance is created (reconfiguration)
	// Destroy lists the starts of the idle instances (InUse false) that
	// sit on the new instance's slices and are destroyed to make room
	// (Create only); Node.Apply removes them from the model.
	Destroy []int `json:"destroy,omitempty"`
}

// Cost is the pick's reconfiguration cost on m: nothing for an existing
// instance, one ReconfigCost for a new one and one more per idle instance
// it destroys.
func (p MIGPick) Cost(m *MIG) float64 {
	if !p.Create || m == nil {
		return 0
	}
	return m.ReconfigCost * float64(1+len(p.Destroy))
}

// Assignment is where, inside one node, a request goes.
type Assignment struct {
	Node     string `json:"node"`
	NodeIdx  int    `json:"node_index"`
	CPUMilli int64  `json:"cpu_milli"`
	MemMiB   int64  `json:"mem_mib"`
	// Cores is the number of exclusive cores taken per NUMA node.
	Cores     map[int]int `json:"cores,omitempty"`
	GPUs      []int       `json:"gpus,omitempty"`
	GPUMilli  int64       `json:"gpu_milli,omitempty"`
	GPUMemMiB int64       `json:"gpu_mem_mib,omitempty"`
	// GPUModel is the model of the GPUs (or of the MIG instance's GPU)
	// taken, "" without GPUs.
	GPUModel string `json:"gpu_model,omitempty"`
	// Owner is the request's Owner: a share it takes on an MPS GPU makes
	// the GPU that owner's until its last share is released.
	Owner string   `json:"owner,omitempty"`
	MIG   *MIGPick `json:"mig,omitempty"`
	// FPGA is the region index, -1 for none; Program is true when the
	// region must be (re)programmed.
	FPGA      int    `json:"fpga"`
	Bitstream string `json:"bitstream,omitempty"`
	Program   bool   `json:"program,omitempty"`
}

// Apply takes a's resources from n. It checks capacity first and changes
// nothing when a does not fit.
func (n *Node) Apply(a *Assignment) error {
	if err := n.checkFits(a); err != nil {
		return err
	}
	n.CPUFreeMilli -= a.CPUMilli
	n.MemFreeMiB -= a.MemMiB
	for numa, c := range a.Cores {
		n.FreeCores[numa] -= c
	}
	for _, g := range a.GPUs {
		n.GPUs[g].MilliFree -= a.GPUMilli
		n.GPUs[g].MemFreeMiB -= a.GPUMemMiB
		if n.GPUs[g].MPS && a.GPUMilli < MilliPerGPU {
			n.GPUs[g].ShareOwner = a.Owner
		}
	}
	if p := a.MIG; p != nil {
		m := n.GPUs[p.GPU].MIG
		if p.Create {
			// The idle instances on the new instance's slices are
			// destroyed first (checkFits made sure none is in use).
			m.Instances = slices.DeleteFunc(m.Instances, func(in MIGInstance) bool {
				return in.overlaps(p.Start, p.Slices)
			})
			m.Instances = append(m.Instances, MIGInstance{Start: p.Start, Slices: p.Slices, InUse: true})
		} else {
			for i := range m.Instances {
				if m.Instances[i].Start == p.Start {
					m.Instances[i].InUse = true
				}
			}
		}
	}
	if a.FPGA >= 0 && a.FPGA < len(n.FPGAs) {
		n.FPGAs[a.FPGA].Busy = true
		n.FPGAs[a.FPGA].Bitstream = a.Bitstream
	}
	n.Version++
	return nil
}

// Release gives a's resources back to n. A MIG instance created by the
// assignment stays (idle) for the next job of that profile; a later
// placement may destroy it to make room for another profile (MIGPick).
func (n *Node) Release(a *Assignment) {
	n.CPUFreeMilli = min(n.CPUMilli, n.CPUFreeMilli+a.CPUMilli)
	n.MemFreeMiB = min(n.MemMiB, n.MemFreeMiB+a.MemMiB)
	for numa, c := range a.Cores {
		if numa >= 0 && numa < len(n.FreeCores) {
			n.FreeCores[numa] += c
		}
	}
	for _, g := range a.GPUs {
		if g >= 0 && g < len(n.GPUs) {
			n.GPUs[g].MilliFree = min(MilliPerGPU, n.GPUs[g].MilliFree+a.GPUMilli)
			n.GPUs[g].MemFreeMiB = min(n.GPUs[g].MemMiB, n.GPUs[g].MemFreeMiB+a.GPUMemMiB)
			if n.GPUs[g].MilliFree == MilliPerGPU {
				n.GPUs[g].ShareOwner = ""
			}
		}
	}
	if p := a.MIG; p != nil && p.GPU >= 0 && p.GPU < len(n.GPUs) && n.GPUs[p.GPU].MIG != nil {
		m := n.GPUs[p.GPU].MIG
		for i := range m.Instances {
			if m.Instances[i].Start == p.Start {
				m.Instances[i].InUse = false
			}
		}
	}
	if a.FPGA >= 0 && a.FPGA < len(n.FPGAs) {
		n.FPGAs[a.FPGA].Busy = false
	}
	n.Version++
}

func (n *Node) checkFits(a *Assignment) error {
	if a.CPUMilli > n.CPUFreeMilli || a.MemMiB > n.MemFreeMiB {
		return fmt.Errorf("%w: %s cpu/memory", ErrDoesNotFit, n.Name)
	}
	for numa, c := range a.Cores {
		if numa < 0 || numa >= len(n.FreeCores) || n.FreeCores[numa] < c {
			return fmt.Errorf("%w: %s cores on NUMA %d", ErrDoesNotFit, n.Name, numa)
		}
	}
	for i, g := range a.GPUs {
		if g >= 0 && g < len(n.GPUs) && !n.GPUs[g].ownerFits(a.Owner, a.GPUMilli) {
			return fmt.Errorf("%w: %s gpu %d (MPS) serves another user's shares", ErrDoesNotFit, n.Name, g)
		}
		if g < 0 || g >= len(n.GPUs) || n.GPUs[g].MIG != nil || n.GPUs[g].MilliFree < a.GPUMilli ||
			(n.GPUs[g].MemMiB > 0 && n.GPUs[g].MemFreeMiB < a.GPUMemMiB) || slices.Contains(a.GPUs[:i], g) {
			return fmt.Errorf("%w: %s gpu %d", ErrDoesNotFit, n.Name, g)
		}
	}
	if p := a.MIG; p != nil {
		if p.GPU < 0 || p.GPU >= len(n.GPUs) || n.GPUs[p.GPU].MIG == nil {
			return fmt.Errorf("%w: %s gpu %d is not in MIG mode", ErrDoesNotFit, n.Name, p.GPU)
		}
		m := n.GPUs[p.GPU].MIG
		if p.Create {
			if !m.sliceRunIdle(p.Start, p.Slices) {
				return fmt.Errorf("%w: %s MIG slices %d+%d busy", ErrDoesNotFit, n.Name, p.Start, p.Slices)
			}
		} else if i := m.instanceAt(p.Start); i < 0 || m.Instances[i].InUse {
			return fmt.Errorf("%w: %s MIG instance at %d not free", ErrDoesNotFit, n.Name, p.Start)
		}
	}
	if a.FPGA >= len(n.FPGAs) || (a.FPGA >= 0 && n.FPGAs[a.FPGA].Busy) {
		return fmt.Errorf("%w: %s fpga region %d", ErrDoesNotFit, n.Name, a.FPGA)
	}
	return nil
}

func (m *MIG) instanceAt(start int) int {
	for i := range m.Instances {
		if m.Instances[i].Start == start {
			return i
		}
	}
	return -1
}

// overlaps reports whether the instance holds any of slices [start, start+k).
func (in MIGInstance) overlaps(start, k int) bool {
	return start < in.Start+in.Slices && in.Start < start+k
}

// sliceRunFree reports whether slices [start, start+k) belong to no instance.
func (m *MIG) sliceRunFree(start, k int) bool {
	if start < 0 || k <= 0 || start+k > m.TotalSlices {
		return false
	}
	for _, in := range m.Instances {
		if in.overlaps(start, k) {
			return false
		}
	}
	return true
}

// sliceRunIdle reports whether slices [start, start+k) belong to no
// instance in use: free, or held only by idle instances a new instance may
// destroy.
func (m *MIG) sliceRunIdle(start, k int) bool {
	if start < 0 || k <= 0 || start+k > m.TotalSlices {
		return false
	}
	for _, in := range m.Instances {
		if in.InUse && in.overlaps(start, k) {
			return false
		}
	}
	return true
}

// idleOn lists the starts of the idle instances on slices [start, start+k).
func (m *MIG) idleOn(start, k int) []int {
	var out []int
	for _, in := range m.Instances {
		if !in.InUse && in.overlaps(start, k) {
			out = append(out, in.Start)
		}
	}
	return out
}

// starts are the slices a new instance of profile (k slices) may start
// at: the driver's placements where Starts names the profile, else the
// multiples of k.
func (m *MIG) starts(profile string, k int) []int {
	var out []int
	if st, ok := m.Starts[profile]; ok && profile != "" {
		for _, s := range st {
			if s >= 0 && k > 0 && s+k <= m.TotalSlices {
				out = append(out, s)
			}
		}
		return out
	}
	for s := 0; k > 0 && s+k <= m.TotalSlices; s += k {
		out = append(out, s)
	}
	return out
}

// usedMask returns which slices belong to some instance.
func (m *MIG) usedMask() uint64 {
	var mask uint64
	for _, in := range m.Instances {
		mask |= instMask(in)
	}
	return mask
}

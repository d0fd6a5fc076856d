// Package hostplacer connects the pure placement engine (daemon/sched) to
// the daemon: it keeps this host as one sched.Node built from the host's
// hardware (the device drivers' inventories, in devices' types, kept
// current through UpdateHardware), turns job specs into sched.Requests,
// places jobs and gangs through the engine, and names the devices and the
// exclusive cores each allocation holds (see cores.go: the engine chooses
// how many cores on which NUMA node, the placer which ones). It implements
// jobs.Placer. It does no I/O: preparing devices (creating a MIG instance,
// programming an FPGA) is the device drivers' Prepare, called before the
// job starts, and the shared CPU pool reaches the cgroups through
// Options.OnShared. The engine scores this host's concrete assignments with
// fusiond's policy over the GPU model table, the request shapes the host
// has seen (a prior until then) and the live load an Options.Live source
// reports (live.go).
//
// It may import daemon/sched, daemon/api, devices, cgroups (only its Core
// type: the cores discovered from the topology), daemon/internal/jobs (the
// Placer interface) and the standard library.
package hostplacer

import (
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/sched"
	"github.com/fusiond/fusiond/devices"
)

// Hardware is the host's schedulable inventory.
type Hardware struct {
	Name   string
	CPU    api.MilliCPU
	Memory api.Bytes
	// Cores are the physical cores guaranteed jobs take exclusively, with
	// their SMT siblings and NUMA nodes: the topology model's cores
	// (cgroups.CoresOf) of the machine jobs run on. Without cores
	// guaranteed jobs get no exclusive cores and share the CPUs.
	Cores []cgroups.Core
	// GPUs are the GPU driver's devices (Kind devices.GPU), FPGAs the
	// FPGA driver's regions, as the drivers' inventories report them
	// (NUMA resolved against the topology).
	GPUs []devices.Device
	// NVLink lists pairs of indices into GPUs joined by NVLink.
	NVLink [][2]int
	FPGAs  []devices.Device
}

// Options tune the placer.
type Options struct {
	// Profiles overrides the engine's weight profile per job class.
	Profiles sched.Profiles
	// Seed makes tie-breaking reproducible.
	Seed uint64
	// ResolveBitstream turns a spec's bitstream reference (name, ID
	// prefix, UUID) into the library ID regions report as loaded. Nil
	// leaves references as written.
	ResolveBitstream func(ref string) (string, error)
	// ProgramEstimate is the expected time to program bitstream ID into
	// region; nil keeps each region's Hardware estimate.
	ProgramEstimate func(region, bitstream string) float64
	// KeepSharedCores is how many of Hardware.Cores exclusive cores always
	// leave in the shared pool (the daemon keeps one).
	KeepSharedCores int
	// OnShared receives the shared pool (SharedCPUs) after every change
	// of it, under the placer's lock so pools arrive in order: the daemon
	// rewrites the burstable and best-effort cpusets there. Nil: nobody
	// is told.
	OnShared func(cpus []int) error
	// Logger reports OnShared's errors; nil discards them.
	Logger *slog.Logger
	// Live reports the host's live load (GPU utilisation and power, CPU
	// busy per NUMA node) for the engine's load and energy dimensions;
	// nil: every device counts as unloaded and unmeasured.
	Live LiveSource
	// Pods offers the host's devices to kubelet as extended resources
	// (pods.go); nil: the host serves no pods.
	Pods *PodOptions
}

type held struct {
	req    sched.Request
	assign sched.Assignment
	// cpus are the job's exclusive cores' CPUs (sorted); assign.Cores is
	// their count per NUMA node.
	cpus []int
	// score is the engine's score of the placement (0..1), scored when
	// a single job was placed (not a gang's member, not a reclaimed
	// placement).
	score  float64
	scored bool
	// pod is set for a pod's device hold (HoldPod, or Reclaim of a job
	// with Spec.Pod): the resource and the device IDs kubelet allocated.
	pod *api.PodHold
}

// Placer places jobs on this host with the engine.
type Placer struct {
	mu      sync.Mutex
	opts    Options
	hw      Hardware
	base    *sched.Node // nothing allocated
	node    *sched.Node
	eng     *sched.Engine
	policy  *sched.Weighted
	learner *sched.ShapeLearner
	// seen are the jobs whose shapes the learner has counted, observed
	// how many.
	seen     map[string]bool
	observed int
	// seeded is the weight SeedProfiles gave the learner, in jobs;
	// shapes the learned model in use (nil: the prior).
	seeded int
	shapes *sched.FragModel
	// liveAt is when the live load was last read (zero: read it at the
	// next decision).
	liveAt time.Time
	// limitW is each GPU's power limit in force (by index, as node.GPUs)
	// from the last live reading, 0 where not read: with the measured
	// draw, the GPU's power headroom.
	limitW []float64
	held   map[string]held
	log    *slog.Logger
	// cores are hw.Cores as normalizeCores keeps them; published is the
	// shared pool OnShared was last given.
	cores     []cgroups.Core
	published []int
	// down holds the GPUs and MIG instances (by ID) that are out of
	// service: they offer nothing to new work until SetHealthy brings
	// them back.
	down map[string]bool
	// reclaimable is what best-effort jobs may be placed on beyond the
	// unreserved capacity, borrowed what each holds of it (reclaim.go).
	reclaimable amount
	borrowed    map[string]amount
	// pins are the assignments a defragmentation plan gave the jobs it
	// moves and the job it makes room for, used by their next placement
	// (defrag.go).
	pins map[string]sched.Assignment
}

var _ jobs.Placer = (*Placer)(nil)

// New returns a placer for hw. Devices hw reports unhealthy start out of
// service.
func New(hw Hardware, o Options) *Placer {
	p := &Placer{
		opts: o, hw: hw, node: &sched.Node{},
		learner: sched.NewShapeLearner(),
		seen:    map[string]bool{},
		held:    map[string]held{},
		down:    map[string]bool{},
		log:     o.Logger,

		borrowed: map[string]amount{},
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	// fusiond's policy over this host's concrete assignments, with the GPU
	// model table's compute and efficiency and the prior request shapes
	// until the host has seen its own (observe).
	p.policy = sched.NewWeighted(o.Profiles, sched.NewFragModel(priorShapes()))
	p.policy.ModelTable = true
	p.eng = sched.NewEngine(sched.Options{Policy: p.policy, Seed: o.Seed, Explain: 3})
	p.rebuild(hw)
	p.published = p.sharedCPUs() // every core: nothing to tell yet
	return p
}

// Hardware is the inventory the placer places on now (what New or the
// last UpdateHardware gave it, with SetHealthy's changes).
func (p *Placer) Hardware() Hardware {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hw
}

// unhealthyMIG marks the placeholder instances SetHealthy puts on the free
// slices of an unhealthy MIG-mode GPU, so that no instance is created there.
const unhealthyMIG = "(unhealthy)"

// UpdateHardware replaces the host's inventory with hw — the drivers'
// inventories read again after a device changed: a health transition, a
// MIG layout applied or an instance created for a job, an FPGA region
// programmed, a device found or gone, a topology refresh. What jobs hold
// stays held: each reservation is applied again to the new inventory, by
// device ID. A MIG instance still to be created for a job is matched to
// the instance of its profile now at its slot, or to a new instance of its
// profile on its GPU (the driver may create it elsewhere than the engine
// chose); idle instances of other profiles on its slots, which the driver
// destroys for it, stay out of the model. Devices
// hw reports unhealthy are out of service, as with SetHealthy.
func (p *Placer) UpdateHardware(hw Hardware) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.hw
	p.hw = hw
	p.rebuild(old)
	p.publish()
}

// rebuild makes the node from p.hw and applies every held reservation to
// it again; old is the inventory the reservations' device indices refer
// to. The caller holds p.mu.
func (p *Placer) rebuild(old Hardware) {
	p.cores = normalizeCores(p.hw.Cores)
	base := buildNode(p.hw, p.cores, p.opts.KeepSharedCores)
	node := base.Clone()
	node.Version = p.node.Version + 1
	p.down = downOf(p.hw)
	// A defragmentation plan's pins name device indices of the old
	// inventory: dropped, the jobs they named are placed as any other.
	p.pins = nil
	gpuAt := map[string]int{}
	for i, g := range p.hw.GPUs {
		gpuAt[g.ID] = i
	}
	fpgaAt := map[string]int{}
	for i, f := range p.hw.FPGAs {
		fpgaAt[f.ID] = i
	}
	oldInstances := map[string]bool{}
	for _, g := range old.GPUs {
		if g.MIG != nil {
			for _, in := range g.MIG.Instances {
				oldInstances[in.ID] = true
			}
		}
	}
	ids := slices.Sorted(maps.Keys(p.held))
	// Remap the reservations to the new indices; instances existing at a
	// held slot are claimed first, then pending creations adopt new ones.
	assigns := make(map[string]*sched.Assignment, len(ids))
	claimed := map[string]bool{}
	for _, id := range ids {
		a := p.held[id].assign
		a.GPUs = nil
		for _, gi := range p.held[id].assign.GPUs {
			if gi < len(old.GPUs) {
				if ni, ok := gpuAt[old.GPUs[gi].ID]; ok {
					a.GPUs = append(a.GPUs, ni)
				}
			}
		}
		if m := a.MIG; m != nil {
			mp := *m
			a.MIG = nil
			if m.GPU < len(old.GPUs) {
				if ni, ok := gpuAt[old.GPUs[m.GPU].ID]; ok && p.hw.GPUs[ni].MIG != nil {
					mp.GPU = ni
					a.MIG = &mp
					// An instance at the slot is the reservation's only if
					// it is of its profile: an idle one of another (that
					// the engine destroys for it) is not.
					if in, ok := instanceAt(p.hw.GPUs[ni].MIG, mp.Start); ok && in.Slots == mp.Slices && in.Profile == p.held[id].req.MIGProfile {
						mp.Create = false
						claimed[in.ID] = true
					} else {
						mp.Create = true
					}
				}
			}
		}
		// Exclusive cores are held by CPU: counted again on the new
		// cores' NUMA nodes.
		a.Cores = p.coresHeld(p.held[id].cpus)
		if a.FPGA >= 0 {
			fi := -1
			if a.FPGA < len(old.FPGAs) {
				if ni, ok := fpgaAt[old.FPGAs[a.FPGA].ID]; ok {
					fi = ni
				}
			}
			a.FPGA = fi
		}
		assigns[id] = &a
	}
	for _, id := range ids {
		m := assigns[id].MIG
		if m == nil || !m.Create {
			continue
		}
		for _, in := range p.hw.GPUs[m.GPU].MIG.Instances {
			if in.ID != "" && !oldInstances[in.ID] && !claimed[in.ID] && in.Profile == p.held[id].req.MIGProfile {
				m.Start, m.Slices, m.Create = in.Start, in.Slots, false
				claimed[in.ID] = true
				break
			}
		}
	}
	for _, id := range ids {
		a := assigns[id]
		if err := node.Apply(a); err != nil {
			// The devices it held are gone or changed under it: keep its
			// CPU and memory reserved, which are still there.
			*a = sched.Assignment{Node: a.Node, NodeIdx: a.NodeIdx, CPUMilli: a.CPUMilli, MemMiB: a.MemMiB, Cores: a.Cores, FPGA: -1}
			_ = node.Apply(a)
		}
		h := p.held[id]
		h.assign = *a
		p.held[id] = h
	}
	p.base, p.node = base, node
	for gi := range p.hw.GPUs {
		p.refreshGPU(gi)
	}
	p.liveAt = time.Time{} // the new node has no live load yet
}

// instanceAt is the instance of m starting at slot start.
func instanceAt(m *devices.MIG, start int) (devices.MIGInstance, bool) {
	for _, in := range m.Instances {
		if in.Start == start {
			return in, true
		}
	}
	return devices.MIGInstance{}, false
}

// downOf is the set of GPUs and MIG instances hw reports unhealthy.
func downOf(hw Hardware) map[string]bool {
	down := map[string]bool{}
	for _, g := range hw.GPUs {
		if !g.Health.Healthy {
			down[g.ID] = true
		}
		if g.MIG != nil {
			for _, in := range g.MIG.Instances {
				if in.Health != nil && !in.Health.Healthy {
					down[in.ID] = true
				}
			}
		}
	}
	return down
}

// SetHealthy takes a GPU or MIG instance (by ID, as in Hardware) out of
// service or returns it: a one-device UpdateHardware. An unhealthy GPU
// offers no free share, memory, MIG instance or free MIG slice; an
// unhealthy MIG instance is not handed out. What jobs already hold stays
// held; when the device is healthy again exactly what is not held becomes
// free. It reports whether the ID names a device of this host.
func (p *Placer) SetHealthy(deviceID string, healthy bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	gi := p.gpuOf(deviceID)
	if gi < 0 {
		return false
	}
	h := devices.Health{Healthy: healthy}
	gpus := slices.Clone(p.hw.GPUs)
	g := &gpus[gi]
	if g.ID == deviceID {
		g.Health = h
	} else {
		m := *g.MIG
		m.Instances = slices.Clone(m.Instances)
		for i := range m.Instances {
			if m.Instances[i].ID == deviceID {
				m.Instances[i].Health = &h
			}
		}
		g.MIG = &m
	}
	p.hw.GPUs = gpus
	p.down = downOf(p.hw)
	p.refreshGPU(gi)
	return true
}

// gpuOf is the index of the GPU that is, or holds the MIG instance, id.
func (p *Placer) gpuOf(id string) int {
	for i, g := range p.hw.GPUs {
		if g.ID == id {
			return i
		}
		if g.MIG != nil {
			for _, in := range g.MIG.Instances {
				if in.ID == id {
					return i
				}
			}
		}
	}
	return -1
}

// Unhealthy lists the devices out of service, sorted.
func (p *Placer) Unhealthy() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.unhealthy()
}

func (p *Placer) unhealthy() []string {
	out := make([]string, 0, len(p.down))
	for id := range p.down {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// refreshGPU recomputes GPU gi of the live node from the empty node, what
// held jobs hold on it and its health. The caller holds p.mu.
func (p *Placer) refreshGPU(gi int) {
	g, b, hw := &p.node.GPUs[gi], p.base.GPUs[gi], p.hw.GPUs[gi]
	gpuDown := p.down[hw.ID]
	var milli, mem int64
	heldMIG := map[int]bool{}
	for _, h := range p.held {
		if slices.Contains(h.assign.GPUs, gi) {
			milli += h.assign.GPUMilli
			mem += h.assign.GPUMemMiB
		}
		if m := h.assign.MIG; m != nil && m.GPU == gi {
			heldMIG[m.Start] = true
		}
	}
	g.MilliFree, g.MemFreeMiB = max(0, b.MilliFree-milli), max(0, b.MemFreeMiB-mem)
	if gpuDown {
		g.MilliFree, g.MemFreeMiB = 0, 0
	}
	if m := g.MIG; m != nil {
		downAt := map[int]bool{}
		if hw.MIG != nil {
			for _, in := range hw.MIG.Instances {
				if p.down[in.ID] {
					downAt[in.Start] = true
				}
			}
		}
		kept := m.Instances[:0]
		for _, in := range m.Instances {
			if in.Profile == unhealthyMIG {
				continue
			}
			in.InUse = heldMIG[in.Start] || gpuDown || downAt[in.Start]
			kept = append(kept, in)
		}
		m.Instances = kept
		if gpuDown {
			for s := range m.TotalSlices {
				if !freeSlice(m.Instances, s) {
					continue
				}
				m.Instances = append(m.Instances, sched.MIGInstance{Profile: unhealthyMIG, Start: s, Slices: 1, InUse: true})
			}
		}
	}
	p.node.Version++
}

// freeSlice reports whether slice s belongs to none of the instances.
func freeSlice(insts []sched.MIGInstance, s int) bool {
	for _, in := range insts {
		if in.Profile != unhealthyMIG && s >= in.Start && s < in.Start+in.Slices {
			return false
		}
	}
	return true
}

func buildNode(hw Hardware, cores []cgroups.Core, keepShared int) *sched.Node {
	n := sched.NewNode(cmpOr(hw.Name, "local"), int64(hw.CPU), hw.Memory.WholeMiB(), 0, "")
	n.FreeCores = coresPerNUMA(cores)
	if len(cores) > 0 {
		n.KeepSharedCores = max(keepShared, 0)
	}
	for _, g := range hw.GPUs {
		// The engine reads the model's efficiency from its table; the
		// table's typical idle draw stands until telemetry reports one.
		sg := sched.GPU{Model: g.Model, MilliFree: sched.MilliPerGPU, MemMiB: g.MemoryMB, MemFreeMiB: g.MemoryMB, NUMA: max(g.NUMA, 0), MPS: g.MPS}
		if spec, ok := sched.LookupGPU(g.Model); ok {
			sg.IdleWatts = spec.IdleW
		}
		if m := g.MIG; m != nil {
			// The driver's placements bound where the engine starts a new
			// instance (the same slots pods' migStarts offer).
			sm := &sched.MIG{TotalSlices: m.Slots, ReconfigCost: g.ReconfigMs, Starts: m.Starts}
			for _, in := range m.Instances {
				sm.Instances = append(sm.Instances, sched.MIGInstance{Profile: in.Profile, Start: in.Start, Slices: in.Slots})
			}
			sg.MIG = sm
		}
		// Each GPU names its model: a host may hold several (an H100
		// beside two L4s), and the engine filters and scores per GPU.
		n.GPUs = append(n.GPUs, sg)
	}
	n.NVLink = slices.Clone(hw.NVLink)
	for _, f := range hw.FPGAs {
		n.FPGAs = append(n.FPGAs, sched.FPGARegion{Bitstream: f.Bitstream, ProgramMs: f.ReconfigMs, NUMA: max(f.NUMA, 0), Busy: !f.Health.Healthy})
	}
	return n
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

var migSlicesRE = regexp.MustCompile(`^([1-8])g\.`)

// jobRequest is a job's engine request against this host, its owner
// included (the user an MPS GPU's shares belong to).
func (p *Placer) jobRequest(j *api.Job) sched.Request {
	r := p.request(j.ID, j.Spec, j.Tier)
	r.Owner = OwnerKey(j.Owner)
	return r
}

// OwnerKey is how the engine names a job's user (Request.Owner): by uid.
func OwnerKey(o api.Owner) string { return fmt.Sprintf("uid:%d", o.UID) }

// request converts a job (its spec and effective tier) to an engine request
// against this host.
func (p *Placer) request(id string, spec api.JobSpec, tier api.Tier) sched.Request {
	models := make([]string, 0, len(p.hw.GPUs))
	for _, g := range p.hw.GPUs {
		models = append(models, g.Model)
	}
	return EngineRequest(id, spec, tier, Target{GPUModels: models, MIGSlots: p.migSlots, ExclusiveCores: len(p.cores) > 0,
		ResolveBitstream: p.opts.ResolveBitstream})
}

// Target is what converting a job to an engine request needs to know of
// the host it is judged against.
type Target struct {
	// GPUModels are the host's GPU model names: a spec's model matches
	// those ModelMatches says ("h200" matches "NVIDIA H200").
	GPUModels []string
	// MIGSlots is a MIG profile's compute slices there (nil: read from
	// the profile's name, "3g.40gb" has 3).
	MIGSlots func(profile string) int
	// ExclusiveCores: guaranteed jobs take whole exclusive cores there.
	ExclusiveCores bool
	// ResolveBitstream turns a bitstream reference into the ID regions
	// report as loaded (nil: as written).
	ResolveBitstream func(ref string) (string, error)
}

// EngineRequest converts a job (its spec and effective tier) to an engine
// request against target: the one conversion the placer uses for this
// host and package peers for the hosts its peers gossip.
func EngineRequest(id string, spec api.JobSpec, tier api.Tier, target Target) sched.Request {
	r := spec.Resources
	req := sched.Request{
		ID: id, Class: spec.Class, Tier: tier, Priority: spec.Priority,
		CPUMilli: int64(r.CPU), MemMiB: r.Memory.MiB(),
		Topology: spec.Topology,
	}
	if tier == api.TierGuaranteed && r.CPU > 0 && target.ExclusiveCores {
		// Guaranteed jobs get whole exclusive cores, a fraction rounded
		// up; the engine counts them (1000 millicores each) instead of
		// shared CPU.
		req.ExclusiveCores, req.CPUMilli = CoresFor(int64(r.CPU)), 0
	}
	if g := r.GPU; g != nil {
		if g.Model != "" {
			for _, m := range target.GPUModels {
				if ModelMatches(m, g.Model) && !slices.Contains(req.GPUModels, m) {
					req.GPUModels = append(req.GPUModels, m)
				}
			}
			if len(req.GPUModels) == 0 {
				req.GPUModels = []string{g.Model} // matches nothing: filtered as a model mismatch
			}
		}
		switch {
		case g.MIG != "":
			req.MIGProfile = g.MIG
			if target.MIGSlots != nil {
				req.MIGSlices = target.MIGSlots(g.MIG)
			} else {
				req.MIGSlices = MIGSlicesOf(g.MIG)
			}
		case g.Share > 0:
			req.GPUs, req.GPUMilli = 1, int64(g.Share)
			req.GPUMemMiB = g.Memory.MiB()
		default:
			req.GPUs, req.GPUMilli = g.Count, sched.MilliPerGPU
		}
	}
	if f := r.FPGA; f != nil {
		req.Bitstream = f.Bitstream
		if target.ResolveBitstream != nil {
			if id, err := target.ResolveBitstream(f.Bitstream); err == nil {
				req.Bitstream = id
			}
		}
	}
	return req
}

// ModelMatches reports whether a job spec's GPU model (what a user
// writes: "h100", "L4", "a100-sxm4") names the GPU model a driver
// reports (host: "NVIDIA H100 80GB HBM3", "NVIDIA L4"): every word of
// the spec's, letters and digits, case-insensitively, is a word of the
// host's. Words, not substrings: "L4" does not match "NVIDIA L40S", nor
// "A10" "NVIDIA A100-SXM4-80GB", which matters on a host holding both.
func ModelMatches(host, spec string) bool {
	words := sched.ModelWords(host)
	want := sched.ModelWords(spec)
	if len(want) == 0 {
		return false
	}
	for _, w := range want {
		if !slices.Contains(words, w) {
			return false
		}
	}
	return true
}

// fieldOf names the spec field a filter reason is about.
var fieldOf = map[sched.FilterReason]string{
	sched.ReasonCPU:       "resources.cpu",
	sched.ReasonMemory:    "resources.memory",
	sched.ReasonCores:     "resources.cpu",
	sched.ReasonGPUModel:  "resources.gpu.model",
	sched.ReasonGPUs:      "resources.gpu.count",
	sched.ReasonGPUShare:  "resources.gpu.share",
	sched.ReasonGPUMemory: "resources.gpu.memory",
	sched.ReasonMIG:       "resources.gpu.mig",
	sched.ReasonFPGA:      "resources.fpga",
	sched.ReasonTopology:  "topology",
}

// Admit refuses a spec that would not fit even on this host with nothing
// else running: such a job could wait forever.
func (p *Placer) Admit(spec api.JobSpec) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	tier := spec.Tier
	if tier == "" {
		tier = api.TierBurstable
	}
	req := p.request("admit", spec, tier)
	if g := spec.Resources.GPU; g != nil && len(p.hw.GPUs) == 0 {
		return unsatisfiable("resources.gpu", "this host has no GPUs")
	}
	if f := spec.Resources.FPGA; f != nil {
		if len(p.hw.FPGAs) == 0 {
			return unsatisfiable("resources.fpga", "this host has no FPGAs")
		}
		if p.opts.ResolveBitstream != nil {
			if _, err := p.opts.ResolveBitstream(f.Bitstream); err != nil {
				return unsatisfiable("resources.fpga.bitstream", "%v (add it with: fusionctl fpga bitstream add FILE)", err)
			}
		}
	}
	if g := spec.Resources.GPU; g != nil && g.MIG != "" && !p.migSupported(g.MIG) {
		return unsatisfiable("resources.gpu.mig", "no GPU of this host supports MIG profile %q", g.MIG)
	}
	if err := req.Validate(); err != nil {
		return &api.Error{Code: api.CodeInvalid, Field: "resources", Message: err.Error()}
	}
	empty := p.base.Clone()
	if r := sched.Filter(&req, empty); r != sched.Fits {
		return unsatisfiable(cmpOr(fieldOf[r], "resources"), "this host could never run it: %s (host: %s CPU, %s memory, %d GPUs, %d FPGA regions)",
			r, p.hw.CPU, p.hw.Memory.Human(), len(p.hw.GPUs), len(p.hw.FPGAs))
	}
	return nil
}

// migSlots is how many slots of a MIG GPU an instance of profile takes, in
// the unit the host's MIG GPUs are modelled in (Hardware: memory slots).
// Unknown profiles fall back to the compute slices in the name.
func (p *Placer) migSlots(profile string) int {
	for _, g := range p.hw.GPUs {
		if g.MIG != nil {
			if n, ok := g.MIG.Profiles[profile]; ok {
				return n
			}
		}
	}
	return MIGSlicesOf(profile)
}

// MIGSlicesOf reads a MIG profile's compute slices from its name
// ("3g.40gb": 3; 0 for a name of another form).
func MIGSlicesOf(profile string) int {
	if m := migSlicesRE.FindStringSubmatch(profile); m != nil {
		n, _ := strconv.Atoi(m[1])
		return n
	}
	return 0
}

func (p *Placer) migSupported(profile string) bool {
	for _, g := range p.hw.GPUs {
		if g.MIG != nil {
			if _, ok := g.MIG.Profiles[profile]; ok {
				return true
			}
		}
	}
	return false
}

func unsatisfiable(field, format string, args ...any) *api.Error {
	return &api.Error{Code: api.CodeUnsatisfiable, Field: field, Message: fmt.Sprintf(format, args...)}
}

// Place places one job, or every member of a gang, or nothing.
func (p *Placer) Place(group []*api.Job) ([]api.Allocation, string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.place(group, nil)
}

// place is Place with a guard (nil: none) that may still refuse the
// engine's assignments once they are committed to the node; refused, they
// are released again and the guard's reason returned. The caller holds
// p.mu.
func (p *Placer) place(group []*api.Job, guard func(reqs []sched.Request) string) ([]api.Allocation, string, bool) {
	reqs := make([]sched.Request, len(group))
	for i, j := range group {
		reqs[i] = p.jobRequest(j)
		p.observe(&reqs[i])
	}
	p.estimateProgramming(reqs)
	p.refreshLive()
	nodes := []*sched.Node{p.node}
	var assigns []sched.Assignment
	var explain []string
	score, scored := 0.0, false
	lent := p.lend(reqs)
	// A job a defragmentation plan moved, or made room for, goes where
	// the plan put it while that is free; the plan kept them apart, so
	// no guard applies to it.
	var pin sched.Assignment
	pinned := len(reqs) == 1
	if pinned {
		pin, pinned = p.placeOnPin(group[0].ID, &reqs[0], nodes)
	}
	switch {
	case pinned:
		assigns = []sched.Assignment{pin}
		explain = []string{"placed where the defragmentation plan put it"}
	case len(reqs) == 1:
		d, err := p.eng.Place(&reqs[0], nodes)
		if err != nil {
			p.unlend(lent)
			return nil, p.withUnhealthy(waitReason(d, err)), false
		}
		if err := p.eng.Commit(&reqs[0], &d.Assignment, nodes); err != nil {
			p.unlend(lent)
			return nil, err.Error(), false
		}
		assigns = []sched.Assignment{d.Assignment}
		explain = []string{p.explain(&d)}
		score, scored = d.Score, true
	default:
		as, err := p.eng.PlaceGang(reqs, nodes)
		if err != nil {
			p.unlend(lent)
			return nil, p.withUnhealthy(fmt.Sprintf("gang of %d does not fit: %v", len(reqs), err)), false
		}
		assigns = as
		for range as {
			explain = append(explain, fmt.Sprintf("gang of %d placed together", len(as)))
		}
	}
	borrowed := p.borrow(assigns, lent)
	if guard != nil && !pinned {
		if why := guard(reqs); why != "" {
			for k := range reqs {
				p.eng.Release(&reqs[k], &assigns[k], nodes)
			}
			return nil, why, false
		}
	}
	// The engine chose how many exclusive cores on which NUMA node; take
	// those cores, member by member.
	out := make([]api.Allocation, len(group))
	for i, j := range group {
		cpus, err := p.takeCoresFor(assigns[i].Cores, corePreference(&reqs[i]))
		if err != nil {
			for k := range group {
				delete(p.held, group[k].ID)
				p.eng.Release(&reqs[k], &assigns[k], nodes)
			}
			p.publish()
			return nil, fmt.Sprintf("guaranteed job needs %d exclusive cores: %v", reqs[i].ExclusiveCores, err), false
		}
		p.held[j.ID] = held{req: reqs[i], assign: assigns[i], cpus: cpus, score: score, scored: scored}
		delete(p.pins, j.ID)
		out[i] = p.allocation(&reqs[i], &assigns[i], explain[i])
		if len(cpus) > 0 {
			out[i].CPUSet = cgroups.FormatCPUList(cpus)
			out[i].Explain = strings.TrimSpace(fmt.Sprintf("%s\nexclusive cores %s (NUMA node %d)", out[i].Explain, out[i].CPUSet, out[i].NUMANode))
		}
	}
	p.noteBorrowed(group, borrowed, out)
	p.publish()
	return out, "", true
}

// waitReason says why the one node of this host cannot take a request now.
func waitReason(d sched.Decision, err error) string {
	for r := range d.Filtered { // one node: at most one reason
		return string(r)
	}
	return err.Error()
}

// withUnhealthy adds the devices out of service to a wait reason. The
// caller holds p.mu.
func (p *Placer) withUnhealthy(reason string) string {
	if len(p.down) == 0 {
		return reason
	}
	return fmt.Sprintf("%s (out of service: %s)", reason, strings.Join(p.unhealthy(), ", "))
}

// estimateProgramming sets each region's programming-time estimate for the
// bitstream being asked for, so the engine weighs the real cost.
func (p *Placer) estimateProgramming(reqs []sched.Request) {
	if p.opts.ProgramEstimate == nil {
		return
	}
	for _, r := range reqs {
		if r.Bitstream == "" {
			continue
		}
		for i := range p.node.FPGAs {
			p.node.FPGAs[i].ProgramMs = p.opts.ProgramEstimate(p.hw.FPGAs[i].ID, r.Bitstream)
		}
	}
}

// allocation names what an assignment holds.
func (p *Placer) allocation(req *sched.Request, a *sched.Assignment, explain string) api.Allocation {
	alloc := api.Allocation{CPU: api.MilliCPU(a.CPUMilli), Memory: api.BytesOfMiB(a.MemMiB), NUMANode: -1, Explain: explain}
	for numa, n := range a.Cores {
		// The node holding most of the job's cores (lowest on a tie).
		if n > 0 && (alloc.NUMANode < 0 || n > a.Cores[alloc.NUMANode] || n == a.Cores[alloc.NUMANode] && numa < alloc.NUMANode) {
			alloc.NUMANode = numa
		}
	}
	notePCI := func(gpu devices.Device) {
		if gpu.PCI == "" {
			return
		}
		if alloc.GPUPCI == nil {
			alloc.GPUPCI = map[string]string{}
		}
		alloc.GPUPCI[gpu.ID] = gpu.PCI
	}
	for _, g := range a.GPUs {
		gpu := p.hw.GPUs[g]
		notePCI(gpu)
		if req.Shared() {
			alloc.GPUShare = &api.GPUShare{GPU: gpu.ID, Milli: int(req.GPUMilli), MemoryMB: req.GPUMemMiB}
			alloc.Devices = append(alloc.Devices, fmt.Sprintf("%s (%d milli-GPU)", gpu.ID, req.GPUMilli))
		} else {
			alloc.GPUs = append(alloc.GPUs, gpu.ID)
			alloc.Devices = append(alloc.Devices, gpu.ID)
		}
		if alloc.NUMANode < 0 {
			alloc.NUMANode = max(gpu.NUMA, 0)
		}
	}
	if m := a.MIG; m != nil {
		g := p.hw.GPUs[m.GPU]
		notePCI(g)
		mig := &api.MIGAllocation{GPU: g.ID, Profile: req.MIGProfile, Start: m.Start}
		if g.MIG != nil && !m.Create {
			for _, in := range g.MIG.Instances {
				if in.Start == m.Start && in.Slots == m.Slices {
					mig.Instance = in.ID
				}
			}
		}
		alloc.MIG = mig
		alloc.Devices = append(alloc.Devices, cmpOr(mig.Instance, fmt.Sprintf("%s %s (to create)", g.ID, req.MIGProfile)))
	}
	if a.FPGA >= 0 {
		r := p.hw.FPGAs[a.FPGA]
		alloc.FPGA = &api.FPGAAllocation{Region: r.ID, Bitstream: req.Bitstream, Program: a.Program}
		alloc.Devices = append(alloc.Devices, r.ID)
	}
	return alloc
}

// Reclaim reserves again what a job re-attached after a daemon restart
// holds, from its recorded allocation, so nothing is handed out twice. A
// pod's device hold (Spec.Pod) is held as a pod hold again (pods.go).
func (p *Placer) Reclaim(j *api.Job) error {
	a := j.Allocation
	if a == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.held[j.ID]; ok {
		return nil
	}
	req := p.jobRequest(j)
	as := sched.Assignment{Node: p.node.Name, CPUMilli: int64(a.CPU), MemMiB: a.Memory.WholeMiB(), FPGA: -1, Owner: req.Owner}
	// Its exclusive cores are the ones its cgroup was made with; a job
	// recorded without a cpuset (placed where the host had no exclusive
	// cores) holds CPU only.
	var cpus []int
	if a.CPUSet != "" && len(p.cores) > 0 {
		var err error
		if cpus, err = cgroups.ParseCPUList(a.CPUSet); err != nil {
			return fmt.Errorf("job %s exclusive cores %q: %w", j.ID, a.CPUSet, err)
		}
		if err := p.claimCores(j.ID, cpus); err != nil {
			return fmt.Errorf("re-reserving job %s: %w", j.ID, err)
		}
		as.Cores = p.coresHeld(cpus)
		n := 0
		for _, c := range as.Cores {
			n += c
		}
		as.CPUMilli = int64(n) * 1000 // what Place counts for its cores
	}
	// Devices are found by UUID, else by the PCI address recorded with the
	// allocation; a GPU found by address has its new UUID written into the
	// job's allocation, so the drivers' reclaim and the job's record name
	// the device as the host now does.
	renamed := map[string]string{}
	find := func(id string) int {
		if gi := p.gpuOf(id); gi >= 0 {
			return gi
		}
		if pci := a.GPUPCI[id]; pci != "" {
			for i, g := range p.hw.GPUs {
				if g.PCI == pci {
					renamed[id] = g.ID
					return i
				}
			}
		}
		return -1
	}
	for _, id := range a.GPUs {
		gi := find(id)
		if gi < 0 {
			return fmt.Errorf("job %s holds GPU %s (PCI %q), which this host no longer has", j.ID, id, a.GPUPCI[id])
		}
		as.GPUs = append(as.GPUs, gi)
		as.GPUMilli = sched.MilliPerGPU
	}
	if s := a.GPUShare; s != nil {
		gi := find(s.GPU)
		if gi < 0 {
			return fmt.Errorf("job %s holds a share of GPU %s, which this host no longer has", j.ID, s.GPU)
		}
		as.GPUs, as.GPUMilli, as.GPUMemMiB = []int{gi}, int64(s.Milli), s.MemoryMB
	}
	if m := a.MIG; m != nil {
		gi := find(m.GPU)
		if gi < 0 {
			return fmt.Errorf("job %s holds a MIG instance on GPU %s, which this host no longer has", j.ID, m.GPU)
		}
		as.MIG = &sched.MIGPick{GPU: gi, Start: m.Start, Slices: p.migSlots(m.Profile)}
		exists := false
		if mm := p.node.GPUs[gi].MIG; mm != nil {
			for _, in := range mm.Instances {
				exists = exists || in.Start == m.Start
			}
		}
		as.MIG.Create = !exists
	}
	if f := a.FPGA; f != nil {
		for i, r := range p.hw.FPGAs {
			if r.ID == f.Region {
				as.FPGA, as.Bitstream = i, f.Bitstream
			}
		}
	}
	b := p.borrowReattached(a, &as)
	// Commit refuses what another reservation holds: a device is never
	// booked twice.
	if err := p.eng.Commit(&req, &as, []*sched.Node{p.node}); err != nil {
		return fmt.Errorf("re-reserving job %s: %w", j.ID, err)
	}
	p.held[j.ID] = held{req: req, assign: as, cpus: cpus, pod: clonePodHold(j.Spec.Pod)}
	if !b.zero() {
		p.borrowed[j.ID] = b
	}
	if len(renamed) > 0 {
		renameGPUs(a, renamed)
	}
	p.publish()
	return nil
}

// renameGPUs rewrites an allocation's GPU UUIDs (old → new).
func renameGPUs(a *api.Allocation, renamed map[string]string) {
	for i, id := range a.GPUs {
		if n, ok := renamed[id]; ok {
			a.GPUs[i] = n
		}
	}
	for i, d := range a.Devices {
		for old, n := range renamed {
			a.Devices[i] = strings.ReplaceAll(d, old, n)
			d = a.Devices[i]
		}
	}
	if s := a.GPUShare; s != nil {
		if n, ok := renamed[s.GPU]; ok {
			s.GPU = n
		}
	}
	if m := a.MIG; m != nil {
		if n, ok := renamed[m.GPU]; ok {
			m.GPU = n
		}
	}
	for old, n := range renamed {
		if pci, ok := a.GPUPCI[old]; ok {
			delete(a.GPUPCI, old)
			a.GPUPCI[n] = pci
		}
	}
}

// Release returns a job's reservation (a pod hold's too, forgotten with
// it); releasing twice is harmless.
func (p *Placer) Release(j *api.Job) {
	p.mu.Lock()
	defer p.mu.Unlock()
	h, ok := p.held[j.ID]
	if !ok {
		return
	}
	delete(p.held, j.ID)
	delete(p.seen, j.ID)
	p.released(j.ID, h.req.Tier)
	p.eng.Release(&h.req, &h.assign, []*sched.Node{p.node})
	p.publish()
	// Release gives back to the node what the job held; an unhealthy
	// device must still offer nothing.
	for id := range p.down {
		p.refreshGPU(p.gpuOf(id))
	}
}

// PlacedScore is the engine's score (0..1) of the placement job id holds,
// from the decision that placed it; false for a job not placed, a gang's
// member or a re-reserved placement (jobs.Scorer: the queue's poor-fit
// rule).
func (p *Placer) PlacedScore(id string) (float64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	h, ok := p.held[id]
	return h.score, ok && h.scored
}

// BestEffortOnly names the GPUs (by ID) whose jobs are all best-effort:
// the GPUs a power policy may cap. Idle GPUs are not in it.
func (p *Placer) BestEffortOnly() map[string]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]bool{}
	other := map[string]bool{}
	for _, h := range p.held {
		gs := slices.Clone(h.assign.GPUs)
		if m := h.assign.MIG; m != nil {
			gs = append(gs, m.GPU)
		}
		for _, g := range gs {
			id := p.hw.GPUs[g].ID
			if h.req.Tier == sched.TierBestEffort {
				out[id] = true
			} else {
				other[id] = true
			}
		}
	}
	for id := range other {
		delete(out, id)
	}
	return out
}

// Capacity is the host's total, in the daemon's one resource vector
// (api.NodeResources); the engine's node keeps the same amounts as plain
// millicores and MiB.
func (p *Placer) Capacity() api.NodeResources {
	p.mu.Lock()
	defer p.mu.Unlock()
	return api.NodeResources{CPU: p.hw.CPU, Memory: p.hw.Memory, GPUs: len(p.hw.GPUs), FPGAs: len(p.hw.FPGAs)}
}

// Allocated is what placed and running jobs hold of the host's capacity;
// the part of best-effort jobs' requests placed on reclaimed capacity
// (OnReclaimed) is not in it: guaranteed and burstable jobs reserved it.
func (p *Placer) Allocated() api.NodeResources {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.node
	used := map[int]bool{}
	fpgas := 0
	for _, h := range p.held {
		for _, g := range h.assign.GPUs {
			used[g] = true
		}
		if m := h.assign.MIG; m != nil {
			used[m.GPU] = true
		}
		if h.assign.FPGA >= 0 {
			fpgas++
		}
	}
	gpus := len(used)
	return api.NodeResources{
		CPU: api.MilliCPU(n.CPUMilli - n.CPUFreeMilli), Memory: api.BytesOfMiB(n.MemMiB - n.MemFreeMiB),
		GPUs: gpus, FPGAs: fpgas,
	}
}

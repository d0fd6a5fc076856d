package nvidia

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"
)

// Sentinel errors of MIG planning.
var (
	// ErrBusy means the plan would touch a GPU or instance that holds work.
	ErrBusy = errors.New("nvidia: GPU or MIG instance holds work")
	// ErrNoCapacity means the requested instances do not fit the GPU.
	ErrNoCapacity = errors.New("nvidia: MIG profiles do not fit the GPU")
	// ErrUnknownProfile means a profile name is not offered by the GPU.
	ErrUnknownProfile = errors.New("nvidia: unknown MIG profile")
	// ErrMIGPending means a MIG mode change waits for a GPU reset (an
	// operator action); the rest of the plan for that GPU cannot proceed.
	ErrMIGPending = errors.New("nvidia: MIG mode change pending a GPU reset")
)

// Instance is an existing MIG GPU instance (with its compute instance).
type Instance struct {
	// GIID is NVML's GPU-instance id on its GPU.
	GIID    int    `json:"giID"`
	Profile string `json:"profile"`
	// Start and Size are its memory-slot placement.
	Start int `json:"start"`
	Size  int `json:"size"`
	// UUID is the MIG device UUID ("MIG-..."), empty until a compute
	// instance exists.
	UUID string `json:"uuid,omitempty"`
	// Busy is set when the instance holds work; the planner never
	// touches it.
	Busy bool `json:"busy,omitempty"`
}

// GPUState is the MIG state of one GPU as planning sees it.
type GPUState struct {
	Index      int        `json:"index"`
	UUID       string     `json:"uuid"`
	Profiles   ProfileSet `json:"profiles"`
	MIGEnabled bool       `json:"migEnabled"`
	Instances  []Instance `json:"instances,omitempty"`
	// Busy is set when the whole GPU (not a MIG instance) holds work.
	Busy bool `json:"busy,omitempty"`
	// Unhealthy GPUs get no new instances on demand.
	Unhealthy bool `json:"unhealthy,omitempty"`
}

// State is the MIG state of a host.
type State struct {
	GPUs []GPUState `json:"gpus"`
}

// ActionKind names a MIG action.
type ActionKind string

// Action kinds, in the order a plan performs them.
const (
	DestroyInstance ActionKind = "destroy-instance"
	SetMIGMode      ActionKind = "set-mig-mode"
	CreateInstance  ActionKind = "create-instance"
)

// Action is one step of a MIG plan.
type Action struct {
	Kind    ActionKind `json:"kind"`
	GPU     int        `json:"gpu"`
	GPUUUID string     `json:"gpuUUID"`
	// Profile, Start: for create/destroy.
	Profile string `json:"profile,omitempty"`
	Start   int    `json:"start"`
	// GIID: for destroy.
	GIID int `json:"giID,omitempty"`
	// Enable: for set-mig-mode.
	Enable bool `json:"enable,omitempty"`
}

func (a Action) String() string {
	switch a.Kind {
	case SetMIGMode:
		return fmt.Sprintf("gpu %d: set MIG mode enabled=%t", a.GPU, a.Enable)
	case DestroyInstance:
		return fmt.Sprintf("gpu %d: destroy %s (GI %d) at slot %d", a.GPU, a.Profile, a.GIID, a.Start)
	default:
		return fmt.Sprintf("gpu %d: create %s at slot %d", a.GPU, a.Profile, a.Start)
	}
}

// Expected reconfiguration times used as the cost of a plan. They are
// estimates from NVIDIA's documentation and public measurements (creating a
// GI+CI takes about a second; a MIG mode change may need a GPU reset).
const (
	CostCreate  = 1500 * time.Millisecond
	CostDestroy = 800 * time.Millisecond
	CostMIGMode = 15 * time.Second
)

// Cost is the expected time to perform the action.
func (a Action) Cost() time.Duration {
	switch a.Kind {
	case SetMIGMode:
		return CostMIGMode
	case DestroyInstance:
		return CostDestroy
	default:
		return CostCreate
	}
}

// PlanCost is the expected reconfiguration time of a plan.
func PlanCost(actions []Action) time.Duration {
	var d time.Duration
	for _, a := range actions {
		d += a.Cost()
	}
	return d
}

// Plan computes the ordered, minimal actions that take cur to target:
// instances that already match are kept, busy GPUs and instances are never
// touched (ErrBusy), and capacity and placement rules are checked
// (ErrNoCapacity). It is pure.
func Plan(cur State, target Target) ([]Action, error) {
	var destroys, modes, creates []Action
	for _, g := range cur.GPUs {
		t, ok := target[g.Index]
		if !ok {
			continue
		}
		d, m, c, err := planGPU(g, t)
		if err != nil {
			return nil, fmt.Errorf("gpu %d (%s): %w", g.Index, g.UUID, err)
		}
		destroys, modes, creates = append(destroys, d...), append(modes, m...), append(creates, c...)
	}
	return append(append(destroys, modes...), creates...), nil
}

func planGPU(g GPUState, t GPUTarget) (destroys, modes, creates []Action, err error) {
	act := func(k ActionKind) Action { return Action{Kind: k, GPU: g.Index, GPUUUID: g.UUID} }
	if !t.MIGEnabled {
		if !g.MIGEnabled {
			return nil, nil, nil, nil
		}
		for _, in := range g.Instances {
			if in.Busy {
				return nil, nil, nil, fmt.Errorf("disable MIG: instance %s (GI %d): %w", in.Profile, in.GIID, ErrBusy)
			}
			a := act(DestroyInstance)
			a.Profile, a.GIID, a.Start = in.Profile, in.GIID, in.Start
			destroys = append(destroys, a)
		}
		m := act(SetMIGMode)
		return destroys, []Action{m}, nil, nil
	}
	if len(g.Profiles) == 0 {
		return nil, nil, nil, fmt.Errorf("GPU is not MIG capable: %w", ErrNotSupported)
	}
	want := map[string]int{}
	for name, n := range t.Counts {
		p, ok := g.Profiles.ByName(name)
		if !ok {
			return nil, nil, nil, fmt.Errorf("%q (GPU offers %v): %w", name, g.Profiles.Names(), ErrUnknownProfile)
		}
		if n > p.MaxCount {
			return nil, nil, nil, fmt.Errorf("%d × %s exceeds the GPU's maximum of %d: %w", n, name, p.MaxCount, ErrNoCapacity)
		}
		want[name] = n
	}
	if !g.MIGEnabled {
		if g.Busy {
			return nil, nil, nil, fmt.Errorf("enable MIG: %w", ErrBusy)
		}
		m := act(SetMIGMode)
		m.Enable = true
		modes = append(modes, m)
	}
	// Keep instances that are wanted, busy ones first.
	insts := append([]Instance(nil), g.Instances...)
	sort.SliceStable(insts, func(i, j int) bool { return insts[i].Busy && !insts[j].Busy })
	var kept, spare []Instance
	remaining := map[string]int{}
	for k, v := range want {
		remaining[k] = v
	}
	for _, in := range insts {
		if remaining[in.Profile] > 0 {
			remaining[in.Profile]--
			kept = append(kept, in)
			continue
		}
		if in.Busy {
			return nil, nil, nil, fmt.Errorf("instance %s (GI %d) is not in the target: %w", in.Profile, in.GIID, ErrBusy)
		}
		spare = append(spare, in)
	}
	placed, ok := placeProfiles(g.Profiles, kept, remaining)
	if !ok {
		// Re-place every free instance; busy ones stay where they are.
		var busy []Instance
		for _, in := range kept {
			if in.Busy {
				busy = append(busy, in)
			} else {
				spare = append(spare, in)
			}
		}
		rem := map[string]int{}
		for k, v := range want {
			rem[k] = v
		}
		for _, in := range busy {
			rem[in.Profile]--
		}
		if placed, ok = placeProfiles(g.Profiles, busy, rem); !ok {
			return nil, nil, nil, fmt.Errorf("%v: %w", t.Counts, ErrNoCapacity)
		}
	}
	sort.Slice(spare, func(i, j int) bool { return spare[i].Start < spare[j].Start })
	for _, in := range spare {
		a := act(DestroyInstance)
		a.Profile, a.GIID, a.Start = in.Profile, in.GIID, in.Start
		destroys = append(destroys, a)
	}
	for _, in := range placed {
		a := act(CreateInstance)
		a.Profile, a.Start = in.Profile, in.Start
		creates = append(creates, a)
	}
	return destroys, modes, creates, nil
}

// slotMask is the set of memory slots an instance occupies.
func slotMask(start, size int) uint16 { return uint16((1<<size)-1) << start }

// placeProfiles places the remaining profile counts around the fixed
// instances, largest first, by backtracking over NVIDIA's allowed starts.
// It enforces non-overlap, per-profile maximum counts and the seven compute
// slices. It returns the new instances (Profile, Start, Size).
func placeProfiles(ps ProfileSet, fixed []Instance, remaining map[string]int) ([]Instance, bool) {
	var used uint16
	slices := 0
	count := map[string]int{}
	for _, in := range fixed {
		used |= slotMask(in.Start, in.Size)
		if p, ok := ps.ByName(in.Profile); ok {
			slices += p.Slices
		}
		count[in.Profile]++
	}
	var todo []Profile
	for name, n := range remaining {
		p, ok := ps.ByName(name)
		if !ok || n < 0 {
			return nil, false
		}
		if count[name]+n > p.MaxCount {
			return nil, false
		}
		for i := 0; i < n; i++ {
			todo = append(todo, p)
			slices += p.Slices
		}
	}
	if slices > ComputeSlices {
		return nil, false
	}
	sort.SliceStable(todo, func(i, j int) bool {
		if todo[i].MemSlots != todo[j].MemSlots {
			return todo[i].MemSlots > todo[j].MemSlots
		}
		if todo[i].Slices != todo[j].Slices {
			return todo[i].Slices > todo[j].Slices
		}
		return todo[i].Name < todo[j].Name
	})
	out := make([]Instance, len(todo))
	var rec func(k int, used uint16) bool
	rec = func(k int, used uint16) bool {
		if k == len(todo) {
			return true
		}
		p := todo[k]
		lo := 0
		// Identical profiles are placed in increasing start order so the
		// search does not revisit permutations.
		if k > 0 && todo[k-1].Name == p.Name {
			lo = out[k-1].Start + 1
		}
		for _, s := range p.Starts() {
			if s < lo || s+p.MemSlots > MemorySlots {
				continue
			}
			m := slotMask(s, p.MemSlots)
			if used&m != 0 {
				continue
			}
			out[k] = Instance{Profile: p.Name, Start: s, Size: p.MemSlots}
			if rec(k+1, used|m) {
				return true
			}
		}
		return false
	}
	if !rec(0, used) {
		return nil, false
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Start < out[j].Start })
	return out, true
}

// Candidate is one way to obtain a new MIG instance of a profile on demand.
type Candidate struct {
	GPU     int      `json:"gpu"`
	GPUUUID string   `json:"gpuUUID"`
	Actions []Action `json:"actions"`
	// Cost is the expected reconfiguration time.
	Cost time.Duration `json:"cost"`
}

// PlanOnDemand lists the ways to create one more instance of profile on the
// host's MIG-enabled GPUs without touching busy GPUs or busy instances:
// first from free slots only; else by destroying idle instances that sit on
// the slots needed. Unhealthy GPUs are skipped. Running instances are never part of any plan. The
// candidates are sorted by cost, cheapest first; none means no GPU can
// offer the profile now (ErrNoCapacity).
func PlanOnDemand(cur State, profile string) ([]Candidate, error) {
	var out []Candidate
	for _, g := range cur.GPUs {
		if !g.MIGEnabled || g.Busy || g.Unhealthy {
			continue
		}
		if c, ok := onDemandGPU(g, profile); ok {
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("on-demand %s: %w", profile, ErrNoCapacity)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Cost < out[j].Cost })
	return out, nil
}

func onDemandGPU(g GPUState, name string) (Candidate, bool) {
	p, ok := g.Profiles.ByName(name)
	if !ok {
		return Candidate{}, false
	}
	best := Candidate{GPU: g.Index, GPUUUID: g.UUID, Cost: -1}
	for _, s := range p.Starts() {
		acts, ok := onDemandAt(g, p, s)
		if !ok {
			continue
		}
		if c := PlanCost(acts); best.Cost < 0 || c < best.Cost {
			best.Actions, best.Cost = acts, c
		}
	}
	return best, best.Cost >= 0
}

// onDemandAt is how to create an instance of p at start s on g: destroy
// the idle instances on its slots, then create it. It is false when s is
// not one of p's starts, a busy instance sits on the slots, or p does not
// fit there next to the instances kept.
func onDemandAt(g GPUState, p Profile, s int) ([]Action, bool) {
	if !slices.Contains(p.Starts(), s) || s+p.MemSlots > MemorySlots {
		return nil, false
	}
	need := slotMask(s, p.MemSlots)
	var keep, drop []Instance
	for _, in := range g.Instances {
		if slotMask(in.Start, in.Size)&need == 0 {
			keep = append(keep, in)
			continue
		}
		if in.Busy {
			return nil, false
		}
		drop = append(drop, in)
	}
	placed, ok := placeAt(g.Profiles, keep, p, s)
	if !ok {
		return nil, false
	}
	var acts []Action
	for _, in := range drop {
		acts = append(acts, Action{Kind: DestroyInstance, GPU: g.Index, GPUUUID: g.UUID, Profile: in.Profile, GIID: in.GIID, Start: in.Start})
	}
	return append(acts, Action{Kind: CreateInstance, GPU: g.Index, GPUUUID: g.UUID, Profile: placed.Profile, Start: placed.Start}), true
}

// PlanOnDemandAt is the way to create an instance of profile at exactly
// start on the GPU gpuUUID: destroy the idle instances on its slots, then
// create it. Busy instances are never touched; a GPU that is busy,
// unhealthy, not in MIG mode or unknown, a profile it lacks, a start
// NVIDIA does not allow for it or a busy instance on its slots is
// ErrNoCapacity.
func PlanOnDemandAt(cur State, gpuUUID, profile string, start int) (Candidate, error) {
	for _, g := range cur.GPUs {
		if g.UUID != gpuUUID {
			continue
		}
		if !g.MIGEnabled || g.Busy || g.Unhealthy {
			break
		}
		p, ok := g.Profiles.ByName(profile)
		if !ok {
			break
		}
		if acts, ok := onDemandAt(g, p, start); ok {
			return Candidate{GPU: g.Index, GPUUUID: g.UUID, Actions: acts, Cost: PlanCost(acts)}, nil
		}
		break
	}
	return Candidate{}, fmt.Errorf("%s at slot %d on %s: %w", profile, start, gpuUUID, ErrNoCapacity)
}

// placeAt checks that p fits at start s next to the kept instances.
func placeAt(ps ProfileSet, keep []Instance, p Profile, s int) (Instance, bool) {
	slices, n := p.Slices, 1
	for _, in := range keep {
		if q, ok := ps.ByName(in.Profile); ok {
			slices += q.Slices
		}
		if in.Profile == p.Name {
			n++
		}
	}
	if slices > ComputeSlices || n > p.MaxCount {
		return Instance{}, false
	}
	return Instance{Profile: p.Name, Start: s, Size: p.MemSlots}, true
}

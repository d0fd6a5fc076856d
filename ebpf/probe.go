package ebpf

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
)

// Errors Load returns when the kernel cannot run the probe; callers run
// without probes and report why.
var (
	// ErrNoBTF: the kernel exposes no BTF (/sys/kernel/btf/vmlinux), which
	// BTF tracepoints and CO-RE relocations need.
	ErrNoBTF = errors.New("ebpf: kernel has no BTF (CONFIG_DEBUG_INFO_BTF)")
	// ErrUnsupported: the kernel lacks a program type or attach point the
	// probe needs (tp_btf tracing programs, Linux 5.5+).
	ErrUnsupported = errors.New("ebpf: kernel does not support the probe")
	// ErrFull: every histogram slot is taken.
	ErrFull = errors.New("ebpf: too many registered cgroups")
)

// MaxCgroups is how many cgroups the probe can time at once by default
// (WithMaxCgroups changes it).
const MaxCgroups = 1024

// MaxCgroupsLimit is the most slots WithMaxCgroups accepts. The histogram
// map is a per-CPU array the kernel allocates in full at load: each slot
// holds one 344-byte histogram (with its attribution) per possible CPU, so
// 8192 slots take 2.8 MB per CPU (361 MB on a host of 128 CPUs), locked
// kernel memory whether jobs run or not; the default 1024 takes 352 KB per
// CPU.
const MaxCgroupsLimit = 8192

// HistogramBytes is the kernel memory one slot's histograms take per
// possible CPU (the hists map's value size).
const HistogramBytes = int(unsafe.Sizeof(runqlatHist{}))

// Probe is the loaded and attached run-queue latency probe. It is safe for
// concurrent use.
type Probe struct {
	log   *slog.Logger
	objs  runqlatObjects
	links []link.Link

	mu    sync.Mutex
	slots map[uint64]uint32 // cgroup id → histogram slot
	// classOnly is the cgroups registered for their class alone (a
	// tier's cgroup): cgroup id → tier.
	classOnly map[uint64]uint32
	gen       uint64 // the classification generation last written
	free      []uint32
	ncpu      int
	max       int
	// refused counts the registrations refused because every slot was
	// taken.
	refused uint64
}

type options struct {
	log *slog.Logger
	v1  bool
	max int
}

// Option configures Load.
type Option func(*options)

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithCgroupV1 keys tasks by their cpu controller's v1 cgroup instead of
// their cgroup v2 (default hierarchy) cgroup: for hosts whose cpu
// controller is mounted on cgroup v1.
func WithCgroupV1(v1 bool) Option { return func(o *options) { o.v1 = v1 } }

// WithMaxCgroups sets how many cgroups the probe can time at once (1 to
// MaxCgroupsLimit; default MaxCgroups): the jobs and hists maps are sized
// to it before they are created. A registration beyond it is refused with
// ErrFull and counted (Slots).
func WithMaxCgroups(n int) Option { return func(o *options) { o.max = n } }

// Load checks the kernel, removes the memlock limit where the kernel still
// charges BPF memory to it, loads the programs and attaches them to the
// sched_wakeup, sched_wakeup_new and sched_switch BTF tracepoints.
func Load(opts ...Option) (*Probe, error) {
	o := options{max: MaxCgroups}
	for _, f := range opts {
		f(&o)
	}
	if o.max < 1 || o.max > MaxCgroupsLimit {
		return nil, fmt.Errorf("ebpf: max cgroups %d: between 1 and %d", o.max, MaxCgroupsLimit)
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	if _, err := btf.LoadKernelSpec(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoBTF, err)
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("ebpf: remove memlock rlimit: %w", err)
	}
	spec, err := loadRunqlat()
	if err != nil {
		return nil, fmt.Errorf("ebpf: %w", err)
	}
	if err := spec.Variables[runqlatVarCgroupV1].Set(o.v1); err != nil {
		return nil, fmt.Errorf("ebpf: set cgroup_v1: %w", err)
	}
	// The maps' sizes in the object are the C source's MAX_JOBS; the
	// configured bound replaces them before the maps are created (the
	// programs never index hists beyond a slot Register handed out, and a
	// lookup past the end returns NULL, which they check).
	for name, n := range map[string]int{"jobs": o.max + MaxClassCgroups, "hists": o.max} {
		m, ok := spec.Maps[name]
		if !ok {
			return nil, fmt.Errorf("ebpf: the object has no %s map", name)
		}
		m.MaxEntries = uint32(n)
	}
	p := &Probe{log: o.log, slots: map[uint64]uint32{}, classOnly: map[uint64]uint32{}, max: o.max}
	if err := spec.LoadAndAssign(&p.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("%w: verifier: %w", ErrUnsupported, err)
		}
		if errors.Is(err, ebpf.ErrNotSupported) {
			return nil, fmt.Errorf("%w: %w", ErrUnsupported, err)
		}
		return nil, fmt.Errorf("ebpf: load runqlat: %w", err)
	}
	for _, prog := range []*ebpf.Program{p.objs.SchedWakeup, p.objs.SchedWakeupNew, p.objs.SchedSwitch} {
		l, err := link.AttachTracing(link.TracingOptions{Program: prog})
		if err != nil {
			_ = p.Close()
			return nil, fmt.Errorf("%w: attach %s: %w", ErrUnsupported, prog, err)
		}
		p.links = append(p.links, l)
	}
	p.ncpu, err = ebpf.PossibleCPU()
	if err != nil {
		_ = p.Close()
		return nil, fmt.Errorf("ebpf: possible cpus: %w", err)
	}
	for i := o.max - 1; i >= 0; i-- {
		p.free = append(p.free, uint32(i))
	}
	mode := "v2"
	if o.v1 {
		mode = "v1 cpu controller"
	}
	o.log.Info("run-queue latency probe attached", "cgroups", mode, "slots", o.max,
		"histogram_bytes", o.max*HistogramBytes*p.ncpu)
	return p, nil
}

// Close detaches the programs and frees the maps. It may be called twice.
func (p *Probe) Close() error {
	var errs []error
	for _, l := range p.links {
		errs = append(errs, l.Close())
	}
	p.links = nil
	errs = append(errs, p.objs.Close())
	p.objs = runqlatObjects{}
	return errors.Join(errs...)
}

// CgroupID returns the id the probe keys a cgroup by: the inode number of
// its directory, which is the cgroup's kernfs id on 64-bit kernels (on v1,
// pass the directory in the cpu controller's hierarchy).
func CgroupID(dir string) (uint64, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return 0, fmt.Errorf("ebpf: cgroup id: %w", err)
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok || !st.IsDir() {
		return 0, fmt.Errorf("ebpf: cgroup id: %s is not a cgroup directory", dir)
	}
	return sys.Ino, nil
}

// Register starts timing the tasks of cgroup id, whose histogram starts at
// zero. tier is a caller's number for the cgroup's class (not 0): a
// preemption counts when a task of a different tier takes the CPU.
// Registering a registered cgroup updates its tier and keeps its histogram.
func (p *Probe) Register(id uint64, tier uint32) error {
	if tier == 0 {
		return fmt.Errorf("ebpf: register cgroup %d: tier must not be 0", id)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.registerLocked(id, tier)
}

func (p *Probe) registerLocked(id uint64, tier uint32) error {
	slot, ok := p.slots[id]
	if !ok {
		if len(p.free) == 0 {
			p.refused++
			return fmt.Errorf("%w: cgroup %d: all %d slots are taken", ErrFull, id, p.max)
		}
		slot = p.free[len(p.free)-1]
		zero := make([]runqlatHist, p.ncpu)
		if err := p.objs.Hists.Put(slot, zero); err != nil {
			return fmt.Errorf("ebpf: clear slot %d: %w", slot, err)
		}
	}
	if err := p.objs.Jobs.Put(id, runqlatJob{Slot: slot, Tier: tier}); err != nil {
		return fmt.Errorf("ebpf: register cgroup %d: %w", id, err)
	}
	if !ok {
		p.free = p.free[:len(p.free)-1]
		p.slots[id] = slot
	}
	delete(p.classOnly, id)
	return p.bumpLocked()
}

// MaxClassCgroups is how many cgroups RegisterClass takes.
const MaxClassCgroups = 16

// noSlot is the slot of a cgroup registered for its class alone.
const noSlot = ^uint32(0)

// RegisterClass names tier as the class of the tasks of cgroup id and of
// its descendants down to three levels, without timing them: the cgroup
// of a tier, so that a job the probe has no slot for is still known as
// the tier's when it holds a CPU. A cgroup registered with Register
// keeps its slot and takes the new tier.
func (p *Probe) RegisterClass(id uint64, tier uint32) error {
	if tier == 0 {
		return fmt.Errorf("ebpf: register cgroup %d: tier must not be 0", id)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, timed := p.slots[id]; timed {
		return p.registerLocked(id, tier)
	}
	if _, ok := p.classOnly[id]; !ok && len(p.classOnly) >= MaxClassCgroups {
		return fmt.Errorf("%w: cgroup %d: %d cgroups are registered for their class", ErrFull, id, MaxClassCgroups)
	}
	if err := p.objs.Jobs.Put(id, runqlatJob{Slot: noSlot, Tier: tier}); err != nil {
		return fmt.Errorf("ebpf: register cgroup %d: %w", id, err)
	}
	p.classOnly[id] = tier
	return p.bumpLocked()
}

// bumpLocked tells the programs that jobs changed: every classification
// they cached before is read again.
func (p *Probe) bumpLocked() error {
	p.gen++
	if err := p.objs.Generation.Put(uint32(0), p.gen); err != nil {
		return fmt.Errorf("ebpf: bump the classification generation: %w", err)
	}
	return nil
}

// SlotStats is the probe's use of its slots.
type SlotStats struct {
	// Used of Max slots hold a registered cgroup.
	Used, Max int
	// Refused counts the registrations refused with ErrFull since Load.
	Refused uint64
}

// Slots reports the probe's slots in use, their number and the
// registrations refused for want of one.
func (p *Probe) Slots() SlotStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return SlotStats{Used: len(p.slots), Max: p.max, Refused: p.refused}
}

// Unregister stops timing cgroup id, or forgets its class (RegisterClass);
// unknown ids are not an error.
func (p *Probe) Unregister(id uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	slot, ok := p.slots[id]
	if _, class := p.classOnly[id]; class {
		if err := p.objs.Jobs.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("ebpf: unregister cgroup %d: %w", id, err)
		}
		delete(p.classOnly, id)
		return p.bumpLocked()
	}
	if !ok {
		return nil
	}
	if err := p.objs.Jobs.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("ebpf: unregister cgroup %d: %w", id, err)
	}
	delete(p.slots, id)
	p.free = append(p.free, slot)
	return p.bumpLocked()
}

// LostWaits counts the waits the probe dropped since Load: two timed
// threads whose ids share a slot of the pending-wait array (65,536 slots)
// waited at once, and the first one's wait was overwritten.
func (p *Probe) LostWaits() (uint64, error) {
	var n uint64
	if err := p.objs.Lost.Lookup(uint32(0), &n); err != nil {
		return 0, fmt.Errorf("ebpf: read lost waits: %w", err)
	}
	return n, nil
}

// Offenders returns, by cgroup id, the waits of timed tasks charged to an
// outside cgroup since Load: each wait's outside share goes to the last
// outside cgroup that ran on the CPU the task waited on. At most 256
// cgroups are kept, the least recently charged dropped first.
func (p *Probe) Offenders() (map[uint64]uint64, error) {
	out := map[uint64]uint64{}
	var id, ns uint64
	it := p.objs.Offenders.Iterate()
	for it.Next(&id, &ns) {
		out[id] = ns
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("ebpf: read offenders: %w", err)
	}
	return out, nil
}

// Histogram returns the cumulative histogram of cgroup id since it was
// registered, summed over CPUs.
func (p *Probe) Histogram(id uint64) (Histogram, error) {
	p.mu.Lock()
	slot, ok := p.slots[id]
	p.mu.Unlock()
	if !ok {
		return Histogram{}, fmt.Errorf("ebpf: cgroup %d is not registered", id)
	}
	var per []runqlatHist
	if err := p.objs.Hists.Lookup(slot, &per); err != nil {
		return Histogram{}, fmt.Errorf("ebpf: read histogram of cgroup %d: %w", id, err)
	}
	var h Histogram
	for _, c := range per {
		for i, n := range c.Buckets {
			h.Buckets[i] += n
		}
		h.Count += c.Count
		h.SumNs += c.SumNs
		h.Preemptions += c.PreemptCount
		h.PreemptNs += c.PreemptNs
		for i, n := range c.BlameNs {
			h.BlameNs[i] += n
		}
	}
	return h, nil
}

// ProgramStats is the kernel's accounting of one program (counted only
// while kernel.bpf_stats_enabled is 1, or while EnableStats is held).
type ProgramStats struct {
	Name      string
	RunCount  uint64
	RunTimeNs uint64
}

// Stats returns the kernel's run count and run time of each program.
func (p *Probe) Stats() ([]ProgramStats, error) {
	var out []ProgramStats
	for _, np := range []struct {
		name string
		prog *ebpf.Program
	}{{runqlatProgSchedWakeup, p.objs.SchedWakeup}, {runqlatProgSchedWakeupNew, p.objs.SchedWakeupNew}, {runqlatProgSchedSwitch, p.objs.SchedSwitch}} {
		name, prog := np.name, np.prog
		st, err := prog.Stats()
		if err != nil {
			return nil, fmt.Errorf("ebpf: stats of %s: %w", name, err)
		}
		out = append(out, ProgramStats{Name: name, RunCount: st.RunCount, RunTimeNs: uint64(st.Runtime.Nanoseconds())})
	}
	return out, nil
}

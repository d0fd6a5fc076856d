package cgroups

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/fusiond/fusiond/cgroups/devicefilter"
)

// Mode is the cgroup layout of a host.
type Mode int

// Modes DetectMode reports.
const (
	ModeUnknown Mode = iota
	// ModeV1 is a legacy or hybrid host: the controllers fusiond needs are
	// on per-controller v1 hierarchies (root/cpu, root/memory, ...).
	ModeV1
	// ModeV2 is a unified host: one cgroup2 hierarchy at root.
	ModeV2
)

func (m Mode) String() string {
	switch m {
	case ModeV1:
		return "v1"
	case ModeV2:
		return "v2"
	}
	return "unknown"
}

// ErrNoCgroups: no usable cgroup hierarchy under the root.
var ErrNoCgroups = errors.New("cgroups: no usable cgroup hierarchy")

// DefaultRoot is where cgroup file systems are mounted.
const DefaultRoot = "/sys/fs/cgroup"

// DetectMode inspects the cgroup mount root: a root with cgroup.controllers
// is a unified (v2) hierarchy; one with a v1 memory and cpu hierarchy is v1
// (a hybrid host's cgroup2 mount at root/unified is ignored, since its
// controllers live in v1). It reads files only, so it works on fixtures.
func DetectMode(root string) (Mode, error) {
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		return ModeV2, nil
	}
	for _, c := range []string{"cpu", "cpuacct", "cpuset", "memory", "pids", "devices", "freezer"} {
		if _, err := os.Stat(filepath.Join(root, c, "cgroup.procs")); err != nil {
			return ModeUnknown, fmt.Errorf("%w: under %s: v1 controller %s: %w", ErrNoCgroups, root, c, err)
		}
	}
	return ModeV1, nil
}

// DeviceFilter installs a cgroup v2 device allow list on a cgroup directory.
type DeviceFilter interface {
	Attach(cgroupDir string, rules []devicefilter.Rule) error
}

// EBPFDeviceFilter is the production DeviceFilter (devicefilter.Attach).
type EBPFDeviceFilter struct{}

var _ DeviceFilter = EBPFDeviceFilter{}

// Attach implements DeviceFilter.
func (EBPFDeviceFilter) Attach(dir string, rules []devicefilter.Rule) error {
	return devicefilter.Attach(dir, rules)
}

type options struct {
	root    string
	parent  string
	log     *slog.Logger
	filter  DeviceFilter
	timeout time.Duration
}

// Option configures a Manager.
type Option func(*options)

// WithRoot sets the cgroup mount root (default /sys/fs/cgroup).
func WithRoot(root string) Option { return func(o *options) { o.root = root } }

// WithParent sets the cgroup under which fusiond's hierarchy lives, e.g.
// the delegated subtree of the systemd unit ("system.slice/fusiond.service");
// default is the root. The hierarchy is PARENT/fusiond/<tier>/<job>.
func WithParent(parent string) Option { return func(o *options) { o.parent = parent } }

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithDeviceFilter replaces the v2 eBPF device filter (tests on fixture
// trees, which cannot hold BPF programs).
func WithDeviceFilter(f DeviceFilter) Option { return func(o *options) { o.filter = f } }

// WithKillTimeout bounds how long Kill waits for the cgroup to empty.
func WithKillTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// backend is what differs between cgroup v1 and v2. rel paths are relative
// to the mount root ("fusiond/burstable/job1").
type backend interface {
	// ensure creates rel (and its parents) with no limits of its own.
	ensure(rel string) error
	// apply creates rel if needed and writes l; idempotent.
	apply(rel string, l Limits) error
	// setWeight sets the CPU weight of rel (v1: the equivalent cpu.shares).
	setWeight(rel string, weight uint64) error
	// setCpus rewrites the cpuset of rel.
	setCpus(rel, cpus string) error
	cpus(rel string) (string, error)
	setCPUMax(rel string, quota int64, period uint64) error
	exists(rel string) bool
	addProc(rel string, pid int) error
	procs(rel string) ([]int, error)
	stats(rel string) (Stats, error)
	kill(rel string) error
	remove(rel string) error
	// children lists the job directories under rel.
	children(rel string) ([]string, error)
}

// Manager creates, finds and removes job cgroups. It keeps no state beyond
// its options, so it and its Cgroups may be used from several goroutines
// for different jobs; calls for one job must be serialised by the caller.
type Manager struct {
	mode Mode
	base string // PARENT/fusiond, relative to the root
	be   backend
	log  *slog.Logger
	opts options
}

// NewManager detects the mode and returns a Manager.
func NewManager(opts ...Option) (*Manager, error) {
	o := options{root: DefaultRoot, timeout: 10 * time.Second, filter: EBPFDeviceFilter{}}
	for _, f := range opts {
		f(&o)
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	if !validRel(o.parent, true) {
		return nil, fmt.Errorf("%w: parent %q", ErrInvalidPlacement, o.parent)
	}
	mode, err := DetectMode(o.root)
	if err != nil {
		return nil, err
	}
	m := &Manager{mode: mode, base: path.Join(o.parent, "fusiond"), log: o.log, opts: o}
	switch mode {
	case ModeV1:
		m.be = newV1(o.root, o.timeout)
	case ModeV2:
		m.be = newV2(o.root, o.filter, o.timeout)
	default:
		return nil, fmt.Errorf("%w: mode %v", ErrNoCgroups, mode)
	}
	return m, nil
}

// Mode reports the back end in use.
func (m *Manager) Mode() Mode { return m.mode }

var jobIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

func validRel(p string, emptyOK bool) bool {
	if p == "" {
		return emptyOK
	}
	if path.IsAbs(p) || path.Clean(p) != p || strings.HasPrefix(p, "..") {
		return false
	}
	return true
}

func (m *Manager) tierRel(t Tier) string { return path.Join(m.base, string(t)) }

// TierWeight is the CPU weight of a tier's own cgroup. CPU weights only
// compete among siblings, so the tiers need weights of their own: with equal
// tier weights all best-effort jobs together would get as much CPU as all
// burstable jobs together. Guaranteed work runs on exclusive cores and
// competes with nobody.
func TierWeight(t Tier) uint64 {
	if t == BestEffort {
		return MinWeight
	}
	return MaxWeight
}

// EnsureHierarchy creates PARENT/fusiond and the three tier cgroups.
func (m *Manager) EnsureHierarchy() error {
	for _, t := range Tiers {
		if err := m.ensureTier(t); err != nil {
			return err
		}
	}
	return nil
}

func (m *Manager) ensureTier(t Tier) error {
	if err := m.be.ensure(m.tierRel(t)); err != nil {
		return fmt.Errorf("create tier %s: %w", t, err)
	}
	if err := m.be.setWeight(m.tierRel(t), TierWeight(t)); err != nil {
		return fmt.Errorf("tier %s weight: %w", t, err)
	}
	return nil
}

// SetSharedCPUs sets the shared pool: the cpuset of the burstable and
// best-effort tiers and of every job in them. It orders the writes so that
// a v1 parent always contains its children's CPUs.
func (m *Manager) SetSharedCPUs(cpus []int) error {
	if len(cpus) == 0 {
		return fmt.Errorf("%w: empty shared pool", ErrInvalidPlacement)
	}
	list := FormatCPUList(cpus)
	if err := m.EnsureHierarchy(); err != nil {
		return err
	}
	for _, t := range []Tier{Burstable, BestEffort} {
		tier := m.tierRel(t)
		cur, err := m.be.cpus(tier)
		if err != nil {
			return err
		}
		old, err := ParseCPUList(cur)
		if err != nil {
			return err
		}
		union := FormatCPUList(append(old, cpus...))
		if err := m.be.setCpus(tier, union); err != nil {
			return fmt.Errorf("widen tier %s cpuset: %w", t, err)
		}
		jobs, err := m.be.children(tier)
		if err != nil {
			return err
		}
		for _, j := range jobs {
			if err := m.be.setCpus(path.Join(tier, j), list); err != nil {
				return fmt.Errorf("job %s cpuset: %w", j, err)
			}
		}
		if err := m.be.setCpus(tier, list); err != nil {
			return fmt.Errorf("tier %s cpuset: %w", t, err)
		}
	}
	m.log.Info("shared cpu pool set", "cpus", list)
	return nil
}

// TierCPUs returns the cpuset a tier's cgroup is confined to now (for
// burstable and best effort, the shared pool as last set).
func (m *Manager) TierCPUs(t Tier) ([]int, error) {
	if !t.Valid() {
		return nil, fmt.Errorf("%w: tier %q", ErrInvalidPlacement, t)
	}
	s, err := m.be.cpus(m.tierRel(t))
	if err != nil {
		return nil, err
	}
	return ParseCPUList(s)
}

// Create makes (or updates, when it exists) the cgroup of jobID in tier and
// applies l. It is idempotent.
func (m *Manager) Create(jobID string, tier Tier, l Limits) (*Cgroup, error) {
	if !jobIDRe.MatchString(jobID) {
		return nil, fmt.Errorf("%w: job id %q", ErrInvalidPlacement, jobID)
	}
	if !tier.Valid() {
		return nil, fmt.Errorf("%w: tier %q", ErrInvalidPlacement, tier)
	}
	if err := m.ensureTier(tier); err != nil {
		return nil, err
	}
	cg := &Cgroup{m: m, job: jobID, tier: tier, rel: path.Join(m.tierRel(tier), jobID)}
	if err := cg.Apply(l); err != nil {
		return nil, err
	}
	m.log.Info("job cgroup applied", "job", jobID, "tier", tier, "path", cg.rel, "cpus", l.Cpus,
		"weight", l.CPUWeight, "quota", l.CPUQuota, "memMax", l.MemoryMax, "pids", l.PidsMax)
	return cg, nil
}

// Load finds the existing cgroup of jobID (after a daemon restart).
func (m *Manager) Load(jobID string) (*Cgroup, error) {
	if !jobIDRe.MatchString(jobID) {
		return nil, fmt.Errorf("%w: job id %q", ErrInvalidPlacement, jobID)
	}
	for _, t := range Tiers {
		rel := path.Join(m.tierRel(t), jobID)
		if m.be.exists(rel) {
			return &Cgroup{m: m, job: jobID, tier: t, rel: rel}, nil
		}
	}
	return nil, fmt.Errorf("%w: job %s", ErrNotFound, jobID)
}

// Jobs lists the job cgroups that exist, by tier.
func (m *Manager) Jobs() (map[Tier][]string, error) {
	out := map[Tier][]string{}
	for _, t := range Tiers {
		if !m.be.exists(m.tierRel(t)) {
			continue
		}
		jobs, err := m.be.children(m.tierRel(t))
		if err != nil {
			return nil, err
		}
		out[t] = jobs
	}
	return out, nil
}

// Cgroup is one job's control group.
type Cgroup struct {
	m    *Manager
	job  string
	tier Tier
	rel  string
}

// JobID returns the job's id.
func (c *Cgroup) JobID() string { return c.job }

// Tier returns the job's tier.
func (c *Cgroup) Tier() Tier { return c.tier }

// Path returns the cgroup path relative to the mount root.
func (c *Cgroup) Path() string { return c.rel }

// Apply (re)writes l; idempotent.
func (c *Cgroup) Apply(l Limits) error {
	if err := c.m.be.apply(c.rel, l); err != nil {
		return fmt.Errorf("apply limits to %s: %w", c.rel, err)
	}
	return nil
}

// AddProc moves pid (and, on v1, all its hierarchies) into the cgroup.
func (c *Cgroup) AddProc(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("%w: pid %d", ErrInvalidPlacement, pid)
	}
	if err := c.m.be.addProc(c.rel, pid); err != nil {
		return fmt.Errorf("add pid %d to %s: %w", pid, c.rel, err)
	}
	return nil
}

// SetCPUQuota changes the CPU limit at run time, in millicores; zero
// removes the limit. The QoS loop moves best-effort jobs with it.
func (c *Cgroup) SetCPUQuota(milli int64) error {
	if milli < 0 {
		return fmt.Errorf("%w: cpu quota %dm", ErrInvalidPlacement, milli)
	}
	if err := c.m.be.setCPUMax(c.rel, QuotaFor(milli, DefaultCPUPeriod), DefaultCPUPeriod); err != nil {
		return fmt.Errorf("set cpu quota of %s: %w", c.rel, err)
	}
	return nil
}

// Cpus returns the cpuset the cgroup is confined to.
func (c *Cgroup) Cpus() ([]int, error) {
	s, err := c.m.be.cpus(c.rel)
	if err != nil {
		return nil, err
	}
	return ParseCPUList(s)
}

// Procs lists the processes in the cgroup.
func (c *Cgroup) Procs() ([]int, error) { return c.m.be.procs(c.rel) }

// Stats reads the job's accounting.
func (c *Cgroup) Stats() (Stats, error) {
	s, err := c.m.be.stats(c.rel)
	if err != nil {
		return Stats{}, fmt.Errorf("stats of %s: %w", c.rel, err)
	}
	return s, nil
}

// Kill SIGKILLs every process in the cgroup (cgroup.kill on v2, freeze,
// kill, thaw on v1) and waits until it is empty.
func (c *Cgroup) Kill() error {
	if err := c.m.be.kill(c.rel); err != nil {
		return fmt.Errorf("kill %s: %w", c.rel, err)
	}
	return c.waitEmpty()
}

func (c *Cgroup) waitEmpty() error {
	deadline := time.Now().Add(c.m.opts.timeout)
	for {
		pids, err := c.m.be.procs(c.rel)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %s: %v", ErrNotEmpty, c.rel, pids)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Delete removes the cgroup; it fails with ErrNotEmpty while processes
// remain. Deleting a cgroup that is gone is not an error.
func (c *Cgroup) Delete() error {
	if !c.m.be.exists(c.rel) {
		return nil
	}
	pids, err := c.m.be.procs(c.rel)
	if err != nil {
		return err
	}
	if len(pids) > 0 {
		return fmt.Errorf("%w: %s: %v", ErrNotEmpty, c.rel, pids)
	}
	if err := c.m.be.remove(c.rel); err != nil {
		return fmt.Errorf("delete %s: %w", c.rel, err)
	}
	c.m.log.Info("job cgroup deleted", "job", c.job, "path", c.rel)
	return nil
}

// readPids parses a cgroup.procs file.
func readPids(file string) ([]int, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, file)
		}
		return nil, err
	}
	var pids []int
	for f := range strings.FieldsSeq(string(b)) {
		p, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", file, err)
		}
		pids = append(pids, p)
	}
	return pids, nil
}

// subdirs lists the directories directly under dir.
func subdirs(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// readKV parses "key value" lines (cpu.stat, memory.events, memory.stat).
func readKV(file string) (map[string]uint64, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			continue
		}
		out[k] = n
	}
	return out, nil
}

// readUint reads a file holding one number ("max" reads as 0).
func readUint(file string) (uint64, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", file, err)
	}
	return n, nil
}

// RemoveHierarchy removes the (empty) tier cgroups and PARENT/fusiond, for
// uninstall and tests. Job cgroups must have been deleted first.
func (m *Manager) RemoveHierarchy() error {
	var errs []error
	for _, t := range Tiers {
		if m.be.exists(m.tierRel(t)) {
			if err := m.be.remove(m.tierRel(t)); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if m.be.exists(m.base) {
		if err := m.be.remove(m.base); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

package fpga

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/fusiond/fusiond/devices"
	"github.com/fusiond/fusiond/devices/fpga/bitstream"
)

// Option configures a Manager.
type Option func(*config)

type config struct {
	sys, dev, firmware string
	log                *slog.Logger
	pr                 PortPR
	run                CommandRunner
	attrs              AttrWriter
	xbutil             string
	lib                *bitstream.Library
	timeout            time.Duration
	alpha              float64
	now                func() time.Time
}

// WithSysRoot sets the sysfs root (default /sys).
func WithSysRoot(dir string) Option { return func(c *config) { c.sys = dir } }

// WithDevRoot sets the /dev root (default /dev).
func WithDevRoot(dir string) Option { return func(c *config) { c.dev = dir } }

// WithFirmwareDir sets the kernel firmware directory (default /lib/firmware).
func WithFirmwareDir(dir string) Option { return func(c *config) { c.firmware = dir } }

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

// WithPortPR replaces the DFL PR ioctl (default IoctlPR).
func WithPortPR(pr PortPR) Option { return func(c *config) { c.pr = pr } }

// WithCommandRunner replaces the runner of XRT's tools (default ExecRunner).
func WithCommandRunner(r CommandRunner) Option { return func(c *config) { c.run = r } }

// WithAttrWriter replaces the sysfs writer (default SysfsWriter).
func WithAttrWriter(w AttrWriter) Option { return func(c *config) { c.attrs = w } }

// WithLibrary sets the bitstream library Program resolves references in.
func WithLibrary(l *bitstream.Library) Option { return func(c *config) { c.lib = l } }

// WithProgramTimeout bounds one programming run (default 10 minutes).
func WithProgramTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithEstimateWeight sets the EWMA weight of a new programming-time
// sample, in (0,1] (default 0.3).
func WithEstimateWeight(a float64) Option { return func(c *config) { c.alpha = a } }

// WithClock replaces time.Now (tests).
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// Manager owns the FPGA regions of a host.
type Manager struct {
	cfg      config
	backends []Backend

	mu      sync.Mutex
	regions map[string]*regionState
	est     map[estKey]time.Duration

	// hub tells subscribers about programming runs and regions found or
	// gone; it is only published to with mu unlocked.
	hub devices.Hub
}

// Subscribe calls fn with a devices.DeviceChanged update whenever a region
// is programmed (or its programming fails) and whenever rediscovery finds
// a region appear or disappear, until cancel is called.
func (m *Manager) Subscribe(fn func(devices.Update)) (cancel func()) { return m.hub.Subscribe(fn) }

type estKey struct{ region, bitstream string }

type regionState struct {
	region  Region
	backend Backend
	busy    bool
	// failed is set by a failed programming run, cleared by a good one.
	failed *devices.Health
	// programmed is the library ID fusiond loaded last, with the AFU ID
	// the driver reported right after.
	programmed    string
	programmedAFU bitstream.UUID
}

// NewManager builds a Manager; it does not touch the host until Refresh.
func NewManager(opts ...Option) (*Manager, error) {
	c := config{sys: "/sys", dev: "/dev", firmware: "/lib/firmware", xbutil: "xbutil",
		pr: IoctlPR{}, run: ExecRunner{}, attrs: SysfsWriter{},
		timeout: 10 * time.Minute, alpha: 0.3, now: time.Now}
	for _, o := range opts {
		o(&c)
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.alpha <= 0 || c.alpha > 1 {
		return nil, fmt.Errorf("fpga: estimate weight %v outside (0,1]", c.alpha)
	}
	m := &Manager{cfg: c, regions: map[string]*regionState{}, est: map[estKey]time.Duration{}}
	m.backends = []Backend{
		NewFPGAManager(c.sys, c.firmware, c.attrs, c.log.With("backend", KindFPGAManager)),
		NewDFL(c.sys, c.dev, c.pr, c.log.With("backend", KindDFL)),
		NewXRT(c.sys, c.dev, c.run, c.xbutil, c.log.With("backend", KindXRT)),
	}
	return m, nil
}

// Refresh rediscovers regions. Busy and failure marks and estimates of
// regions still present are kept. One back end's error does not hide the
// others' regions.
func (m *Manager) Refresh(ctx context.Context) error {
	type found struct {
		r Region
		b Backend
	}
	var all []found
	var errs []error
	for _, b := range m.backends {
		rs, err := b.Discover(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", b.Kind(), err))
		}
		for _, r := range rs {
			all = append(all, found{r, b})
		}
	}
	var changed []string
	defer func() {
		for _, d := range changed {
			m.hub.Publish(devices.Update{Kind: devices.DeviceChanged, Device: d, Detail: "region found or gone"})
		}
	}()
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[string]bool{}
	for _, f := range all {
		seen[f.r.ID] = true
		st, ok := m.regions[f.r.ID]
		if !ok {
			st = &regionState{}
			m.regions[f.r.ID] = st
			changed = append(changed, f.r.ID)
			m.cfg.log.Info("fpga region found", "region", f.r.ID, "kind", f.r.Kind, "interface", f.r.InterfaceID, "loaded", f.r.Loaded.AFUID)
		}
		if st.busy {
			continue // the programming run owns the region's state
		}
		st.region, st.backend = f.r, f.b
	}
	for id, st := range m.regions {
		if !seen[id] && !st.busy {
			delete(m.regions, id)
			changed = append(changed, id)
			m.cfg.log.Warn("fpga region gone", "region", id)
		}
	}
	return errors.Join(errs...)
}

// RegionStatus is a region as the daemon and the scheduler see it.
type RegionStatus struct {
	Region
	Health devices.Health `json:"health"`
	// Busy: being reprogrammed; nothing else may use it.
	Busy bool `json:"busy"`
	// LoadedBitstream is the library ID of what the region holds, ""
	// when unknown or not in the library.
	LoadedBitstream string `json:"loaded_bitstream,omitempty"`
	LoadedName      string `json:"loaded_name,omitempty"`
}

// Regions refreshes and returns every region, sorted by ID.
func (m *Manager) Regions(ctx context.Context) ([]RegionStatus, error) {
	err := m.Refresh(ctx)
	lib := m.libraryList()
	m.mu.Lock()
	ids := slices.Sorted(maps.Keys(m.regions))
	states := make([]regionState, len(ids))
	for i, id := range ids {
		states[i] = *m.regions[id]
	}
	m.mu.Unlock()
	out := make([]RegionStatus, len(ids))
	for i := range states {
		out[i] = m.status(ctx, &states[i], lib)
	}
	return out, err
}

// Region returns one region's status (without rediscovery).
func (m *Manager) Region(ctx context.Context, id string) (RegionStatus, error) {
	st, err := m.snapshot(id)
	if err != nil {
		return RegionStatus{}, err
	}
	return m.status(ctx, &st, m.libraryList()), nil
}

func (m *Manager) snapshot(id string) (regionState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	st, ok := m.regions[id]
	if !ok {
		return regionState{}, fmt.Errorf("%w: %q", ErrNoRegion, id)
	}
	return *st, nil
}

func (m *Manager) libraryList() []bitstream.Bitstream {
	if m.cfg.lib == nil {
		return nil
	}
	l, err := m.cfg.lib.List()
	if err != nil {
		m.cfg.log.Warn("bitstream library unreadable", "err", err)
	}
	return l
}

func (m *Manager) status(ctx context.Context, st *regionState, lib []bitstream.Bitstream) RegionStatus {
	s := RegionStatus{Region: st.region, Busy: st.busy}
	s.Health = m.health(ctx, st)
	s.LoadedBitstream = loadedID(st, lib)
	for _, b := range lib {
		if b.ID == s.LoadedBitstream {
			s.LoadedName = b.Name
		}
	}
	return s
}

// health: a failed programming run wins over the driver's own view.
func (m *Manager) health(ctx context.Context, st *regionState) devices.Health {
	if st.failed != nil {
		return *st.failed
	}
	if st.busy {
		return devices.Health{Healthy: true, Reason: "being reprogrammed"}
	}
	h := st.backend.Health(ctx, st.region)
	if h.Since.IsZero() {
		h.Since = m.cfg.now()
	}
	return h
}

// loadedID names the library bitstream the region holds: what the driver
// names, else what fusiond loaded last if the driver's AFU ID still
// matches, else the only library bitstream with the driver's AFU ID.
func loadedID(st *regionState, lib []bitstream.Bitstream) string {
	l := st.region.Loaded
	if l.BitstreamID != "" {
		return l.BitstreamID
	}
	if l.AFUID.IsZero() {
		return ""
	}
	if st.programmed != "" && st.programmedAFU == l.AFUID {
		return st.programmed
	}
	var hit string
	for _, b := range lib {
		if b.Header.AFUID == l.AFUID && slices.Contains(st.region.Accepts, b.Header.Format) {
			if hit != "" {
				return "" // ambiguous
			}
			hit = b.ID
		}
	}
	return hit
}

// Health returns one region's health.
func (m *Manager) Health(ctx context.Context, id string) (devices.Health, error) {
	st, err := m.snapshot(id)
	if err != nil {
		return devices.Health{}, err
	}
	return m.health(ctx, &st), nil
}

// Grant returns the device nodes and environment a job using the region
// needs. A busy or unhealthy region is refused.
func (m *Manager) Grant(ctx context.Context, id string) (devices.Grant, error) {
	st, err := m.snapshot(id)
	if err != nil {
		return devices.Grant{}, err
	}
	if st.busy {
		return devices.Grant{}, fmt.Errorf("%w: %s", ErrBusy, id)
	}
	if h := m.health(ctx, &st); !h.Healthy {
		return devices.Grant{}, fmt.Errorf("%w: %s: %s", ErrUnhealthy, id, h.Reason)
	}
	g := devices.Grant{Nodes: slices.Clone(st.region.Nodes), Env: maps.Clone(st.region.Env)}
	if g.Env == nil {
		g.Env = map[string]string{}
	}
	g.Env["FUSIOND_FPGA_REGION"] = id
	if lid := loadedID(&st, m.libraryList()); lid != "" {
		g.Env["FUSIOND_FPGA_BITSTREAM"] = lid
	}
	if !st.region.Loaded.AFUID.IsZero() {
		g.Env["FUSIOND_FPGA_AFU_ID"] = st.region.Loaded.AFUID.String()
	}
	return g, nil
}

// Check resolves ref and plans programming it into region id, touching
// nothing.
func (m *Manager) Check(id, ref string) (Plan, bitstream.Bitstream, error) {
	if m.cfg.lib == nil {
		return Plan{}, bitstream.Bitstream{}, ErrNoLibrary
	}
	b, err := m.cfg.lib.Get(ref)
	if err != nil {
		return Plan{}, b, err
	}
	st, err := m.snapshot(id)
	if err != nil {
		return Plan{}, b, err
	}
	p, err := PlanProgram(st.region, loadedID(&st, m.libraryList()), b)
	return p, b, err
}

// ProgramOption tunes one Program call.
type ProgramOption func(*programOpts)

type programOpts struct {
	progress func(Progress)
	force    bool
}

// WithProgress receives progress reports.
func WithProgress(fn func(Progress)) ProgramOption {
	return func(o *programOpts) { o.progress = fn }
}

// Force reprograms even if the region already holds the bitstream.
func Force() ProgramOption { return func(o *programOpts) { o.force = true } }

// Result is the outcome of a Program call.
type Result struct {
	Plan
	Duration time.Duration `json:"duration"`
	Loaded   Loaded        `json:"loaded"`
}

// Program loads bitstream ref (name, ID, ID prefix or AFU ID) into region
// id. It refuses an incompatible bitstream before touching anything, and
// returns at once when the region already holds it (unless Force). The
// region is busy for the duration. A failure marks the region unhealthy
// with the driver's error; a later success makes it healthy again and
// feeds the programming-time estimate.
func (m *Manager) Program(ctx context.Context, id, ref string, opts ...ProgramOption) (Result, error) {
	var o programOpts
	for _, f := range opts {
		f(&o)
	}
	plan, b, err := m.Check(id, ref)
	if err != nil {
		return Result{Plan: plan}, err
	}
	if plan.AlreadyLoaded && !o.force {
		st, _ := m.snapshot(id)
		if st.busy {
			return Result{Plan: plan}, fmt.Errorf("%w: %s", ErrBusy, id)
		}
		if st.failed == nil {
			return Result{Plan: plan, Loaded: st.region.Loaded}, nil
		}
	}
	plan.AlreadyLoaded = false

	m.mu.Lock()
	st, ok := m.regions[id]
	if !ok {
		m.mu.Unlock()
		return Result{Plan: plan}, fmt.Errorf("%w: %q", ErrNoRegion, id)
	}
	if st.busy {
		m.mu.Unlock()
		return Result{Plan: plan}, fmt.Errorf("%w: %s", ErrBusy, id)
	}
	st.busy = true
	region, backend := st.region, st.backend
	m.mu.Unlock()

	log := m.cfg.log.With("region", id, "bitstream", b.ID[:12], "name", b.Name)
	log.Info("programming fpga region", "size", b.Size)
	pctx, cancel := context.WithTimeout(ctx, m.cfg.timeout)
	start := m.cfg.now()
	err = backend.Program(pctx, region, b, o.progress)
	var loaded Loaded
	if err == nil {
		report(o.progress, Progress{Phase: "verify"})
		loaded, err = m.verify(pctx, backend, region, b)
	}
	cancel()
	took := m.cfg.now().Sub(start)
	// The region changed (new bitstream, or unhealthy after a failure):
	// say so once the lock is released.
	defer m.hub.Publish(devices.Update{Kind: devices.DeviceChanged, Device: id, Detail: "programmed " + b.ID})

	m.mu.Lock()
	defer m.mu.Unlock()
	st.busy = false
	if err != nil {
		st.failed = &devices.Health{Healthy: false, Reason: err.Error(), Since: m.cfg.now()}
		st.programmed = ""
		log.Error("fpga programming failed", "err", err, "after", took)
		if sr, ok := errors.AsType[*StillRunningError](err); ok {
			st.busy = true // until the driver call returns
			go func() {
				<-sr.Done
				m.mu.Lock()
				st.busy = false
				m.mu.Unlock()
				log.Warn("abandoned fpga driver call returned; region no longer busy")
			}()
		}
		return Result{Plan: plan, Duration: took}, err
	}
	st.failed = nil
	st.programmed, st.programmedAFU = b.ID, loaded.AFUID
	st.region.Loaded = loaded
	k := estKey{id, b.ID}
	if prev, ok := m.est[k]; ok {
		m.est[k] = time.Duration(m.cfg.alpha*float64(took) + (1-m.cfg.alpha)*float64(prev))
	} else {
		m.est[k] = took
	}
	log.Info("fpga region programmed", "took", took, "estimate", m.est[k])
	return Result{Plan: plan, Duration: took, Loaded: loaded}, nil
}

// verify reads back what the driver says is loaded and checks it is b.
func (m *Manager) verify(ctx context.Context, be Backend, r Region, b bitstream.Bitstream) (Loaded, error) {
	l, err := be.Identify(ctx, r)
	if err != nil {
		return l, fmt.Errorf("%w: reading back the loaded image: %w", ErrProgram, err)
	}
	if !l.AFUID.IsZero() && !b.Header.AFUID.IsZero() && l.AFUID != b.Header.AFUID {
		return l, fmt.Errorf("%w: driver reports AFU %s after loading %q (AFU %s)", ErrProgram, l.AFUID, b.Name, b.Header.AFUID)
	}
	if l.BitstreamID != "" && l.BitstreamID != b.ID {
		return l, fmt.Errorf("%w: driver reports image %s after loading %s", ErrProgram, l.BitstreamID, b.ID)
	}
	if l.BitstreamID == "" && l.AFUID.IsZero() {
		l.BitstreamID = b.ID // the driver keeps no identity; trust the run
	}
	return l, nil
}

// priorRate is the programming rate (bytes/s) assumed for a back end
// before a region has been measured; measurements replace it.
func priorRate(k Kind) float64 {
	switch k {
	case KindXRT:
		return 50e6 // xbutil program including clock setup
	case KindFPGAManager:
		return 30e6 // PCAP / SelectMAP on SoCs
	default:
		return 200e6 // DFL PR over PCIe
	}
}

// Estimate returns the expected time to program bitstream ID bitstreamID
// into region id: the EWMA of measured runs when there is one (measured
// true), otherwise a prior from the bitstream's size.
func (m *Manager) Estimate(id, bitstreamID string) (d time.Duration, measured bool) {
	m.mu.Lock()
	e, ok := m.est[estKey{id, bitstreamID}]
	st := m.regions[id]
	m.mu.Unlock()
	if ok {
		return e, true
	}
	var size int64
	if m.cfg.lib != nil {
		if b, err := m.cfg.lib.Get(bitstreamID); err == nil {
			size = b.Size
		}
	}
	rate := priorRate(KindDFL)
	if st != nil {
		rate = priorRate(st.region.Kind)
	}
	return time.Second + time.Duration(float64(size)/rate*float64(time.Second)), false
}

// SeedEstimates loads measured estimates saved from an earlier run (the
// output of Estimates), so a restart does not forget them. Existing
// estimates are kept.
func (m *Manager) SeedEstimates(saved map[string]map[string]time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for region, bs := range saved {
		for b, d := range bs {
			k := estKey{region, b}
			if _, ok := m.est[k]; !ok && d > 0 {
				m.est[k] = d
			}
		}
	}
}

// Estimates returns every measured estimate: region ID → bitstream ID →
// duration, for the scheduler.
func (m *Manager) Estimates() map[string]map[string]time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]map[string]time.Duration{}
	for k, v := range m.est {
		if out[k.region] == nil {
			out[k.region] = map[string]time.Duration{}
		}
		out[k.region][k.bitstream] = v
	}
	return out
}

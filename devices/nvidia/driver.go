package nvidia

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/fusiond/fusiond/devices"
)

// migCreateMs is the expected time to create a MIG instance on idle slots,
// the cost the placement engine weighs against reusing one.
const migCreateMs = 1500

// Driver is the Manager as a devices.Driver: the GPUs it offers (with
// their MIG layouts), its health, telemetry and MIG changes as updates,
// and per-job preparation: GPU share admission, on-demand MIG instance
// creation and the grant.
type Driver struct {
	m       *Manager
	log     *slog.Logger
	opts    DriverOptions
	sampler *Sampler
	// migMu serialises on-demand MIG creation: two jobs prepared at once
	// must not plan the same free slots.
	migMu sync.Mutex

	mu     sync.Mutex
	shares map[string]string // job ID → GPU UUID of its admitted share
}

var (
	_ devices.Driver = (*Driver)(nil)
	_ devices.Runner = (*Driver)(nil)
)

// DriverOptions tune the driver's background work (Run).
type DriverOptions struct {
	// SampleInterval is the telemetry period (default 100 ms, 10 Hz).
	SampleInterval time.Duration
	// HealthProbe is how often unhealthy GPUs are probed (default 10 s).
	HealthProbe time.Duration
}

// NewDriver returns the driver over m; log may be nil.
func NewDriver(m *Manager, log *slog.Logger, o DriverOptions) *Driver {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if o.HealthProbe <= 0 {
		o.HealthProbe = 10 * time.Second
	}
	return &Driver{m: m, log: log, opts: o, sampler: m.NewSampler(o.SampleInterval), shares: map[string]string{}}
}

// Run samples telemetry and watches GPU health (publishing both as
// updates) until ctx ends. A host without GPUs has nothing to run.
func (d *Driver) Run(ctx context.Context) error {
	if len(d.m.GPUs()) == 0 {
		return nil
	}
	var wg sync.WaitGroup
	run := func(name string, f func(context.Context) error) {
		wg.Go(func() {
			if err := f(ctx); err != nil && ctx.Err() == nil {
				d.log.Error(name+" stopped", "err", err)
			}
		})
	}
	run("GPU telemetry", func(ctx context.Context) error { return d.sampler.Run(ctx, nil) })
	run("GPU health watch", func(ctx context.Context) error { return d.m.WatchHealth(ctx, d.opts.HealthProbe, nil) })
	wg.Wait()
	return nil
}

// Telemetry is the latest telemetry sweep (empty before Run's first).
func (d *Driver) Telemetry() []Sample { return d.sampler.Latest() }

// Manager is the NVIDIA manager behind the driver, for the API's GPU
// routes (MIG layout plans, sharing status, telemetry).
func (d *Driver) Manager() *Manager { return d.m }

// Kind reports devices.GPU.
func (d *Driver) Kind() devices.Kind { return devices.GPU }

// Subscribe delivers the manager's updates.
func (d *Driver) Subscribe(fn func(devices.Update)) (cancel func()) { return d.m.Subscribe(fn) }

// Inventory lists the GPUs with their health and MIG layout, and their
// NVLinks. When the MIG state cannot be read the MIG-mode GPUs are
// reported unhealthy (the engine could otherwise plan instances on
// occupied slots) and the error is returned with the inventory.
func (d *Driver) Inventory(ctx context.Context) (devices.Inventory, error) {
	var inv devices.Inventory
	state, stateErr := d.m.State(ctx, nil)
	if stateErr != nil {
		stateErr = fmt.Errorf("reading MIG state: %w", stateErr)
	}
	mode := map[string]ShareMode{}
	for _, gs := range d.m.Status().GPUs {
		mode[gs.UUID] = gs.ShareMode
	}
	for _, g := range d.m.GPUs() {
		h := d.m.Health(g.UUID)
		h.Healthy = d.m.Healthy(g.UUID)
		if stateErr != nil && g.MIGEnabled {
			h.Healthy, h.Reason = false, "MIG state unreadable"
		}
		dev := devices.Device{
			ID: g.UUID, Kind: devices.GPU, Model: g.Model, PCI: g.BDF, NUMA: g.NUMANode,
			MemoryMB: int64(g.MemoryMB), Health: h, MPS: mode[g.UUID] == ModeMPS && !g.MIGEnabled,
		}
		if g.MIGEnabled {
			// MIG GPUs are modelled in memory slots, the unit NVIDIA
			// places instances in (a 3g instance takes 4 of 8).
			m := &devices.MIG{Slots: MemorySlots, Profiles: map[string]int{}, Starts: map[string][]int{}}
			for _, p := range g.Profiles {
				m.Profiles[p.Name] = p.MemSlots
				m.Starts[p.Name] = p.Starts()
			}
			for _, gs := range state.GPUs {
				if gs.UUID != g.UUID {
					continue
				}
				for _, in := range gs.Instances {
					mi := devices.MIGInstance{ID: in.UUID, Profile: in.Profile, Start: in.Start, Slots: in.Size}
					if ih := d.m.Health(in.UUID); in.UUID != "" && !ih.Healthy {
						mi.Health = &ih
					}
					m.Instances = append(m.Instances, mi)
				}
			}
			dev.MIG, dev.ReconfigMs = m, migCreateMs
		}
		inv.Devices = append(inv.Devices, dev)
	}
	links, err := d.m.DeviceLinks(ctx)
	if err != nil {
		d.log.Debug("nvidia: no NVLink information", "err", err)
	}
	inv.Links = links
	return inv, stateErr
}

// Prepare admits the job's GPU share, creates its MIG instance when it is
// still to be created (recording its UUID and start slot in a.MIG) and
// returns the grant for its GPUs, share and instance.
func (d *Driver) Prepare(ctx context.Context, jobID string, a *devices.Allocation) (devices.Grant, error) {
	alloc := Alloc{GPUs: a.Devices}
	if s := a.Share; s != nil {
		share := shareOf(jobID, *s)
		if err := d.m.AdmitShare(ctx, share); err != nil {
			return devices.Grant{}, fmt.Errorf("GPU share: %w", err)
		}
		d.noteShare(jobID, s.Device)
		alloc.Share = &share
	}
	if m := a.MIG; m != nil {
		if m.Instance == "" {
			inst, start, err := d.createMIG(ctx, m, a.Held)
			if err != nil {
				d.release(ctx, jobID)
				return devices.Grant{}, err
			}
			m.Instance, m.Start = inst, start
		}
		alloc.MIG = []string{m.Instance}
	}
	g, err := d.m.Grant(alloc)
	if err != nil {
		d.release(ctx, jobID)
		return devices.Grant{}, fmt.Errorf("GPU grant: %w", err)
	}
	return g, nil
}

// shareOf is the manager's share for job jobID's device share.
func shareOf(jobID string, s devices.Share) Share {
	return Share{ID: jobID, GPU: s.Device, Milli: s.Milli, MemoryMB: uint64(max(s.MemoryMB, 0)), UID: s.UID, GID: s.GID}
}

// createMIG creates one instance of the profile on the allocated GPU, at
// the slot the engine chose when the driver allows it (destroying the idle
// instances on it where needed), else wherever PlanOnDemand finds room on
// that GPU, never touching instances that hold work. It returns the
// instance's UUID and start slot.
func (d *Driver) createMIG(ctx context.Context, m *devices.MIGAllocation, held map[string]bool) (string, int, error) {
	d.migMu.Lock()
	defer d.migMu.Unlock()
	busy := Busy(maps.Clone(held))
	delete(busy, m.GPU) // the GPU is "held" by this very job until its instance exists
	exact := []Action{{Kind: CreateInstance, GPUUUID: m.GPU, Profile: m.Profile, Start: m.Start}}
	if err := d.m.Apply(ctx, exact, busy); err == nil {
		// An instance of the profile already at the slot makes the create
		// a no-op: it is the job's only when no other job holds it.
		if uuid := d.findInstance(ctx, m.GPU, m.Profile, m.Start); uuid != "" && !busy[uuid] {
			d.log.Info("MIG instance created for job", "gpu", m.GPU, "profile", m.Profile, "start", m.Start, "instance", uuid)
			return uuid, m.Start, nil
		}
	} else {
		d.log.Info("MIG slot chosen by the engine not usable; planning another", "gpu", m.GPU, "profile", m.Profile, "start", m.Start, "err", err)
	}
	state, err := d.m.State(ctx, busy)
	if err != nil {
		return "", 0, fmt.Errorf("MIG state: %w", err)
	}
	// The engine may have chosen slots that idle instances hold (it
	// destroys them in its model): destroy them here too and create at
	// its slot, so the instance is where the engine placed it.
	if c, err := PlanOnDemandAt(state, m.GPU, m.Profile, m.Start); err == nil {
		inst, err := d.m.ApplyOnDemand(ctx, c, busy)
		if err == nil {
			d.log.Info("MIG instance created after destroying idle instances", "gpu", m.GPU, "profile", m.Profile, "start", inst.Start, "instance", inst.UUID, "cost", c.Cost)
			return inst.UUID, inst.Start, nil
		}
		d.log.Info("MIG slot chosen by the engine not usable after destroying idle instances; planning another", "gpu", m.GPU, "profile", m.Profile, "start", m.Start, "err", err)
		if state, err = d.m.State(ctx, busy); err != nil {
			return "", 0, fmt.Errorf("MIG state: %w", err)
		}
	}
	cands, err := PlanOnDemand(state, m.Profile)
	if err != nil {
		return "", 0, fmt.Errorf("no room for a %s instance: %w", m.Profile, err)
	}
	for _, c := range cands {
		if c.GPUUUID != m.GPU {
			continue
		}
		inst, err := d.m.ApplyOnDemand(ctx, c, busy)
		if err != nil {
			return "", 0, fmt.Errorf("creating a %s instance on %s: %w", m.Profile, m.GPU, err)
		}
		d.log.Info("MIG instance created on demand", "gpu", m.GPU, "profile", m.Profile, "instance", inst.UUID, "start", inst.Start, "cost", c.Cost)
		return inst.UUID, inst.Start, nil
	}
	return "", 0, fmt.Errorf("GPU %s has no room for a %s instance without touching running work", m.GPU, m.Profile)
}

// findInstance returns the UUID of the instance of profile at start on gpu.
func (d *Driver) findInstance(ctx context.Context, gpu, profile string, start int) string {
	state, err := d.m.State(ctx, nil)
	if err != nil {
		return ""
	}
	for _, g := range state.GPUs {
		if g.UUID != gpu {
			continue
		}
		for _, in := range g.Instances {
			if in.Profile == profile && in.Start == start {
				return in.UUID
			}
		}
	}
	return ""
}

// Reclaim admits again the GPU share of a job re-attached after a daemon
// restart, so share admission counts it.
func (d *Driver) Reclaim(ctx context.Context, jobID string, a devices.Allocation) error {
	s := a.Share
	if s == nil {
		return nil
	}
	if err := d.m.AdmitShare(ctx, shareOf(jobID, *s)); err != nil {
		return fmt.Errorf("GPU share: %w", err)
	}
	d.noteShare(jobID, s.Device)
	return nil
}

// Release gives back the job's GPU share.
func (d *Driver) Release(ctx context.Context, jobID string) error { return d.release(ctx, jobID) }

func (d *Driver) release(ctx context.Context, jobID string) error {
	d.mu.Lock()
	gpu, ok := d.shares[jobID]
	delete(d.shares, jobID)
	d.mu.Unlock()
	if !ok {
		return nil
	}
	if err := d.m.ReleaseShare(ctx, gpu, jobID); err != nil {
		return fmt.Errorf("releasing GPU share on %s: %w", gpu, err)
	}
	return nil
}

func (d *Driver) noteShare(jobID, gpu string) {
	d.mu.Lock()
	d.shares[jobID] = gpu
	d.mu.Unlock()
}

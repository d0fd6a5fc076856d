// Package hardware assembles fusiond's view of the machine it runs on: the
// topology model (sockets, NUMA nodes, PCIe tree, NVLinks), the device
// drivers (one list of devices.Driver: the NVIDIA GPU driver when the host
// has one, then the FPGA region driver) and the bitstream library. It opens
// them over the live host or, with Config.Simulate, over a simulated
// DGX-class host (go-nvml's mock GPUs plus sysfs fixture trees written
// once: the read-only topology tree in a per-user tmpfs directory shared
// between starts, the FPGA trees under the state directory), owns their
// background work (GPU telemetry sampling, GPU health watch, topology
// refresh), fans the drivers' updates
// and topology changes out to subscribers (Subscribe), and serves them to
// the API through Backend. Placement decisions are not made here: the
// daemon builds the placer's inventory from Drivers and Topology.
//
// It touches hardware only through devices/*, topology and their simulated
// hosts, and may import those, daemon/api (for the API's device backend),
// golang.org/x/sys/unix and the standard library; not the daemon's other
// internal packages.
package hardware

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/devices"
	"github.com/fusiond/fusiond/devices/fpga"
	"github.com/fusiond/fusiond/devices/fpga/bitstream"
	fpgasim "github.com/fusiond/fusiond/devices/fpga/simhost"
	"github.com/fusiond/fusiond/devices/nvidia"
	"github.com/fusiond/fusiond/topology"
	toposim "github.com/fusiond/fusiond/topology/simhost"
)

// Config says which host to open.
type Config struct {
	// StateDir holds the bitstream library (bitstreams/) and, when
	// simulating, the simulated host's FPGA trees (sim/), and its
	// topology tree where SimTreeDir gives no other place.
	StateDir string
	// SimTreeDir holds the simulated host's topology tree, which is read
	// only: one tree per content (named by its digest), shared by every
	// simulated daemon of this user and kept between starts, so a daemon
	// starting on an empty state directory does not write it again.
	// "" is /dev/shm/fusiond-UID where /dev/shm is a tmpfs (writing the
	// tree there costs a fraction of what it costs on ext4, and a start
	// after the first nothing), else StateDir/sim; "-" is StateDir/sim. The
	// directory must be this user's alone (mode 0700), else StateDir/sim
	// is used and a note says why.
	SimTreeDir string
	// Simulate names a simulated host (see SimulatedHosts); "" opens the
	// live host.
	Simulate string
	// Root is the live host's filesystem root (default "/"); tests point
	// it at a fixture tree. Unused when simulating.
	Root string
	// TopologyPeriod is how often the live topology is re-discovered
	// (default one minute; negative: only at startup). Simulated hosts
	// are discovered once.
	TopologyPeriod time.Duration
	// SampleInterval is the GPU telemetry period (default 100 ms, 10 Hz).
	SampleInterval time.Duration
	// HealthProbe is how often unhealthy GPUs are probed (default 10 s).
	HealthProbe time.Duration
	// HealthProbation is how long a GPU that answers healthy again stays
	// out of service before it returns (default 5 minutes).
	HealthProbation time.Duration
	// MPSRoot holds the per-GPU CUDA MPS pipe and log directories
	// (default StateDir/mps). MPS is used where nvidia-cuda-mps-control
	// is on PATH and the host is live.
	MPSRoot string
	// SampleBitstreamBytes is the payload size of the sample bitstreams
	// written for a simulated host (default 1 MiB).
	SampleBitstreamBytes int64
}

// SimulatedHosts lists the names Config.Simulate accepts.
func SimulatedHosts() []string { return nvidia.SimulatedHosts() }

// ErrUnknownSimulation is returned for a Simulate name that is not one of
// SimulatedHosts.
var ErrUnknownSimulation = errors.New("unknown simulated host")

// CheckSimulate validates a Simulate name ("" is the live host).
func CheckSimulate(name string) error {
	if name == "" || slices.Contains(SimulatedHosts(), name) {
		return nil
	}
	return fmt.Errorf("%w %q (want one of %s)", ErrUnknownSimulation, name, strings.Join(SimulatedHosts(), ", "))
}

// Host is the assembled hardware view. Its accessors are safe for
// concurrent use.
type Host struct {
	cfg    Config
	log    *slog.Logger
	topo   *topology.Watcher
	gpus   *nvidia.Manager
	gpuSim *nvidia.SimHost
	// simMIGChanges signals a MIG layout change of the simulated GPUs,
	// to be saved (simmig.go); nil on a real host.
	simMIGChanges <-chan struct{}
	fpgas         *fpga.Manager
	fpgaSim       *fpgasim.Host
	lib           *bitstream.Library
	// drivers are the device drivers, GPU driver first when present,
	// then FPGA; gpuDrv and fpgaDrv are the same drivers, typed, for the
	// API's kind-specific routes.
	drivers []devices.Driver
	gpuDrv  *nvidia.Driver
	fpgaDrv *fpga.Driver
	// hub hands subscribers every driver update and topology change.
	hub    devices.Hub
	unsubs []func()
	notes  []string
	// samples is the directory of the simulated host's sample bitstreams.
	samples string

	mu      sync.Mutex
	regions int // FPGA regions found at the last listing
	health  healthLog

	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// Open discovers the host (or writes and opens the simulated one) and
// starts the background work. A host without an NVIDIA driver or without
// FPGAs opens with none and says so in Notes; other failures are errors.
func Open(ctx context.Context, cfg Config, log *slog.Logger) (*Host, error) {
	if err := CheckSimulate(cfg.Simulate); err != nil {
		return nil, err
	}
	if cfg.Root == "" {
		cfg.Root = "/"
	}
	if cfg.TopologyPeriod == 0 {
		cfg.TopologyPeriod = time.Minute
	}
	if cfg.SampleInterval <= 0 {
		cfg.SampleInterval = 100 * time.Millisecond
	}
	if cfg.HealthProbe <= 0 {
		cfg.HealthProbe = 10 * time.Second
	}
	if cfg.HealthProbation <= 0 {
		cfg.HealthProbation = 5 * time.Minute
	}
	if cfg.MPSRoot == "" {
		cfg.MPSRoot = filepath.Join(cfg.StateDir, "mps")
	}
	if cfg.SampleBitstreamBytes <= 0 {
		cfg.SampleBitstreamBytes = 1 << 20
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &Host{cfg: cfg, log: log}
	if cfg.Simulate != "" {
		h.notes = append(h.notes, fmt.Sprintf("devices are SIMULATED (%s): mock NVIDIA GPUs and fixture sysfs trees for topology and FPGAs; no real GPU or FPGA is behind them and jobs run on this machine's CPUs", cfg.Simulate))
		log.Warn("devices are simulated", "host", cfg.Simulate)
	}
	ok := false
	defer func() {
		if !ok {
			h.Close()
		}
	}()
	if err := h.openGPUs(ctx); err != nil {
		return nil, err
	}
	if err := h.openTopology(ctx); err != nil {
		return nil, err
	}
	if err := h.openFPGAs(ctx); err != nil {
		return nil, err
	}
	for _, d := range h.drivers {
		h.unsubs = append(h.unsubs, d.Subscribe(h.noteUpdate))
	}
	h.start()
	ok = true
	return h, nil
}

func (h *Host) simDir(name string) string { return filepath.Join(h.cfg.StateDir, "sim", name) }

func (h *Host) live(path string) string { return filepath.Join(h.cfg.Root, path) }

func (h *Host) openGPUs(ctx context.Context) error {
	opts := []nvidia.Option{nvidia.WithLogger(h.log.With("component", "nvidia")), nvidia.WithProbation(h.cfg.HealthProbation)}
	if h.cfg.Simulate != "" {
		sim, err := nvidia.NewSimHost(h.cfg.Simulate)
		if err != nil {
			return fmt.Errorf("simulated GPUs: %w", err)
		}
		h.gpuSim = sim
		opts = append(opts, nvidia.WithNVML(sim))
	} else {
		opts = append(opts, nvidia.WithDevRoot(h.live("dev")), nvidia.WithProcRoot(h.live("proc")),
			nvidia.WithMPS(&nvidia.MPSDaemon{Root: h.cfg.MPSRoot}))
	}
	m, err := nvidia.Open(opts...)
	switch {
	case errors.Is(err, nvidia.ErrNoDriver):
		h.log.Info("no NVIDIA driver: running without GPUs", "err", err)
		h.notes = append(h.notes, "no NVIDIA driver (libnvidia-ml not found): this host offers no GPUs")
		return nil
	case err != nil:
		// A broken driver should not take the node down: run without
		// GPUs and say why.
		h.log.Error("NVIDIA driver unusable: running without GPUs", "err", err)
		h.notes = append(h.notes, fmt.Sprintf("NVIDIA driver unusable, running without GPUs: %v", err))
		return nil
	}
	h.gpus = m
	if h.gpuSim != nil {
		if err := restoreSimMIG(ctx, m, h.simDir(simMIGFile)); err != nil {
			return fmt.Errorf("simulated GPUs: %w", err)
		}
		notify, changes := simMIGChanges()
		h.unsubs = append(h.unsubs, m.Subscribe(notify))
		h.simMIGChanges = changes
	}
	h.gpuDrv = nvidia.NewDriver(m, h.log.With("component", "nvidia"),
		nvidia.DriverOptions{SampleInterval: h.cfg.SampleInterval, HealthProbe: h.cfg.HealthProbe})
	h.drivers = append(h.drivers, h.gpuDrv)
	if len(m.GPUs()) == 0 {
		h.notes = append(h.notes, "the NVIDIA driver reports no GPUs")
	}
	return nil
}

func (h *Host) openTopology(ctx context.Context) error {
	root := h.cfg.Root
	period := h.cfg.TopologyPeriod
	if h.cfg.Simulate != "" {
		dir, err := h.simTopology()
		if err != nil {
			return fmt.Errorf("simulated topology: %w", err)
		}
		root, period = dir, -1
	}
	tlog := h.log.With("component", "topology")
	opts := []topology.Option{topology.WithRoot(root)}
	if h.gpus != nil {
		opts = append(opts, topology.WithLinkSource(h.gpus))
	}
	if period < 0 {
		period = 0
	}
	// Discovery logs what it could not read; say it at startup, not on
	// every periodic refresh (the warnings stay in Host.Warnings, and
	// changes are logged as events).
	var discoveries atomic.Int64
	discover := func(ctx context.Context) (*topology.Host, error) {
		l := tlog
		if discoveries.Add(1) > 1 {
			l = slog.New(slog.DiscardHandler)
		}
		return topology.Discover(ctx, append(slices.Clip(opts), topology.WithLogger(l))...)
	}
	h.topo = topology.NewWatcher(topology.WatcherConfig{Period: period, Discover: discover, Logger: tlog})
	if _, err := h.topo.Refresh(ctx); err != nil {
		return fmt.Errorf("topology: %w", err)
	}
	t := h.topo.Current()
	for _, w := range t.Warnings {
		h.log.Debug("topology warning", "warning", w)
	}
	h.log.Info("topology", "root", root, "sockets", len(t.Sockets), "nodes", len(t.Nodes),
		"cpus", t.OnlineCPUs.String(), "pci_devices", len(t.Devices), "accelerators", len(t.Accelerators()), "links", len(t.Links))
	return nil
}

// simTopology returns the simulated host's topology tree, written if it
// is not there yet: in the shared directory (Config.SimTreeDir) under the
// tree's digest, else under the state directory.
func (h *Host) simTopology() (string, error) {
	opts := []toposim.Option{toposim.WithSharedContent()}
	if ids := nvidia.SimPCIDeviceIDs(h.cfg.Simulate); ids != nil {
		opts = append(opts, toposim.WithGPUs(ids...))
	}
	tree := toposim.Plan(opts...)
	base, err := sharedSimDir(h.cfg.SimTreeDir)
	if err != nil {
		h.log.Warn("simulated topology tree kept under the state directory", "err", err)
		h.notes = append(h.notes, fmt.Sprintf("simulated topology tree written under the state directory: %v", err))
	}
	if base == "" {
		return writeOnce(h.simDir("topology"), tree.Write)
	}
	name := simTreePrefix + tree.Digest()[:16]
	pruneSimTrees(base, name, time.Now(), h.log)
	return writeOnce(filepath.Join(base, name), tree.Write)
}

// simTreePrefix begins the name of a simulated topology tree in the
// shared directory; the digest of its content follows.
const simTreePrefix = "topology-"

// sharedSimDir returns the directory for shared simulated trees, "" for
// none (then the state directory holds them), or an error saying why the
// configured or default one cannot be used.
func sharedSimDir(dir string) (string, error) {
	switch dir {
	case "-":
		return "", nil
	case "":
		var st unix.Statfs_t
		if err := unix.Statfs("/dev/shm", &st); err != nil || st.Type != unix.TMPFS_MAGIC {
			return "", nil // no tmpfs there: the state directory, as ever
		}
		dir = filepath.Join("/dev/shm", fmt.Sprintf("fusiond-%d", os.Geteuid()))
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	// Another user may have made the name first (/dev/shm is everyone's):
	// use only a real directory of ours that nobody else can write to.
	fi, err := os.Lstat(dir)
	if err != nil {
		return "", err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return "", fmt.Errorf("%s is not a directory", dir)
	case !ok || int(st.Uid) != os.Geteuid():
		return "", fmt.Errorf("%s is not owned by uid %d", dir, os.Geteuid())
	case fi.Mode().Perm()&0o077 != 0:
		return "", fmt.Errorf("%s is open to other users (mode %04o; want 0700)", dir, fi.Mode().Perm())
	}
	return dir, nil
}

// Simulated trees and half-written ones that other binaries left in the
// shared directory are removed once they are this old: a simulated daemon
// reads its topology tree only while it starts.
const (
	staleSimTree    = time.Hour
	staleSimTreeTmp = 10 * time.Minute
)

// pruneSimTrees removes from base the topology trees other than keep
// older than staleSimTree, and temporary trees older than staleSimTreeTmp.
func pruneSimTrees(base, keep string, now time.Time, log *slog.Logger) {
	ents, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, e := range ents {
		name := e.Name()
		age := staleSimTree
		switch {
		case name == keep || !e.IsDir():
			continue
		case strings.HasPrefix(name, "."+simTreePrefix):
			age = staleSimTreeTmp
		case !strings.HasPrefix(name, simTreePrefix):
			continue
		}
		if fi, err := e.Info(); err == nil && now.Sub(fi.ModTime()) > age {
			if err := os.RemoveAll(filepath.Join(base, name)); err != nil {
				log.Warn("stale simulated tree not removed", "dir", filepath.Join(base, name), "err", err)
			}
		}
	}
}

// writeOnce fills dir with write unless dir already exists: write fills
// an empty temporary sibling, which is renamed into place, so a crash
// never leaves half a tree and of two daemons writing the same tree at
// once one keeps its own and the other finds it.
func writeOnce(dir string, write func(tmp string) error) (string, error) {
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "."+filepath.Base(dir)+".tmp-")
	if err != nil {
		return "", err
	}
	// MkdirTemp makes it 0700; the tree is as readable as the state
	// directory above it.
	if err := os.Chmod(tmp, 0o755); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	if err := write(tmp); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		if _, serr := os.Stat(dir); serr == nil {
			return dir, nil // another daemon renamed its copy first
		}
		return "", err
	}
	return dir, nil
}

func (h *Host) openFPGAs(ctx context.Context) error {
	flog := h.log.With("component", "fpga")
	lib, err := bitstream.OpenLibrary(filepath.Join(h.cfg.StateDir, "bitstreams"), flog)
	if err != nil {
		return fmt.Errorf("bitstream library: %w", err)
	}
	h.lib = lib
	opts := []fpga.Option{fpga.WithLibrary(lib), fpga.WithLogger(flog)}
	if h.cfg.Simulate != "" {
		// Programming takes a realistic-looking but short time: 300 ms
		// plus 100 MB/s.
		sim, err := fpgasim.Write(h.simDir("fpga"), fpgasim.ProgramRate(100e6), fpgasim.Overhead(300*time.Millisecond))
		if err != nil {
			return fmt.Errorf("simulated FPGA host: %w", err)
		}
		h.fpgaSim = sim
		h.samples = h.simDir("fpga-samples")
		if _, err := writeOnce(h.samples, func(tmp string) error {
			_, err := fpgasim.WriteSamples(tmp, h.cfg.SampleBitstreamBytes)
			return err
		}); err != nil {
			return fmt.Errorf("sample bitstreams: %w", err)
		}
		opts = append(sim.Options(), opts...)
	} else {
		opts = append(opts, fpga.WithSysRoot(h.live("sys")), fpga.WithDevRoot(h.live("dev")),
			fpga.WithFirmwareDir(h.live("lib/firmware")))
	}
	m, err := fpga.NewManager(opts...)
	if err != nil {
		return fmt.Errorf("fpga: %w", err)
	}
	regions, err := m.Regions(ctx)
	if err != nil {
		// One back end's failure does not hide the others' regions.
		flog.Warn("FPGA discovery incomplete", "err", err)
		h.notes = append(h.notes, fmt.Sprintf("FPGA discovery incomplete: %v", err))
	}
	if len(regions) == 0 && h.cfg.Simulate == "" {
		flog.Info("no FPGA regions found")
		h.notes = append(h.notes, "no FPGA regions found (no fpga_manager, DFL or XRT devices)")
		return nil
	}
	h.fpgas = m
	h.fpgaDrv = fpga.NewDriver(m, flog)
	h.drivers = append(h.drivers, h.fpgaDrv)
	h.regions = len(regions)
	flog.Info("FPGA regions", "count", len(regions))
	return nil
}

// start runs the background work: each driver's (GPU telemetry and
// health), topology refresh.
func (h *Host) start() {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	run := func(name string, f func(context.Context) error) {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			if err := f(ctx); err != nil && ctx.Err() == nil {
				h.log.Error(name+" stopped", "err", err)
			}
		}()
	}
	if h.simMIGChanges != nil {
		run("simulated MIG layout", func(ctx context.Context) error { return h.keepSimMIG(ctx, h.simMIGChanges) })
	}
	// The drivers' own work (GPU telemetry and health watch); what it
	// finds reaches noteUpdate through the drivers' updates.
	for _, d := range h.drivers {
		if r, ok := d.(devices.Runner); ok {
			run(string(d.Kind())+" driver", r.Run)
		}
	}
	if h.cfg.Simulate == "" && h.cfg.TopologyPeriod > 0 {
		events, unsubscribe := h.topo.Subscribe()
		run("topology refresh", h.topo.Run)
		run("topology events", func(ctx context.Context) error {
			defer unsubscribe()
			for {
				select {
				case <-ctx.Done():
					return nil
				case e, ok := <-events:
					if !ok {
						return nil
					}
					h.log.Info("topology changed", "event", e.Kind, "detail", fmt.Sprintf("%+v", e))
					// NUMA nodes and PCI placement feed the inventory.
					h.hub.Publish(devices.Update{Kind: devices.DeviceChanged, Detail: fmt.Sprintf("topology: %s", e.Kind)})
				}
			}
		})
	}
}

// Close stops the background work and releases the drivers. Calls after
// the first do nothing.
func (h *Host) Close() error {
	var err error
	h.closeOnce.Do(func() {
		if h.cancel != nil {
			h.cancel()
		}
		h.wg.Wait()
		for _, cancel := range h.unsubs {
			cancel()
		}
		if h.gpus != nil {
			if cerr := h.gpus.Close(); cerr != nil {
				err = fmt.Errorf("nvidia: %w", cerr)
			}
		}
	})
	return err
}

// Topology is the current host model.
func (h *Host) Topology() *topology.Host { return h.topo.Current() }

// TopologyWatcher is the watcher behind Topology, for subscribers to
// topology changes.
func (h *Host) TopologyWatcher() *topology.Watcher { return h.topo }

// GPUs is the NVIDIA GPU manager, nil when the host has no driver.
func (h *Host) GPUs() *nvidia.Manager { return h.gpus }

// Telemetry is the latest GPU telemetry sweep (nil without GPUs).
func (h *Host) Telemetry() []nvidia.Sample {
	if h.gpuDrv == nil {
		return nil
	}
	return h.gpuDrv.Telemetry()
}

// FPGAs is the FPGA region manager, nil when the host has no FPGA regions.
func (h *Host) FPGAs() *fpga.Manager { return h.fpgas }

// SimulatedFPGA is the simulated FPGA hardware (fault injection), nil on a
// live host.
func (h *Host) SimulatedFPGA() *fpgasim.Host { return h.fpgaSim }

// Library is the bitstream library (always present).
func (h *Host) Library() *bitstream.Library { return h.lib }

// Simulated names the simulated host, "" on a live host.
func (h *Host) Simulated() string { return h.cfg.Simulate }

// SampleBitstreams is the directory holding the simulated host's sample
// bitstream files ("" on a live host); they are not in the library until
// someone adds them.
func (h *Host) SampleBitstreams() string { return h.samples }

// Notes are facts an operator should know: simulated devices, no driver,
// no FPGAs.
func (h *Host) Notes() []string { return slices.Clone(h.notes) }

// Capacity is the host's device contribution to node capacity: GPU and
// FPGA region counts (CPU and memory are left zero).
func (h *Host) Capacity() api.NodeResources {
	var r api.NodeResources
	if h.gpus != nil {
		r.GPUs = len(h.gpus.GPUs())
	}
	h.mu.Lock()
	r.FPGAs = h.regions
	h.mu.Unlock()
	return r
}

// Drivers are the host's device drivers: the GPU driver first when the
// host has one, then the FPGA driver. The daemon builds the placement
// inventory and prepares jobs' devices by looping over them.
func (h *Host) Drivers() []devices.Driver { return slices.Clone(h.drivers) }

// Subscribe calls fn with every update of every driver (health
// transitions, telemetry, device changes) and with a devices.DeviceChanged
// update without a Device after a topology change, until cancel is called.
func (h *Host) Subscribe(fn func(devices.Update)) (cancel func()) { return h.hub.Subscribe(fn) }

// noteUpdate records a driver's health transitions and passes every
// update on to the host's subscribers.
func (h *Host) noteUpdate(u devices.Update) {
	// Subscribers (the placer) first: whoever sees the health event has
	// a placer that already knows.
	h.hub.Publish(u)
	if u.Kind == devices.HealthChanged && u.Health != nil {
		h.noteHealth(u)
	}
}

// Devices lists every device of every driver for node status.
func (h *Host) Devices(ctx context.Context) []api.DeviceStatus {
	var out []api.DeviceStatus
	for _, d := range h.drivers {
		inv, err := d.Inventory(ctx)
		if err != nil {
			h.log.Warn("device inventory incomplete", "driver", d.Kind(), "err", err)
		}
		detail := h.detailer(ctx, d.Kind(), len(inv.Devices))
		for _, dev := range inv.Devices {
			out = append(out, api.DeviceStatus{ID: dev.ID, Kind: string(dev.Kind), Model: dev.Model, Healthy: dev.Health.Healthy, Detail: detail(dev)})
		}
	}
	return out
}

// detailer renders the one-line detail of a device of kind for node
// status; n is how many the driver listed.
func (h *Host) detailer(ctx context.Context, kind devices.Kind, n int) func(devices.Device) string {
	switch kind {
	case devices.GPU:
		status := map[string]nvidia.GPUStatus{}
		for _, g := range h.gpus.Status().GPUs {
			status[g.UUID] = g
		}
		return func(d devices.Device) string {
			var migs []string
			if d.MIG != nil {
				for _, in := range d.MIG.Instances {
					migs = append(migs, in.Profile)
				}
			}
			return gpuDetail(status[d.ID], migs, h.probationEnds(d.ID))
		}
	case devices.FPGA:
		h.mu.Lock()
		h.regions = n
		h.mu.Unlock()
		return func(d devices.Device) string {
			r, err := h.fpgas.Region(ctx, d.ID)
			if err != nil {
				return err.Error()
			}
			return regionDetail(r)
		}
	}
	return func(devices.Device) string { return string(kind) }
}

func gpuDetail(g nvidia.GPUStatus, migs []string, probationEnds *time.Time) string {
	parts := []string{fmt.Sprintf("#%d", g.Index), api.Bytes(g.MemoryMB << 20).Human()}
	if g.NUMANode >= 0 {
		parts = append(parts, fmt.Sprintf("NUMA %d", g.NUMANode))
	}
	parts = append(parts, string(g.ShareMode))
	switch {
	case g.MIGEnabled && len(migs) > 0:
		parts = append(parts, "MIG "+strings.Join(migs, "+"))
	case g.MIGEnabled:
		parts = append(parts, "MIG on, no instances")
	}
	if !g.Health.Healthy && g.Health.Reason != "" {
		parts = append(parts, g.Health.Reason)
	}
	if probationEnds != nil {
		parts = append(parts, "back in service at "+probationEnds.Format(time.RFC3339))
	}
	return strings.Join(parts, ", ")
}

func regionDetail(r fpga.RegionStatus) string {
	parts := []string{string(r.Kind)}
	switch {
	case r.LoadedName != "":
		parts = append(parts, "holds "+r.LoadedName)
	case !r.Loaded.AFUID.IsZero():
		parts = append(parts, "holds AFU "+r.Loaded.AFUID.String())
	default:
		parts = append(parts, "empty")
	}
	if r.Busy {
		parts = append(parts, "being programmed")
	}
	if !r.Health.Healthy && r.Health.Reason != "" {
		parts = append(parts, r.Health.Reason)
	}
	return strings.Join(parts, ", ")
}

// regionStatuses lists the FPGA regions (rediscovering them) and keeps the
// count for Capacity.
func (h *Host) regionStatuses(ctx context.Context) []fpga.RegionStatus {
	if h.fpgas == nil {
		return nil
	}
	rs, err := h.fpgas.Regions(ctx)
	if err != nil {
		h.log.Warn("FPGA discovery incomplete", "err", err)
	}
	h.mu.Lock()
	h.regions = len(rs)
	h.mu.Unlock()
	return rs
}

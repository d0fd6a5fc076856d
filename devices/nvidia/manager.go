package nvidia

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/fusiond/fusiond/devices"
)

// Clock is the time source for health probation; tests inject a fake one.
type Clock interface {
	Now() time.Time
}

type realClock struct{}

var _ Clock = realClock{}

func (realClock) Now() time.Time { return time.Now() }

// Option configures Open.
type Option func(*options)

type options struct {
	lib       nvml.Interface
	log       *slog.Logger
	devRoot   string
	procRoot  string
	clock     Clock
	probation time.Duration
	simulated string
	mps       MPSControl
}

// WithNVML uses lib instead of the system NVML library (a go-nvml mock or
// a SimHost).
func WithNVML(lib nvml.Interface) Option { return func(o *options) { o.lib = lib } }

// WithSimulated runs over Simulated(name) and marks the inventory simulated.
func WithSimulated(name string) Option { return func(o *options) { o.simulated = name } }

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithDevRoot sets the directory holding the nvidia* device nodes
// (default /dev).
func WithDevRoot(dir string) Option { return func(o *options) { o.devRoot = dir } }

// WithProcRoot sets the proc directory holding driver/nvidia-caps/mig-minors
// (default /proc).
func WithProcRoot(dir string) Option { return func(o *options) { o.procRoot = dir } }

// WithClock sets the clock used for health probation.
func WithClock(c Clock) Option { return func(o *options) { o.clock = c } }

// WithProbation sets how long a recovered GPU must stay healthy before it
// returns to service (default 5 minutes).
func WithProbation(d time.Duration) Option { return func(o *options) { o.probation = d } }

// WithMPS sets the CUDA MPS control used for shared GPUs (default: none,
// shared GPUs fall back to time-slicing).
func WithMPS(c MPSControl) Option { return func(o *options) { o.mps = c } }

// GPU is the inventory record of one physical GPU.
type GPU struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	Model string `json:"model"`
	// MemoryMB is the framebuffer size in MiB.
	MemoryMB uint64 `json:"memoryMB"`
	// BDF is the PCI address, lower case domain:bus:device.function, the
	// key for joining to topology's PCIe tree.
	BDF string `json:"bdf"`
	// NUMANode is the NUMA node NVML reports, -1 when unknown.
	NUMANode int `json:"numaNode"`
	// ComputeCapability is the CUDA compute capability, e.g. "9.0".
	ComputeCapability string `json:"computeCapability"`
	// PCIDeviceID is the PCI device and vendor id, e.g. "0x233010DE",
	// matched by a layout's device-filter.
	PCIDeviceID string `json:"pciDeviceID,omitempty"`
	// Minor is the N of /dev/nvidiaN.
	Minor      int  `json:"minor"`
	MIGCapable bool `json:"migCapable"`
	MIGEnabled bool `json:"migEnabled"`
	// Power limits in watts; zero when NVML does not report them.
	PowerLimitW    float64 `json:"powerLimitW,omitempty"`
	PowerMinLimitW float64 `json:"powerMinLimitW,omitempty"`
	PowerMaxLimitW float64 `json:"powerMaxLimitW,omitempty"`
	// Profiles are the MIG profiles the GPU supports, named.
	Profiles ProfileSet `json:"profiles,omitempty"`
}

// Manager is the NVIDIA driver of one host.
type Manager struct {
	lib       nvml.Interface
	log       *slog.Logger
	devRoot   string
	procRoot  string
	clock     Clock
	probation time.Duration
	simulated string
	mps       MPSControl

	mu      sync.Mutex
	gpus    []GPU
	handles []nvml.Device
	shares  map[string]*shareState // by GPU UUID
	health  *healthState

	// hub tells subscribers about health transitions, telemetry sweeps
	// and MIG reconfiguration.
	hub devices.Hub
}

// Subscribe calls fn with every health transition (from WatchHealth),
// telemetry sample (from a running Sampler) and MIG change (from Apply)
// until cancel is called.
func (m *Manager) Subscribe(fn func(devices.Update)) (cancel func()) { return m.hub.Subscribe(fn) }

// Open initialises NVML and takes the inventory. Without a driver it
// returns an error wrapping ErrNoDriver; the daemon then runs with zero
// GPUs.
func Open(opts ...Option) (*Manager, error) {
	o := options{devRoot: "/dev", procRoot: "/proc", clock: realClock{}, probation: 5 * time.Minute}
	for _, opt := range opts {
		opt(&o)
	}
	if o.log == nil {
		o.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.simulated != "" && o.lib == nil {
		lib, err := Simulated(o.simulated)
		if err != nil {
			return nil, err
		}
		o.lib = lib
	}
	if o.lib == nil {
		o.lib = nvml.New()
	}
	if h, ok := o.lib.(*SimHost); ok && o.simulated == "" {
		o.simulated = h.Name()
	}
	if err := call0("nvmlInit", o.lib.Init); err != nil {
		return nil, err
	}
	m := &Manager{
		lib: o.lib, log: o.log, devRoot: o.devRoot, procRoot: o.procRoot, clock: o.clock,
		probation: o.probation, simulated: o.simulated, mps: o.mps,
		shares: map[string]*shareState{},
	}
	m.health = newHealthState()
	if _, err := m.Refresh(context.Background()); err != nil {
		_ = call0("nvmlShutdown", o.lib.Shutdown)
		return nil, err
	}
	m.log.Info("nvidia: inventory", "gpus", len(m.gpus), "simulated", o.simulated)
	return m, nil
}

// Close shuts NVML down.
func (m *Manager) Close() error { return call0("nvmlShutdown", m.lib.Shutdown) }

// Simulated names the simulated host, "" on real hardware.
func (m *Manager) Simulated() string { return m.simulated }

// GPUs returns a copy of the inventory.
func (m *Manager) GPUs() []GPU {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]GPU, len(m.gpus))
	copy(out, m.gpus)
	return out
}

// Refresh re-reads the inventory from NVML.
func (m *Manager) Refresh(ctx context.Context) ([]GPU, error) {
	n, err := call("DeviceGetCount", m.lib.DeviceGetCount)
	if err != nil {
		return nil, err
	}
	gpus := make([]GPU, 0, n)
	handles := make([]nvml.Device, 0, n)
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		d, err := call("DeviceGetHandleByIndex", func() (nvml.Device, nvml.Return) { return m.lib.DeviceGetHandleByIndex(i) })
		if err != nil {
			return nil, fmt.Errorf("gpu %d: %w", i, err)
		}
		g, err := readGPU(i, d)
		if err != nil {
			return nil, fmt.Errorf("gpu %d: %w", i, err)
		}
		gpus = append(gpus, g)
		handles = append(handles, d)
	}
	m.mu.Lock()
	m.gpus, m.handles = gpus, handles
	m.mu.Unlock()
	return gpus, nil
}

// readGPU reads one GPU's inventory record. UUID, name and memory are
// required; everything else is optional and left zero when unsupported.
func readGPU(i int, d nvml.Device) (GPU, error) {
	g := GPU{Index: i, NUMANode: -1, Minor: i}
	var err error
	if g.UUID, err = call("GetUUID", d.GetUUID); err != nil {
		return g, err
	}
	if g.Model, err = call("GetName", d.GetName); err != nil {
		return g, err
	}
	mem, err := call("GetMemoryInfo", d.GetMemoryInfo)
	if err != nil {
		return g, err
	}
	g.MemoryMB = mem.Total / (1024 * 1024)
	if pci, err := call("GetPciInfo", d.GetPciInfo); err == nil {
		g.BDF = normalizeBDF(cString(pci.BusId[:]))
		g.PCIDeviceID = fmt.Sprintf("0x%08X", pci.PciDeviceId)
	}
	if numa, err := call("GetNumaNodeId", d.GetNumaNodeId); err == nil {
		g.NUMANode = numa
	}
	if minor, err := call("GetMinorNumber", d.GetMinorNumber); err == nil {
		g.Minor = minor
	}
	type cc struct{ major, minor int }
	if c, err := call("GetCudaComputeCapability", func() (cc, nvml.Return) {
		a, b, r := d.GetCudaComputeCapability()
		return cc{a, b}, r
	}); err == nil {
		g.ComputeCapability = fmt.Sprintf("%d.%d", c.major, c.minor)
	}
	if cur, err := call("GetMigMode", func() (int, nvml.Return) {
		c, _, r := d.GetMigMode()
		return c, r
	}); err == nil {
		g.MIGCapable = true
		g.MIGEnabled = cur == nvml.DEVICE_MIG_ENABLE
	}
	if lim, err := call("GetPowerManagementLimit", d.GetPowerManagementLimit); err == nil {
		g.PowerLimitW = float64(lim) / 1000
	}
	type mm struct{ min, max uint32 }
	if c, err := call("GetPowerManagementLimitConstraints", func() (mm, nvml.Return) {
		a, b, r := d.GetPowerManagementLimitConstraints()
		return mm{a, b}, r
	}); err == nil {
		g.PowerMinLimitW, g.PowerMaxLimitW = float64(c.min)/1000, float64(c.max)/1000
	}
	if g.MIGCapable {
		g.Profiles = readProfiles(d, g.MemoryMB)
		if len(g.Profiles) == 0 {
			g.MIGCapable = false
		}
	}
	return g, nil
}

func readProfiles(d nvml.Device, totalMB uint64) ProfileSet {
	var infos []nvml.GpuInstanceProfileInfo
	for _, id := range candidateProfileIDs {
		info, err := call("GetGpuInstanceProfileInfo", func() (nvml.GpuInstanceProfileInfo, nvml.Return) {
			return d.GetGpuInstanceProfileInfo(id)
		})
		if err != nil || info.SliceCount == 0 {
			continue
		}
		infos = append(infos, info)
	}
	return profilesFromInfo(infos, totalMB)
}

// normalizeBDF turns NVML's "00000000:3B:00.0" into "0000:3b:00.0".
func normalizeBDF(s string) string {
	var dom, bus, dev, fn uint32
	if _, err := fmt.Sscanf(s, "%x:%x:%x.%x", &dom, &bus, &dev, &fn); err != nil {
		return strings.ToLower(s)
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", dom, bus, dev, fn)
}

// gpu returns the record and handle of the GPU with the given UUID.
func (m *Manager) gpu(uuid string) (GPU, nvml.Device, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, g := range m.gpus {
		if g.UUID == uuid {
			return g, m.handles[i], nil
		}
	}
	return GPU{}, nil, fmt.Errorf("gpu %s: %w", uuid, ErrUnknownDevice)
}

// DeviceLinks reports the NVLinks of the host's GPUs, one Link per
// connected pair with the number of links between them. It satisfies
// topology's link-source interface.
func (m *Manager) DeviceLinks(ctx context.Context) ([]devices.Link, error) {
	m.mu.Lock()
	gpus, handles := m.gpus, m.handles
	m.mu.Unlock()
	type pair struct{ a, b string }
	lanes := map[pair]int{}
	for i, d := range handles {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		self := gpus[i].BDF
		for link := 0; link < nvml.NVLINK_MAX_LINKS; link++ {
			st, err := call("GetNvLinkState", func() (nvml.EnableState, nvml.Return) { return d.GetNvLinkState(link) })
			if errors.Is(err, ErrNotSupported) && link == 0 {
				break
			}
			if err != nil || st != nvml.FEATURE_ENABLED {
				continue
			}
			pci, err := call("GetNvLinkRemotePciInfo", func() (nvml.PciInfo, nvml.Return) { return d.GetNvLinkRemotePciInfo(link) })
			if err != nil {
				continue
			}
			remote := normalizeBDF(cString(pci.BusId[:]))
			if remote == "" || remote == self {
				continue
			}
			p := pair{self, remote}
			if remote < self {
				p = pair{remote, self}
			}
			lanes[p]++
		}
	}
	out := make([]devices.Link, 0, len(lanes))
	for p, n := range lanes {
		// A GPU-GPU link is seen from both ends; a link to a non-GPU
		// (NVSwitch) only from one.
		if isGPU(gpus, p.a) && isGPU(gpus, p.b) {
			n /= 2
		}
		out = append(out, devices.Link{A: p.a, B: p.b, Type: devices.NVLink, Lanes: n})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].A != out[j].A {
			return out[i].A < out[j].A
		}
		return out[i].B < out[j].B
	})
	return out, nil
}

func isGPU(gpus []GPU, bdf string) bool {
	for _, g := range gpus {
		if g.BDF == bdf {
			return true
		}
	}
	return false
}

// GPUStatus is one GPU as status output shows it.
type GPUStatus struct {
	GPU
	Health devices.Health `json:"health"`
	// ShareMode is how sharing would be enforced on this GPU.
	ShareMode ShareMode `json:"shareMode"`
}

// Status is the driver's summary for `fusionctl status` and
// `fusionctl gpu list`.
type Status struct {
	// Simulated names the simulated host; empty on real hardware.
	Simulated string      `json:"simulated,omitempty"`
	GPUs      []GPUStatus `json:"gpus"`
}

// Status summarises inventory, health and sharing mode.
func (m *Manager) Status() Status {
	s := Status{Simulated: m.simulated}
	for _, g := range m.GPUs() {
		m.mu.Lock()
		mode := m.shareOf(g.UUID).mode
		m.mu.Unlock()
		s.GPUs = append(s.GPUs, GPUStatus{GPU: g, Health: m.Health(g.UUID), ShareMode: mode})
	}
	return s
}

package nvidia

import (
	"crypto/sha256"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// SimulatedHosts lists the names Simulated accepts.
func SimulatedHosts() []string { return []string{"dgxa100", "dgxh100", "dgxh200", "dgxb200", "mixed"} }

// simL4 is an NVIDIA L4 (Ada, 24 GB, 72 W, no MIG, no NVLink) for go-nvml's
// mock server, which has no L4 of its own.
var simL4 = gpus.Config{
	Name:         "NVIDIA L4",
	Architecture: nvml.DEVICE_ARCH_ADA,
	Brand:        nvml.BRAND_NVIDIA,
	MemoryMB:     23034,
	CudaMajor:    8,
	CudaMinor:    9,
	PciDeviceId:  0x27B810DE,
}

// SimPCIDeviceIDs are the PCI device ids of the simulated host's GPUs in
// index order, for its topology tree; nil for the 8-GPU DGX hosts, whose
// tree is the default one.
func SimPCIDeviceIDs(name string) []uint16 {
	if name == "mixed" {
		return []uint16{uint16(gpus.H100_SXM5_80GB.PciDeviceId >> 16), uint16(simL4.PciDeviceId >> 16), uint16(simL4.PciDeviceId >> 16)}
	}
	return nil
}

// SimHost is a simulated NVIDIA host: one of go-nvml's mock servers with
// the parts of NVML the mock leaves out (PCI bus IDs, NUMA, power, clocks,
// utilization, NVLink, MIG device handles, events) filled in. It satisfies
// nvml.Interface, so the production code runs over it unchanged, and it can
// inject faults for health tests and demos.
type SimHost struct {
	*server.Server
	name string

	mu     sync.Mutex
	events chan nvml.EventData
	state  []*simGPU
	devs   []*simDevice
}

type simGPU struct {
	lost       bool
	dbe        uint64
	powerLimit uint32 // milliwatts
	tdp        uint32 // milliwatts
	power      uint32 // the draw it reports, milliwatts
	migDevs    map[string]*mock.Device
	procs      []nvml.ProcessInfo // the compute processes it reports (SetProcesses)
	smUtil     uint32             // the SM utilisation it reports, percent (SetUtilization)
}

var _ nvml.Interface = (*SimHost)(nil)

// Simulated returns a simulated host: an 8-GPU "dgxa100", "dgxh100",
// "dgxh200" or "dgxb200", or "mixed" (one H100 SXM and two L4s, as a
// workstation or an inference box beside a training GPU).
func Simulated(name string) (nvml.Interface, error) {
	return NewSimHost(name)
}

// NewSimHost is Simulated with the concrete type, for callers that inject
// faults.
func NewSimHost(name string) (*SimHost, error) {
	var s *server.Server
	switch name {
	case "dgxa100":
		s = dgxa100.New()
	case "dgxh100":
		s = dgxh100.New()
	case "dgxh200":
		s = dgxh200.New()
	case "dgxb200":
		s = dgxb200.New()
	case "mixed":
		s, _ = server.New(server.WithGPUs(gpus.H100_SXM5_80GB, simL4, simL4), server.WithDriverVersion("550.54.15"),
			server.WithNVMLVersion("12.550.54.15"), server.WithCUDADriverVersion(12040))
	default:
		return nil, fmt.Errorf("nvidia: unknown simulated host %q (want one of %v)", name, SimulatedHosts())
	}
	h := &SimHost{Server: s, name: name, events: make(chan nvml.EventData, 64)}
	for i, d := range s.Devices {
		tdp := simTDP(name, d.(*server.Device).Config)
		h.state = append(h.state, &simGPU{powerLimit: tdp, tdp: tdp, power: simPower(tdp, d.(*server.Device).Config), migDevs: map[string]*mock.Device{}})
		sd := &simDevice{Device: d.(*server.Device), h: h, i: i}
		// The mock draws random UUIDs at every start; a real GPU keeps its
		// UUID, and so must a simulated one, or jobs re-attached after a
		// restart would hold GPUs the host no longer names.
		sd.Device.UUID = SimGPUUUID(name, i)
		h.devs = append(h.devs, sd)
		h.wireDevice(i, sd.Device)
		if name == "mixed" {
			noFabric(sd.Device)
		}
	}
	s.DeviceGetHandleByIndexFunc = func(index int) (nvml.Device, nvml.Return) {
		if index < 0 || index >= len(h.devs) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		return h.devs[index], nvml.SUCCESS
	}
	s.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &simEventSet{h: h}, nvml.SUCCESS
	}
	return h, nil
}

// SimGPUUUID is the UUID of GPU index of the simulated host name: derived
// from both, so it is the same at every start.
func SimGPUUUID(name string, index int) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("fusiond-sim/%s/gpu/%d", name, index)))
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
}

// simEventSet delivers injected events. Its methods shadow the mock's so
// that frequent calls are not recorded by the mock (which keeps every call
// in memory).
type simEventSet struct {
	mock.EventSet
	h *SimHost
}

func (e *simEventSet) Wait(timeoutMs uint32) (nvml.EventData, nvml.Return) {
	select {
	case ev := <-e.h.events:
		return ev, nvml.SUCCESS
	case <-time.After(time.Duration(timeoutMs) * time.Millisecond):
		return nvml.EventData{}, nvml.ERROR_TIMEOUT
	}
}

func (e *simEventSet) Free() nvml.Return { return nvml.SUCCESS }

// simDevice answers the queries telemetry and health probes make many
// times a second directly, without the mock's call recording, so a
// long-running simulated daemon does not grow without bound.
type simDevice struct {
	*server.Device
	h *SimHost
	i int
}

var _ nvml.Device = (*simDevice)(nil)

func (d *simDevice) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	return d.Device.MemoryInfo, nvml.SUCCESS
}

func (d *simDevice) GetPowerUsage() (uint32, nvml.Return) {
	return d.h.state[d.i].power, d.h.lostOr(d.i)
}

func (d *simDevice) GetPowerManagementLimit() (uint32, nvml.Return) {
	d.h.mu.Lock()
	defer d.h.mu.Unlock()
	return d.h.state[d.i].powerLimit, nvml.SUCCESS
}

func (d *simDevice) GetEnforcedPowerLimit() (uint32, nvml.Return) { return d.GetPowerManagementLimit() }

func (d *simDevice) GetTemperature(nvml.TemperatureSensors) (uint32, nvml.Return) {
	return 34, d.h.lostOr(d.i)
}

func (d *simDevice) GetClockInfo(t nvml.ClockType) (uint32, nvml.Return) {
	if t == nvml.CLOCK_MEM {
		return 2619, d.h.lostOr(d.i)
	}
	return 1980, d.h.lostOr(d.i)
}

func (d *simDevice) GetUtilizationRates() (nvml.Utilization, nvml.Return) {
	if ret := d.h.lostOr(d.i); ret != nvml.SUCCESS {
		return nvml.Utilization{}, ret
	}
	d.h.mu.Lock()
	defer d.h.mu.Unlock()
	return nvml.Utilization{Gpu: d.h.state[d.i].smUtil}, nvml.SUCCESS
}

func (d *simDevice) GetComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	if ret := d.h.lostOr(d.i); ret != nvml.SUCCESS {
		return nil, ret
	}
	d.h.mu.Lock()
	defer d.h.mu.Unlock()
	return append([]nvml.ProcessInfo(nil), d.h.state[d.i].procs...), nvml.SUCCESS
}

func (d *simDevice) GetTotalEccErrors(t nvml.MemoryErrorType, c nvml.EccCounterType) (uint64, nvml.Return) {
	d.h.mu.Lock()
	defer d.h.mu.Unlock()
	if t == nvml.MEMORY_ERROR_TYPE_UNCORRECTED && c == nvml.VOLATILE_ECC {
		return d.h.state[d.i].dbe, nvml.SUCCESS
	}
	return 0, nvml.SUCCESS
}

// Name is the simulated host's name.
func (h *SimHost) Name() string { return h.name }

// simPower is what a simulated GPU reports drawing: awake at a light
// load, a fifth of its board limit (about twice the idle draw of the
// DGX parts); an L4, whose fifth (14 W) is below its idle draw, twice
// its 16 W idle.
func simPower(tdp uint32, c gpus.Config) uint32 {
	if c.Name == simL4.Name {
		return 32_000
	}
	return tdp / 5
}

// simTDP is the board power limit of a simulated GPU in milliwatts.
func simTDP(name string, c gpus.Config) uint32 {
	if c.Name == simL4.Name {
		return 72_000
	}
	switch name {
	case "dgxa100":
		return 400_000
	case "dgxb200":
		return 1_000_000
	default:
		return 700_000
	}
}

func (h *SimHost) wireDevice(i int, d *server.Device) {
	n := len(h.Server.Devices)
	st := h.state[i]
	tdp := st.tdp
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		return simPci(d.PciBusID, d.Config.PciDeviceId), nvml.SUCCESS
	}
	// Two sockets of four GPU slots (the DGX layout, as topology/simhost
	// lays the tree out): slots 0-3 on NUMA node 0, 4-7 on node 1.
	d.GetNumaNodeIdFunc = func() (int, nvml.Return) { return i / 4, nvml.SUCCESS }
	d.GetPowerManagementLimitConstraintsFunc = func() (uint32, uint32, nvml.Return) {
		return tdp / 2, tdp, nvml.SUCCESS
	}
	d.SetPowerManagementLimitFunc = func(mw uint32) nvml.Return {
		if mw < tdp/2 || mw > tdp {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		st.powerLimit = mw
		return nvml.SUCCESS
	}
	// NVLink: every GPU reaches every other over two links (an NVSwitch
	// fabric seen from the GPU side).
	d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
		if link < 0 || link >= 2*(n-1) {
			return nvml.FEATURE_DISABLED, nvml.ERROR_INVALID_ARGUMENT
		}
		return nvml.FEATURE_ENABLED, nvml.SUCCESS
	}
	d.GetNvLinkRemotePciInfoFunc = func(link int) (nvml.PciInfo, nvml.Return) {
		if link < 0 || link >= 2*(n-1) {
			return nvml.PciInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		peer := link / 2
		if peer >= i {
			peer++
		}
		pd := h.Server.Devices[peer].(*server.Device)
		return simPci(pd.PciBusID, pd.Config.PciDeviceId), nvml.SUCCESS
	}
	d.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	d.GetMigDeviceHandleByIndexFunc = func(idx int) (nvml.Device, nvml.Return) {
		devs := h.migDevices(i, d)
		if idx < 0 || idx >= len(devs) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return devs[idx], nvml.SUCCESS
	}
}

// migDevices lists MIG device handles for the mock's current GPU and
// compute instances, ordered by (GI, CI), with stable UUIDs.
func (h *SimHost) migDevices(i int, d *server.Device) []nvml.Device {
	type key struct{ gi, ci uint32 }
	var keys []key
	d.RLock()
	for gi := range d.GpuInstances {
		gi.RLock()
		for ci := range gi.ComputeInstances {
			keys = append(keys, key{gi.Info.Id, ci.Info.Id})
		}
		gi.RUnlock()
	}
	d.RUnlock()
	sort.Slice(keys, func(a, b int) bool {
		if keys[a].gi != keys[b].gi {
			return keys[a].gi < keys[b].gi
		}
		return keys[a].ci < keys[b].ci
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.state[i]
	out := make([]nvml.Device, 0, len(keys))
	for _, k := range keys {
		sum := sha256.Sum256([]byte(fmt.Sprintf("%s/%d/%d", d.UUID, k.gi, k.ci)))
		uuid := fmt.Sprintf("MIG-%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
		md, ok := st.migDevs[uuid]
		if !ok {
			gi, ci := int(k.gi), int(k.ci)
			md = &mock.Device{
				GetUUIDFunc:              func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
				GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return gi, nvml.SUCCESS },
				GetComputeInstanceIdFunc: func() (int, nvml.Return) { return ci, nvml.SUCCESS },
			}
			st.migDevs[uuid] = md
		}
		out = append(out, md)
	}
	return out
}

// noFabric makes a simulated GPU one of a PCIe workstation: no NVLink,
// and no MIG where the model has none (an L4 answers NOT_SUPPORTED, as the
// driver does).
func noFabric(d *server.Device) {
	d.GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) {
		return nvml.FEATURE_DISABLED, nvml.ERROR_NOT_SUPPORTED
	}
	if len(d.Config.MIGProfiles.GpuInstanceProfiles) > 0 {
		return
	}
	d.GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NOT_SUPPORTED }
	d.SetMigModeFunc = func(int) (nvml.Return, nvml.Return) { return nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_NOT_SUPPORTED }
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
}

func simPci(busID string, devID uint32) nvml.PciInfo {
	p := nvml.PciInfo{PciDeviceId: devID}
	var dom, bus, dev, fn uint32
	fmt.Sscanf(busID, "%x:%x:%x.%x", &dom, &bus, &dev, &fn)
	p.Domain, p.Bus, p.Device = dom, bus, dev
	for j := 0; j < len(busID) && j < len(p.BusId)-1; j++ {
		p.BusId[j] = int8(busID[j])
	}
	return p
}

func (h *SimHost) lostOr(i int) nvml.Return {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state[i].lost {
		return nvml.ERROR_GPU_IS_LOST
	}
	return nvml.SUCCESS
}

func (h *SimHost) device(index int) (nvml.Device, error) {
	if index < 0 || index >= len(h.devs) {
		return nil, fmt.Errorf("simulated GPU %d: %w", index, ErrUnknownDevice)
	}
	return h.devs[index], nil
}

// InjectXid delivers a critical Xid event for GPU index, as the driver
// would after a fault. Lost marks the GPU as no longer answering until
// ResetGPU (Xid 79, "fallen off the bus").
func (h *SimHost) InjectXid(index int, xid uint64, lost bool) error {
	d, err := h.device(index)
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.state[index].lost = h.state[index].lost || lost
	h.mu.Unlock()
	h.events <- nvml.EventData{Device: d, EventType: nvml.EventTypeXidCriticalError, EventData: xid,
		GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}
	return nil
}

// InjectMIGXid delivers a critical Xid event contained in GPU instance
// giid of GPU index (the event carries the instance's GpuInstanceId, as
// the driver reports an Xid 94 contained ECC error), for an instance that
// exists now: one of the layout at start or one created later.
func (h *SimHost) InjectMIGXid(index, giid int, xid uint64) error {
	d, err := h.device(index)
	if err != nil {
		return err
	}
	sd := h.devs[index]
	var found bool
	for _, md := range h.migDevices(index, sd.Device) {
		if gi, r := md.GetGpuInstanceId(); r == nvml.SUCCESS && gi == giid {
			found = true
			break
		}
	}
	if !found {
		return fmt.Errorf("simulated GPU %d has no GPU instance %d: %w", index, giid, ErrUnknownDevice)
	}
	h.events <- nvml.EventData{Device: d, EventType: nvml.EventTypeXidCriticalError, EventData: xid,
		GpuInstanceId: uint32(giid), ComputeInstanceId: 0}
	return nil
}

// InjectDoubleBitECC records an uncorrectable ECC error on GPU index and
// delivers the event; the volatile counter stays non-zero until ResetGPU.
func (h *SimHost) InjectDoubleBitECC(index int) error {
	d, err := h.device(index)
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.state[index].dbe++
	h.mu.Unlock()
	h.events <- nvml.EventData{Device: d, EventType: nvml.EventTypeDoubleBitEccError,
		GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}
	return nil
}

// ResetGPU is what an operator's GPU reset does: the GPU answers again and
// its volatile ECC counters are cleared.
func (h *SimHost) ResetGPU(index int) error {
	if _, err := h.device(index); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.state[index].lost = false
	h.state[index].dbe = 0
	return nil
}

// SetUtilization sets the SM utilisation (percent, 0..100) GPU index
// reports from GetUtilizationRates; it reports 0 until set. Its power
// stays what the simulated host reports (simPower).
func (h *SimHost) SetUtilization(index int, smPct uint32) error {
	if _, err := h.device(index); err != nil {
		return err
	}
	if smPct > 100 {
		return fmt.Errorf("simulated GPU %d: SM utilisation %d%%, at most 100", index, smPct)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.state[index].smUtil = smPct
	return nil
}

// MaxSimProcesses bounds the processes SetProcesses takes for one GPU.
const MaxSimProcesses = 1024

// SetProcesses sets the compute processes GPU index reports from
// GetComputeRunningProcesses (what nvidia-smi lists), replacing those set
// before; nil clears them. A process's UsedGpuMemory is in bytes, and
// GpuInstanceId/ComputeInstanceId are 0xFFFFFFFF outside MIG. The
// processes need not exist: the simulated GPU reports what it is told.
func (h *SimHost) SetProcesses(index int, ps []nvml.ProcessInfo) error {
	if _, err := h.device(index); err != nil {
		return err
	}
	if len(ps) > MaxSimProcesses {
		return fmt.Errorf("simulated GPU %d: %d processes, at most %d", index, len(ps), MaxSimProcesses)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.state[index].procs = append([]nvml.ProcessInfo(nil), ps...)
	return nil
}

// SetProcessUsage is SetProcesses for callers outside this package, which
// do not speak NVML: each process's PID and memory in MiB (GIID ≥ 0 puts
// it in that MIG GPU instance, -1 outside MIG).
func (h *SimHost) SetProcessUsage(index int, ps []ProcessUsage) error {
	const none = 0xFFFFFFFF
	out := make([]nvml.ProcessInfo, len(ps))
	for i, p := range ps {
		gi := uint32(none)
		if p.GIID >= 0 {
			gi = uint32(p.GIID)
		}
		out[i] = nvml.ProcessInfo{Pid: p.PID, UsedGpuMemory: p.MemoryMB << 20, GpuInstanceId: gi, ComputeInstanceId: none}
	}
	return h.SetProcesses(index, out)
}

package devices

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Kind names the class of device a driver offers.
type Kind string

const (
	// GPU is a whole GPU (possibly in MIG mode, partitioned into instances).
	GPU Kind = "gpu"
	// FPGA is a reconfigurable FPGA region.
	FPGA Kind = "fpga"
)

// Driver is one device driver as the daemon sees it: what devices it
// offers (Inventory), how they change while the daemon runs (Subscribe),
// and how a job's allocation of them is readied, re-attached and given
// back (Prepare, Reclaim, Release). It follows Nomad's device plugins
// (Fingerprint / Reserve / Stats) and mig-parted's one interface with a
// back end per vendor; devices/nvidia and devices/fpga implement it. The
// daemon holds its drivers in one list and loops over it: nothing outside
// a driver knows the vendor API behind it.
//
// Implementations are safe for concurrent use.
type Driver interface {
	// Kind is the class of every device the driver offers.
	Kind() Kind
	// Inventory lists the driver's devices as they are now: health, MIG
	// layout, loaded bitstream, and the links between them.
	Inventory(ctx context.Context) (Inventory, error)
	// Subscribe calls fn with every update (health transition, telemetry
	// sample, device change) until cancel is called. fn is called from
	// the goroutine that caused the update and must not block or call
	// back into the driver's mutating methods.
	Subscribe(fn func(Update)) (cancel func())
	// Prepare readies a's devices for job jobID (admits a GPU share,
	// creates a MIG instance, programs an FPGA region) and returns what
	// the job must be granted. It fills in what it decided: the instance
	// it created for a.MIG. On error nothing stays taken.
	Prepare(ctx context.Context, jobID string, a *Allocation) (Grant, error)
	// Reclaim takes again what Prepare took for a job re-attached after a
	// daemon restart (a GPU share), so admission counts it.
	Reclaim(ctx context.Context, jobID string, a Allocation) error
	// Release gives back what Prepare or Reclaim took for the job;
	// releasing twice, or a job never prepared, is harmless.
	Release(ctx context.Context, jobID string) error
}

// Runner is implemented by drivers with background work (telemetry
// sampling, a health watch); whoever holds the drivers runs it once.
type Runner interface {
	// Run works until ctx ends and returns nil then.
	Run(ctx context.Context) error
}

// Inventory is what a driver offers.
type Inventory struct {
	Devices []Device `json:"devices"`
	// Links are the direct interconnects between the driver's devices.
	Links []Link `json:"links,omitempty"`
}

// Device is one device as placement needs it.
type Device struct {
	// ID is the ID jobs are allocated (GPU UUID, FPGA region ID).
	ID    string `json:"id"`
	Kind  Kind   `json:"kind"`
	Model string `json:"model,omitempty"`
	// PCI is the device's PCI address (0000:3b:00.0, lower case), "" when
	// unknown.
	PCI string `json:"pci,omitempty"`
	// NUMA is the NUMA node the driver reports, -1 when unknown.
	NUMA     int    `json:"numa"`
	MemoryMB int64  `json:"memory_mb,omitempty"`
	Health   Health `json:"health"`
	// MIG is set for a GPU in MIG mode.
	MIG *MIG `json:"mig,omitempty"`
	// Bitstream is the library ID of the bitstream an FPGA region holds
	// ("" when empty or unknown).
	Bitstream string `json:"bitstream,omitempty"`
	// ReconfigMs is the expected time to reconfigure the device for new
	// work: program a bitstream into a region, create a MIG instance.
	ReconfigMs float64 `json:"reconfig_ms,omitempty"`
	// MPS is set for a GPU whose shares run under CUDA MPS: one user's
	// shares at a time (its control daemon runs one server per user).
	MPS bool `json:"mps,omitempty"`
}

// MIG is a MIG-mode GPU's slots, the profiles it supports and the
// instances that exist.
type MIG struct {
	// Slots is the number of placement slots (NVIDIA's memory slots).
	Slots int `json:"slots"`
	// Profiles maps each supported profile to the slots an instance takes.
	Profiles map[string]int `json:"profiles"`
	// Starts maps a profile to the slots an instance of it may start at
	// (NVIDIA's placements: a 1g instance at 0..6 of 8 memory slots); a
	// profile not in it may start at any multiple of its slots.
	Starts    map[string][]int `json:"starts,omitempty"`
	Instances []MIGInstance    `json:"instances,omitempty"`
}

// MIGInstance is an existing MIG instance.
type MIGInstance struct {
	ID      string `json:"id"`
	Profile string `json:"profile"`
	Start   int    `json:"start"`
	Slots   int    `json:"slots"`
	// Health, when set, is the instance's own health; nil: as its GPU.
	Health *Health `json:"health,omitempty"`
}

// Allocation is a job's allocation of one driver's devices, as the
// placement engine chose it.
type Allocation struct {
	// Devices are the whole devices held (GPU UUIDs, FPGA region IDs).
	Devices []string `json:"devices,omitempty"`
	// Share is a fraction of one device.
	Share *Share `json:"share,omitempty"`
	// MIG is a MIG instance: an existing one, or one Prepare creates.
	MIG *MIGAllocation `json:"mig,omitempty"`
	// Bitstream is the library ID the FPGA regions in Devices must hold.
	Bitstream string `json:"bitstream,omitempty"`
	// Held names the devices (of every driver) that other jobs hold:
	// preparing must not disturb them.
	Held map[string]bool `json:"-"`
}

// Share is a fraction of one device: Milli thousandths of its compute and
// MemoryMB of its memory, for processes running as UID:GID (a driver may
// keep a device to one user's shares at a time, as NVIDIA MPS does).
type Share struct {
	Device   string `json:"device"`
	Milli    int    `json:"milli"`
	MemoryMB int64  `json:"memory_mb,omitempty"`
	UID      uint32 `json:"uid"`
	GID      uint32 `json:"gid"`
}

// MIGAllocation is a MIG instance of Profile on GPU, at slot Start;
// Instance is its UUID, empty until Prepare created it.
type MIGAllocation struct {
	GPU      string `json:"gpu"`
	Profile  string `json:"profile"`
	Start    int    `json:"start"`
	Instance string `json:"instance,omitempty"`
}

// UpdateKind says what an Update reports.
type UpdateKind string

const (
	// HealthChanged: Device's health changed to Health.
	HealthChanged UpdateKind = "health"
	// Telemetry: a fresh utilisation sample of Device.
	Telemetry UpdateKind = "telemetry"
	// DeviceChanged: Device (or, with Device empty, the driver's device
	// set) changed: MIG layout, programmed bitstream, hot-plug or unplug.
	// Read the Inventory again.
	DeviceChanged UpdateKind = "changed"
)

// Update is one live change a driver reports.
type Update struct {
	Kind   UpdateKind `json:"kind"`
	Device string     `json:"device,omitempty"`
	At     time.Time  `json:"at"`
	// Health is set for HealthChanged.
	Health *Health `json:"health,omitempty"`
	// Code is the driver's fault code behind a health change (an NVIDIA
	// Xid), 0 when none.
	Code uint64 `json:"code,omitempty"`
	// Sample is set for Telemetry.
	Sample *Sample `json:"sample,omitempty"`
	// Detail says what changed, for logs.
	Detail string `json:"detail,omitempty"`
}

// Sample is one telemetry reading of a device.
type Sample struct {
	// Util is the compute utilisation, 0..1.
	Util      float64 `json:"util"`
	MemUsedMB int64   `json:"mem_used_mb,omitempty"`
	PowerW    float64 `json:"power_w,omitempty"`
	TempC     float64 `json:"temp_c,omitempty"`
}

// Hub fans updates out to subscribers; drivers embed one to implement
// Subscribe. The zero value is ready to use.
type Hub struct {
	mu   sync.Mutex
	next uint64
	subs map[uint64]func(Update)
}

// Subscribe registers fn until cancel is called.
func (h *Hub) Subscribe(fn func(Update)) (cancel func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs == nil {
		h.subs = map[uint64]func(Update){}
	}
	id := h.next
	h.next++
	h.subs[id] = fn
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.subs, id)
	}
}

// Publish calls every subscriber with u, in subscription order.
func (h *Hub) Publish(u Update) {
	if u.At.IsZero() {
		u.At = time.Now()
	}
	h.mu.Lock()
	ids := make([]uint64, 0, len(h.subs))
	for id := range h.subs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	fns := make([]func(Update), 0, len(ids))
	for _, id := range ids {
		fns = append(fns, h.subs[id])
	}
	h.mu.Unlock()
	for _, fn := range fns {
		fn(u)
	}
}

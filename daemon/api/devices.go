package api

import (
	"time"

	"github.com/fusiond/fusiond/devices"
	"github.com/fusiond/fusiond/topology"
)

// GPUFaultRequest is the body of POST /v1/gpus/{index}/fault (simulated
// hosts only): deliver Xid (Lost: the GPU stops answering until reset), or
// Reset the GPU as an operator would.
type GPUFaultRequest struct {
	Xid   uint64 `json:"xid,omitempty"`
	Lost  bool   `json:"lost,omitempty"`
	Reset bool   `json:"reset,omitempty"`
}

// GPUProcessesRequest is the body of POST /v1/gpus/{index}/processes
// (simulated hosts only): the compute processes the GPU reports from then
// on (NVML's running compute processes, what nvidia-smi lists), replacing
// those set before; none clears them. At most 1024.
type GPUProcessesRequest struct {
	Processes []GPUProcess `json:"processes"`
}

// GPUProcess is one compute process on a GPU: its PID (as the host's PID
// namespace sees it) and the GPU memory it holds.
type GPUProcess struct {
	PID    uint32 `json:"pid"`
	Memory Bytes  `json:"memory"`
}

// GPUList is the body of GET /v1/gpus.
type GPUList struct {
	// Simulated names the simulated host ("dgxh200"); empty on hardware.
	Simulated string `json:"simulated,omitempty"`
	GPUs      []GPU  `json:"gpus"`
	// Notes explain an empty list (no driver).
	Notes []string `json:"notes,omitempty"`
	// Events are the last device health transitions, oldest first.
	Events []Event `json:"events,omitempty"`
}

// GPU is one physical GPU with its health, sharing mode, MIG state and
// latest telemetry.
type GPU struct {
	Index             int            `json:"index"`
	UUID              string         `json:"uuid"`
	Model             string         `json:"model"`
	Memory            Bytes          `json:"memory"`
	BDF               string         `json:"bdf,omitempty"`
	NUMANode          int            `json:"numa_node"`
	ComputeCapability string         `json:"compute_capability,omitempty"`
	PowerLimitW       float64        `json:"power_limit_w,omitempty"`
	Health            devices.Health `json:"health"`
	// ShareMode is how a shared GPU is enforced: mps or time-slicing.
	ShareMode  string `json:"share_mode"`
	MIGCapable bool   `json:"mig_capable"`
	MIGEnabled bool   `json:"mig_enabled"`
	// MIGProfiles are the profile names the GPU supports.
	MIGProfiles []string      `json:"mig_profiles,omitempty"`
	MIG         []MIGInstance `json:"mig,omitempty"`
	Telemetry   *GPUTelemetry `json:"telemetry,omitempty"`
	// Xid is the fault that took an unhealthy GPU out of service and
	// XidMeaning what it means.
	Xid        uint64 `json:"xid,omitempty"`
	XidMeaning string `json:"xid_meaning,omitempty"`
	// ProbationEnds is when an unhealthy GPU that answers healthy again
	// returns to service (absent while it still fails).
	ProbationEnds *time.Time `json:"probation_ends,omitempty"`
	// Sharing is the GPU's sharing state: mode, replicas and the shares
	// admitted on it.
	Sharing *GPUSharing `json:"sharing,omitempty"`
}

// GPUSharing is one GPU's sharing state.
type GPUSharing struct {
	Mode string `json:"mode"`
	// Replicas is the whole-GPU replica count the sharing config gives
	// the GPU (0: not configured).
	Replicas   int              `json:"replicas,omitempty"`
	UsedMilli  int              `json:"used_milli"`
	UsedMemory Bytes            `json:"used_memory"`
	Shares     []GPUShareStatus `json:"shares,omitempty"`
}

// GPUShareStatus is one job's share of a GPU.
type GPUShareStatus struct {
	Job    string `json:"job"`
	Milli  int    `json:"milli"`
	Memory Bytes  `json:"memory,omitempty"`
}

// MIGInstance is one MIG instance on a GPU.
type MIGInstance struct {
	Profile string `json:"profile"`
	// Start is its first memory slot.
	Start int    `json:"start"`
	GIID  int    `json:"gi_id"`
	UUID  string `json:"uuid,omitempty"`
	Busy  bool   `json:"busy,omitempty"`
	// Health is set while the instance itself is out of service (a
	// fault contained in it); an instance of an unhealthy GPU is out with
	// its GPU.
	Health *devices.Health `json:"health,omitempty"`
}

// GPUTelemetry is a GPU's latest sample.
type GPUTelemetry struct {
	At          time.Time `json:"at"`
	SMUtilPct   uint32    `json:"sm_util_pct"`
	MemUtilPct  uint32    `json:"mem_util_pct"`
	MemoryUsed  Bytes     `json:"memory_used"`
	PowerW      float64   `json:"power_w"`
	TempC       uint32    `json:"temp_c"`
	SMClockMHz  uint32    `json:"sm_clock_mhz"`
	MemClockMHz uint32    `json:"mem_clock_mhz"`
	Processes   int       `json:"processes"`
}

// MIGRequest is the body of POST /v1/mig/plan and /v1/mig/apply.
type MIGRequest struct {
	// Layout is a layout file in NVIDIA mig-parted's format (YAML or
	// JSON text).
	Layout string `json:"layout"`
	// Config names one of the layout's mig-configs.
	Config string `json:"config"`
}

// MIGPlan is the answer to a MIG plan or apply.
type MIGPlan struct {
	Config  string      `json:"config"`
	Actions []MIGAction `json:"actions"`
	// ExpectedSeconds is the expected reconfiguration time.
	ExpectedSeconds float64 `json:"expected_seconds"`
	// Applied is true when the actions were carried out.
	Applied bool `json:"applied"`
}

// MIGAction is one step of a MIG plan.
type MIGAction struct {
	// Kind is destroy-instance, set-mig-mode or create-instance.
	Kind    string `json:"kind"`
	GPU     int    `json:"gpu"`
	GPUUUID string `json:"gpu_uuid"`
	Profile string `json:"profile,omitempty"`
	Start   int    `json:"start"`
	GIID    int    `json:"gi_id,omitempty"`
	Enable  bool   `json:"enable,omitempty"`
	// Description is the action in words.
	Description string `json:"description"`
}

// FPGARegion is one reconfigurable FPGA region.
type FPGARegion struct {
	ID      string   `json:"id"`
	Kind    string   `json:"kind"`
	PCI     string   `json:"pci,omitempty"`
	Name    string   `json:"name,omitempty"`
	Accepts []string `json:"accepts"`
	// InterfaceID is the static region's interface UUID.
	InterfaceID string `json:"interface_id,omitempty"`
	// LoadedAFU is the loaded accelerator's ID as the driver reports it.
	LoadedAFU string `json:"loaded_afu,omitempty"`
	// LoadedBitstream is the library ID (sha256) of what it holds.
	LoadedBitstream string         `json:"loaded_bitstream,omitempty"`
	LoadedName      string         `json:"loaded_name,omitempty"`
	State           string         `json:"state,omitempty"`
	Health          devices.Health `json:"health"`
	// Busy is true while the region is being reprogrammed.
	Busy bool `json:"busy"`
	// Held is true while a job holds the region.
	Held bool `json:"held,omitempty"`
}

// FPGAProgramRequest is the body of POST /v1/fpga/regions/{id}/program.
type FPGAProgramRequest struct {
	// Bitstream is a library reference: name, sha256 (or a unique prefix
	// of at least 8 hex digits), or AFU/xclbin UUID.
	Bitstream string `json:"bitstream"`
	// Force reprograms even when the region already holds the bitstream.
	Force bool `json:"force,omitempty"`
}

// FPGAProgramResult is the outcome of programming a region.
type FPGAProgramResult struct {
	Region    string `json:"region"`
	Bitstream string `json:"bitstream"`
	Name      string `json:"name,omitempty"`
	// AlreadyLoaded is true when nothing had to be done.
	AlreadyLoaded bool    `json:"already_loaded"`
	Seconds       float64 `json:"seconds"`
}

// TopologyMatrix is the body of GET /v1/topology/matrix: the distance
// between every pair of accelerators and NICs, in nvidia-smi topo -m's
// vocabulary (X, NV#, PIX, PXB, PHB, NODE, SYS).
type TopologyMatrix struct {
	Devices []MatrixDevice `json:"devices"`
	// Distances[i][j] is the distance between Devices[i] and Devices[j].
	Distances [][]topology.Distance `json:"distances"`
}

// MatrixDevice is one row of the matrix.
type MatrixDevice struct {
	Label    string `json:"label"`
	Addr     string `json:"addr"`
	Kind     string `json:"kind"`
	NUMANode int    `json:"numa_node"`
	// CPUs is the device's local CPU list.
	CPUs string `json:"cpus,omitempty"`
}

package api

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/fusiond/fusiond/devices"
	"github.com/fusiond/fusiond/devices/fpga/bitstream"
	"github.com/fusiond/fusiond/topology"
)

// DeviceBackend serves the host's hardware: topology, GPUs and MIG, FPGA
// regions and the bitstream library. The daemon's host package implements
// it. The server checks admin rights before calling the mutating methods.
type DeviceBackend interface {
	Topology(ctx context.Context) (*topology.Host, error)
	GPUs(ctx context.Context) (GPUList, error)
	// PlanMIG computes the actions that would bring the GPUs to the
	// layout's named config; nothing is changed.
	PlanMIG(ctx context.Context, req MIGRequest) (MIGPlan, error)
	// ApplyMIG plans and applies; GPUs and instances that hold jobs are
	// refused (CodeConflict).
	ApplyMIG(ctx context.Context, req MIGRequest) (MIGPlan, error)
	FPGARegions(ctx context.Context) ([]FPGARegion, error)
	ProgramFPGA(ctx context.Context, region string, req FPGAProgramRequest) (FPGAProgramResult, error)
	Bitstreams(ctx context.Context) ([]bitstream.Bitstream, error)
	// AddBitstream stores the bitstream read from r; fileName (may be
	// empty) helps recognise raw formats by extension.
	AddBitstream(ctx context.Context, r io.Reader, name, fileName string) (bitstream.Bitstream, error)
	RemoveBitstream(ctx context.Context, ref string) (bitstream.Bitstream, error)
	// InjectGPUFault injects a fault into, or resets, a GPU of a
	// simulated host; a live host refuses (CodeConflict).
	InjectGPUFault(ctx context.Context, index int, req GPUFaultRequest) error
}

// GPUFaultRequest is the body of POST /v1/gpus/{index}/fault (simulated
// hosts only): deliver Xid (Lost: the GPU stops answering until reset), or
// Reset the GPU as an operator would.
type GPUFaultRequest struct {
	Xid   uint64 `json:"xid,omitempty"`
	Lost  bool   `json:"lost,omitempty"`
	Reset bool   `json:"reset,omitempty"`
}

// DefaultMaxBitstreamBytes caps bitstream uploads unless configured.
const DefaultMaxBitstreamBytes = 1 << 30

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

// BuildTopologyMatrix computes the matrix WriteMatrix shows for h.
func BuildTopologyMatrix(h *topology.Host) (TopologyMatrix, error) {
	addrs, labels := topology.MatrixDevices(h)
	d, err := topology.NewLocality(h).Matrix(addrs)
	if err != nil {
		return TopologyMatrix{}, err
	}
	m := TopologyMatrix{Devices: make([]MatrixDevice, len(addrs)), Distances: d}
	for i, a := range addrs {
		md := MatrixDevice{Label: labels[i], Addr: string(a), NUMANode: -1}
		if dev := h.Device(a); dev != nil {
			md.Kind, md.NUMANode, md.CPUs = string(dev.Kind), int(dev.Node), dev.LocalCPUs.String()
		}
		m.Devices[i] = md
	}
	return m, nil
}

// deviceHandlers are the device routes' handlers.
func (s *Server) deviceHandlers() map[string]http.HandlerFunc {
	return map[string]http.HandlerFunc{
		"GET /v1/topology":                   s.dev(s.topology),
		"GET /v1/topology/matrix":            s.dev(s.topologyMatrix),
		"GET /v1/gpus":                       s.dev(s.gpus),
		"POST /v1/gpus/{index}/fault":        s.dev(s.admin(s.gpuFault)),
		"POST /v1/mig/plan":                  s.dev(s.mig(false)),
		"POST /v1/mig/apply":                 s.dev(s.admin(s.mig(true))),
		"GET /v1/fpga/regions":               s.dev(s.fpgaRegions),
		"POST /v1/fpga/regions/{id}/program": s.dev(s.admin(s.fpgaProgram)),
		"GET /v1/fpga/bitstreams":            s.dev(s.bitstreams),
		"POST /v1/fpga/bitstreams":           s.dev(s.admin(s.addBitstream)),
		"DELETE /v1/fpga/bitstreams/{ref}":   s.dev(s.admin(s.removeBitstream)),
	}
}

// dev answers 503 when the daemon was built without a device backend.
func (s *Server) dev(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.Devices == nil {
			writeError(w, Errorf(CodeUnavailable, "this daemon serves no devices"))
			return
		}
		h(w, r)
	}
}

// admin refuses callers that are neither root nor in the admin group.
func (s *Server) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !caller(r).Admin {
			writeError(w, Errorf(CodeForbidden, "%s %s is for root or the admin group", r.Method, r.URL.Path))
			return
		}
		h(w, r)
	}
}

func (s *Server) topology(w http.ResponseWriter, r *http.Request) {
	if err := checkQuery(r); err != nil {
		writeError(w, err)
		return
	}
	h, err := s.cfg.Devices.Topology(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, h)
}

func (s *Server) topologyMatrix(w http.ResponseWriter, r *http.Request) {
	if err := checkQuery(r); err != nil {
		writeError(w, err)
		return
	}
	h, err := s.cfg.Devices.Topology(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	m, err := BuildTopologyMatrix(h)
	if err != nil {
		writeError(w, Errorf(CodeInternal, "distance matrix: %v", err))
		return
	}
	writeJSON(w, http.StatusOK, m)
}

func (s *Server) gpuFault(w http.ResponseWriter, r *http.Request) {
	if err := checkQuery(r); err != nil {
		writeError(w, err)
		return
	}
	index, err := strconv.Atoi(r.PathValue("index"))
	if err != nil || index < 0 {
		writeError(w, FieldError("index", "want a GPU index, got %q", r.PathValue("index")))
		return
	}
	body, err := s.readBody(w, r)
	if err != nil {
		writeError(w, err)
		return
	}
	var req GPUFaultRequest
	if err := DecodeStrict(body, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Reset == (req.Xid != 0) {
		writeError(w, FieldError("xid", "give either an Xid or reset: true"))
		return
	}
	s.log.Warn("simulated GPU fault requested", "gpu", index, "xid", req.Xid, "lost", req.Lost, "reset", req.Reset, "uid", caller(r).UID)
	if err := s.cfg.Devices.InjectGPUFault(r.Context(), index, req); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) gpus(w http.ResponseWriter, r *http.Request) {
	if err := checkQuery(r); err != nil {
		writeError(w, err)
		return
	}
	l, err := s.cfg.Devices.GPUs(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, l)
}

// readBody reads a small request body under the request size limit.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, Errorf(CodeTooLarge, "request body larger than %d bytes", s.cfg.MaxBodyBytes)
		}
		return nil, Errorf(CodeBadRequest, "reading body: %v", err)
	}
	return body, nil
}

func (s *Server) mig(apply bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := checkQuery(r); err != nil {
			writeError(w, err)
			return
		}
		body, err := s.readBody(w, r)
		if err != nil {
			writeError(w, err)
			return
		}
		var req MIGRequest
		if err := DecodeStrict(body, &req); err != nil {
			writeError(w, err)
			return
		}
		switch {
		case req.Layout == "":
			writeError(w, FieldError("layout", "required: a mig-parted layout file (version: v1, mig-configs: ...)"))
			return
		case req.Config == "":
			writeError(w, FieldError("config", "required: the name of one of the layout's mig-configs"))
			return
		}
		var plan MIGPlan
		if apply {
			s.log.Info("MIG apply requested", "config", req.Config, "uid", caller(r).UID)
			plan, err = s.cfg.Devices.ApplyMIG(r.Context(), req)
		} else {
			plan, err = s.cfg.Devices.PlanMIG(r.Context(), req)
		}
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, plan)
	}
}

func (s *Server) fpgaRegions(w http.ResponseWriter, r *http.Request) {
	if err := checkQuery(r); err != nil {
		writeError(w, err)
		return
	}
	regions, err := s.cfg.Devices.FPGARegions(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	if regions == nil {
		regions = []FPGARegion{}
	}
	writeJSON(w, http.StatusOK, regions)
}

func (s *Server) fpgaProgram(w http.ResponseWriter, r *http.Request) {
	if err := checkQuery(r); err != nil {
		writeError(w, err)
		return
	}
	body, err := s.readBody(w, r)
	if err != nil {
		writeError(w, err)
		return
	}
	var req FPGAProgramRequest
	if err := DecodeStrict(body, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Bitstream == "" {
		writeError(w, FieldError("bitstream", "required: a bitstream name, sha256 or AFU/xclbin UUID from the library"))
		return
	}
	id := r.PathValue("id")
	s.log.Info("FPGA program requested", "region", id, "bitstream", req.Bitstream, "uid", caller(r).UID)
	res, err := s.cfg.Devices.ProgramFPGA(r.Context(), id, req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) bitstreams(w http.ResponseWriter, r *http.Request) {
	if err := checkQuery(r); err != nil {
		writeError(w, err)
		return
	}
	list, err := s.cfg.Devices.Bitstreams(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	if list == nil {
		list = []bitstream.Bitstream{}
	}
	writeJSON(w, http.StatusOK, list)
}

// addBitstream streams the request body into the library; it is never
// held in memory whole.
func (s *Server) addBitstream(w http.ResponseWriter, r *http.Request) {
	if err := checkQuery(r, "name", "file"); err != nil {
		writeError(w, err)
		return
	}
	limit := s.cfg.MaxBitstreamBytes
	if r.ContentLength > limit {
		writeError(w, Errorf(CodeTooLarge, "bitstream of %d bytes is larger than the %d bytes allowed (max_bitstream_bytes)", r.ContentLength, limit))
		return
	}
	q := r.URL.Query()
	body := http.MaxBytesReader(w, r.Body, limit)
	b, err := s.cfg.Devices.AddBitstream(r.Context(), body, q.Get("name"), q.Get("file"))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			err = Errorf(CodeTooLarge, "bitstream larger than the %d bytes allowed (max_bitstream_bytes)", limit)
		}
		writeError(w, err)
		return
	}
	s.log.Debug("bitstream added", "id", b.ID, "name", b.Name, "size", b.Size, "uid", caller(r).UID)
	writeJSON(w, http.StatusCreated, b)
}

func (s *Server) removeBitstream(w http.ResponseWriter, r *http.Request) {
	if err := checkQuery(r); err != nil {
		writeError(w, err)
		return
	}
	b, err := s.cfg.Devices.RemoveBitstream(r.Context(), r.PathValue("ref"))
	if err != nil {
		writeError(w, err)
		return
	}
	s.log.Debug("bitstream removed", "id", b.ID, "name", b.Name, "uid", caller(r).UID)
	writeJSON(w, http.StatusOK, b)
}

package apiserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/devices/fpga/bitstream"
	"github.com/fusiond/fusiond/topology"
)

// DeviceBackend serves the host's hardware: topology, GPUs and MIG, FPGA
// regions and the bitstream library. The daemon's host package implements
// it. The server checks admin rights before calling the mutating methods.
type DeviceBackend interface {
	Topology(ctx context.Context) (*topology.Host, error)
	GPUs(ctx context.Context) (api.GPUList, error)
	// PlanMIG computes the actions that would bring the GPUs to the
	// layout's named config; nothing is changed.
	PlanMIG(ctx context.Context, req api.MIGRequest) (api.MIGPlan, error)
	// ApplyMIG plans and applies; GPUs and instances that hold jobs are
	// refused (CodeConflict).
	ApplyMIG(ctx context.Context, req api.MIGRequest) (api.MIGPlan, error)
	FPGARegions(ctx context.Context) ([]api.FPGARegion, error)
	ProgramFPGA(ctx context.Context, region string, req api.FPGAProgramRequest) (api.FPGAProgramResult, error)
	Bitstreams(ctx context.Context) ([]bitstream.Bitstream, error)
	// AddBitstream stores the bitstream read from r; fileName (may be
	// empty) helps recognise raw formats by extension.
	AddBitstream(ctx context.Context, r io.Reader, name, fileName string) (bitstream.Bitstream, error)
	RemoveBitstream(ctx context.Context, ref string) (bitstream.Bitstream, error)
	// InjectGPUFault injects a fault into, or resets, a GPU of a
	// simulated host; a live host refuses (CodeConflict).
	InjectGPUFault(ctx context.Context, index int, req api.GPUFaultRequest) error
	// SetGPUProcesses sets the compute processes a GPU of a simulated
	// host reports; a live host refuses (CodeConflict).
	SetGPUProcesses(ctx context.Context, index int, req api.GPUProcessesRequest) error
}

// DefaultMaxBitstreamBytes caps bitstream uploads unless configured.
const DefaultMaxBitstreamBytes = 1 << 30

// BuildTopologyMatrix computes the matrix WriteMatrix shows for h.
func BuildTopologyMatrix(h *topology.Host) (api.TopologyMatrix, error) {
	addrs, labels := topology.MatrixDevices(h)
	d, err := topology.NewLocality(h).Matrix(addrs)
	if err != nil {
		return api.TopologyMatrix{}, err
	}
	m := api.TopologyMatrix{Devices: make([]api.MatrixDevice, len(addrs)), Distances: d}
	for i, a := range addrs {
		md := api.MatrixDevice{Label: labels[i], Addr: string(a), NUMANode: -1}
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
		"POST /v1/gpus/{index}/processes":    s.dev(s.admin(s.gpuProcesses)),
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
			writeError(w, api.Errorf(api.CodeUnavailable, "this daemon serves no devices"))
			return
		}
		h(w, r)
	}
}

// admin refuses callers that are neither root nor in the admin group.
func (s *Server) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !caller(r).Admin {
			writeError(w, api.Errorf(api.CodeForbidden, "%s %s is for root or the admin group", r.Method, r.URL.Path))
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
		writeError(w, api.Errorf(api.CodeInternal, "distance matrix: %v", err))
		return
	}
	writeJSON(w, http.StatusOK, m)
}

// gpuIndexBody reads a simulated GPU's index from the path and the
// request body into v; false (the error written) when either is bad.
func (s *Server) gpuIndexBody(w http.ResponseWriter, r *http.Request, v any) (int, bool) {
	if err := checkQuery(r); err != nil {
		writeError(w, err)
		return 0, false
	}
	index, err := strconv.Atoi(r.PathValue("index"))
	if err != nil || index < 0 {
		writeError(w, api.FieldError("index", "want a GPU index, got %q", r.PathValue("index")))
		return 0, false
	}
	body, err := s.readBody(w, r)
	if err != nil {
		writeError(w, err)
		return 0, false
	}
	if err := api.DecodeStrict(body, v); err != nil {
		writeError(w, err)
		return 0, false
	}
	return index, true
}

func (s *Server) gpuFault(w http.ResponseWriter, r *http.Request) {
	var req api.GPUFaultRequest
	index, ok := s.gpuIndexBody(w, r, &req)
	if !ok {
		return
	}
	if req.Reset == (req.Xid != 0) {
		writeError(w, api.FieldError("xid", "give either an Xid or reset: true"))
		return
	}
	s.log.Warn("simulated GPU fault requested", "gpu", index, "xid", req.Xid, "lost", req.Lost, "reset", req.Reset, "uid", caller(r).UID)
	if err := s.cfg.Devices.InjectGPUFault(r.Context(), index, req); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// maxGPUProcesses bounds a GPUProcessesRequest.
const maxGPUProcesses = 1024

func (s *Server) gpuProcesses(w http.ResponseWriter, r *http.Request) {
	var req api.GPUProcessesRequest
	index, ok := s.gpuIndexBody(w, r, &req)
	if !ok {
		return
	}
	if len(req.Processes) > maxGPUProcesses {
		writeError(w, api.FieldError("processes", "at most %d processes, got %d", maxGPUProcesses, len(req.Processes)))
		return
	}
	for i, p := range req.Processes {
		switch {
		case p.PID == 0:
			writeError(w, api.FieldError(fmt.Sprintf("processes[%d].pid", i), "want a PID above 0"))
			return
		case p.Memory < 0:
			writeError(w, api.FieldError(fmt.Sprintf("processes[%d].memory", i), "must not be negative"))
			return
		}
	}
	s.log.Warn("simulated GPU processes set", "gpu", index, "processes", len(req.Processes), "uid", caller(r).UID)
	if err := s.cfg.Devices.SetGPUProcesses(r.Context(), index, req); err != nil {
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
		var req api.MIGRequest
		if err := api.DecodeStrict(body, &req); err != nil {
			writeError(w, err)
			return
		}
		switch {
		case req.Layout == "":
			writeError(w, api.FieldError("layout", "required: a mig-parted layout file (version: v1, mig-configs: ...)"))
			return
		case req.Config == "":
			writeError(w, api.FieldError("config", "required: the name of one of the layout's mig-configs"))
			return
		}
		var plan api.MIGPlan
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
		regions = []api.FPGARegion{}
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
	var req api.FPGAProgramRequest
	if err := api.DecodeStrict(body, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Bitstream == "" {
		writeError(w, api.FieldError("bitstream", "required: a bitstream name, sha256 or AFU/xclbin UUID from the library"))
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
		writeError(w, api.Errorf(api.CodeTooLarge, "bitstream of %d bytes is larger than the %d bytes allowed (max_bitstream_bytes)", r.ContentLength, limit))
		return
	}
	q := r.URL.Query()
	body := http.MaxBytesReader(w, r.Body, limit)
	b, err := s.cfg.Devices.AddBitstream(r.Context(), body, q.Get("name"), q.Get("file"))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			err = api.Errorf(api.CodeTooLarge, "bitstream larger than the %d bytes allowed (max_bitstream_bytes)", limit)
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

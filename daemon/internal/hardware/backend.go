package hardware

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/apiserver"
	"github.com/fusiond/fusiond/devices/fpga"
	"github.com/fusiond/fusiond/devices/fpga/bitstream"
	"github.com/fusiond/fusiond/devices/nvidia"
	"github.com/fusiond/fusiond/topology"
)

// Holders reports the devices that jobs hold: GPU UUIDs, MIG device UUIDs
// and FPGA region IDs of placed and running jobs. MIG apply and FPGA
// programming refuse to touch them. The job manager satisfies it once
// allocations carry devices; until then the daemon passes NoneHeld.
type Holders interface {
	HeldDevices() map[string]bool
}

// NoneHeld is a Holders for a daemon whose placer hands out no devices.
type NoneHeld struct{}

// HeldDevices reports nothing held.
func (NoneHeld) HeldDevices() map[string]bool { return nil }

var _ Holders = NoneHeld{}

// Backend serves the host to the API's device routes.
type Backend struct {
	h    *Host
	held Holders
}

var _ apiserver.DeviceBackend = (*Backend)(nil)

// NewBackend returns the API backend for h; held may be nil (nothing held).
func NewBackend(h *Host, held Holders) *Backend {
	if held == nil {
		held = NoneHeld{}
	}
	return &Backend{h: h, held: held}
}

// Topology returns the current host model.
func (b *Backend) Topology(context.Context) (*topology.Host, error) { return b.h.Topology(), nil }

// GPUs lists the GPUs with health, share mode, MIG instances and the
// latest telemetry.
func (b *Backend) GPUs(ctx context.Context) (api.GPUList, error) {
	out := api.GPUList{Simulated: b.h.Simulated(), GPUs: []api.GPU{}}
	m := b.h.GPUs()
	if m == nil {
		out.Notes = b.h.Notes()
		return out, nil
	}
	st, err := m.State(ctx, nvidia.Busy(b.held.HeldDevices()))
	if err != nil {
		return out, api.Errorf(api.CodeInternal, "reading MIG state: %v", err)
	}
	instances := map[string][]nvidia.Instance{}
	for _, g := range st.GPUs {
		instances[g.UUID] = g.Instances
	}
	samples := map[string]nvidia.Sample{}
	for _, s := range b.h.Telemetry() {
		samples[s.UUID] = s
	}
	sharing := map[string]nvidia.ShareStatus{}
	for _, s := range m.ShareStatuses() {
		sharing[s.GPU] = s
	}
	out.Events = b.h.HealthEvents()
	for _, g := range m.Status().GPUs {
		ag := api.GPU{
			Index: g.Index, UUID: g.UUID, Model: g.Model, Memory: api.Bytes(g.MemoryMB << 20),
			BDF: g.BDF, NUMANode: g.NUMANode, ComputeCapability: g.ComputeCapability,
			PowerLimitW: g.PowerLimitW, Health: g.Health, ShareMode: string(g.ShareMode),
			MIGCapable: g.MIGCapable, MIGEnabled: g.MIGEnabled,
		}
		for _, p := range g.Profiles {
			ag.MIGProfiles = append(ag.MIGProfiles, p.Name)
		}
		for _, in := range instances[g.UUID] {
			ai := api.MIGInstance{Profile: in.Profile, Start: in.Start, GIID: in.GIID, UUID: in.UUID, Busy: in.Busy}
			if h := m.Health(in.UUID); in.UUID != "" && !h.Healthy {
				ai.Health = &h
			}
			ag.MIG = append(ag.MIG, ai)
		}
		if s, ok := samples[g.UUID]; ok {
			ag.Telemetry = &api.GPUTelemetry{
				At: s.At, SMUtilPct: s.SMUtil, MemUtilPct: s.MemUtil, MemoryUsed: api.Bytes(s.MemUsedMB << 20),
				PowerW: s.PowerW, TempC: s.TempC, SMClockMHz: s.SMClockMHz, MemClockMHz: s.MemClockMHz,
				Processes: len(s.Processes),
			}
		}
		if !g.Health.Healthy {
			if e, ok := b.h.lastFault(g.UUID); ok && e.Xid != 0 {
				ag.Xid, ag.XidMeaning = e.Xid, nvidia.XidMeaning(e.Xid)
			}
			ag.ProbationEnds = b.h.probationEnds(g.UUID)
		}
		if s, ok := sharing[g.UUID]; ok {
			ag.Sharing = gpuSharing(s)
		}
		out.GPUs = append(out.GPUs, ag)
	}
	return out, nil
}

func gpuSharing(s nvidia.ShareStatus) *api.GPUSharing {
	out := &api.GPUSharing{Mode: string(s.Mode), Replicas: s.Replicas, UsedMilli: s.UsedMilli, UsedMemory: api.Bytes(s.UsedMemMB << 20)}
	for _, sh := range s.Shares {
		out.Shares = append(out.Shares, api.GPUShareStatus{Job: sh.ID, Milli: sh.Milli, Memory: api.Bytes(sh.MemoryMB << 20)})
	}
	return out
}

// InjectGPUFault delivers an Xid to, or resets, a simulated GPU.
func (b *Backend) InjectGPUFault(_ context.Context, index int, req api.GPUFaultRequest) error {
	var err error
	if req.Reset {
		err = b.h.ResetSimulatedGPU(index)
	} else {
		err = b.h.InjectGPUFault(index, req.Xid, req.Lost)
	}
	return simulatedError(err, api.CodeInternal)
}

// simulatedError is the API error of a request to a simulated GPU:
// conflict on a live host, not found for an unknown index, other for the
// rest (nil for nil).
func simulatedError(err error, other string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrNotSimulated):
		return api.Errorf(api.CodeConflict, "%v; this host's GPUs are real", err)
	case errors.Is(err, nvidia.ErrUnknownDevice):
		return api.Errorf(api.CodeNotFound, "%v", err)
	}
	return api.Errorf(other, "%v", err)
}

// SetGPUProcesses sets the compute processes a simulated GPU reports.
func (b *Backend) SetGPUProcesses(_ context.Context, index int, req api.GPUProcessesRequest) error {
	ps := make([]nvidia.ProcessUsage, len(req.Processes))
	for i, p := range req.Processes {
		ps[i] = nvidia.ProcessUsage{PID: p.PID, MemoryMB: uint64(max(p.Memory, 0)) >> 20, GIID: -1}
	}
	return simulatedError(b.h.SetSimulatedGPUProcesses(index, ps), api.CodeInvalid)
}

// PlanMIG plans the request's layout config against the current MIG state.
func (b *Backend) PlanMIG(ctx context.Context, req api.MIGRequest) (api.MIGPlan, error) {
	plan, _, err := b.planMIG(ctx, req)
	return plan, err
}

// ApplyMIG plans and applies the request's layout config; devices that
// jobs hold are never touched (the plan is refused instead).
func (b *Backend) ApplyMIG(ctx context.Context, req api.MIGRequest) (api.MIGPlan, error) {
	plan, acts, err := b.planMIG(ctx, req)
	if err != nil {
		return plan, err
	}
	if err := b.h.GPUs().Apply(ctx, acts, nvidia.Busy(b.held.HeldDevices())); err != nil {
		return plan, migError(err)
	}
	plan.Applied = true
	return plan, nil
}

func (b *Backend) planMIG(ctx context.Context, req api.MIGRequest) (api.MIGPlan, []nvidia.Action, error) {
	plan := api.MIGPlan{Config: req.Config, Actions: []api.MIGAction{}}
	m := b.h.GPUs()
	if m == nil || len(m.GPUs()) == 0 {
		return plan, nil, &api.Error{Code: api.CodeUnsatisfiable, Message: "this host has no GPUs"}
	}
	lf, err := nvidia.ParseLayout([]byte(req.Layout))
	if err != nil {
		return plan, nil, api.FieldError("layout", "%s", strings.TrimPrefix(err.Error(), "nvidia: "))
	}
	if !slices.Contains(lf.ConfigNames(), req.Config) {
		return plan, nil, api.FieldError("config", "the layout has no mig-config %q (it has: %s)", req.Config, strings.Join(lf.ConfigNames(), ", "))
	}
	target, err := lf.Resolve(req.Config, m.GPUs())
	if err != nil {
		return plan, nil, api.FieldError("layout", "%s", strings.TrimPrefix(err.Error(), "nvidia: "))
	}
	st, err := m.State(ctx, nvidia.Busy(b.held.HeldDevices()))
	if err != nil {
		return plan, nil, api.Errorf(api.CodeInternal, "reading MIG state: %v", err)
	}
	acts, err := nvidia.Plan(st, target)
	if err != nil {
		return plan, nil, migError(err)
	}
	for _, a := range acts {
		plan.Actions = append(plan.Actions, api.MIGAction{
			Kind: string(a.Kind), GPU: a.GPU, GPUUUID: a.GPUUUID, Profile: a.Profile, Start: a.Start,
			GIID: a.GIID, Enable: a.Enable, Description: a.String(),
		})
	}
	plan.ExpectedSeconds = nvidia.PlanCost(acts).Seconds()
	return plan, acts, nil
}

// migError maps MIG planning and apply errors to API errors.
func migError(err error) error {
	msg := strings.TrimPrefix(err.Error(), "nvidia: ")
	switch {
	case errors.Is(err, nvidia.ErrBusy), errors.Is(err, nvidia.ErrMIGPending):
		return api.Errorf(api.CodeConflict, "%s", msg)
	case errors.Is(err, nvidia.ErrNoCapacity), errors.Is(err, nvidia.ErrUnknownProfile):
		return &api.Error{Code: api.CodeUnsatisfiable, Field: "layout", Message: msg}
	case errors.Is(err, nvidia.ErrLayout):
		return api.FieldError("layout", "%s", msg)
	}
	return api.Errorf(api.CodeInternal, "MIG: %v", err)
}

// FPGARegions lists the FPGA regions.
func (b *Backend) FPGARegions(ctx context.Context) ([]api.FPGARegion, error) {
	held := b.held.HeldDevices()
	out := []api.FPGARegion{}
	for _, r := range b.h.regionStatuses(ctx) {
		ar := api.FPGARegion{
			ID: r.ID, Kind: string(r.Kind), PCI: r.PCI, Name: r.Name, LoadedBitstream: r.LoadedBitstream,
			LoadedName: r.LoadedName, State: r.State, Health: r.Health, Busy: r.Busy, Held: held[r.ID],
		}
		for _, f := range r.Accepts {
			ar.Accepts = append(ar.Accepts, string(f))
		}
		if !r.InterfaceID.IsZero() {
			ar.InterfaceID = r.InterfaceID.String()
		}
		if !r.Loaded.AFUID.IsZero() {
			ar.LoadedAFU = r.Loaded.AFUID.String()
		}
		out = append(out, ar)
	}
	return out, nil
}

// ProgramFPGA programs a region with a library bitstream; a region that a
// job holds is refused.
func (b *Backend) ProgramFPGA(ctx context.Context, region string, req api.FPGAProgramRequest) (api.FPGAProgramResult, error) {
	m := b.h.FPGAs()
	if m == nil {
		return api.FPGAProgramResult{}, api.Errorf(api.CodeNotFound, "no FPGA region %q: this host has no FPGAs", region)
	}
	if b.held.HeldDevices()[region] {
		return api.FPGAProgramResult{}, api.Errorf(api.CodeConflict, "FPGA region %s is held by a job; it cannot be reprogrammed until the job ends", region)
	}
	var opts []fpga.ProgramOption
	if req.Force {
		opts = append(opts, fpga.Force())
	}
	res, err := m.Program(ctx, region, req.Bitstream, opts...)
	if err != nil {
		return api.FPGAProgramResult{}, fpgaError(err, region)
	}
	out := api.FPGAProgramResult{Region: res.Region, Bitstream: res.Bitstream, AlreadyLoaded: res.AlreadyLoaded, Seconds: res.Duration.Seconds()}
	if bs, err := b.h.Library().Get(res.Bitstream); err == nil {
		out.Name = bs.Name
	}
	return out, nil
}

// fpgaError maps FPGA and bitstream library errors to API errors.
func fpgaError(err error, region string) error {
	msg := err.Error()
	switch {
	case errors.Is(err, fpga.ErrNoRegion):
		return api.Errorf(api.CodeNotFound, "no FPGA region %q (see fusionctl fpga list)", region)
	case errors.Is(err, bitstream.ErrNotFound):
		return &api.Error{Code: api.CodeNotFound, Field: "bitstream", Message: msg + " (see fusionctl fpga bitstream list)"}
	case errors.Is(err, bitstream.ErrAmbiguous):
		return api.FieldError("bitstream", "%s", msg)
	case errors.Is(err, fpga.ErrIncompatible):
		return api.FieldError("bitstream", "%s", msg)
	case errors.Is(err, fpga.ErrBusy):
		return api.Errorf(api.CodeConflict, "%s", msg)
	case errors.Is(err, fpga.ErrUnsupported):
		return api.Errorf(api.CodeUnsatisfiable, "%s", msg)
	case errors.Is(err, fpga.ErrProgram):
		return api.Errorf(api.CodeInternal, "%s (the region is marked unhealthy until a programming succeeds)", msg)
	}
	return api.Errorf(api.CodeInternal, "FPGA: %v", err)
}

// Bitstreams lists the library.
func (b *Backend) Bitstreams(context.Context) ([]bitstream.Bitstream, error) {
	list, err := b.h.Library().List()
	if err != nil {
		return nil, api.Errorf(api.CodeInternal, "bitstream library: %v", err)
	}
	return list, nil
}

// AddBitstream streams r into the library.
func (b *Backend) AddBitstream(_ context.Context, r io.Reader, name, fileName string) (bitstream.Bitstream, error) {
	if name == "" {
		// As the library's AddFile: the file's base name without extension.
		base := filepath.Base(fileName)
		name = strings.TrimSuffix(base, filepath.Ext(base))
		if fileName == "" {
			return bitstream.Bitstream{}, api.FieldError("name", "required (or a file name to take it from)")
		}
	}
	bs, err := b.h.Library().Add(r, name, fileName)
	switch {
	case err == nil:
		return bs, nil
	case errors.Is(err, bitstream.ErrNameTaken):
		return bs, &api.Error{Code: api.CodeConflict, Field: "name", Message: err.Error()}
	case errors.Is(err, bitstream.ErrDuplicate):
		return bs, &api.Error{Code: api.CodeConflict, Field: "body", Message: err.Error()}
	case errors.Is(err, bitstream.ErrInvalidName):
		return bs, api.FieldError("name", "%v", err)
	case errors.Is(err, bitstream.ErrUnknownFormat), errors.Is(err, bitstream.ErrMalformed):
		return bs, api.FieldError("body", "%v", err)
	}
	// A size-limit error from the request body passes through unwrapped
	// for the server to turn into 413.
	return bs, fmt.Errorf("adding bitstream: %w", err)
}

// RemoveBitstream removes a bitstream from the library.
func (b *Backend) RemoveBitstream(_ context.Context, ref string) (bitstream.Bitstream, error) {
	bs, err := b.h.Library().Remove(ref)
	switch {
	case err == nil:
		return bs, nil
	case errors.Is(err, bitstream.ErrNotFound):
		return bs, api.Errorf(api.CodeNotFound, "%v", err)
	case errors.Is(err, bitstream.ErrAmbiguous):
		return bs, api.FieldError("ref", "%v", err)
	}
	return bs, api.Errorf(api.CodeInternal, "bitstream library: %v", err)
}

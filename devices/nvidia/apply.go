package nvidia

import (
	"context"
	"fmt"
	"slices"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/fusiond/fusiond/devices"
)

// Busy is the set of UUIDs (GPU or MIG device) that hold work.
type Busy map[string]bool

// State reads the MIG state of every GPU, marking what busy names.
func (m *Manager) State(ctx context.Context, busy Busy) (State, error) {
	m.mu.Lock()
	gpus, handles := m.gpus, m.handles
	m.mu.Unlock()
	st := State{GPUs: make([]GPUState, 0, len(gpus))}
	for i, g := range gpus {
		if err := ctx.Err(); err != nil {
			return State{}, err
		}
		gs, err := readGPUState(g, handles[i])
		if err != nil {
			return State{}, fmt.Errorf("gpu %d: %w", g.Index, err)
		}
		gs.Busy = busy[g.UUID]
		gs.Unhealthy = !m.Healthy(g.UUID)
		for k := range gs.Instances {
			gs.Instances[k].Busy = gs.Instances[k].UUID != "" && busy[gs.Instances[k].UUID]
		}
		st.GPUs = append(st.GPUs, gs)
	}
	return st, nil
}

func readGPUState(g GPU, d nvml.Device) (GPUState, error) {
	gs := GPUState{Index: g.Index, UUID: g.UUID, Profiles: g.Profiles}
	if !g.MIGCapable {
		return gs, nil
	}
	cur, err := call("GetMigMode", func() (int, nvml.Return) {
		c, _, r := d.GetMigMode()
		return c, r
	})
	if err != nil {
		return gs, err
	}
	gs.MIGEnabled = cur == nvml.DEVICE_MIG_ENABLE
	if !gs.MIGEnabled {
		return gs, nil
	}
	migs := migDevices(d)
	for _, p := range g.Profiles {
		gis, err := listGIs(d, p.ID)
		if err != nil {
			return gs, err
		}
		for _, gi := range gis {
			info, err := call("GpuInstance.GetInfo", gi.GetInfo)
			if err != nil {
				return gs, err
			}
			gs.Instances = append(gs.Instances, Instance{
				GIID: int(info.Id), Profile: p.Name,
				Start: int(info.Placement.Start), Size: p.MemSlots,
				UUID: migs[int(info.Id)].uuid,
			})
		}
	}
	sort.Slice(gs.Instances, func(a, b int) bool { return gs.Instances[a].Start < gs.Instances[b].Start })
	return gs, nil
}

func listGIs(d nvml.Device, profileID int) ([]nvml.GpuInstance, error) {
	info, err := call("GetGpuInstanceProfileInfo", func() (nvml.GpuInstanceProfileInfo, nvml.Return) {
		return d.GetGpuInstanceProfileInfo(profileID)
	})
	if err != nil {
		return nil, err
	}
	return call("GetGpuInstances", func() ([]nvml.GpuInstance, nvml.Return) { return d.GetGpuInstances(&info) })
}

type migDev struct {
	uuid string
	ci   int
}

// migDevices maps GPU-instance id to the MIG device of its (first)
// compute instance.
func migDevices(d nvml.Device) map[int]migDev {
	out := map[int]migDev{}
	n, err := call("GetMaxMigDeviceCount", d.GetMaxMigDeviceCount)
	if err != nil {
		return out
	}
	for i := 0; i < n; i++ {
		md, err := call("GetMigDeviceHandleByIndex", func() (nvml.Device, nvml.Return) { return d.GetMigDeviceHandleByIndex(i) })
		if err != nil {
			continue
		}
		gi, err1 := call("GetGpuInstanceId", md.GetGpuInstanceId)
		ci, err2 := call("GetComputeInstanceId", md.GetComputeInstanceId)
		uuid, err3 := call("GetUUID", md.GetUUID)
		if err1 == nil && err2 == nil && err3 == nil {
			if _, dup := out[gi]; !dup {
				out[gi] = migDev{uuid: uuid, ci: ci}
			}
		}
	}
	return out
}

// Apply performs a plan. It is idempotent: an action whose effect is
// already present (instance exists at that slot, instance already gone,
// MIG mode already set) is skipped, so applying a plan twice, or after a
// partial failure, converges. It refuses actions on a GPU or instance that
// busy names.
func (m *Manager) Apply(ctx context.Context, actions []Action, busy Busy) error {
	var touched []string
	defer func() {
		// Even a partial apply changed the layout of the GPUs it reached.
		for _, uuid := range touched {
			m.hub.Publish(devices.Update{Kind: devices.DeviceChanged, Device: uuid, Detail: "MIG layout changed"})
		}
	}()
	for _, a := range actions {
		if err := ctx.Err(); err != nil {
			return err
		}
		g, d, err := m.gpu(a.GPUUUID)
		if err != nil {
			return err
		}
		if !slices.Contains(touched, g.UUID) {
			touched = append(touched, g.UUID)
		}
		if err := m.applyOne(g, d, a, busy); err != nil {
			return fmt.Errorf("%s: %w", a, err)
		}
		m.log.Info("nvidia: mig", "action", a.String())
	}
	_, err := m.Refresh(ctx)
	return err
}

func (m *Manager) applyOne(g GPU, d nvml.Device, a Action, busy Busy) error {
	st, err := readGPUState(g, d)
	if err != nil {
		return err
	}
	switch a.Kind {
	case SetMIGMode:
		if st.MIGEnabled == a.Enable {
			return nil
		}
		if busy[g.UUID] {
			return ErrBusy
		}
		mode := nvml.DEVICE_MIG_DISABLE
		if a.Enable {
			mode = nvml.DEVICE_MIG_ENABLE
		}
		if err := call0("SetMigMode", func() nvml.Return {
			_, r := d.SetMigMode(mode)
			return r
		}); err != nil {
			return err
		}
		cur, err := call("GetMigMode", func() (int, nvml.Return) {
			c, _, r := d.GetMigMode()
			return c, r
		})
		if err != nil {
			return err
		}
		if cur != mode {
			// The driver accepted the change but applies it only after a
			// GPU reset, which fusiond never does by itself.
			return ErrMIGPending
		}
		return nil
	case DestroyInstance:
		for _, in := range st.Instances {
			if in.GIID != a.GIID || in.Profile != a.Profile {
				continue
			}
			if busy[g.UUID] || (in.UUID != "" && busy[in.UUID]) {
				return ErrBusy
			}
			return destroyGI(d, g.Profiles, a)
		}
		return nil // already gone
	case CreateInstance:
		p, ok := g.Profiles.ByName(a.Profile)
		if !ok {
			return fmt.Errorf("%q: %w", a.Profile, ErrUnknownProfile)
		}
		for _, in := range st.Instances {
			if in.Profile == a.Profile && in.Start == a.Start {
				return nil // already there
			}
		}
		// Our rules, not the device's, decide capacity: the mock accepts
		// anything.
		if _, ok := placeAt(g.Profiles, st.Instances, p, a.Start); !ok || !startAllowed(p, a.Start) || overlaps(st.Instances, a.Start, p.MemSlots) {
			return fmt.Errorf("%s at slot %d: %w", a.Profile, a.Start, ErrNoCapacity)
		}
		return createGI(d, p, a.Start)
	}
	return fmt.Errorf("unknown action kind %q", a.Kind)
}

func startAllowed(p Profile, s int) bool {
	for _, x := range p.Starts() {
		if x == s {
			return true
		}
	}
	return false
}

func overlaps(insts []Instance, start, size int) bool {
	m := slotMask(start, size)
	for _, in := range insts {
		if slotMask(in.Start, in.Size)&m != 0 {
			return true
		}
	}
	return false
}

func createGI(d nvml.Device, p Profile, start int) error {
	info, err := call("GetGpuInstanceProfileInfo", func() (nvml.GpuInstanceProfileInfo, nvml.Return) {
		return d.GetGpuInstanceProfileInfo(p.ID)
	})
	if err != nil {
		return err
	}
	pl := nvml.GpuInstancePlacement{Start: uint32(start), Size: uint32(p.MemSlots)}
	gi, err := call("CreateGpuInstanceWithPlacement", func() (nvml.GpuInstance, nvml.Return) {
		return d.CreateGpuInstanceWithPlacement(&info, &pl)
	})
	if err != nil {
		return err
	}
	ci, err := fullComputeProfile(gi, p.Slices)
	if err != nil {
		_ = call0("GpuInstance.Destroy", gi.Destroy)
		return err
	}
	if _, err := call("CreateComputeInstance", func() (nvml.ComputeInstance, nvml.Return) {
		return gi.CreateComputeInstance(&ci)
	}); err != nil {
		_ = call0("GpuInstance.Destroy", gi.Destroy)
		return err
	}
	return nil
}

// fullComputeProfile finds the compute-instance profile spanning the whole
// GPU instance.
func fullComputeProfile(gi nvml.GpuInstance, slices int) (nvml.ComputeInstanceProfileInfo, error) {
	for id := 0; id < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; id++ {
		info, err := call("GetComputeInstanceProfileInfo", func() (nvml.ComputeInstanceProfileInfo, nvml.Return) {
			return gi.GetComputeInstanceProfileInfo(id, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		})
		if err == nil && int(info.SliceCount) == slices {
			return info, nil
		}
	}
	return nvml.ComputeInstanceProfileInfo{}, fmt.Errorf("no %d-slice compute instance profile: %w", slices, ErrNotSupported)
}

func destroyGI(d nvml.Device, ps ProfileSet, a Action) error {
	p, ok := ps.ByName(a.Profile)
	if !ok {
		return fmt.Errorf("%q: %w", a.Profile, ErrUnknownProfile)
	}
	gis, err := listGIs(d, p.ID)
	if err != nil {
		return err
	}
	for _, gi := range gis {
		info, err := call("GpuInstance.GetInfo", gi.GetInfo)
		if err != nil || int(info.Id) != a.GIID {
			continue
		}
		for id := 0; id < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; id++ {
			ciInfo, err := call("GetComputeInstanceProfileInfo", func() (nvml.ComputeInstanceProfileInfo, nvml.Return) {
				return gi.GetComputeInstanceProfileInfo(id, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
			})
			if err != nil {
				continue
			}
			cis, err := call("GetComputeInstances", func() ([]nvml.ComputeInstance, nvml.Return) { return gi.GetComputeInstances(&ciInfo) })
			if err != nil {
				continue
			}
			for _, ci := range cis {
				if err := call0("ComputeInstance.Destroy", ci.Destroy); err != nil {
					return err
				}
			}
		}
		return call0("GpuInstance.Destroy", gi.Destroy)
	}
	return nil
}

// ApplyOnDemand performs an on-demand candidate and returns the instance it
// created (with its MIG UUID, for the job's grant).
func (m *Manager) ApplyOnDemand(ctx context.Context, c Candidate, busy Busy) (Instance, error) {
	if len(c.Actions) == 0 || c.Actions[len(c.Actions)-1].Kind != CreateInstance {
		return Instance{}, fmt.Errorf("on-demand candidate without a create: %w", ErrNoCapacity)
	}
	if err := m.Apply(ctx, c.Actions, busy); err != nil {
		return Instance{}, err
	}
	want := c.Actions[len(c.Actions)-1]
	g, d, err := m.gpu(c.GPUUUID)
	if err != nil {
		return Instance{}, err
	}
	st, err := readGPUState(g, d)
	if err != nil {
		return Instance{}, err
	}
	for _, in := range st.Instances {
		if in.Profile == want.Profile && in.Start == want.Start {
			return in, nil
		}
	}
	return Instance{}, fmt.Errorf("%s: instance not found after apply: %w", want, ErrNoCapacity)
}

package hardware

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/devices"
	"github.com/fusiond/fusiond/devices/nvidia"
)

// maxHealthEvents is how many device health transitions the host keeps
// for `fusionctl gpu list` and node status.
const maxHealthEvents = 32

// ErrNotSimulated is returned by the fault-injection methods on a live host.
var ErrNotSimulated = errors.New("faults can only be injected into a simulated host")

// healthLog keeps the recent device health transitions and the handlers
// that want them.
type healthLog struct {
	events   []api.Event
	handlers []func(api.Event)
}

// OnHealth registers fn to be called, from the health watch, with every
// health transition of a GPU or MIG instance (a device event: Device,
// Healthy, Xid, Reason). Register before relying on it; transitions that
// happened earlier are in HealthEvents and in GPUs().Healthy.
func (h *Host) OnHealth(fn func(api.Event)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.health.handlers = append(h.health.handlers, fn)
}

// HealthEvents returns the last device health transitions, oldest first.
func (h *Host) HealthEvents() []api.Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.health.events)
}

// healthEvent turns a driver's health transition into a device event.
func healthEvent(u devices.Update) api.Event {
	healthy := u.Health.Healthy
	return api.Event{Time: u.At.UTC(), Kind: api.EventDevice, Device: u.Device, Healthy: &healthy, Xid: u.Code, Reason: u.Health.Reason}
}

// noteHealth logs, records and hands out one transition.
func (h *Host) noteHealth(u devices.Update) {
	if u.Health.Healthy {
		h.log.Info("device back in service", "device", u.Device, "reason", u.Health.Reason)
	} else {
		h.log.Warn("device unhealthy: no new work is placed on it", "device", u.Device, "code", u.Code, "reason", u.Health.Reason)
	}
	ev := healthEvent(u)
	h.mu.Lock()
	h.health.events = append(h.health.events, ev)
	if n := len(h.health.events); n > maxHealthEvents {
		h.health.events = slices.Clone(h.health.events[n-maxHealthEvents:])
	}
	handlers := slices.Clone(h.health.handlers)
	h.mu.Unlock()
	for _, fn := range handlers {
		fn(ev)
	}
}

// lastFault is the most recent unhealthy event of a device, if any.
func (h *Host) lastFault(uuid string) (api.Event, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := len(h.health.events) - 1; i >= 0; i-- {
		if e := h.health.events[i]; e.Device == uuid && e.Healthy != nil && !*e.Healthy {
			return e, true
		}
	}
	return api.Event{}, false
}

// InjectGPUFault delivers a critical Xid on simulated GPU index, as the
// driver would after a fault; lost makes the GPU stop answering until
// ResetSimulatedGPU. Live hosts refuse with ErrNotSimulated.
func (h *Host) InjectGPUFault(index int, xid uint64, lost bool) error {
	if h.gpuSim == nil {
		return ErrNotSimulated
	}
	if err := h.gpuSim.InjectXid(index, xid, lost); err != nil {
		return fmt.Errorf("inject Xid %d: %w", xid, err)
	}
	return nil
}

// InjectMIGFault delivers a critical Xid contained in the MIG instance
// with UUID instance (one of the layout at start or one created on demand
// since) on the simulated host, as the driver reports it: on the
// instance's GPU, with the instance's GPU-instance id. Live hosts refuse
// with ErrNotSimulated.
func (h *Host) InjectMIGFault(ctx context.Context, instance string, xid uint64) error {
	if h.gpuSim == nil || h.gpus == nil {
		return ErrNotSimulated
	}
	st, err := h.gpus.State(ctx, nil)
	if err != nil {
		return fmt.Errorf("inject Xid %d into %s: reading MIG state: %w", xid, instance, err)
	}
	for _, g := range st.GPUs {
		for _, in := range g.Instances {
			if in.UUID == instance {
				if err := h.gpuSim.InjectMIGXid(g.Index, in.GIID, xid); err != nil {
					return fmt.Errorf("inject Xid %d into %s: %w", xid, instance, err)
				}
				return nil
			}
		}
	}
	return fmt.Errorf("inject Xid %d into %s: %w", xid, instance, nvidia.ErrUnknownDevice)
}

// ResetSimulatedGPU is an operator's GPU reset on the simulated host: the
// GPU answers again, and returns to service after the probation.
func (h *Host) ResetSimulatedGPU(index int) error {
	if h.gpuSim == nil {
		return ErrNotSimulated
	}
	return h.gpuSim.ResetGPU(index)
}

// probationEnds is when a recovering device returns to service.
func (h *Host) probationEnds(uuid string) *time.Time {
	if h.gpus == nil {
		return nil
	}
	t, ok := h.gpus.ProbationEnds(uuid)
	if !ok {
		return nil
	}
	t = t.UTC()
	return &t
}

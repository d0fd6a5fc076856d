package nvidia

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/fusiond/fusiond/devices"
)

// ErrUnhealthy means the GPU or MIG instance is out of service.
var ErrUnhealthy = errors.New("nvidia: GPU is unhealthy")

// xidMeanings are the Xids fusiond names (NVIDIA "Xid Errors" catalogue).
var xidMeanings = map[uint64]string{
	13:  "graphics engine exception",
	31:  "GPU memory page fault",
	43:  "GPU stopped processing",
	45:  "preemptive cleanup, due to previous errors",
	48:  "double-bit ECC error",
	61:  "internal micro-controller breakpoint/warning",
	62:  "internal micro-controller halt",
	63:  "ECC page retirement or row remapping recording event",
	64:  "ECC page retirement or row remapping recording failure",
	68:  "NVDEC0 exception",
	69:  "graphics engine class error",
	74:  "NVLink error",
	79:  "GPU has fallen off the bus",
	92:  "high single-bit ECC error rate",
	94:  "contained ECC error",
	95:  "uncontained ECC error",
	109: "context switch timeout",
	119: "GSP RPC timeout",
	120: "GSP error",
	140: "unrecovered ECC error",
}

// applicationXids are caused by the application, not the GPU; like NVIDIA's
// device plugin, fusiond does not take the GPU out of service for them.
var applicationXids = map[uint64]bool{13: true, 31: true, 43: true, 45: true, 68: true, 109: true}

// XidMeaning returns the short meaning of an Xid.
func XidMeaning(xid uint64) string {
	if s, ok := xidMeanings[xid]; ok {
		return s
	}
	return "unknown Xid"
}

// CriticalXid reports whether an Xid takes the GPU out of service.
func CriticalXid(xid uint64) bool { return !applicationXids[xid] }

// HealthEvent is one health transition of a GPU or MIG instance.
type HealthEvent struct {
	// UUID is the GPU or MIG device UUID.
	UUID    string    `json:"uuid"`
	Healthy bool      `json:"healthy"`
	Xid     uint64    `json:"xid,omitempty"`
	Reason  string    `json:"reason"`
	At      time.Time `json:"at"`
}

type healthEntry struct {
	gpu        string // parent GPU UUID
	since      time.Time
	reason     string
	xid        uint64
	recovering time.Time // zero while the probe still fails
}

type healthState struct {
	bad map[string]*healthEntry // by GPU or MIG UUID
}

func newHealthState() *healthState { return &healthState{bad: map[string]*healthEntry{}} }

// Health returns the health of a GPU or MIG device; a MIG device is
// unhealthy when its GPU is.
func (m *Manager) Health(uuid string) devices.Health {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.health.bad[uuid]; ok {
		return devices.Health{Healthy: false, Reason: e.reason, Since: e.since}
	}
	return devices.Health{Healthy: true}
}

// ProbationEnds is when an out-of-service device that answers healthy
// again returns to service; false while it is healthy or still failing.
func (m *Manager) ProbationEnds(uuid string) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.health.bad[uuid]
	if !ok || e.recovering.IsZero() {
		return time.Time{}, false
	}
	// The remaining probation is measured on the monotonic clock and
	// shown from the wall clock's reading now, so a wall clock set forward
	// or back meanwhile does not misplace it.
	now := m.clock.Now()
	return now.Add(m.probation - now.Sub(e.recovering)), true
}

// Healthy reports whether new work may be placed on uuid (GPU or MIG).
func (m *Manager) Healthy(uuid string) bool {
	if !m.Health(uuid).Healthy {
		return false
	}
	if parent, ok := m.migParent(uuid); ok {
		return m.Health(parent).Healthy
	}
	return true
}

func (m *Manager) migParent(migUUID string) (string, bool) {
	if len(migUUID) < 4 || migUUID[:4] != "MIG-" {
		return "", false
	}
	gp, _, _, err := m.migOwner(migUUID)
	if err != nil {
		return "", false
	}
	return gp.UUID, true
}

// MarkUnhealthy takes a GPU or MIG device out of service. It returns the
// event, or false when it was already out for the same reason.
func (m *Manager) MarkUnhealthy(uuid, gpu string, xid uint64, reason string) (HealthEvent, bool) {
	now := m.clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.health.bad[uuid]; ok {
		e.recovering = time.Time{} // a new fault restarts probation
		if e.xid == xid && e.reason == reason {
			return HealthEvent{}, false
		}
		e.xid, e.reason = xid, reason
	} else {
		m.health.bad[uuid] = &healthEntry{gpu: gpu, since: now, reason: reason, xid: xid}
	}
	m.log.Warn("nvidia: unhealthy", "uuid", uuid, "xid", xid, "reason", reason)
	return HealthEvent{UUID: uuid, Healthy: false, Xid: xid, Reason: reason, At: now}, true
}

// handleEvent turns one NVML event into a health transition.
func (m *Manager) handleEvent(ev nvml.EventData) (HealthEvent, bool) {
	if ev.Device == nil {
		return HealthEvent{}, false
	}
	gpuUUID, err := call("GetUUID", ev.Device.GetUUID)
	if err != nil {
		return HealthEvent{}, false
	}
	var xid uint64
	var reason string
	switch ev.EventType {
	case nvml.EventTypeXidCriticalError:
		xid = ev.EventData
		if !CriticalXid(xid) {
			m.log.Info("nvidia: application Xid", "gpu", gpuUUID, "xid", xid, "meaning", XidMeaning(xid))
			return HealthEvent{}, false
		}
		reason = fmt.Sprintf("Xid %d: %s", xid, XidMeaning(xid))
	case nvml.EventTypeDoubleBitEccError:
		xid = 48
		reason = "double-bit ECC error"
	default:
		return HealthEvent{}, false
	}
	target := gpuUUID
	if ev.GpuInstanceId != 0xFFFFFFFF {
		if _, d, err := m.gpu(gpuUUID); err == nil {
			if md, ok := migDevices(d)[int(ev.GpuInstanceId)]; ok {
				target = md.uuid
			}
		}
	}
	return m.MarkUnhealthy(target, gpuUUID, xid, reason)
}

// probe reports whether a GPU answers healthy: it responds (not lost) and
// has no outstanding volatile uncorrectable ECC errors.
func (m *Manager) probe(gpu string) bool {
	_, d, err := m.gpu(gpu)
	if err != nil {
		return false
	}
	if _, err := call("GetTemperature", func() (uint32, nvml.Return) { return d.GetTemperature(nvml.TEMPERATURE_GPU) }); err != nil && !errors.Is(err, ErrNotSupported) {
		return false
	}
	n, err := call("GetTotalEccErrors", func() (uint64, nvml.Return) {
		return d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
	})
	if err == nil && n > 0 {
		return false
	}
	return err == nil || errors.Is(err, ErrNotSupported)
}

// CheckRecovery probes every out-of-service GPU and MIG device: one that
// answers healthy starts probation, one that stays healthy for the whole
// probation returns to service. It returns the recoveries.
func (m *Manager) CheckRecovery() []HealthEvent {
	m.mu.Lock()
	type item struct {
		uuid, gpu string
	}
	var items []item
	for u, e := range m.health.bad {
		g := e.gpu
		if g == "" {
			g = u
		}
		items = append(items, item{u, g})
	}
	m.mu.Unlock()
	var out []HealthEvent
	for _, it := range items {
		ok := m.probe(it.gpu)
		now := m.clock.Now()
		m.mu.Lock()
		e, still := m.health.bad[it.uuid]
		switch {
		case !still:
		case !ok:
			e.recovering = time.Time{}
		case e.recovering.IsZero():
			e.recovering = now
			m.log.Info("nvidia: probation started", "uuid", it.uuid, "probation", m.probation)
		}
		if still && ok && now.Sub(e.recovering) >= m.probation {
			delete(m.health.bad, it.uuid)
			ev := HealthEvent{UUID: it.uuid, Healthy: true, Xid: e.xid,
				Reason: fmt.Sprintf("healthy for %s after %s", m.probation, e.reason), At: now}
			out = append(out, ev)
			m.log.Info("nvidia: back in service", "uuid", it.uuid)
		}
		m.mu.Unlock()
	}
	return out
}

// WatchHealth listens for critical Xid and double-bit ECC events on every
// GPU and probes out-of-service devices every probeEvery, calling emit for
// each transition, until ctx ends.
func (m *Manager) WatchHealth(ctx context.Context, probeEvery time.Duration, emit func(HealthEvent)) error {
	emit = m.publishHealth(emit)
	set, err := call("EventSetCreate", m.lib.EventSetCreate)
	switch {
	case errors.Is(err, ErrNotSupported):
		m.log.Warn("nvidia: no NVML event sets; health by probing only", "err", err)
		set = nil
	case err != nil:
		return err
	default:
		defer func() { _ = call0("EventSet.Free", set.Free) }()
		m.mu.Lock()
		gpus, handles := m.gpus, m.handles
		m.mu.Unlock()
		for i, d := range handles {
			types := uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError)
			if err := call0("RegisterEvents", func() nvml.Return { return d.RegisterEvents(types, set) }); err != nil {
				m.log.Warn("nvidia: health events unavailable", "gpu", gpus[i].UUID, "err", err)
			}
		}
	}
	lastProbe := time.Now()
	waitMs := uint32(max(10*time.Millisecond, min(probeEvery, 500*time.Millisecond)) / time.Millisecond)
	for ctx.Err() == nil {
		ev, err := nvml.EventData{}, error(ErrNotSupported)
		if set != nil {
			ev, err = call("EventSet.Wait", func() (nvml.EventData, nvml.Return) { return set.Wait(waitMs) })
		}
		switch {
		case err == nil:
			if he, ok := m.handleEvent(ev); ok {
				emit(he)
			}
		case errors.Is(err, nvml.ERROR_TIMEOUT):
		case errors.Is(err, ErrNotSupported):
			// No event source: fall back to probing only.
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(waitMs) * time.Millisecond):
			}
		default:
			m.log.Warn("nvidia: event wait", "err", err)
			// Do not spin on a persistent error (a lost GPU).
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(waitMs) * time.Millisecond):
			}
		}
		if time.Since(lastProbe) >= probeEvery {
			lastProbe = time.Now()
			for _, he := range m.CheckRecovery() {
				emit(he)
			}
		}
	}
	return nil
}

// publishHealth wraps emit so that subscribers learn every transition too.
func (m *Manager) publishHealth(emit func(HealthEvent)) func(HealthEvent) {
	return func(e HealthEvent) {
		h := devices.Health{Healthy: e.Healthy, Reason: e.Reason, Since: e.At}
		m.hub.Publish(devices.Update{Kind: devices.HealthChanged, Device: e.UUID, At: e.At, Health: &h, Code: e.Xid, Detail: e.Reason})
		if emit != nil {
			emit(e)
		}
	}
}

// CheckEvents subscribes to the events WatchHealth listens for (critical
// Xid, double-bit ECC) on every GPU, waits wait for one, and frees the
// subscription; it changes nothing on the GPUs. It returns how many GPUs
// accepted the registration and whether an event arrived, or the first
// error of creating the set or registering a GPU.
func (m *Manager) CheckEvents(wait time.Duration) (registered int, got bool, err error) {
	set, err := call("EventSetCreate", m.lib.EventSetCreate)
	if err != nil {
		return 0, false, err
	}
	defer func() { _ = call0("EventSet.Free", set.Free) }()
	m.mu.Lock()
	gpus, handles := m.gpus, m.handles
	m.mu.Unlock()
	types := uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError)
	for i, d := range handles {
		if err := call0("RegisterEvents", func() nvml.Return { return d.RegisterEvents(types, set) }); err != nil {
			return registered, false, fmt.Errorf("gpu %d: %w", gpus[i].Index, err)
		}
		registered++
	}
	_, err = call("EventSet.Wait", func() (nvml.EventData, nvml.Return) { return set.Wait(uint32(wait / time.Millisecond)) })
	switch {
	case err == nil:
		return registered, true, nil
	case errors.Is(err, nvml.ERROR_TIMEOUT):
		return registered, false, nil
	default:
		return registered, false, fmt.Errorf("event wait: %w", err)
	}
}

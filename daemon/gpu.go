package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/hardware"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
	"github.com/fusiond/fusiond/devices"
	"github.com/fusiond/fusiond/devices/nvidia"
)

// GPUConfig is the gpu: section of the configuration.
//
//	gpu:
//	  health_probation: 5m     # healthy this long after a fault before placement resumes
//	  health_probe: 10s        # how often out-of-service GPUs are probed
//	  sharing:                 # the NVIDIA device plugin's sharing section, as written for it
//	    timeSlicing:
//	      resources:
//	      - {name: nvidia.com/gpu, replicas: 4}
//	    over_cap: warn         # or kill: a time-sliced share's job over its memory cap (fusiond's own key)
//	  power: {enabled: true, besteffort_cap_watts: 300}
type GPUConfig struct {
	HealthProbation Duration `json:"health_probation"`
	HealthProbe     Duration `json:"health_probe"`
	// Sharing is the device plugin's sharing: sub-tree (timeSlicing and/or
	// mps), decoded by nvidia.ParseSharingConfig, plus fusiond's own
	// over_cap key (OverCap), taken out before.
	Sharing json.RawMessage `json:"sharing,omitempty"`
	Power   PowerConfig     `json:"power"`
}

// PowerConfig caps the power of GPUs that run only best-effort jobs.
type PowerConfig struct {
	Enabled            bool    `json:"enabled"`
	BestEffortCapWatts float64 `json:"besteffort_cap_watts"`
	// Period is how often the caps are reconciled with the jobs placed on
	// each GPU (default 2s).
	Period Duration `json:"period,omitempty"`
}

// OverCapPolicy is what the daemon does with a job whose processes hold
// more memory than its share's cap on a time-sliced GPU
// (gpu.sharing.over_cap).
type OverCapPolicy string

const (
	// OverCapWarn records an event and counts the episode; the job runs on.
	OverCapWarn OverCapPolicy = "warn"
	// OverCapKill also stops the job (SIGTERM, SIGKILL after cancel_grace).
	OverCapKill OverCapPolicy = "kill"
)

// errOverCap marks a bad gpu.sharing.over_cap.
var errOverCap = errors.New("over_cap")

// sharingParts splits the sharing sub-tree into fusiond's over_cap key and
// the device plugin's keys (nil when there are none).
func (g GPUConfig) sharingParts() (OverCapPolicy, json.RawMessage, error) {
	raw := bytes.TrimSpace(g.Sharing)
	if len(raw) == 0 || string(raw) == "null" {
		return OverCapWarn, nil, nil
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(raw, &keys); err != nil {
		return "", nil, fmt.Errorf("want a mapping (timeSlicing, mps, over_cap): %w", err)
	}
	policy := OverCapWarn
	if v, ok := keys["over_cap"]; ok {
		var s string
		if err := json.Unmarshal(v, &s); err != nil || (s != string(OverCapWarn) && s != string(OverCapKill)) {
			return "", nil, fmt.Errorf("%w: want warn or kill, got %s", errOverCap, v)
		}
		policy = OverCapPolicy(s)
		delete(keys, "over_cap")
	}
	if len(keys) == 0 {
		return policy, nil, nil
	}
	rest, err := json.Marshal(keys)
	return policy, rest, err
}

// OverCap is the gpu.sharing.over_cap policy (default warn).
func (g GPUConfig) OverCap() (OverCapPolicy, error) {
	p, _, err := g.sharingParts()
	return p, err
}

// SharingConfig decodes the device plugin's part of the sharing sub-tree
// (nil when there is none).
func (g GPUConfig) SharingConfig() (*nvidia.SharingConfig, error) {
	_, raw, err := g.sharingParts()
	if err != nil || raw == nil {
		return nil, err
	}
	doc, err := json.Marshal(map[string]json.RawMessage{"version": json.RawMessage(`"v1"`), "sharing": raw})
	if err != nil {
		return nil, err
	}
	return nvidia.ParseSharingConfig(doc)
}

// validate checks the gpu: section; key names the offending field.
func (g GPUConfig) validate() (key string, err error) {
	switch {
	case g.HealthProbation < 0:
		return "gpu.health_probation", fmt.Errorf("must not be negative")
	case g.HealthProbe < 0:
		return "gpu.health_probe", fmt.Errorf("must not be negative")
	case g.Power.Period < 0:
		return "gpu.power.period", fmt.Errorf("must not be negative")
	case g.Power.Enabled && g.Power.BestEffortCapWatts <= 0:
		return "gpu.power.besteffort_cap_watts", fmt.Errorf("must be positive when power capping is enabled")
	}
	if _, err := g.OverCap(); errors.Is(err, errOverCap) {
		return "gpu.sharing.over_cap", err
	}
	if _, err := g.SharingConfig(); err != nil {
		return "gpu.sharing", err
	}
	return "", nil
}

// hostConfig is what the host needs from the gpu: section.
func (g GPUConfig) hostConfig(c hardware.Config) hardware.Config {
	c.HealthProbation = time.Duration(g.HealthProbation)
	c.HealthProbe = time.Duration(g.HealthProbe)
	return c
}

// inventoryTarget is the part of the placer the device updates drive.
type inventoryTarget interface {
	UpdateHardware(hostplacer.Hardware)
}

// devicePublisher sends device events to the event stream.
type devicePublisher interface {
	PublishDevice(api.Event)
}

// connectDevices keeps the placer's inventory in line with the drivers:
// every health transition and device change (MIG layout applied or an
// instance created for a job, FPGA region programmed, device found or
// gone, topology refreshed) reads the inventory again with inventory and
// hands it to the placer; health transitions also appear in the event
// stream. It then brings the placer up to date with what changed before
// the connection. The returned function disconnects.
func connectDevices(hw *hardware.Host, placer inventoryTarget, pub devicePublisher, inventory func() hostplacer.Hardware) (cancel func()) {
	var s inventorySync
	update := func() { s.run(func() { placer.UpdateHardware(inventory()) }) }
	cancel = hw.Subscribe(func(u devices.Update) {
		if u.Kind == devices.HealthChanged || u.Kind == devices.DeviceChanged {
			update()
		}
	})
	hw.OnHealth(pub.PublishDevice)
	update()
	return cancel
}

// inventorySync runs inventory updates one at a time, so an older
// inventory never replaces a newer one. An update asked for while one runs
// (from another goroutine, or from a driver publishing while its inventory
// is read) makes the running one read the inventory again instead.
type inventorySync struct {
	mu             sync.Mutex
	running, dirty bool
}

func (s *inventorySync) run(update func()) {
	s.mu.Lock()
	s.dirty = true
	if s.running {
		s.mu.Unlock()
		return
	}
	s.running = true
	for s.dirty {
		s.dirty = false
		s.mu.Unlock()
		update()
		s.mu.Lock()
	}
	s.running = false
	s.mu.Unlock()
}

// applyGPUConfig applies the sharing section at start.
func applyGPUConfig(hw *hardware.Host, g GPUConfig, log *slog.Logger) error {
	m := hw.GPUs()
	sc, err := g.SharingConfig()
	if err != nil || sc == nil || m == nil {
		return err
	}
	if err := m.ApplySharingConfig(sc); err != nil {
		return fmt.Errorf("gpu.sharing: %w", err)
	}
	for _, s := range m.ShareStatuses() {
		log.Info("GPU sharing", "gpu", s.GPU, "mode", s.Mode, "replicas", s.Replicas)
	}
	return nil
}

// bestEffortSource says which GPUs run only best-effort jobs.
type bestEffortSource interface {
	BestEffortOnly() map[string]bool
}

// powerCaps keeps the GPU power caps in line with the policy: every Period
// it asks the placer which GPUs hold only best-effort jobs and, when that
// set changed, applies the policy (cap those, restore the others to their
// maximum). It returns when ctx ends.
func powerCaps(ctx context.Context, m *nvidia.Manager, p PowerConfig, src bestEffortSource, log *slog.Logger) {
	if !p.Enabled || m == nil {
		return
	}
	policy := nvidia.PowerPolicy{Enabled: true, BestEffortCapW: p.BestEffortCapWatts}
	period := time.Duration(p.Period)
	if period <= 0 {
		period = 2 * time.Second
	}
	var last map[string]bool
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		cur := src.BestEffortOnly()
		if last == nil || !maps.Equal(cur, last) {
			if err := m.ApplyPowerPolicy(policy, cur); err != nil {
				log.Warn("GPU power policy", "err", err)
			} else {
				last = cur
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

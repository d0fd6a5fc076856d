package hardware

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/fusiond/fusiond/devices"
	"github.com/fusiond/fusiond/devices/nvidia"
)

// A real GPU keeps its MIG mode and instances in the driver when fusiond
// restarts; the simulated GPUs live in fusiond's memory. So that a
// simulated host behaves as a real one across restarts (a job or a pod
// holding a MIG instance finds it again), the simulated GPUs' MIG layout
// is saved under the state directory after every change and applied again
// when the simulated host opens.

// simMIGFile is the saved layout, under the simulated host's directory.
const simMIGFile = "gpu-mig.json"

// simMIGLayout is what is saved: each GPU in MIG mode and its instances.
type simMIGLayout struct {
	GPUs []simMIGGPU `json:"gpus"`
}

type simMIGGPU struct {
	Index     int              `json:"index"`
	UUID      string           `json:"uuid"`
	Instances []simMIGInstance `json:"instances,omitempty"`
}

type simMIGInstance struct {
	Profile string `json:"profile"`
	Start   int    `json:"start"`
}

// restoreSimMIG applies the layout saved at path to the simulated GPUs
// (nothing when none was saved).
func restoreSimMIG(ctx context.Context, m *nvidia.Manager, path string) error {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var l simMIGLayout
	if err := json.Unmarshal(data, &l); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	var actions []nvidia.Action
	for _, g := range l.GPUs {
		actions = append(actions, nvidia.Action{Kind: nvidia.SetMIGMode, GPU: g.Index, GPUUUID: g.UUID, Enable: true})
		for _, in := range g.Instances {
			actions = append(actions, nvidia.Action{Kind: nvidia.CreateInstance, GPU: g.Index, GPUUUID: g.UUID, Profile: in.Profile, Start: in.Start})
		}
	}
	if err := m.Apply(ctx, actions, nvidia.Busy{}); err != nil {
		return fmt.Errorf("applying the saved MIG layout of %s: %w", path, err)
	}
	return nil
}

// saveSimMIG writes the simulated GPUs' MIG layout to path (atomically).
func saveSimMIG(ctx context.Context, m *nvidia.Manager, path string) error {
	st, err := m.State(ctx, nil)
	if err != nil {
		return err
	}
	var l simMIGLayout
	for _, g := range st.GPUs {
		if !g.MIGEnabled {
			continue
		}
		sg := simMIGGPU{Index: g.Index, UUID: g.UUID}
		for _, in := range g.Instances {
			sg.Instances = append(sg.Instances, simMIGInstance{Profile: in.Profile, Start: in.Start})
		}
		l.GPUs = append(l.GPUs, sg)
	}
	data, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// keepSimMIG saves the simulated GPUs' layout after every MIG change
// until ctx ends: changes is told of every driver update.
func (h *Host) keepSimMIG(ctx context.Context, changes <-chan struct{}) error {
	path := h.simDir(simMIGFile)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changes:
			if err := saveSimMIG(ctx, h.gpus, path); err != nil && ctx.Err() == nil {
				h.log.Warn("saving the simulated GPUs' MIG layout", "path", path, "err", err)
			}
		}
	}
}

// simMIGChanges is a driver subscriber that signals layout changes on a
// channel of one (a burst of changes makes one save).
func simMIGChanges() (func(devices.Update), <-chan struct{}) {
	ch := make(chan struct{}, 1)
	return func(u devices.Update) {
		if u.Kind != devices.DeviceChanged {
			return
		}
		select {
		case ch <- struct{}{}:
		default:
		}
	}, ch
}

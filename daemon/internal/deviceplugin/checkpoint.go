package deviceplugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// kubeletCheckpoint is the device manager's checkpoint kubelet keeps in
// its device-plugin directory: for each pod container, the devices of
// each resource it was allocated, and the pod's UID, which kubelet's
// pod-resources API (v1) does not tell.
const kubeletCheckpoint = "kubelet_internal_checkpoint"

// maxCheckpoint bounds the checkpoint read (a node with many pods).
const maxCheckpoint = 16 << 20

// checkpointEntry is one pod container's entry in the checkpoint, as
// kubelet writes it (k8s.io/kubernetes pkg/kubelet/cm/devicemanager/
// checkpoint: PodDevicesEntry, JSON without tags).
type checkpointEntry struct {
	PodUID        string
	ContainerName string
	ResourceName  string
	DeviceIDs     map[string][]string // NUMA node → device IDs
}

// podUID is what the checkpoint says of one device: the pod UID and the
// container it was allocated to.
type podUID struct{ uid, container string }

// readPodUIDs reads kubelet's checkpoint in dir: each device's pod UID
// and container. A missing checkpoint is an empty map; one kubelet wrote
// in another form is an error (the UIDs then stay unknown).
func readPodUIDs(dir string) (map[devKey]podUID, error) {
	f, err := os.Open(filepath.Join(dir, kubeletCheckpoint))
	if errors.Is(err, fs.ErrNotExist) {
		return map[devKey]podUID{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxCheckpoint+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxCheckpoint {
		return nil, fmt.Errorf("%s is larger than %d bytes", f.Name(), maxCheckpoint)
	}
	var cp struct {
		Data struct {
			PodDeviceEntries []checkpointEntry
		}
	}
	if err := json.Unmarshal(data, &cp); err != nil {
		return nil, fmt.Errorf("%s: %w", f.Name(), err)
	}
	out := map[devKey]podUID{}
	for _, e := range cp.Data.PodDeviceEntries {
		for _, ids := range e.DeviceIDs {
			for _, id := range ids {
				out[devKey{e.ResourceName, id}] = podUID{uid: e.PodUID, container: e.ContainerName}
			}
		}
	}
	return out, nil
}

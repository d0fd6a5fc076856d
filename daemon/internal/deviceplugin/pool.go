// Package deviceplugin serves fusiond's devices to kubelet through the
// published device-plugin API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1):
// one gRPC server per extended resource, registered with kubelet and
// registered again whenever kubelet restarts. ListAndWatch follows the
// daemon's inventory, GetPreferredAllocation asks the daemon's placement,
// and each Allocate becomes a pod hold admitted through the daemon's one
// admission path. A reconcile loop compares the holds with kubelet's
// pod-resources API (k8s.io/kubelet/pkg/apis/podresources/v1): it names the
// pod each hold belongs to and releases holds kubelet no longer has. It
// also writes the node-feature-discovery features file.
//
// The daemon is reached only through Pool; the package owns the protocol,
// not the ledger.
package deviceplugin

import (
	"context"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/devices"
)

// Resource is one extended resource the plugin serves and its devices.
type Resource struct {
	// Name is the full resource name ("fusiond.io/gpu-h200").
	Name    string
	Devices []Device
}

// Device is one device ID of a resource as kubelet sees it.
type Device struct {
	ID string
	// Healthy devices count in kubelet's allocatable; unhealthy ones
	// (out of service, held by a fusiond job) only in its capacity.
	Healthy bool
	// NUMA is the device's NUMA node, -1 when unknown.
	NUMA int
}

// Allocation is what one container gets for the devices kubelet
// allocated to it.
type Allocation struct {
	// Hold is the ID of the job record that holds the devices.
	Hold string
	Env  map[string]string
	// Nodes are the device nodes the container needs (host path =
	// container path).
	Nodes []devices.DeviceNode
	// CDI names the devices in CDI form ("nvidia.com/gpu=GPU-…") for
	// runtimes that resolve CDI devices.
	CDI []string
	// Mounts are host directories the container needs at the same path
	// (an MPS share's control directories).
	Mounts []string
}

// Hold is one pod hold the daemon keeps.
type Hold struct {
	// ID is the hold's job ID.
	ID       string
	Resource string
	Devices  []string
	// Pod is the pod container the hold belongs to; nil until the
	// reconcile loop found it in kubelet's pod resources.
	Pod     *api.PodRef
	Created time.Time
}

// Pool is the daemon as the plugin needs it: the inventory as resources,
// placement, the admission of holds, and their release.
type Pool interface {
	// Resources lists every resource the plugin serves now, sorted by
	// name, each device sorted by ID.
	Resources() []Resource
	// Watch calls fn (which must not block) after every change that may
	// change what Resources returns, until cancel is called.
	Watch(fn func()) (cancel func())
	// Prefer chooses size device IDs of resource among available, keeping
	// every one of mustInclude, by the daemon's placement; the decision is
	// recorded for explanation.
	Prefer(resource string, available, mustInclude []string, size int) ([]string, error)
	// Allocate admits a hold of ids of resource for one container through
	// the daemon's admission (limits, audit) and prepares the devices
	// (creating a MIG instance on demand). On error nothing is held.
	Allocate(ctx context.Context, resource string, ids []string) (Allocation, error)
	// Holds lists the pod holds the daemon keeps.
	Holds() []Hold
	// Bind records the pod container hold id belongs to.
	Bind(id string, pod api.PodRef) error
	// Release ends hold id: kubelet no longer has its devices.
	Release(id, why string) error
	// Features are the node features for node-feature-discovery
	// (label name without prefix → value).
	Features() map[string]string
}

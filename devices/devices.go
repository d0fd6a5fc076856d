// Package devices is the contract between fusiond's device drivers
// (devices/nvidia, devices/fpga) and the rest of the daemon: the Driver
// interface every driver implements (inventory, live updates,
// prepare/reclaim/release for a job), the hardware-neutral types it speaks
// (Device, Allocation, Update), the device nodes and environment a job must
// be granted, device health, and point-to-point links between devices. It
// owns no hardware and imports nothing but the standard library, so that
// every layer can depend on it.
package devices

import "time"

// NodeType is the kind of a device special file.
type NodeType byte

const (
	// CharDevice is a character device ("c" in a cgroup device rule).
	CharDevice NodeType = 'c'
	// BlockDevice is a block device ("b" in a cgroup device rule).
	BlockDevice NodeType = 'b'
)

// DeviceNode is one device special file a job may open.
type DeviceNode struct {
	// Path is the absolute path of the node on the host, e.g. /dev/nvidia0.
	Path string `json:"path"`
	// Type is the node type, CharDevice or BlockDevice.
	Type NodeType `json:"type"`
	// Major and Minor are the device numbers the cgroup rule is keyed on.
	Major uint32 `json:"major"`
	Minor uint32 `json:"minor"`
	// Access is the cgroup access string: any of "r", "w", "m".
	Access string `json:"access"`
}

// Grant is what a job needs to use the devices it was allocated: the
// environment variables it must see and the device nodes it may open.
type Grant struct {
	Env   map[string]string `json:"env,omitempty"`
	Nodes []DeviceNode      `json:"nodes,omitempty"`
}

// Merge appends other's nodes and environment to g. Later values win on an
// environment key clash.
func (g *Grant) Merge(other Grant) {
	if len(other.Env) > 0 && g.Env == nil {
		g.Env = make(map[string]string, len(other.Env))
	}
	for k, v := range other.Env {
		g.Env[k] = v
	}
	g.Nodes = append(g.Nodes, other.Nodes...)
}

// Health is a device's (or device partition's) fitness for new work.
type Health struct {
	Healthy bool      `json:"healthy"`
	Reason  string    `json:"reason,omitempty"`
	Since   time.Time `json:"since"`
}

// LinkType names a point-to-point interconnect between two devices.
type LinkType string

// NVLink is NVIDIA's GPU-to-GPU interconnect.
const NVLink LinkType = "NVLink"

// Link is a direct interconnect between two PCI devices, reported by the
// driver that owns them (topology never talks to drivers itself).
type Link struct {
	// A and B are PCI addresses in domain:bus:device.function form
	// (0000:3b:00.0), lower case.
	A    string   `json:"a"`
	B    string   `json:"b"`
	Type LinkType `json:"type"`
	// Lanes is the number of links between A and B (NVLink "NV12" = 12).
	Lanes int `json:"lanes"`
}

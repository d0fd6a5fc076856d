package topology

import (
	"slices"

	"github.com/fusiond/fusiond/devices"
)

// SocketID is a physical package number (topology/physical_package_id).
type SocketID int

// NodeID is a NUMA node number; NoNode means "not known" (numa_node -1).
type NodeID int

// NoNode is the NodeID of a device whose NUMA node the kernel does not know.
const NoNode NodeID = -1

// NoSocket is the SocketID of a memory-only NUMA node.
const NoSocket SocketID = -1

// CacheID identifies a cache group within a Host (its index in Host.L3).
type CacheID int

// PCIAddr is a PCI function address in domain:bus:device.function form,
// lower case, e.g. "0000:3b:00.0".
type PCIAddr string

// Host is the model of one machine. It is a plain value: safe to copy,
// compare with Diff and encode as JSON.
type Host struct {
	// Hostname is informational.
	Hostname string `json:"hostname,omitempty"`
	// Sockets in ascending ID order.
	Sockets []Socket `json:"sockets"`
	// Nodes in ascending ID order, including memory-only nodes.
	Nodes []Node `json:"nodes"`
	// Dies in (socket, die id) order: one per die of a package, from
	// topology/die_cpus (die_id); empty when the kernel has no die files
	// (before Linux 5.3, and on architectures without dies).
	Dies []Die `json:"dies,omitempty"`
	// Cores in (socket, core id) order; offline CPUs are not in any core.
	Cores []Core `json:"cores"`
	// L3 holds the last-level cache groups; Core.L3 indexes it.
	L3 []CacheGroup `json:"l3,omitempty"`
	// OnlineCPUs and OfflineCPUs partition the present CPUs, except an
	// online CPU without a cpuN/topology directory, which is in neither
	// (left out of the model, as hwloc does; a warning names it).
	OnlineCPUs  CPUSet `json:"online_cpus"`
	OfflineCPUs CPUSet `json:"offline_cpus,omitzero"`
	// Devices is every PCI function, bridges included, in address order.
	Devices []PCIDevice `json:"devices"`
	// CoreKindSource says where Core.Kind came from on a hybrid CPU
	// (CoreKindSourcePMU, CoreKindSourceCapacity, CoreKindSourceBaseFreq);
	// empty when the host is not hybrid.
	CoreKindSource string `json:"core_kind_source,omitempty"`
	// Links are direct device-to-device interconnects (NVLink) reported by
	// a LinkSource.
	Links []devices.Link `json:"links,omitempty"`
	// Warnings explain what discovery could not read or had to guess;
	// the model is still usable (partial where said).
	Warnings []string `json:"warnings,omitempty"`
}

// Socket is one physical package.
type Socket struct {
	ID    SocketID `json:"id"`
	CPUs  CPUSet   `json:"cpus"`
	Nodes []NodeID `json:"nodes"`
}

// Die is one die of a multi-die package (Intel Cascade Lake-AP and
// later, AMD chiplets where the kernel reports them). A package with a
// single die has one Die with the package's CPUs.
type Die struct {
	Socket SocketID `json:"socket"`
	// ID is topology/die_id (unique within its socket); -1 when the kernel
	// lists die_cpus but no die_id.
	ID int `json:"id"`
	// CPUs are the die's online CPUs.
	CPUs CPUSet `json:"cpus"`
}

// Node is one NUMA node.
type Node struct {
	ID NodeID `json:"id"`
	// Socket is the package the node's CPUs sit in; NoSocket for a
	// memory-only node (CXL memory, HBM, hot-plug).
	Socket SocketID `json:"socket"`
	// CPUs are the node's online CPUs.
	CPUs CPUSet `json:"cpus"`
	// Initiators, for a CPU-less node, are the online CPUs of the nodes
	// listed as its initiators (the CPUs with the best access to
	// this memory; access1/initiators, else access0), else those of the
	// nodes strictly nearest by SLIT distance (as hwloc); empty when
	// neither says.
	Initiators CPUSet `json:"initiators,omitzero"`
	// GPU, for an NVIDIA GPU's memory exposed as a NUMA node, is that
	// GPU (from /proc/driver/nvidia/gpus/ADDR/numa_status); its
	// Initiators are then the GPU's local CPUs unless access1/access0
	// initiators say otherwise.
	GPU PCIAddr `json:"gpu,omitempty"`
	// MemoryBytes is MemTotal from the node's own meminfo
	// (/sys/devices/system/node/nodeN/meminfo): the memory the kernel can
	// allocate on this node, which is what a cpuset.mems placement gets.
	// It is what hwloc reports too; /proc/meminfo's MemTotal is the
	// host-wide sum and can differ (see docs/topology.md).
	MemoryBytes uint64 `json:"memory_bytes"`
	// BlockMemoryBytes is the size of the node's online memory blocks
	// (/sys/devices/system/memory/block_size_bytes × online memoryN links
	// under the node): the physical memory attached to the node, which can
	// exceed MemoryBytes while the kernel has not yet taken all of it into
	// its page allocator (hot-plug, unaccepted or ballooned memory in VMs).
	// 0 when the kernel exposes no memory blocks.
	BlockMemoryBytes uint64 `json:"block_memory_bytes,omitempty"`
	// Distances is this node's row of the kernel's SLIT distance matrix,
	// aligned with Host.Nodes (10 = local).
	Distances []int `json:"distances"`
}

// Core is one physical core and its SMT siblings.
type Core struct {
	Socket SocketID `json:"socket"`
	Node   NodeID   `json:"node"`
	// ID is topology/core_id, informational: it can repeat within a
	// socket (per die); cores are identified by their CPUs.
	ID int `json:"id"`
	// CPUs are the online hardware threads of the core.
	CPUs CPUSet `json:"cpus"`
	// L3 indexes Host.L3; -1 when the cache is not known.
	L3 CacheID `json:"l3"`
	// Kind is performance or efficiency on a hybrid CPU, unknown (empty)
	// elsewhere (coretype.go, docs/topology.md "Hybrid cores").
	Kind CoreKind `json:"kind,omitempty"`
	// Capacity is the core's capacity relative to the host's biggest
	// core (MaxCoreCapacity = 1024) on a hybrid CPU, from cpu_capacity or
	// base_frequency; 0 when not known or not hybrid.
	Capacity int `json:"capacity,omitempty"`
}

// CacheGroup is a set of CPUs sharing one cache.
type CacheGroup struct {
	ID        CacheID `json:"id"`
	Level     int     `json:"level"`
	SizeBytes uint64  `json:"size_bytes"`
	CPUs      CPUSet  `json:"cpus"`
}

// DeviceKind is the role fusiond gives a PCI function.
type DeviceKind string

// Device kinds. Accelerators are KindGPU, KindFPGA and KindNPU.
const (
	KindGPU     DeviceKind = "gpu"
	KindFPGA    DeviceKind = "fpga"
	KindNPU     DeviceKind = "npu"
	KindNIC     DeviceKind = "nic"
	KindStorage DeviceKind = "storage"
	KindBridge  DeviceKind = "bridge"
	KindOther   DeviceKind = "other"
)

// IsAccelerator reports whether k is a GPU, FPGA or NPU.
func (k DeviceKind) IsAccelerator() bool {
	return k == KindGPU || k == KindFPGA || k == KindNPU
}

// PCIDevice is one PCI function.
type PCIDevice struct {
	Addr PCIAddr `json:"addr"`
	// Class is the 24-bit class code (0x030200 = 3D controller).
	Class      uint32     `json:"class"`
	ClassName  string     `json:"class_name,omitempty"`
	VendorID   uint16     `json:"vendor_id"`
	DeviceID   uint16     `json:"device_id"`
	VendorName string     `json:"vendor_name,omitempty"`
	DeviceName string     `json:"device_name,omitempty"`
	Kind       DeviceKind `json:"kind"`
	// Node is the device's NUMA node; NoNode when the kernel reports -1
	// and no CPU-locality fallback applied.
	Node NodeID `json:"node"`
	// LocalCPUs is local_cpulist: the CPUs closest to the device.
	LocalCPUs CPUSet `json:"local_cpus"`
	// HostBridge names the root complex, e.g. "pci0000:17".
	HostBridge string `json:"host_bridge"`
	// Upstream lists the bridges above the device, from the root port
	// down to its immediate parent; empty for a device on a root bus.
	Upstream []PCIAddr `json:"upstream,omitempty"`
	// Link attributes where sysfs has them (PCIe only): speed as the
	// kernel prints it ("32.0 GT/s PCIe"), width in lanes.
	LinkSpeed    string `json:"link_speed,omitempty"`
	LinkWidth    int    `json:"link_width,omitempty"`
	MaxLinkSpeed string `json:"max_link_speed,omitempty"`
	MaxLinkWidth int    `json:"max_link_width,omitempty"`
}

// Parent is the device's immediate upstream bridge, or "" on a root bus.
func (d *PCIDevice) Parent() PCIAddr {
	if len(d.Upstream) == 0 {
		return ""
	}
	return d.Upstream[len(d.Upstream)-1]
}

// Device returns the device at addr, or nil.
func (h *Host) Device(addr PCIAddr) *PCIDevice {
	i, ok := slices.BinarySearchFunc(h.Devices, addr, func(d PCIDevice, a PCIAddr) int {
		switch {
		case d.Addr < a:
			return -1
		case d.Addr > a:
			return 1
		}
		return 0
	})
	if !ok {
		return nil
	}
	return &h.Devices[i]
}

// Node returns the node with the given ID, or nil.
func (h *Host) Node(id NodeID) *Node {
	for i := range h.Nodes {
		if h.Nodes[i].ID == id {
			return &h.Nodes[i]
		}
	}
	return nil
}

// Accelerators returns the GPUs, FPGAs and NPUs in address order.
func (h *Host) Accelerators() []PCIDevice {
	var out []PCIDevice
	for _, d := range h.Devices {
		if d.Kind.IsAccelerator() {
			out = append(out, d)
		}
	}
	return out
}

// NodeDistance is the kernel's distance between two nodes, or -1 when
// either is unknown.
func (h *Host) NodeDistance(a, b NodeID) int {
	na := h.Node(a)
	if na == nil {
		return -1
	}
	for j := range h.Nodes {
		if h.Nodes[j].ID == b && j < len(na.Distances) {
			return na.Distances[j]
		}
	}
	return -1
}

// classify maps a PCI class code and vendor to a DeviceKind.
func classify(class uint32, vendor uint16) DeviceKind {
	base, sub := class>>16, (class>>8)&0xff
	switch {
	case vendor == 0x10ee || vendor == 0x1172 || vendor == 0x1d0f && base == 0x12:
		// Xilinx/AMD, Intel (Altera) programmable devices, AWS F1.
		if base == 0x12 || base == 0x0b || base == 0x11 || base == 0xff || base == 0x05 && sub == 0x80 {
			return KindFPGA
		}
	}
	switch {
	case base == 0x03 && sub == 0x02: // 3D controller: compute GPUs
		return KindGPU
	case base == 0x03 && (vendor == 0x10de || vendor == 0x1002): // NVIDIA/AMD VGA
		return KindGPU
	case base == 0x12, base == 0x0b && sub == 0x40: // processing accelerator, co-processor
		return KindNPU
	case base == 0x02:
		return KindNIC
	case base == 0x01:
		return KindStorage
	case base == 0x06:
		return KindBridge
	}
	return KindOther
}

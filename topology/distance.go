package topology

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/fusiond/fusiond/devices"
)

// Class is a locality class in nvidia-smi topo -m vocabulary, ordered
// from closest to farthest.
type Class uint8

// Locality classes.
const (
	// Self (X): the device itself.
	Self Class = iota
	// NV: a direct NVLink connection (Distance.Lanes links).
	NV
	// PIX: at most one PCIe switch (or bridge) between the two.
	PIX
	// PXB: several PCIe bridges, without crossing a host bridge.
	PXB
	// PHB: through a PCIe host bridge (the root complex in the CPU).
	PHB
	// NODE: between host bridges within one NUMA node (or one socket).
	NODE
	// SYS: across the SMP interconnect between sockets (UPI, xGMI), or a
	// NUMA node that is not known.
	SYS
)

var classNames = [...]string{Self: "X", NV: "NV", PIX: "PIX", PXB: "PXB", PHB: "PHB", NODE: "NODE", SYS: "SYS"}

// String returns the nvidia-smi label ("X", "NV", "PIX", ...).
func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return "Class(" + strconv.Itoa(int(c)) + ")"
}

// Distance is the locality of a device pair or a device and CPUs.
type Distance struct {
	Class Class `json:"class"`
	// Lanes is the number of NVLinks for Class NV.
	Lanes int `json:"lanes,omitempty"`
}

// String returns the matrix label: "X", "NV18", "PIX", ..., "SYS".
func (d Distance) String() string {
	if d.Class == NV {
		return "NV" + strconv.Itoa(d.Lanes)
	}
	return d.Class.String()
}

// MarshalText encodes the label.
func (d Distance) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText decodes a label produced by MarshalText.
func (d *Distance) UnmarshalText(b []byte) error {
	s := string(b)
	if rest, ok := strings.CutPrefix(s, "NV"); ok && rest != "" {
		n, err := strconv.Atoi(rest)
		if err != nil || n <= 0 {
			return fmt.Errorf("%w: distance %q", ErrSyntax, s)
		}
		*d = Distance{Class: NV, Lanes: n}
		return nil
	}
	for c, name := range classNames {
		if name == s && Class(c) != NV {
			*d = Distance{Class: Class(c)}
			return nil
		}
	}
	return fmt.Errorf("%w: distance %q", ErrSyntax, s)
}

// ErrUnknownDevice is returned for a PCI address not in the Host.
var ErrUnknownDevice = errors.New("topology: unknown PCI device")

// ErrEmptyCPUSet is returned when a CPU-locality query names no CPU.
var ErrEmptyCPUSet = errors.New("topology: empty CPU set")

type pair struct{ a, b PCIAddr }

func orderedPair(a, b PCIAddr) pair {
	if b < a {
		a, b = b, a
	}
	return pair{a, b}
}

// Locality answers distance queries over one Host. Build it once per Host
// with NewLocality; it is immutable and safe for concurrent use.
type Locality struct {
	host   *Host
	dev    map[PCIAddr]*PCIDevice
	nvlink map[pair]int
	socket map[NodeID]SocketID
}

// NewLocality indexes h (its devices, nodes and NVLink links). h must not
// be modified while the Locality is in use.
func NewLocality(h *Host) *Locality {
	l := &Locality{
		host:   h,
		dev:    make(map[PCIAddr]*PCIDevice, len(h.Devices)),
		nvlink: map[pair]int{},
		socket: make(map[NodeID]SocketID, len(h.Nodes)),
	}
	for i := range h.Devices {
		l.dev[h.Devices[i].Addr] = &h.Devices[i]
	}
	for _, lk := range h.Links {
		if lk.Type == devices.NVLink && lk.A != lk.B {
			l.nvlink[orderedPair(PCIAddr(lk.A), PCIAddr(lk.B))] += max(lk.Lanes, 1)
		}
	}
	for _, n := range h.Nodes {
		l.socket[n.ID] = n.Socket
	}
	return l
}

// Between classifies the path between two devices. An NVLink connection
// wins over any PCIe path.
func (l *Locality) Between(a, b PCIAddr) (Distance, error) {
	da, ok := l.dev[a]
	if !ok {
		return Distance{}, fmt.Errorf("%w: %s", ErrUnknownDevice, a)
	}
	db, ok := l.dev[b]
	if !ok {
		return Distance{}, fmt.Errorf("%w: %s", ErrUnknownDevice, b)
	}
	if a == b {
		return Distance{Class: Self}, nil
	}
	if n := l.nvlink[orderedPair(a, b)]; n > 0 {
		return Distance{Class: NV, Lanes: n}, nil
	}
	return Distance{Class: l.pcieClass(da, db)}, nil
}

// pcieClass classifies the PCIe path between two distinct devices.
func (l *Locality) pcieClass(a, b *PCIDevice) Class {
	if a.HostBridge != b.HostBridge {
		return l.nodeClass(a.Node, b.Node)
	}
	// Compare the chains root port ... device of both sides; the deepest
	// common element is where the paths meet.
	common := 0
	for common <= len(a.Upstream) && common <= len(b.Upstream) && chainAt(a, common) == chainAt(b, common) {
		common++
	}
	if common == 0 {
		return PHB // the paths meet only in the host bridge
	}
	// Elements below the meeting point on each side. Through a single
	// PCIe switch that is at most a downstream port and the device (or
	// just the device when the meeting point is a port above it).
	if len(a.Upstream)+1-common <= 2 && len(b.Upstream)+1-common <= 2 {
		return PIX
	}
	return PXB
}

// chainAt returns element i of the device's chain Upstream + itself.
func chainAt(d *PCIDevice, i int) PCIAddr {
	if i < len(d.Upstream) {
		return d.Upstream[i]
	}
	return d.Addr
}

// nodeClass classifies the path between two NUMA nodes.
func (l *Locality) nodeClass(a, b NodeID) Class {
	if a == NoNode || b == NoNode {
		return SYS
	}
	if a == b {
		return NODE
	}
	sa, oka := l.socket[a]
	sb, okb := l.socket[b]
	if oka && okb && sa == sb && sa != NoSocket {
		return NODE
	}
	return SYS
}

// ToCPUs classifies the path from a device to a set of CPUs, reporting
// the farthest CPU: PHB when every CPU is in the device's NUMA node, NODE
// when some are in another node of the same socket, SYS when some are
// across sockets or the device's node is not known.
func (l *Locality) ToCPUs(a PCIAddr, cpus CPUSet) (Distance, error) {
	d, ok := l.dev[a]
	if !ok {
		return Distance{}, fmt.Errorf("%w: %s", ErrUnknownDevice, a)
	}
	if cpus.IsEmpty() {
		return Distance{}, ErrEmptyCPUSet
	}
	worst := PHB
	rest := cpus
	for _, n := range l.host.Nodes {
		if !cpus.Intersects(n.CPUs) {
			continue
		}
		rest = rest.Difference(n.CPUs)
		c := PHB
		if n.ID != d.Node {
			c = l.nodeClass(d.Node, n.ID)
		} else if d.Node == NoNode {
			c = SYS
		}
		worst = max(worst, c)
	}
	if !rest.IsEmpty() || d.Node == NoNode {
		worst = SYS // CPUs in no known node
	}
	return Distance{Class: worst}, nil
}

// Matrix returns the pairwise distances of addrs, row by row.
func (l *Locality) Matrix(addrs []PCIAddr) ([][]Distance, error) {
	out := make([][]Distance, len(addrs))
	for i, a := range addrs {
		out[i] = make([]Distance, len(addrs))
		for j, b := range addrs {
			d, err := l.Between(a, b)
			if err != nil {
				return nil, err
			}
			out[i][j] = d
		}
	}
	return out, nil
}

// MemoryNodesFor returns the NUMA nodes a job running on node id's CPUs
// should allocate from (its cpuset.mems): the node itself when it has
// memory; for a memory-less CPU node (SNC or firmware setups, POWER),
// the nearest nodes with memory by SLIT distance, else (no distances)
// those whose initiators (access1/access0, HMAT) include the node's CPUs.
// GPU memory nodes (Node.GPU) are never chosen for a CPU node: that
// memory belongs to the GPU's jobs. It returns nil when the node is
// unknown or nothing says where its memory is, meaning "do not
// restrict" (the job may use every node its parent allows).
func (h *Host) MemoryNodesFor(id NodeID) []NodeID {
	i := slices.IndexFunc(h.Nodes, func(n Node) bool { return n.ID == id })
	if i < 0 {
		return nil
	}
	n := &h.Nodes[i]
	if n.MemoryBytes > 0 {
		return []NodeID{id}
	}
	usable := func(j int) bool { return j != i && h.Nodes[j].MemoryBytes > 0 && h.Nodes[j].GPU == "" }
	var out []NodeID
	if len(n.Distances) == len(h.Nodes) {
		best := -1
		for j, d := range n.Distances {
			if usable(j) && (best < 0 || d < best) {
				best = d
			}
		}
		for j, d := range n.Distances {
			if usable(j) && d == best {
				out = append(out, h.Nodes[j].ID)
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	for j := range h.Nodes {
		if usable(j) && !n.CPUs.IsEmpty() && n.CPUs.IsSubsetOf(h.Nodes[j].Initiators) {
			out = append(out, h.Nodes[j].ID)
		}
	}
	return out
}

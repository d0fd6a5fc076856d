package topology

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/fusiond/fusiond/devices"
)

// ErrNoCPUs is returned when a tree has no usable CPU information at all
// (no /sys/devices/system/cpu): nothing sensible can be modelled.
var ErrNoCPUs = errors.New("topology: no CPU information")

// LinkSource reports direct device-to-device links (NVLink), typically
// implemented by the GPU driver layer. topology never talks to drivers.
type LinkSource interface {
	DeviceLinks(ctx context.Context) ([]devices.Link, error)
}

// Option configures Discover.
type Option func(*options)

type options struct {
	root    string
	logger  *slog.Logger
	links   LinkSource
	noNames bool
}

// WithRoot makes discovery read sysfs and procfs below dir instead of "/"
// (a fixture tree, an unpacked ghw snapshot, a simhost tree).
func WithRoot(dir string) Option { return func(o *options) { o.root = dir } }

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithLinkSource adds NVLink-style links to the model.
func WithLinkSource(s LinkSource) Option { return func(o *options) { o.links = s } }

// WithoutNames skips the pci.ids lookup (names stay empty); Watcher uses
// it for cheap periodic refreshes when names are not wanted.
func WithoutNames() Option { return func(o *options) { o.noNames = true } }

// discovery carries the state of one Discover call.
type discovery struct {
	ctx  context.Context
	fs   *fsRoot
	o    options
	log  *slog.Logger
	host *Host
}

func (d *discovery) warn(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	d.log.Warn("topology: " + msg)
	d.host.Warnings = append(d.host.Warnings, msg)
}

// Discover builds the Host model from the tree (see WithRoot). It fails
// only when the tree has no CPU information (ErrNoCPUs) or ctx is done;
// everything else that is missing or malformed is explained in
// Host.Warnings and left out of the model.
func Discover(ctx context.Context, opts ...Option) (*Host, error) {
	o := options{root: "/"}
	for _, opt := range opts {
		opt(&o)
	}
	if o.logger == nil {
		o.logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	d := &discovery{ctx: ctx, fs: newFSRoot(ctx, o.root), o: o, log: o.logger, host: &Host{}}
	defer d.fs.close()
	if err := d.cpus(); err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return nil, fmt.Errorf("topology: discovery stopped: %w", cerr)
		}
		return nil, err
	}
	d.nodes()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("topology: discovery stopped: %w", err)
	}
	d.cores()
	d.coreKinds()
	d.sockets()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("topology: discovery stopped: %w", err)
	}
	d.pci()
	d.deviceLinks()
	if hn, err := d.fs.read("/proc/sys/kernel/hostname"); err == nil {
		d.host.Hostname = hn
	}
	slices.Sort(d.host.Warnings)
	d.host.Warnings = slices.Compact(d.host.Warnings)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("topology: discovery stopped: %w", err)
	}
	return d.host, nil
}

const (
	sysCPU  = "/sys/devices/system/cpu"
	sysNode = "/sys/devices/system/node"
	sysPCI  = "/sys/bus/pci/devices"
)

// cpus reads the online and offline CPU sets.
func (d *discovery) cpus() error {
	if _, err := os.Stat(d.fs.path(sysCPU)); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrNoCPUs, sysCPU, err)
	}
	present := d.listedCPUs()
	listed, presentErr := d.fs.readCPUList(sysCPU + "/present")
	online, err := d.fs.readCPUList(sysCPU + "/online")
	// An empty cpuN directory that neither cpu/present nor cpu/online
	// names is not a CPU (hwloc makes no PU of it either). Only those
	// directories are looked into.
	unnamed := present.Difference(online)
	if presentErr == nil {
		unnamed = unnamed.Difference(listed)
	}
	var phantom CPUSet
	for _, c := range unnamed.List() {
		if sub, err := d.fs.readDir(fmt.Sprintf("%s/cpu%d", sysCPU, c)); err == nil && len(sub) == 0 {
			phantom = phantom.Union(NewCPUSet(c))
		}
	}
	if !phantom.IsEmpty() {
		d.warn("%s/cpuN directories of CPUs %s are empty and named by neither %s/present nor online; not CPUs", sysCPU, phantom, sysCPU)
		present = present.Difference(phantom)
	}
	if err != nil {
		d.warn("%v; treating every cpuN directory without online=0 as online", err)
		online = CPUSet{}
		for _, c := range present.List() {
			if v, err := d.fs.readInt(fmt.Sprintf("%s/cpu%d/online", sysCPU, c)); err == nil && v == 0 {
				continue
			}
			online = online.Union(NewCPUSet(c))
		}
	}
	if online.IsEmpty() {
		return fmt.Errorf("%w: %s lists no online CPU", ErrNoCPUs, sysCPU+"/online")
	}
	// An online CPU without cpuN/topology: the kernel does not say which
	// core, package or die it is in, and other CPUs' sibling lists may
	// still name it (it would land in two cores). It is left out of the
	// model, as hwloc leaves it out — unless no CPU has a topology
	// directory at all (then each CPU is its own core, warned later).
	var noTopo CPUSet
	for _, c := range online.List() {
		if _, err := os.Stat(d.fs.path(fmt.Sprintf("%s/cpu%d/topology", sysCPU, c))); errors.Is(err, fs.ErrNotExist) {
			noTopo = noTopo.Union(NewCPUSet(c))
		}
	}
	if !noTopo.IsEmpty() && !noTopo.Equal(online) {
		d.warn("%s/cpuN/topology is missing for online CPUs %s; they are left out of the model (as hwloc): no core, package or node", sysCPU, noTopo)
		online = online.Difference(noTopo)
		present = present.Difference(noTopo)
	}
	d.host.OnlineCPUs = online
	if presentErr == nil {
		present = present.Union(listed.Difference(noTopo))
	}
	d.host.OfflineCPUs = present.Difference(online)
	if !d.host.OfflineCPUs.IsEmpty() {
		d.warn("CPUs %s are offline and left out of cores, nodes and sockets", d.host.OfflineCPUs)
	}
	return nil
}

// listedCPUs returns the CPUs that have a cpuN directory.
func (d *discovery) listedCPUs() CPUSet {
	ents, _ := d.fs.readDir(sysCPU)
	var ids []int
	for _, e := range ents {
		if n, ok := numberedEntry(e.Name(), "cpu"); ok {
			ids = append(ids, n)
		}
	}
	return NewCPUSet(ids...)
}

// numberedEntry parses names like "cpu12" or "node1".
func numberedEntry(name, prefix string) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok || rest == "" || strings.Trim(rest, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	return n, err == nil && n < MaxCPUs
}

// nodes reads NUMA nodes: CPUs, memory and distances.
func (d *discovery) nodes() {
	ents, err := d.fs.readDir(sysNode)
	var ids []int
	for _, e := range ents {
		if n, ok := numberedEntry(e.Name(), "node"); ok {
			ids = append(ids, n)
		}
	}
	sort.Ints(ids)
	ids = d.realNodes(ids)
	if err != nil || len(ids) == 0 {
		d.warn("no NUMA nodes under %s (kernel without CONFIG_NUMA?); modelling one node 0 with all CPUs and /proc/meminfo's memory", sysNode)
		n := Node{ID: 0, CPUs: d.host.OnlineCPUs, Distances: []int{10}}
		if s, err := d.fs.read("/proc/meminfo"); err != nil {
			d.warn("%v; node 0 memory unknown", err)
		} else if m, err := ParseMeminfoTotal(s); err != nil {
			d.warn("/proc/meminfo: %v", err)
		} else {
			n.MemoryBytes = m
		}
		d.host.Nodes = []Node{n}
		return
	}
	var covered CPUSet
	var overlaps []string
	unknownCPUs := map[NodeID]bool{}
	for _, id := range ids {
		dir := fmt.Sprintf("%s/node%d", sysNode, id)
		n := Node{ID: NodeID(id), Socket: NoSocket}
		// The cpumap mask (as hwloc; the only file on older kernels,
		// ia64, POWER), else cpulist.
		if m, err := d.fs.readCPUMask(dir + "/cpumap"); err == nil {
			n.CPUs = m.Intersection(d.host.OnlineCPUs)
		} else if c, err2 := d.fs.readCPUList(dir + "/cpulist"); err2 == nil {
			n.CPUs = c.Intersection(d.host.OnlineCPUs)
		} else if links := d.nodeCPULinks(dir); !links.IsEmpty() {
			// The kernel also links each of the node's CPUs under it
			// (nodeN/cpuM): better than dropping the node (hwloc drops
			// it, memory and all) or calling it CPU-less.
			n.CPUs = links.Intersection(d.host.OnlineCPUs)
			d.warn("%v; %v; node%d CPUs %s taken from its cpuM links", err, err2, id, links)
		} else {
			unknownCPUs[NodeID(id)] = true
			d.warn("%v; %v; no cpuM links either: node%d CPUs unknown, none in the model and no initiators guessed", err, err2, id)
		}
		// Overlapping node CPU lists (buggy firmware): the first node
		// keeps them, later nodes lose the overlap.
		if ov := n.CPUs.Intersection(covered); !ov.IsEmpty() {
			overlaps = append(overlaps, fmt.Sprintf("node%d", id))
			n.CPUs = n.CPUs.Difference(covered)
		}
		covered = covered.Union(n.CPUs)
		if s, err := d.fs.read(dir + "/meminfo"); err != nil {
			d.warn("%v; node%d memory unknown", err, id)
		} else if m, err := ParseMeminfoTotal(s); err != nil {
			d.warn("%s/meminfo: %v", dir, err)
		} else {
			n.MemoryBytes = m
		}
		n.BlockMemoryBytes = d.blockMemory(dir)
		if s, err := d.fs.read(dir + "/distance"); err != nil {
			d.warn("%v; node%d distances unknown", err, id)
		} else if row, err := ParseDistances(s); err != nil {
			d.warn("%s/distance: %v", dir, err)
		} else if len(row) != len(ids) {
			d.warn("%s/distance: %d entries for %d nodes; ignored", dir, len(row), len(ids))
		} else {
			n.Distances = row
		}
		d.host.Nodes = append(d.host.Nodes, n)
	}
	if len(overlaps) > 0 {
		d.warn("%s/nodeN/cpulist: %s list CPUs of an earlier node; the earlier node keeps them", sysNode, strings.Join(overlaps, ", "))
	}
	gpuMem := d.gpuMemoryNodes()
	var cpuless []string
	for i := range d.host.Nodes {
		n := &d.host.Nodes[i]
		if g, ok := gpuMem[n.ID]; ok {
			n.GPU = g.addr
		}
		if !n.CPUs.IsEmpty() || unknownCPUs[n.ID] {
			continue
		}
		cpuless = append(cpuless, fmt.Sprintf("node%d", n.ID))
		// access1/initiators/nodeM: the CPU nodes with the best access
		// (what hwloc reads); else access0 (best initiator of any kind).
		ents, err := d.fs.readDir(fmt.Sprintf("%s/node%d/access1/initiators", sysNode, n.ID))
		if err != nil {
			ents, err = d.fs.readDir(fmt.Sprintf("%s/node%d/access0/initiators", sysNode, n.ID))
		}
		if err == nil {
			for _, e := range ents {
				if m, ok := numberedEntry(e.Name(), "node"); ok {
					if in := d.host.Node(NodeID(m)); in != nil {
						n.Initiators = n.Initiators.Union(in.CPUs)
					}
				}
			}
		}
		if g, ok := gpuMem[n.ID]; ok && n.Initiators.IsEmpty() {
			// GPU memory (POWER9 NVLink, Grace Hopper): the CPUs local
			// to the GPU whose memory it is, as hwloc does.
			n.Initiators = g.cpus
		}
		if n.Initiators.IsEmpty() {
			// No initiators (older kernels, KNL's MCDRAM nodes): the
			// CPUs of the strictly nearest nodes by SLIT distance.
			n.Initiators = d.host.nearestCPUs(i)
		}
	}
	if len(cpuless) > 0 {
		d.warn("%s: nodes without an online CPU (memory-only, or all their CPUs offline): %s", sysNode, strings.Join(cpuless, ", "))
	}
	if rest := d.host.OnlineCPUs.Difference(covered); !rest.IsEmpty() {
		d.warn("online CPUs %s belong to no NUMA node", rest)
	}
}

// realNodes drops nodeN directories that are no NUMA node: with
// node/online (the kernel's list, which hwloc reads), those it does not
// name; without it, those holding none of cpumap, cpulist, meminfo and
// distance. A stray directory would otherwise add a phantom node and
// make every distance row one entry short.
func (d *discovery) realNodes(ids []int) []int {
	var stray []string
	online, err := d.fs.readCPUList(sysNode + "/online")
	keep := ids[:0:0]
	for _, id := range ids {
		dir := fmt.Sprintf("%s/node%d", sysNode, id)
		switch {
		case err == nil && !online.Contains(id):
			stray = append(stray, fmt.Sprintf("node%d", id))
		case err != nil && !slices.ContainsFunc([]string{"cpumap", "cpulist", "meminfo", "distance"}, func(f string) bool {
			_, e := os.Stat(d.fs.path(dir + "/" + f))
			return e == nil
		}):
			stray = append(stray, fmt.Sprintf("node%d", id))
		default:
			keep = append(keep, id)
		}
	}
	if len(stray) > 0 {
		why := "hold none of cpumap, cpulist, meminfo, distance"
		if err == nil {
			why = fmt.Sprintf("are not in %s/online (%s)", sysNode, online)
		}
		d.warn("%s: %s %s; not NUMA nodes, ignored", sysNode, abbreviate(stray, 6), why)
	}
	return keep
}

// nodeCPULinks returns the CPUs linked under a node directory (cpuM).
func (d *discovery) nodeCPULinks(dir string) CPUSet {
	ents, err := d.fs.readDir(dir)
	if err != nil {
		return CPUSet{}
	}
	var ids []int
	for _, e := range ents {
		if n, ok := numberedEntry(e.Name(), "cpu"); ok {
			ids = append(ids, n)
		}
	}
	return NewCPUSet(ids...)
}

// gpuMemory is an NVIDIA GPU's memory exposed as a NUMA node.
type gpuMemory struct {
	addr PCIAddr
	cpus CPUSet // the GPU's local CPUs (online); empty when unknown
}

// gpuMemoryNodes reads /proc/driver/nvidia/gpus/ADDR/numa_status
// ("Node: 250"): the NUMA node holding that GPU's memory (POWER9 with
// NVLink to the CPU, Grace Hopper). The node's locality is the GPU's
// local_cpulist (else local_cpus), as hwloc takes it. A node the kernel
// does not have, or a file without a Node line, is warned about once.
func (d *discovery) gpuMemoryNodes() map[NodeID]gpuMemory {
	const dir = "/proc/driver/nvidia/gpus"
	ents, err := d.fs.readDir(dir)
	if err != nil {
		return nil
	}
	out := map[NodeID]gpuMemory{}
	var bad []string
	for _, e := range ents {
		addr, err := ParsePCIAddr(e.Name())
		if err != nil {
			continue
		}
		p := dir + "/" + e.Name() + "/numa_status"
		s, err := d.fs.read(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue // older drivers, or a GPU without coherent memory
		}
		if err != nil {
			bad = append(bad, err.Error())
			continue
		}
		node, ok := numaStatusNode(s)
		switch {
		case !ok:
			bad = append(bad, fmt.Sprintf("%s: no \"Node: N\" line", p))
			continue
		case node < 0:
			continue // the driver has not onlined the memory
		case d.host.Node(NodeID(node)) == nil:
			bad = append(bad, fmt.Sprintf("%s: Node %d is not a NUMA node here", p, node))
			continue
		}
		g := gpuMemory{addr: addr}
		if c, file, err := d.readCPUSetFile(sysPCI+"/"+e.Name(), "local_cpulist", "local_cpus"); err == nil && file != "" {
			g.cpus = c.Intersection(d.host.OnlineCPUs)
		}
		out[NodeID(node)] = g
	}
	if len(bad) > 0 {
		d.warn("NVIDIA GPU memory nodes: %s; those GPUs' memory is not located", abbreviate(bad, 2))
	}
	return out
}

// numaStatusNode parses the "Node:" line of an NVIDIA numa_status file.
func numaStatusNode(s string) (int, bool) {
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(k) != "Node" {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(v))
		return n, err == nil
	}
	return 0, false
}

// blockMemory sums the node's online memory blocks; 0 when the kernel
// has no memory block devices (or the files are unreadable, warned).
func (d *discovery) blockMemory(nodeDir string) uint64 {
	ents, err := d.fs.readDir(nodeDir)
	if err != nil {
		return 0
	}
	// block_size_bytes first: without it the sum is 0 whatever the
	// blocks say, and one online block decides whether that is warned;
	// the per-block online files (thousands on a large host, often
	// dangling links in captured trees) are then not read.
	size, sizeErr := d.fs.readHex("/sys/devices/system/memory/block_size_bytes", 64)
	var blocks uint64
	for _, e := range ents {
		if _, ok := numberedEntry(e.Name(), "memory"); !ok {
			continue
		}
		// Blocks without an online file cannot be offlined: they are online.
		if v, err := d.fs.readInt(nodeDir + "/" + e.Name() + "/online"); err == nil && v == 0 {
			continue
		}
		blocks++
		if sizeErr != nil {
			break
		}
	}
	if blocks == 0 {
		return 0
	}
	if sizeErr != nil {
		d.warn("%v; memory block sizes unknown", sizeErr)
		return 0
	}
	return blocks * size
}

// nearestCPUs returns the CPUs (or, for a CPU-less node, the initiators
// found so far) of the nodes nearest to h.Nodes[i] by SLIT distance, as
// hwloc places a CPU-less node without initiators: the nearest distance
// must be larger than the node's own, and not every other node may be at
// that distance (then no node is nearer than another). Empty when the
// distances are unknown or say nothing.
func (h *Host) nearestCPUs(i int) CPUSet {
	row := h.Nodes[i].Distances
	if len(row) != len(h.Nodes) || len(h.Nodes) < 2 {
		return CPUSet{}
	}
	best, nb := -1, 0
	for j, dist := range row {
		switch {
		case j == i:
		case best < 0 || dist < best:
			best, nb = dist, 1
		case dist == best:
			nb++
		}
	}
	if best <= row[i] || nb == len(h.Nodes)-1 {
		return CPUSet{}
	}
	var out CPUSet
	for j, dist := range row {
		if j != i && dist == best {
			out = out.Union(h.Nodes[j].CPUs).Union(h.Nodes[j].Initiators)
		}
	}
	return out
}

// nodeOfCPU returns the node holding cpu, or NoNode.
func (h *Host) nodeOfCPU(cpu int) NodeID {
	for _, n := range h.Nodes {
		if n.CPUs.Contains(cpu) {
			return n.ID
		}
	}
	return NoNode
}

// sockets ties nodes to the sockets their CPUs sit in; a node spanning
// two packages is listed under each (Node.Socket is the first).
func (d *discovery) sockets() {
	for i := range d.host.Nodes {
		n := &d.host.Nodes[i]
		for j := range d.host.Sockets {
			s := &d.host.Sockets[j]
			if n.CPUs.Intersects(s.CPUs) {
				if n.Socket == NoSocket {
					n.Socket = s.ID
				}
				s.Nodes = append(s.Nodes, n.ID)
			}
		}
	}
}

// pci walks /sys/bus/pci/devices.
func (d *discovery) pci() {
	ents, err := d.fs.readDir(sysPCI)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			d.warn("%s: %v; no PCI devices in the model", sysPCI, err)
		}
		return
	}
	var unknownNode, noPath, badNode []string
	for _, e := range ents {
		addr, err := ParsePCIAddr(e.Name())
		if err != nil {
			d.warn("%s/%s: %v; skipped", sysPCI, e.Name(), err)
			continue
		}
		dev, ok := d.pciDevice(addr, &noPath, &badNode)
		if !ok {
			continue
		}
		if dev.Node == NoNode && len(d.host.Nodes) > 1 {
			unknownNode = append(unknownNode, string(addr))
		}
		d.host.Devices = append(d.host.Devices, dev)
	}
	slices.SortFunc(d.host.Devices, func(a, b PCIDevice) int { return cmp.Compare(a.Addr, b.Addr) })
	if len(d.host.Devices) > 0 && !d.o.noNames {
		if names, ok := d.pciNames(d.host.Devices); ok {
			for i := range d.host.Devices {
				names.name(&d.host.Devices[i])
			}
		}
	}
	if len(noPath) > 0 {
		d.warn("%s: %d entries are not symlinks to a /sys/devices/pciDDDD:BB/... path (%s); kept with unknown host bridge and upstream bridges", sysPCI, len(noPath), abbreviate(noPath, 6))
	}
	if len(badNode) > 0 {
		d.warn("%s, naming no NUMA node here (nodes: %s), for %d devices; placed by local_cpulist instead where it names one node", abbreviate(badNode, 3), d.nodeList(), len(badNode))
	}
	if len(unknownNode) > 0 {
		d.warn("%s/*/numa_node is -1 and local_cpulist names no single node for %d devices (%s); their NUMA node is unknown", sysPCI, len(unknownNode), abbreviate(unknownNode, 6))
	}
}

// pciDevice reads one device; ok is false when it must be skipped.
func (d *discovery) pciDevice(addr PCIAddr, noPath, badNode *[]string) (PCIDevice, bool) {
	dir := sysPCI + "/" + string(addr)
	dev := PCIDevice{Addr: addr, Node: NoNode}
	// A /sys/bus/pci/devices entry is normally a symlink into
	// /sys/devices/pciDDDD:BB/...; some trees (and some platforms) have a
	// plain directory or an unparsable target: the device is kept with an
	// unknown host bridge and upstream path.
	isLink, target, err := d.fs.resolveLink(dir)
	if err != nil {
		d.warn("%s: %v; device skipped", dir, err)
		return dev, false
	}
	if isLink {
		rel, err := filepath.Rel(d.fs.path("/"), target)
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			d.warn("%s resolves to %s, outside the tree; device skipped", dir, target)
			return dev, false
		}
		hb, chain, err := parseDevicePath("/" + rel)
		if err != nil || chain[len(chain)-1] != addr {
			*noPath = append(*noPath, string(addr))
		} else {
			dev.HostBridge = hb
			dev.Upstream = chain[:len(chain)-1]
			if len(dev.Upstream) == 0 {
				dev.Upstream = nil
			}
		}
	} else {
		*noPath = append(*noPath, string(addr))
	}
	class, err := d.fs.readHex(dir+"/class", 32)
	if err != nil {
		d.warn("%v; class unknown", err)
	}
	vendor, err := d.fs.readHex(dir+"/vendor", 16)
	if err != nil {
		d.warn("%v; vendor unknown", err)
	}
	device, err := d.fs.readHex(dir+"/device", 16)
	if err != nil {
		d.warn("%v; device id unknown", err)
	}
	dev.Class, dev.VendorID, dev.DeviceID = uint32(class), uint16(vendor), uint16(device)
	dev.Kind = classify(dev.Class, dev.VendorID)
	// local_cpulist, else the local_cpus mask (the only file on older
	// kernels and what hwloc reads).
	if c, file, err := d.readCPUSetFile(dir, "local_cpulist", "local_cpus"); err != nil {
		d.warn("%v", err)
	} else if file != "" {
		dev.LocalCPUs = c
	}
	dev.Node = d.deviceNode(dir, dev.LocalCPUs, badNode)
	if s, err := d.fs.read(dir + "/current_link_speed"); err == nil && !strings.HasPrefix(s, "Unknown") {
		dev.LinkSpeed = s
	}
	if s, err := d.fs.read(dir + "/max_link_speed"); err == nil && !strings.HasPrefix(s, "Unknown") {
		dev.MaxLinkSpeed = s
	}
	dev.LinkWidth = d.linkWidth(dir + "/current_link_width")
	dev.MaxLinkWidth = d.linkWidth(dir + "/max_link_width")
	return dev, true
}

func (d *discovery) linkWidth(p string) int {
	n, err := d.fs.readInt(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return 0
	case err != nil:
		d.warn("%v", err)
		return 0
	case n < 0 || n > 32:
		d.warn("%s: %v: width %d", p, ErrMalformed, n)
		return 0
	}
	return n
}

// deviceNode resolves a device's NUMA node: numa_node when the kernel
// knows it; on a single-node host node 0; otherwise the one node whose
// CPUs contain local_cpulist, else NoNode.
func (d *discovery) deviceNode(dir string, local CPUSet, badNode *[]string) NodeID {
	n, err := d.fs.readInt(dir + "/numa_node")
	switch {
	case err == nil && n >= 0:
		if d.host.Node(NodeID(n)) != nil {
			return NodeID(n)
		}
		// A node the kernel does not have (firmware _PXM naming an
		// absent or offline node): place the device by its local
		// CPUs below, as hwloc does (it reads only local_cpus).
		*badNode = append(*badNode, fmt.Sprintf("%s/numa_node is %d", dir, n))
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		d.warn("%v", err)
	}
	if len(d.host.Nodes) == 1 {
		return d.host.Nodes[0].ID
	}
	local = local.Intersection(d.host.OnlineCPUs)
	if local.IsEmpty() || local.Equal(d.host.OnlineCPUs) {
		return NoNode
	}
	found := NoNode
	for _, nd := range d.host.Nodes {
		if local.IsSubsetOf(nd.CPUs) && !nd.CPUs.IsEmpty() {
			if found != NoNode {
				return NoNode
			}
			found = nd.ID
		}
	}
	return found
}

// nodeList is the model's node IDs as a list ("0-1,250-255").
func (d *discovery) nodeList() string {
	ids := make([]int, len(d.host.Nodes))
	for i, n := range d.host.Nodes {
		ids[i] = int(n.ID)
	}
	return NewCPUSet(ids...).String()
}

// pciNames looks devs' names up in pci.ids (PCIDB_PATH, else the usual
// places below the root, then on the host); ok is false (with a warning)
// when none is readable.
func (d *discovery) pciNames(devs []PCIDevice) (pciNames, bool) {
	var candidates []string
	if p := os.Getenv("PCIDB_PATH"); p != "" {
		candidates = append(candidates, p)
	}
	for _, r := range []string{d.o.root, "/"} {
		for _, p := range []string{"/usr/share/hwdata/pci.ids", "/usr/share/misc/pci.ids", "/usr/share/pci.ids"} {
			candidates = append(candidates, filepath.Join(r, p))
		}
	}
	for _, p := range candidates {
		var names pciNames
		err := d.fs.withHostFile(p, func(b []byte) { names = lookupPCINames(b, devs) })
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err == nil {
			return names, true
		}
		d.warn("pci.ids: %v", err)
	}
	d.warn("no pci.ids found (install the pci.ids package or set PCIDB_PATH); device names are empty")
	return pciNames{}, false
}

func (d *discovery) deviceLinks() {
	if d.o.links == nil {
		return
	}
	links, err := d.o.links.DeviceLinks(d.ctx)
	if err != nil {
		d.warn("device links: %v", err)
		return
	}
	for _, l := range links {
		a, errA := ParsePCIAddr(l.A)
		b, errB := ParsePCIAddr(l.B)
		if errA != nil || errB != nil {
			d.warn("device link %s-%s: bad PCI address; ignored", l.A, l.B)
			continue
		}
		if d.host.Device(a) == nil || d.host.Device(b) == nil {
			d.warn("device link %s-%s: device not on the PCI bus; ignored", a, b)
			continue
		}
		l.A, l.B = string(a), string(b)
		d.host.Links = append(d.host.Links, l)
	}
}

// abbreviate joins the first n items and says how many more there are,
// so that a warning stays one readable line.
func abbreviate(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:n], ", "), len(items)-n)
}

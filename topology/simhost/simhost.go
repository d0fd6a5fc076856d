// Package simhost writes the sysfs and procfs tree of a simulated
// 2-socket, 8-GPU HGX/DGX H200-class server, laid out as the Linux kernel
// lays it out (real symlinks from /sys/bus/pci/devices into
// /sys/devices/pciDDDD:BB/..., cpuN/topology, node*/distance, meminfo,
// /proc/cpuinfo), so that topology.Discover, ghw and hwloc
// (HWLOC_FSROOT) all read it like a live host.
//
// Layout: two sockets of 56 cores × 2 threads (by default; see
// WithCoresPerSocket), one NUMA node each.
// Each socket has two PCIe host bridges with one Broadcom PEX switch
// behind each; every switch carries two H200 GPUs and one ConnectX-7
// NIC. One NVMe drive per socket sits on a second root port of the
// second host bridge, and the BMC's VGA sits on its own host bridge
// of socket 0.
//
// The GPUs use the PCI bus IDs of go-nvml's dgxh200 mock
// (0000:00:00.0 ... 0000:07:00.0, in NVML index order) so a simulated
// NVML host can be joined to this topology by bus ID. Those bus numbers
// cannot be reached through the switches' bridge bus ranges on real
// hardware; the tree is consistent in its sysfs paths, which is what
// topology reads, and the bridges' config space lists the true secondary
// bus of each downstream port where it can (see busRange).
//
// It imports only the standard library.
package simhost

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Shape of the simulated machine.
const (
	Sockets        = 2
	CoresPerSocket = 56 // default; see WithCoresPerSocket
	ThreadsPerCore = 2
	// NodeMemKiB is each node's MemTotal in KiB (1 TiB less firmware
	// reservations).
	NodeMemKiB = 1056763472
	Hostname   = "sim-dgx-h200"
)

// Kind says what a simulated PCI function is.
type Kind int

// Kinds of simulated PCI functions.
const (
	RootPort Kind = iota
	SwitchUp
	SwitchDown
	GPU
	NIC
	NVMe
	VGA
	VGABridge
)

// Device is one simulated PCI function.
type Device struct {
	Addr   string
	Kind   Kind
	Node   int
	Parent string // "" for a root port
	// HostBridge is "pciDDDD:BB".
	HostBridge string
}

// GPUAddrs are the GPUs' PCI addresses in NVML index order, equal to
// go-nvml's dgxh200 mock (fmt.Sprintf("0000:%02x:00.0", index)).
func GPUAddrs() []string {
	out := make([]string, 8)
	for i := range out {
		out[i] = fmt.Sprintf("0000:%02x:00.0", i)
	}
	return out
}

// NICAddrs are the four ConnectX-7 NICs, one per switch, in switch order.
func NICAddrs() []string {
	return []string{"0000:13:00.0", "0000:23:00.0", "0000:93:00.0", "0000:a3:00.0"}
}

// Devices returns every simulated PCI function, parents before children.
func Devices() []Device {
	var out []Device
	add := func(addr string, k Kind, node int, parent, hb string) {
		out = append(out, Device{Addr: addr, Kind: k, Node: node, Parent: parent, HostBridge: hb})
	}
	gpus := GPUAddrs()
	nics := NICAddrs()
	// Four switches: (host bridge bus, socket).
	for sw, hbBus := range []int{0x10, 0x20, 0x90, 0xa0} {
		node := sw / 2
		hb := fmt.Sprintf("pci0000:%02x", hbBus)
		rp := fmt.Sprintf("0000:%02x:01.0", hbBus)
		up := fmt.Sprintf("0000:%02x:00.0", hbBus+1)
		add(rp, RootPort, node, "", hb)
		add(up, SwitchUp, node, rp, hb)
		for port, ep := range []string{gpus[2*sw], gpus[2*sw+1], nics[sw]} {
			dp := fmt.Sprintf("0000:%02x:%02x.0", hbBus+2, port)
			add(dp, SwitchDown, node, up, hb)
			k := GPU
			if port == 2 {
				k = NIC
			}
			add(ep, k, node, dp, hb)
		}
		if sw%2 == 1 { // NVMe on a second root port of the socket's 2nd host bridge
			rp2 := fmt.Sprintf("0000:%02x:02.0", hbBus)
			add(rp2, RootPort, node, "", hb)
			add(fmt.Sprintf("0000:%02x:00.0", hbBus+4), NVMe, node, rp2, hb)
		}
	}
	// BMC: root port -> ASPEED bridge -> ASPEED VGA, socket 0.
	add("0000:30:01.0", RootPort, 0, "", "pci0000:30")
	add("0000:31:00.0", VGABridge, 0, "0000:30:01.0", "pci0000:30")
	add("0000:32:00.0", VGA, 0, "0000:31:00.0", "pci0000:30")
	return out
}

// ids: vendor, device, class, subsystem vendor, subsystem device, link
// speed, link width.
type ids struct {
	vendor, device    uint16
	class             uint32
	subVendor, subDev uint16
	speed             string
	width             int
}

func idsOf(k Kind) ids {
	switch k {
	case RootPort:
		return ids{0x8086, 0x352a, 0x060400, 0x8086, 0x0000, "32.0 GT/s PCIe", 16}
	case SwitchUp, SwitchDown:
		return ids{0x1000, 0xc030, 0x060400, 0x1000, 0x100b, "32.0 GT/s PCIe", 16}
	case GPU:
		return ids{0x10de, 0x2333, 0x030200, 0x10de, 0x18be, "32.0 GT/s PCIe", 16} // device id as the dgxh200 mock
	case NIC:
		return ids{0x15b3, 0x1021, 0x020000, 0x15b3, 0x0041, "32.0 GT/s PCIe", 16}
	case NVMe:
		return ids{0x144d, 0xa80a, 0x010802, 0x144d, 0xa813, "16.0 GT/s PCIe", 4}
	case VGABridge:
		return ids{0x1a03, 0x1150, 0x060400, 0x1a03, 0x1150, "5.0 GT/s PCIe", 1}
	default: // VGA
		return ids{0x1a03, 0x2000, 0x030000, 0x1a03, 0x2000, "", 0}
	}
}

// writer collects the tree's files and symlinks in the order they are
// planned; put writes them out.
type writer struct {
	entries []entry
}

// entry is one file (data is its content) or symlink (data is its
// target) at an in-host path.
type entry struct {
	path string
	link bool
	data string
}

func (w *writer) file(p, content string) {
	w.entries = append(w.entries, entry{path: p, data: content})
}

func (w *writer) link(p, target string) {
	w.entries = append(w.entries, entry{path: p, link: true, data: target})
}

// put writes entries below root and keeps the first error.
type put struct {
	root string
	dirs map[string]bool // directories already created
	err  error
	// pool, when set, holds one file per distinct content, which every
	// file of that content is a hard link to (see WithSharedContent).
	pool   string
	pooled map[string]string // content → its file in pool
}

func (w *put) mkdir(dir string) {
	if w.dirs[dir] {
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		w.err = err
		return
	}
	w.dirs[dir] = true
}

func (w *put) file(p, content string) {
	if w.err != nil {
		return
	}
	full := filepath.Join(w.root, p)
	if w.mkdir(filepath.Dir(full)); w.err != nil {
		return
	}
	if w.pool == "" {
		w.err = os.WriteFile(full, []byte(content), 0o644)
		return
	}
	src, ok := w.pooled[content]
	if !ok {
		if w.mkdir(w.pool); w.err != nil {
			return
		}
		src = filepath.Join(w.pool, strconv.Itoa(len(w.pooled)))
		if w.err = os.WriteFile(src, []byte(content), 0o644); w.err != nil {
			return
		}
		w.pooled[content] = src
	}
	w.err = os.Link(src, full)
}

func (w *put) link(p, target string) {
	if w.err != nil {
		return
	}
	full := filepath.Join(w.root, p)
	if w.mkdir(filepath.Dir(full)); w.err != nil {
		return
	}
	w.err = os.Symlink(target, full)
}

// ErrNotEmpty is returned when Write's directory already holds a tree.
var ErrNotEmpty = errors.New("simhost: target directory is not empty")

// Option changes the simulated machine.
type Option func(*shape)

// shape is the CPU shape of the machine, its GPUs (and how it is
// written).
type shape struct {
	cores  int
	shared bool
	// gpus are the GPUs' PCI device ids by slot (GPUAddrs order); nil:
	// eight H200s.
	gpus []uint16
}

// WithGPUs fills the first len(ids) GPU slots (GPUAddrs order) with GPUs
// of those PCI device ids (NVIDIA's vendor id) and leaves the other slots
// empty: a host with fewer GPUs, or of several models (an H100 beside two
// L4s). At most 8; more are ignored.
func WithGPUs(ids ...uint16) Option {
	return func(s *shape) { s.gpus = slices.Clone(ids[:min(len(ids), 8)]) }
}

// devices are the machine's PCI functions: Devices, less the empty GPU
// slots.
func (sh shape) devices() []Device {
	all := Devices()
	if sh.gpus == nil {
		return all
	}
	slot := map[string]int{}
	for i, a := range GPUAddrs() {
		slot[a] = i
	}
	out := all[:0]
	for _, d := range all {
		if d.Kind != GPU || slot[d.Addr] < len(sh.gpus) {
			out = append(out, d)
		}
	}
	return out
}

// PoolDir is the directory, below Write's dir, of the content files that
// WithSharedContent links to.
const PoolDir = ".simhost-content"

// WithSharedContent writes each distinct file content once (below
// PoolDir) and makes every file of that content a hard link to it: a
// tree of some 15,000 files then costs a few hundred file creations, the
// rest being links, which most filesystems make far more cheaply than
// files (on ext4 under load, ms per file, tens of µs per link). Files of
// such a tree share their inode with every file of the same content, so
// it is for trees that are read, not edited in place (the daemon's
// simulated host); a file is changed by replacing it, never by writing
// into it.
func WithSharedContent() Option { return func(s *shape) { s.shared = true } }

// cpus is the number of logical CPUs.
func (sh shape) cpus() int { return Sockets * sh.cores * ThreadsPerCore }

// WithCoresPerSocket shrinks (or grows) the sockets: tests that write
// many trees use a few cores to stay fast. n < 1 is taken as 1.
func WithCoresPerSocket(n int) Option { return func(s *shape) { s.cores = max(n, 1) } }

// Tree is a simulated host's tree planned in memory: what Write puts on
// disk, and a digest of it that names its content.
type Tree struct {
	shared  bool
	entries []entry
}

// Plan lays the tree out in memory (a few milliseconds; nothing is
// written).
func Plan(opts ...Option) *Tree {
	sh := shape{cores: CoresPerSocket}
	for _, o := range opts {
		o(&sh)
	}
	w := &writer{}
	sh.writeCPUs(w)
	sh.writeNodes(w)
	sh.writePCI(w)
	w.file("/proc/sys/kernel/hostname", Hostname+"\n")
	return &Tree{shared: sh.shared, entries: w.entries}
}

// Digest is the sha256 (hex) of the tree as Write lays it out: every
// path with its content or link target, in path order, and whether
// content is shared. Two trees with one digest read the same.
func (t *Tree) Digest() string {
	sorted := slices.Clone(t.entries)
	slices.SortFunc(sorted, func(a, b entry) int { return strings.Compare(a.path, b.path) })
	h := sha256.New()
	fmt.Fprintf(h, "simhost shared=%v\n", t.shared)
	var buf []byte
	for _, e := range sorted {
		kind := byte('f')
		if e.link {
			kind = 'l'
		}
		// Lengths first: no content can pass for another entry.
		buf = append(buf[:0], kind, ' ')
		buf = strconv.AppendInt(buf, int64(len(e.path)), 10)
		buf = append(append(append(buf, ' '), e.path...), ' ')
		buf = strconv.AppendInt(buf, int64(len(e.data)), 10)
		buf = append(append(append(buf, '\n'), e.data...), '\n')
		h.Write(buf)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Write creates the tree below dir (created if missing; it must be empty).
func (t *Tree) Write(dir string) error {
	if ents, err := os.ReadDir(dir); err == nil && len(ents) > 0 {
		return fmt.Errorf("%w: %s", ErrNotEmpty, dir)
	}
	w := &put{root: dir, dirs: map[string]bool{}}
	if t.shared {
		w.pool, w.pooled = filepath.Join(dir, PoolDir), map[string]string{}
	}
	for _, e := range t.entries {
		if e.link {
			w.link(e.path, e.data)
		} else {
			w.file(e.path, e.data)
		}
	}
	if w.err != nil {
		return fmt.Errorf("simhost: write %s: %w", dir, w.err)
	}
	return nil
}

// cpuOf returns socket, core and thread of a logical CPU, numbered as
// Linux numbers Intel CPUs: all first threads of socket 0, then of
// socket 1, then the second threads.
func (sh shape) cpuOf(cpu int) (socket, core, thread int) {
	perThread := Sockets * sh.cores
	thread = cpu / perThread
	socket = (cpu % perThread) / sh.cores
	core = cpu % sh.cores
	return
}

// socketCPUs is the cpulist of a socket.
func (sh shape) socketCPUs(s int) []int {
	var out []int
	for c := 0; c < sh.cpus(); c++ {
		if so, _, _ := sh.cpuOf(c); so == s {
			out = append(out, c)
		}
	}
	return out
}

func (sh shape) coreCPUs(s, core int) []int {
	var out []int
	for t := 0; t < ThreadsPerCore; t++ {
		out = append(out, t*Sockets*sh.cores+s*sh.cores+core)
	}
	return out
}

// cpuList formats ascending CPUs in cpulist form.
func cpuList(cpus []int) string {
	var parts []string
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", cpus[i], cpus[j]))
		} else {
			parts = append(parts, fmt.Sprint(cpus[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// cpuMask formats CPUs as the kernel's comma-separated 32-bit hex words.
func (sh shape) cpuMask(cpus []int) string {
	words := make([]uint32, (sh.cpus()+31)/32)
	for _, c := range cpus {
		words[c/32] |= 1 << (c % 32)
	}
	parts := make([]string, len(words))
	for i := range words {
		parts[len(words)-1-i] = fmt.Sprintf("%08x", words[i])
	}
	return strings.Join(parts, ",")
}

func (sh shape) allCPUs() []int {
	out := make([]int, sh.cpus())
	for i := range out {
		out[i] = i
	}
	return out
}

func (sh shape) writeCPUs(w *writer) {
	all := cpuList(sh.allCPUs())
	for _, f := range []string{"online", "possible", "present"} {
		w.file("/sys/devices/system/cpu/"+f, all+"\n")
	}
	w.file("/sys/devices/system/cpu/offline", "\n")
	var cpuinfo strings.Builder
	caches := []struct {
		level          int
		typ            string
		size           string
		ways, sets     int
		sharedBySocket bool
	}{
		{1, "Data", "48K", 12, 64, false},
		{1, "Instruction", "32K", 8, 64, false},
		{2, "Unified", "2048K", 16, 2048, false},
		{3, "Unified", "107520K", 15, 114688, true},
	}
	for c := 0; c < sh.cpus(); c++ {
		s, core, _ := sh.cpuOf(c)
		dir := fmt.Sprintf("/sys/devices/system/cpu/cpu%d", c)
		if c != 0 {
			w.file(dir+"/online", "1\n")
		}
		sib, pkg := sh.coreCPUs(s, core), sh.socketCPUs(s)
		topo := map[string]string{
			"physical_package_id": fmt.Sprint(s),
			"die_id":              "0",
			"core_id":             fmt.Sprint(core),
			"thread_siblings":     sh.cpuMask(sib), "thread_siblings_list": cpuList(sib),
			"core_cpus": sh.cpuMask(sib), "core_cpus_list": cpuList(sib),
			"core_siblings": sh.cpuMask(pkg), "core_siblings_list": cpuList(pkg),
			"package_cpus": sh.cpuMask(pkg), "package_cpus_list": cpuList(pkg),
			"die_cpus": sh.cpuMask(pkg), "die_cpus_list": cpuList(pkg),
		}
		if sh.shared && sib[0] != c {
			// A thread's topology and caches read exactly as its first
			// sibling's: with shared content they are links to them.
			w.link(dir+"/topology", fmt.Sprintf("../cpu%d/topology", sib[0]))
			w.link(dir+"/cache", fmt.Sprintf("../cpu%d/cache", sib[0]))
		}
		for k, v := range topo {
			if sh.shared && sib[0] != c {
				break
			}
			w.file(dir+"/topology/"+k, v+"\n")
		}
		for i, ca := range caches {
			if sh.shared && sib[0] != c {
				break
			}
			shared, id := sib, s*sh.cores+core
			if ca.sharedBySocket {
				shared, id = pkg, s
				if sh.shared && pkg[0] != c {
					w.link(fmt.Sprintf("%s/cache/index%d", dir, i), fmt.Sprintf("../../cpu%d/cache/index%d", pkg[0], i))
					continue
				}
			}
			cd := fmt.Sprintf("%s/cache/index%d/", dir, i)
			w.file(cd+"level", fmt.Sprintf("%d\n", ca.level))
			w.file(cd+"type", ca.typ+"\n")
			w.file(cd+"size", ca.size+"\n")
			w.file(cd+"id", fmt.Sprintf("%d\n", id))
			w.file(cd+"coherency_line_size", "64\n")
			w.file(cd+"physical_line_partition", "1\n")
			w.file(cd+"ways_of_associativity", fmt.Sprintf("%d\n", ca.ways))
			w.file(cd+"number_of_sets", fmt.Sprintf("%d\n", ca.sets))
			w.file(cd+"shared_cpu_map", sh.cpuMask(shared)+"\n")
			w.file(cd+"shared_cpu_list", cpuList(shared)+"\n")
		}
		fmt.Fprintf(&cpuinfo, "processor\t: %d\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"+
			"model name\t: Intel(R) Xeon(R) Platinum 8480C\nstepping\t: 8\ncpu MHz\t\t: 2000.000\ncache size\t: 107520 KB\n"+
			"physical id\t: %d\nsiblings\t: %d\ncore id\t\t: %d\ncpu cores\t: %d\napicid\t\t: %d\n"+
			"flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ss ht syscall nx lm avx avx2 avx512f amx_tile\n\n",
			c, s, sh.cores*ThreadsPerCore, core, sh.cores, s*256+core*2+c/(Sockets*sh.cores))
	}
	w.file("/proc/cpuinfo", cpuinfo.String())
	w.file("/proc/meminfo", meminfo("", Sockets*NodeMemKiB))
}

func (sh shape) writeNodes(w *writer) {
	nodes := cpuList([]int{0, 1})
	for _, f := range []string{"online", "possible", "has_cpu", "has_memory", "has_normal_memory"} {
		w.file("/sys/devices/system/node/"+f, nodes+"\n")
	}
	for n := 0; n < Sockets; n++ {
		dir := fmt.Sprintf("/sys/devices/system/node/node%d", n)
		cpus := sh.socketCPUs(n)
		w.file(dir+"/cpulist", cpuList(cpus)+"\n")
		w.file(dir+"/cpumap", sh.cpuMask(cpus)+"\n")
		dist := make([]string, Sockets)
		for m := range dist {
			dist[m] = "21"
			if m == n {
				dist[m] = "10"
			}
		}
		w.file(dir+"/distance", strings.Join(dist, " ")+"\n")
		w.file(dir+"/meminfo", meminfo(fmt.Sprintf("Node %d ", n), NodeMemKiB))
		w.file(dir+"/hugepages/hugepages-2048kB/nr_hugepages", "0\n")
		w.file(dir+"/hugepages/hugepages-1048576kB/nr_hugepages", "0\n")
		for _, c := range cpus {
			w.link(fmt.Sprintf("%s/cpu%d", dir, c), fmt.Sprintf("../../cpu/cpu%d", c))
		}
	}
}

// devicePath returns the /sys/devices path of a device.
func devicePath(byAddr map[string]Device, d Device) string {
	parts := []string{d.Addr}
	for p := d.Parent; p != ""; p = byAddr[p].Parent {
		parts = append([]string{p}, parts...)
	}
	return "/sys/devices/" + d.HostBridge + "/" + strings.Join(parts, "/")
}

func (sh shape) writePCI(w *writer) {
	devs := sh.devices()
	slot := map[string]int{}
	for i, a := range GPUAddrs() {
		slot[a] = i
	}
	byAddr := map[string]Device{}
	children := map[string][]string{}
	for _, d := range devs {
		byAddr[d.Addr] = d
		children[d.Parent] = append(children[d.Parent], d.Addr)
	}
	hostBridges := map[string]bool{}
	for _, d := range devs {
		p := devicePath(byAddr, d)
		id := idsOf(d.Kind)
		if d.Kind == GPU && sh.gpus != nil {
			id.device = sh.gpus[slot[d.Addr]]
		}
		cpus := sh.socketCPUs(d.Node)
		if !hostBridges[d.HostBridge] {
			hostBridges[d.HostBridge] = true
			w.file("/sys/devices/"+d.HostBridge+"/uevent", "")
			w.file("/sys/devices/"+d.HostBridge+"/power/control", "auto\n")
		}
		files := map[string]string{
			"vendor":           fmt.Sprintf("0x%04x", id.vendor),
			"device":           fmt.Sprintf("0x%04x", id.device),
			"class":            fmt.Sprintf("0x%06x", id.class),
			"subsystem_vendor": fmt.Sprintf("0x%04x", id.subVendor),
			"subsystem_device": fmt.Sprintf("0x%04x", id.subDev),
			"revision":         "0x01",
			"numa_node":        fmt.Sprint(d.Node),
			"local_cpulist":    cpuList(cpus),
			"local_cpus":       sh.cpuMask(cpus),
			"enable":           "1",
			"modalias": fmt.Sprintf("pci:v%08Xd%08Xsv%08Xsd%08Xbc%02Xsc%02Xi%02X",
				id.vendor, id.device, id.subVendor, id.subDev, id.class>>16, (id.class>>8)&0xff, id.class&0xff),
		}
		if id.speed != "" {
			files["current_link_speed"] = id.speed
			files["max_link_speed"] = id.speed
			files["current_link_width"] = fmt.Sprint(id.width)
			files["max_link_width"] = fmt.Sprint(id.width)
		}
		for k, v := range files {
			w.file(p+"/"+k, v+"\n")
		}
		sec, sub := busRange(d.Addr, children)
		w.file(p+"/config", string(configSpace(d, id, sec, sub)))
		w.link("/sys/bus/pci/devices/"+d.Addr, "../../.."+strings.TrimPrefix(p, "/sys"))
	}
}

// busOf returns the bus number of a PCI address.
func busOf(addr string) int {
	var bus int
	fmt.Sscanf(addr[5:7], "%x", &bus)
	return bus
}

// busRange returns a bridge's secondary and subordinate bus numbers.
// The secondary bus is the children's bus; where that is below the
// bridge's own bus (the dgxh200 GPU bus IDs 00-07), which no real bridge
// can have and hwloc rejects, a placeholder bus (own bus + 0x0c + the
// port's device number) stands in, so every bridge stays a valid bridge
// with an empty range. The subordinate bus is the highest bus below.
func busRange(addr string, children map[string][]string) (secondary, subordinate int) {
	own, kids := busOf(addr), children[addr]
	if len(kids) == 0 {
		return 0, 0
	}
	secondary = busOf(kids[0])
	if secondary <= own {
		var dev int
		fmt.Sscanf(addr[8:10], "%x", &dev)
		secondary = own + 0x0c + dev
	}
	subordinate = secondary
	for _, k := range kids {
		if b := busOf(k); b > own {
			subordinate = max(subordinate, b)
		}
		if len(children[k]) > 0 {
			_, sub := busRange(k, children)
			subordinate = max(subordinate, sub)
		}
	}
	return secondary, subordinate
}

// configSpace returns the first 64 bytes of the function's PCI config
// space: IDs, class, header type and, for bridges, the bus numbers.
func configSpace(d Device, id ids, secondary, subordinate int) []byte {
	b := make([]byte, 64)
	binary.LittleEndian.PutUint16(b[0:], id.vendor)
	binary.LittleEndian.PutUint16(b[2:], id.device)
	binary.LittleEndian.PutUint16(b[4:], 0x0406) // memory space, bus master
	b[8] = 0x01
	b[9], b[10], b[11] = byte(id.class), byte(id.class>>8), byte(id.class>>16)
	if id.class>>8 == 0x0604 {
		b[0x0e] = 0x01 // PCI-to-PCI bridge header
		b[0x18], b[0x19], b[0x1a] = byte(busOf(d.Addr)), byte(secondary), byte(subordinate)
	} else {
		binary.LittleEndian.PutUint16(b[0x2c:], id.subVendor)
		binary.LittleEndian.PutUint16(b[0x2e:], id.subDev)
	}
	return b
}

// meminfo renders a meminfo file (prefix "" for /proc/meminfo, "Node N "
// for a node's) with the fields ghw and hwloc read.
func meminfo(prefix string, totalKiB int) string {
	used := totalKiB / 64
	rows := []struct {
		key string
		val int
		kb  bool
	}{
		{"MemTotal", totalKiB, true}, {"MemFree", totalKiB - used, true}, {"MemUsed", used, true},
		{"MemAvailable", totalKiB - used, true}, {"Cached", used / 2, true},
		{"HugePages_Total", 0, false}, {"HugePages_Free", 0, false}, {"HugePages_Surp", 0, false},
		{"Hugepagesize", 2048, true}, {"Hugetlb", 0, true},
	}
	var sb strings.Builder
	for _, r := range rows {
		if prefix != "" && (r.key == "MemAvailable" || r.key == "Hugepagesize" || r.key == "Hugetlb") {
			continue // not in a node's meminfo
		}
		if prefix == "" && r.key == "MemUsed" {
			continue // only in a node's meminfo
		}
		unit := ""
		if r.kb {
			unit = " kB"
		}
		fmt.Fprintf(&sb, "%s%-16s %12d%s\n", prefix, r.key+":", r.val, unit)
	}
	return sb.String()
}

package topology

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/fusiond/fusiond/topology/simhost"
)

// Item 18: sysfs values ending in NUL bytes still parse.
func TestDiscoverNULTerminatedValues(t *testing.T) {
	root := writeSimhost(t)
	h0 := discoverAt(t, root, WithoutNames())
	for _, n := range h0.Nodes {
		p := filepath.Join("/sys/devices/system/node", "node"+itoa(int(n.ID)))
		writeFile(t, root, p+"/cpulist", n.CPUs.String()+"\n\x00")
		writeFile(t, root, p+"/cpumap", "zz\x00") // force the cpulist path: cpumap unreadable
	}
	h := discoverAt(t, root, WithoutNames())
	for i, n := range h.Nodes {
		if !n.CPUs.Equal(h0.Nodes[i].CPUs) {
			t.Fatalf("node%d CPUs %s, want %s (warnings %q)", n.ID, n.CPUs, h0.Nodes[i].CPUs, h.Warnings)
		}
	}
}

func itoa(n int) string { return NewCPUSet(n).String() }

// Items 20 and 21: a /sys/bus/pci/devices entry that is a plain directory
// (not a symlink into /sys/devices/pci...) is kept with an unknown
// upstream, and with numa_node -1 and only the local_cpus mask it is
// placed on the node the mask names.
func TestDiscoverPCIDirectoryEntryAndLocalCPUsMask(t *testing.T) {
	root := writeSimhost(t)
	gpu := simhost.GPUAddrs()[4] // node 1
	link := filepath.Join(root, "/sys/bus/pci/devices", gpu)
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	h0 := discoverAt(t, root, WithoutNames())
	if h0.Device(PCIAddr(gpu)) != nil {
		t.Fatal("removed device still present")
	}
	node1 := h0.Nodes[1].CPUs
	mask := cpuMaskString(node1)
	writeFile(t, root, "/sys/bus/pci/devices/"+gpu+"/class", "0x030200\n")
	writeFile(t, root, "/sys/bus/pci/devices/"+gpu+"/numa_node", "-1\n")
	writeFile(t, root, "/sys/bus/pci/devices/"+gpu+"/local_cpus", mask+"\n")
	h := discoverAt(t, root, WithoutNames())
	d := h.Device(PCIAddr(gpu))
	if d == nil {
		t.Fatalf("directory entry dropped; warnings %q", h.Warnings)
	}
	if d.HostBridge != "" || d.Upstream != nil || d.Node != 1 || !d.LocalCPUs.Equal(node1) || d.Kind != KindGPU {
		t.Fatalf("device %+v, want node 1, no upstream, local CPUs %s", d, node1)
	}
	if !hasWarning(h, "not symlinks to a /sys/devices/pciDDDD:BB/... path ("+gpu+")") {
		t.Fatalf("warnings %q", h.Warnings)
	}
}

// cpuMaskString writes a CPU set in the kernel's cpumap format.
func cpuMaskString(c CPUSet) string {
	words := make([]uint32, MaxCPUs/32)
	last := 0
	for _, cpu := range c.List() {
		words[cpu/32] |= 1 << (cpu % 32)
		last = max(last, cpu/32)
	}
	s := ""
	for i := last; i >= 0; i-- {
		if s != "" {
			s += ","
		}
		s += fmtHex32(words[i])
	}
	return s
}

func fmtHex32(w uint32) string {
	const hex = "0123456789abcdef"
	b := make([]byte, 8)
	for i := 7; i >= 0; i-- {
		b[i] = hex[w&0xf]
		w >>= 4
	}
	return string(b)
}

// Item 19: cores come from thread_siblings / core_cpus, not from
// (package, core_id): two dies repeating core_id 0 give two cores.
func TestDiscoverCoresFromSiblingsNotCoreID(t *testing.T) {
	root := writeSimhost(t)
	h0 := discoverAt(t, root, WithoutNames())
	for _, c := range h0.OnlineCPUs.List() {
		writeFile(t, root, "/sys/devices/system/cpu/cpu"+itoa(c)+"/topology/core_id", "0\n")
	}
	h := discoverAt(t, root, WithoutNames())
	if len(h.Cores) != len(h0.Cores) {
		t.Fatalf("%d cores with repeated core_id, want %d", len(h.Cores), len(h0.Cores))
	}
	for _, c := range h.Cores {
		if c.CPUs.Len() != simhost.ThreadsPerCore {
			t.Fatalf("core %+v", c)
		}
	}
}

// physical_package_id -1 (POWER, s390): packages from core_siblings.
func TestDiscoverPackageIDMinusOne(t *testing.T) {
	root := writeSimhost(t)
	h0 := discoverAt(t, root, WithoutNames())
	for _, c := range h0.OnlineCPUs.List() {
		writeFile(t, root, "/sys/devices/system/cpu/cpu"+itoa(c)+"/topology/physical_package_id", "-1\n")
	}
	h := discoverAt(t, root, WithoutNames())
	if len(h.Sockets) != simhost.Sockets || !h.Sockets[0].CPUs.Equal(h0.Sockets[0].CPUs) || h.Nodes[1].Socket != 1 {
		t.Fatalf("sockets %+v, want %+v", h.Sockets, h0.Sockets)
	}
	if !hasWarning(h, "physical_package_id is -1") {
		t.Fatalf("warnings %q", h.Warnings)
	}
}

// Item 22: a CPU-less memory node takes its locality from
// access1/initiators (else access0), not the whole machine.
func TestDiscoverCPULessNodeInitiators(t *testing.T) {
	root := writeSimhost(t)
	n2 := "/sys/devices/system/node/node2"
	writeFile(t, root, "/sys/devices/system/node/online", "0-2\n")
	writeFile(t, root, n2+"/cpulist", "\n")
	writeFile(t, root, n2+"/cpumap", "00000000\n")
	writeFile(t, root, n2+"/meminfo", "Node 2 MemTotal: 1048576 kB\n")
	writeFile(t, root, n2+"/distance", "20 20 10\n")
	writeFile(t, root, "/sys/devices/system/node/node0/distance", "10 21 20\n")
	writeFile(t, root, "/sys/devices/system/node/node1/distance", "21 10 20\n")
	if err := os.MkdirAll(filepath.Join(root, n2, "access0/initiators"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../node1", filepath.Join(root, n2, "access0/initiators/node1")); err != nil {
		t.Fatal(err)
	}
	h := discoverAt(t, root, WithoutNames())
	if len(h.Nodes) != 3 || !h.Nodes[2].CPUs.IsEmpty() || !h.Nodes[2].Initiators.Equal(h.Nodes[1].CPUs) || h.Nodes[2].Socket != NoSocket {
		t.Fatalf("nodes %+v", h.Nodes)
	}
}

// Dies from cpuN/topology/die_cpus (die_id): each socket split into two
// dies of half its cores; die_id -1 (arm64) or no die files: no dies; die
// files on some CPUs only: the others are in no die, in one warning.
func TestDiscoverDies(t *testing.T) {
	root := writeSimhost(t, simhost.WithCoresPerSocket(4))
	h0 := discoverAt(t, root, WithoutNames())
	if len(h0.Dies) != simhost.Sockets || !h0.Dies[1].CPUs.Equal(h0.Sockets[1].CPUs) || h0.Dies[1].Socket != h0.Sockets[1].ID {
		t.Fatalf("simhost (one die per package): dies %+v, sockets %+v", h0.Dies, h0.Sockets)
	}
	type want struct {
		socket SocketID
		id     int
		cpus   CPUSet
	}
	var wants []want
	for _, s := range h0.Sockets {
		var cores []Core
		for _, c := range h0.Cores {
			if c.Socket == s.ID {
				cores = append(cores, c)
			}
		}
		for die, part := range [][]Core{cores[:len(cores)/2], cores[len(cores)/2:]} {
			var cpus CPUSet
			for _, c := range part {
				cpus = cpus.Union(c.CPUs)
			}
			wants = append(wants, want{s.ID, die, cpus})
			for _, c := range cpus.List() {
				dir := "/sys/devices/system/cpu/cpu" + itoa(c) + "/topology/"
				writeFile(t, root, dir+"die_id", itoa(die)+"\n")
				writeFile(t, root, dir+"die_cpus", cpuMaskString(cpus)+"\n")
				writeFile(t, root, dir+"die_cpus_list", cpus.String()+"\n")
			}
		}
	}
	h := discoverAt(t, root, WithoutNames())
	if len(h.Dies) != len(wants) {
		t.Fatalf("dies %+v, want %+v", h.Dies, wants)
	}
	for i, w := range wants {
		if d := h.Dies[i]; d.Socket != w.socket || d.ID != w.id || !d.CPUs.Equal(w.cpus) {
			t.Errorf("die %d = %+v, want %+v", i, d, w)
		}
	}
	// Only die_cpus_list (no mask, no die_id): same dies, ID -1.
	for _, c := range h0.OnlineCPUs.List() {
		dir := filepath.Join(root, "/sys/devices/system/cpu/cpu"+itoa(c)+"/topology/")
		for _, f := range []string{"die_id", "die_cpus"} {
			if err := os.Remove(filepath.Join(dir, f)); err != nil {
				t.Fatal(err)
			}
		}
	}
	h = discoverAt(t, root, WithoutNames())
	if len(h.Dies) != len(wants) || h.Dies[1].ID != -1 || !h.Dies[1].CPUs.Equal(wants[1].cpus) && !h.Dies[1].CPUs.Equal(wants[0].cpus) {
		t.Fatalf("die_cpus_list only: dies %+v", h.Dies)
	}
	// The CPUs of one die without die files: in no die, one warning
	// naming them (a single such CPU stays in the die its siblings name).
	for _, c := range wants[0].cpus.List() {
		if err := os.Remove(filepath.Join(root, "/sys/devices/system/cpu/cpu"+itoa(c)+"/topology/die_cpus_list")); err != nil {
			t.Fatal(err)
		}
	}
	h = discoverAt(t, root, WithoutNames())
	if len(h.Dies) != len(wants)-1 || h.Dies[0].CPUs.Intersects(wants[0].cpus) || !hasWarning(h, "die_id} missing; CPU in no die: CPUs "+wants[0].cpus.String()) {
		t.Fatalf("dies %+v, warnings %q", h.Dies, h.Warnings)
	}
	// die_id -1 everywhere (arm64 writes die_cpus = the CPU alone): no dies.
	for _, c := range h0.OnlineCPUs.List() {
		dir := "/sys/devices/system/cpu/cpu" + itoa(c) + "/topology/"
		writeFile(t, root, dir+"die_id", "-1\n")
		writeFile(t, root, dir+"die_cpus_list", itoa(c)+"\n")
	}
	if h = discoverAt(t, root, WithoutNames()); len(h.Dies) != 0 || hasWarning(h, "no die") {
		t.Fatalf("die_id -1: dies %+v, warnings %q", h.Dies, h.Warnings)
	}
	// No die files at all (kernels before 5.3): no dies, no warning.
	for _, c := range h0.OnlineCPUs.List() {
		dir := filepath.Join(root, "/sys/devices/system/cpu/cpu"+itoa(c)+"/topology/")
		for _, f := range []string{"die_id", "die_cpus_list"} {
			if err := os.Remove(filepath.Join(dir, f)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if h = discoverAt(t, root, WithoutNames()); len(h.Dies) != 0 || hasWarning(h, "no die") {
		t.Fatalf("no die files: dies %+v, warnings %q", h.Dies, h.Warnings)
	}
}

// A CPU-less node without initiators is local to the strictly nearest
// node by SLIT distance (as hwloc places KNL's MCDRAM nodes); with every
// other node equally near it stays unplaced.
func TestDiscoverCPULessNodeByDistance(t *testing.T) {
	root := writeSimhost(t, simhost.WithCoresPerSocket(4))
	n2 := "/sys/devices/system/node/node2"
	writeFile(t, root, "/sys/devices/system/node/online", "0-2\n")
	writeFile(t, root, n2+"/cpulist", "\n")
	writeFile(t, root, n2+"/cpumap", "00000000\n")
	writeFile(t, root, n2+"/meminfo", "Node 2 MemTotal: 1048576 kB\n")
	writeFile(t, root, n2+"/distance", "31 21 10\n")
	writeFile(t, root, "/sys/devices/system/node/node0/distance", "10 21 31\n")
	writeFile(t, root, "/sys/devices/system/node/node1/distance", "21 10 21\n")
	h := discoverAt(t, root, WithoutNames())
	if len(h.Nodes) != 3 || !h.Nodes[2].Initiators.Equal(h.Nodes[1].CPUs) {
		t.Fatalf("nodes %+v", h.Nodes)
	}
	writeFile(t, root, n2+"/distance", "21 21 10\n")
	if h = discoverAt(t, root, WithoutNames()); !h.Nodes[2].Initiators.IsEmpty() {
		t.Fatalf("equidistant: node 2 initiators %s, want none", h.Nodes[2].Initiators)
	}
}

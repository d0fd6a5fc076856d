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

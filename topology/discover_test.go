package topology

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/topology/simhost"
)

const simCores = 2 // writeSimhost's default cores per socket

func TestDiscoverSimhost(t *testing.T) {
	h := discoverAt(t, writeSimhost(t))
	if len(h.Warnings) != 0 {
		t.Errorf("warnings on a complete tree: %q", h.Warnings)
	}
	if h.Hostname != simhost.Hostname {
		t.Errorf("hostname %q", h.Hostname)
	}
	if len(h.Sockets) != simhost.Sockets || len(h.Nodes) != simhost.Sockets {
		t.Fatalf("%d sockets, %d nodes; want %d each", len(h.Sockets), len(h.Nodes), simhost.Sockets)
	}
	perNode := simCores * simhost.ThreadsPerCore
	for i, n := range h.Nodes {
		if n.CPUs.Len() != perNode || n.Socket != SocketID(i) || n.MemoryBytes != simhost.NodeMemKiB*1024 {
			t.Errorf("node %d = %+v", i, n)
		}
		if len(n.Distances) != 2 || n.Distances[i] != 10 || n.Distances[1-i] <= 10 {
			t.Errorf("node %d distances %v", i, n.Distances)
		}
		if !n.CPUs.IsSubsetOf(h.Sockets[i].CPUs) || !slices.Equal(h.Sockets[i].Nodes, []NodeID{n.ID}) {
			t.Errorf("node %d not tied to socket %d: %+v", i, i, h.Sockets[i])
		}
	}
	if len(h.Cores) != simhost.Sockets*simCores {
		t.Fatalf("%d cores", len(h.Cores))
	}
	for _, c := range h.Cores {
		if c.CPUs.Len() != simhost.ThreadsPerCore || c.L3 < 0 || !c.CPUs.IsSubsetOf(h.L3[c.L3].CPUs) {
			t.Errorf("core %+v", c)
		}
		if n := h.Node(c.Node); n == nil || !c.CPUs.IsSubsetOf(n.CPUs) {
			t.Errorf("core %+v outside its node", c)
		}
	}
	if len(h.L3) != simhost.Sockets {
		t.Errorf("%d L3 groups", len(h.L3))
	}
	want := simhost.Devices()
	if len(h.Devices) != len(want) {
		t.Fatalf("%d devices, want %d", len(h.Devices), len(want))
	}
	kinds := map[simhost.Kind]DeviceKind{
		simhost.GPU: KindGPU, simhost.NIC: KindNIC, simhost.NVMe: KindStorage, simhost.VGA: KindOther,
		simhost.RootPort: KindBridge, simhost.SwitchUp: KindBridge, simhost.SwitchDown: KindBridge, simhost.VGABridge: KindBridge,
	}
	for _, w := range want {
		d := h.Device(PCIAddr(w.Addr))
		if d == nil {
			t.Errorf("%s missing", w.Addr)
			continue
		}
		if d.Node != NodeID(w.Node) || d.Parent() != PCIAddr(w.Parent) || d.HostBridge != w.HostBridge || d.Kind != kinds[w.Kind] {
			t.Errorf("%s = node %d parent %q hb %q kind %s; want %d %q %q %s",
				w.Addr, d.Node, d.Parent(), d.HostBridge, d.Kind, w.Node, w.Parent, w.HostBridge, kinds[w.Kind])
		}
		if w.Kind != simhost.VGA && (d.LinkWidth == 0 || d.LinkSpeed == "") {
			t.Errorf("%s has no link attributes", w.Addr)
		}
	}
	if got := len(h.Accelerators()); got != len(simhost.GPUAddrs()) {
		t.Errorf("%d accelerators, want %d GPUs (the BMC VGA is not one)", got, len(simhost.GPUAddrs()))
	}
	if nic := h.Device(PCIAddr(simhost.NICAddrs()[0])); !strings.Contains(nic.DeviceName, "ConnectX-7") || nic.VendorName == "" {
		t.Errorf("NIC names %q / %q (pci.ids installed?)", nic.VendorName, nic.DeviceName)
	}
}

// TestDiscoverDamagedTrees breaks one file at a time in a simhost tree:
// discovery must name the file in a warning and keep the rest.
func TestDiscoverDamagedTrees(t *testing.T) {
	gpu := simhost.GPUAddrs()[4] // node 1
	dev := "/sys/bus/pci/devices/" + gpu
	tests := []struct {
		name   string
		damage func(t *testing.T, root string)
		warn   string
		check  func(h *Host) error
	}{
		{
			name:   "node meminfo missing",
			damage: remove("/sys/devices/system/node/node1/meminfo"),
			warn:   "/sys/devices/system/node/node1/meminfo",
			check: func(h *Host) error {
				if h.Nodes[1].MemoryBytes != 0 || h.Nodes[0].MemoryBytes == 0 {
					return fmt.Errorf("memory %d/%d", h.Nodes[0].MemoryBytes, h.Nodes[1].MemoryBytes)
				}
				return nil
			},
		},
		{
			name:   "node meminfo malformed",
			damage: write("/sys/devices/system/node/node1/meminfo", "Node 1 MemTotal: lots kB\n"),
			warn:   "/sys/devices/system/node/node1/meminfo",
			check:  func(h *Host) error { return expect(h.Nodes[1].MemoryBytes == 0, "memory kept") },
		},
		{
			name:   "distance malformed",
			damage: write("/sys/devices/system/node/node0/distance", "10 x\n"),
			warn:   "/sys/devices/system/node/node0/distance",
			check: func(h *Host) error {
				return expect(h.Nodes[0].Distances == nil && h.Nodes[1].Distances != nil, "distances")
			},
		},
		{
			name:   "distance row too short",
			damage: write("/sys/devices/system/node/node0/distance", "10\n"),
			warn:   "/sys/devices/system/node/node0/distance: 1 entries for 2 nodes",
			check:  func(h *Host) error { return expect(h.Nodes[0].Distances == nil, "distances kept") },
		},
		{
			name: "node cpumap and cpulist malformed",
			damage: func(t *testing.T, root string) {
				write("/sys/devices/system/node/node1/cpulist", "4-x\n")(t, root)
				write("/sys/devices/system/node/node1/cpumap", "zz\n")(t, root)
			},
			// The node's cpuM links still say which CPUs it has.
			warn: "taken from its cpuM links",
			check: func(h *Host) error {
				n0, n1 := h.Nodes[0].CPUs, h.Nodes[1].CPUs
				return expect(n1.Len() == simhost.ThreadsPerCore*simCores && n0.Len() == n1.Len() && !n0.Intersects(n1), "cpus")
			},
		},
		{
			name:   "numa_node malformed falls back to local_cpulist",
			damage: write(dev+"/numa_node", "one\n"),
			warn:   dev + "/numa_node",
			check:  func(h *Host) error { return expect(h.Device(PCIAddr(gpu)).Node == 1, "node not derived") },
		},
		{
			// As hwloc, the device is placed by its local CPUs; the
			// warning names the value the file holds.
			name:   "numa_node names a missing node falls back to local_cpulist",
			damage: write(dev+"/numa_node", "7\n"),
			warn:   dev + "/numa_node is 7, naming no NUMA node here (nodes: 0-1)",
			check:  func(h *Host) error { return expect(h.Device(PCIAddr(gpu)).Node == 1, "node not derived") },
		},
		{
			name: "numa_node -1 and local_cpulist spanning sockets",
			damage: func(t *testing.T, root string) {
				write(dev+"/numa_node", "-1\n")(t, root)
				write(dev+"/local_cpulist", fmt.Sprintf("0-%d\n", 2*simhost.Sockets*simCores-1))(t, root)
			},
			warn:  "their NUMA node is unknown",
			check: func(h *Host) error { return expect(h.Device(PCIAddr(gpu)).Node == NoNode, "node guessed") },
		},
		{
			name:   "class malformed",
			damage: write(dev+"/class", "0xzz\n"),
			warn:   dev + "/class",
			check:  func(h *Host) error { return expect(h.Device(PCIAddr(gpu)).Kind == KindOther, "kind") },
		},
		{
			name:   "link width malformed",
			damage: write(dev+"/current_link_width", "sixteen\n"),
			warn:   dev + "/current_link_width",
			check:  func(h *Host) error { return expect(h.Device(PCIAddr(gpu)).LinkWidth == 0, "width kept") },
		},
		{
			name: "dangling device symlink",
			damage: func(t *testing.T, root string) {
				remove(dev)(t, root)
				if err := os.Symlink("../../../devices/pci0000:99/0000:99:00.0", filepath.Join(root, dev)); err != nil {
					t.Fatal(err)
				}
			},
			warn: dev,
			check: func(h *Host) error {
				return expect(h.Device(PCIAddr(gpu)) == nil && len(h.Devices) == len(simhost.Devices())-1, "device count")
			},
		},
		{
			name: "device symlink leaving the tree",
			damage: func(t *testing.T, root string) {
				outside := filepath.Join(t.TempDir(), "devices", "pci0000:99", gpu)
				if err := os.MkdirAll(outside, 0o755); err != nil {
					t.Fatal(err)
				}
				remove(dev)(t, root)
				if err := os.Symlink(outside, filepath.Join(root, dev)); err != nil {
					t.Fatal(err)
				}
			},
			warn:  "outside the tree",
			check: func(h *Host) error { return expect(h.Device(PCIAddr(gpu)) == nil, "device kept") },
		},
		{
			name:   "cpu online file missing",
			damage: remove("/sys/devices/system/cpu/online"),
			warn:   "/sys/devices/system/cpu/online",
			check:  func(h *Host) error { return expect(h.OnlineCPUs.Len() == 2*simhost.Sockets*simCores, "online") },
		},
		{
			// Cores come from sysfs, not from /proc/cpuinfo (s390 has no
			// "processor : N" lines); the warning is the missing L3.
			name: "cpuinfo missing and no caches: cores still found",
			damage: func(t *testing.T, root string) {
				remove("/proc/cpuinfo")(t, root)
				for c := range simhost.ThreadsPerCore * simhost.Sockets * simCores {
					remove(fmt.Sprintf("/sys/devices/system/cpu/cpu%d/cache", c))(t, root)
				}
			},
			warn: "no L3 cache under /sys/devices/system/cpu/cpuN/cache",
			check: func(h *Host) error {
				return expect(len(h.Cores) == simhost.Sockets*simCores && len(h.Sockets) == simhost.Sockets && len(h.L3) == 0, "cores")
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			root := writeSimhost(t)
			tt.damage(t, root)
			h := discoverAt(t, root, WithoutNames())
			if !hasWarning(h, tt.warn) {
				t.Errorf("no warning containing %q in %q", tt.warn, h.Warnings)
			}
			if err := tt.check(h); err != nil {
				t.Error(err)
			}
		})
	}
}

func remove(p string) func(*testing.T, string) {
	return func(t *testing.T, root string) {
		t.Helper()
		if err := os.RemoveAll(filepath.Join(root, p)); err != nil {
			t.Fatal(err)
		}
	}
}

func write(p, content string) func(*testing.T, string) {
	return func(t *testing.T, root string) { t.Helper(); writeFile(t, root, p, content) }
}

func expect(ok bool, what string) error {
	if !ok {
		return errors.New("unexpected model: " + what)
	}
	return nil
}

func TestDiscoverNoCPUs(t *testing.T) {
	_, err := Discover(context.Background(), WithRoot(t.TempDir()))
	if !errors.Is(err, ErrNoCPUs) || !strings.Contains(err.Error(), "/sys/devices/system/cpu") {
		t.Fatalf("error = %v, want ErrNoCPUs naming /sys/devices/system/cpu", err)
	}
}

// offlineCPU takes a CPU offline the way the kernel shows it.
func offlineCPU(t *testing.T, root string, cpu int, online, node0 string) {
	t.Helper()
	writeFile(t, root, fmt.Sprintf("/sys/devices/system/cpu/cpu%d/online", cpu), "0\n")
	remove(fmt.Sprintf("/sys/devices/system/cpu/cpu%d/topology", cpu))(t, root)
	remove(fmt.Sprintf("/sys/devices/system/node/node0/cpu%d", cpu))(t, root)
	writeFile(t, root, "/sys/devices/system/cpu/online", online)
	writeFile(t, root, "/sys/devices/system/node/node0/cpulist", node0)
}

func TestDiscoverOfflineCPU(t *testing.T) {
	root := writeSimhost(t)
	// 2 cores/socket: node0 = 0-1,4-5; take CPU 5 (core 1's sibling) offline.
	offlineCPU(t, root, 5, "0-4,6-7\n", "0-1,4\n")
	h := discoverAt(t, root, WithoutNames())
	if !h.OfflineCPUs.Equal(NewCPUSet(5)) || h.OnlineCPUs.Contains(5) || h.Nodes[0].CPUs.Contains(5) {
		t.Fatalf("offline %s online %s node0 %s", h.OfflineCPUs, h.OnlineCPUs, h.Nodes[0].CPUs)
	}
	for _, c := range h.Cores {
		if c.CPUs.Contains(5) {
			t.Fatalf("offline CPU 5 in core %+v", c)
		}
		if c.CPUs.Contains(1) && c.CPUs.Len() != 1 {
			t.Fatalf("core of CPU 1 keeps its offline sibling: %+v", c)
		}
	}
	if !hasWarning(h, "CPUs 5 are offline") {
		t.Fatalf("warnings %q", h.Warnings)
	}
}

func TestDiscoverMemoryOnlyNode(t *testing.T) {
	root := writeSimhost(t)
	n2 := "/sys/devices/system/node/node2"
	writeFile(t, root, "/sys/devices/system/node/online", "0-2\n")
	writeFile(t, root, n2+"/cpulist", "\n")
	writeFile(t, root, n2+"/meminfo", "Node 2 MemTotal: 268435456 kB\n")
	writeFile(t, root, n2+"/distance", "60 60 10\n")
	writeFile(t, root, "/sys/devices/system/memory/block_size_bytes", "80000000\n")
	writeFile(t, root, n2+"/memory32/online", "1\n")
	writeFile(t, root, n2+"/memory33/online", "0\n")
	writeFile(t, root, n2+"/memory34/uevent", "") // no online file: boot memory, online
	writeFile(t, root, "/sys/devices/system/node/node0/distance", "10 21 60\n")
	writeFile(t, root, "/sys/devices/system/node/node1/distance", "21 10 60\n")
	h := discoverAt(t, root, WithoutNames())
	if len(h.Nodes) != 3 {
		t.Fatalf("%d nodes", len(h.Nodes))
	}
	n := h.Nodes[2]
	if n.Socket != NoSocket || !n.CPUs.IsEmpty() || n.MemoryBytes != 268435456*1024 || h.NodeDistance(0, 2) != 60 ||
		n.BlockMemoryBytes != 2*0x80000000 || h.Nodes[0].BlockMemoryBytes != 0 {
		t.Fatalf("memory-only node %+v, distance %d", n, h.NodeDistance(0, 2))
	}
	if !hasWarning(h, "without an online CPU (memory-only, or all their CPUs offline): node2") {
		t.Fatalf("warnings %q", h.Warnings)
	}
}

// TestDiscoverGhwSnapshots runs discovery on ghw's real-machine snapshots
// through the same code path as the live host.
func TestDiscoverGhwSnapshots(t *testing.T) {
	checks := map[string]func(h *Host) error{
		"linux-amd64-8581cf3a529e5d8b97ea876eade2f60d": func(h *Host) error { // 2-NUMA Xeon
			return expect(len(h.Nodes) == 2 && len(h.Sockets) == 2 && h.NodeDistance(0, 1) > 10 && h.Nodes[0].CPUs.Len() == 12, "2-NUMA Xeon")
		},
		"linux-amd64-accel-nvidia": func(h *Host) error {
			acc := h.Accelerators()
			return expect(len(acc) > 0 && acc[0].Kind == KindGPU && acc[0].VendorID == 0x10de, "NVIDIA GPU")
		},
		"linux-amd64-offlineCPUs": func(h *Host) error {
			return expect(!h.OfflineCPUs.IsEmpty() && !h.OnlineCPUs.Intersects(h.OfflineCPUs), "offline CPUs")
		},
	}
	for _, snap := range ghwSnapshots(t) {
		name := strings.TrimSuffix(filepath.Base(snap), ".tar.gz")
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := discoverAt(t, unpackSnapshot(t, snap))
			if h.OnlineCPUs.IsEmpty() || len(h.Nodes) == 0 {
				t.Fatalf("empty model: %+v", h)
			}
			for _, c := range h.Cores {
				if !c.CPUs.IsSubsetOf(h.OnlineCPUs) {
					t.Errorf("core %+v has CPUs that are not online", c)
				}
			}
			if check := checks[name]; check != nil {
				if err := check(h); err != nil {
					t.Errorf("%v; warnings %q", err, h.Warnings)
				}
			}
		})
	}
}

func BenchmarkDiscoverLiveHost(b *testing.B) {
	for b.Loop() {
		if _, err := Discover(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDiscoverSimhost(b *testing.B) {
	root := writeSimhost(b, simhost.WithCoresPerSocket(simhost.CoresPerSocket))
	for b.Loop() {
		if _, err := Discover(context.Background(), WithRoot(root)); err != nil {
			b.Fatal(err)
		}
	}
}

package topology

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// BenchmarkDiscoverVsLstopo times Discover beside hwloc's lstopo on every
// vendored hwloc tree and on a synthetic 1,024-CPU / 16-node tree
// (writeBigTree), side by side in one run so that the ratio holds on a
// noisy machine:
//
//	go test ./topology -run '^$' -bench '^BenchmarkDiscoverVsLstopo$' -benchtime 1x
//
// For each tree, after one warm-up run of each, it interleaves 5 runs of
// Discover (default options, as the daemon calls it: pci.ids names
// included), 5 of Discover WithoutNames and 5 of
// `HWLOC_COMPONENTS=linux,stop HWLOC_FSROOT=TREE lstopo-no-graphics --of xml --whole-io -`
// (the wall time of the process, output to /dev/null) and prints the
// medians and the ratio ours/lstopo as a markdown table. It asserts no
// timing; it fails when lstopo-no-graphics is missing or fails on a tree.
// BENCH_TREES=name,name limits it to some trees ("synthetic-1024cpu-16n"
// is the synthetic one).
func BenchmarkDiscoverVsLstopo(b *testing.B) {
	bin, err := exec.LookPath("lstopo-no-graphics")
	if err != nil {
		b.Fatalf("lstopo-no-graphics (Debian package hwloc) is needed: %v", err)
	}
	type tree struct{ name, root string }
	var trees []tree
	want := map[string]bool{}
	for _, n := range strings.Split(os.Getenv("BENCH_TREES"), ",") {
		if n != "" {
			want[n] = true
		}
	}
	for _, tr := range hwlocTrees(b) {
		if len(want) == 0 || want[tr.name] {
			trees = append(trees, tree{tr.name, unpackBz2Tree(b, tr.dir, tr.source)})
		}
	}
	if len(want) == 0 || want[bigTreeName] {
		trees = append(trees, tree{bigTreeName, writeBigTree(b)})
	}
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer devnull.Close()
	lstopo := func(root string) time.Duration {
		cmd := exec.Command(bin, "--of", "xml", "--whole-io", "-")
		cmd.Env = append(os.Environ(), "HWLOC_COMPONENTS=linux,stop", "HWLOC_FSROOT="+root, "HWLOC_DUMPED_HWDATA_DIR=/nonexistent")
		cmd.Stdout = devnull
		var stderr strings.Builder
		cmd.Stderr = &stderr
		start := time.Now()
		if err := cmd.Run(); err != nil {
			b.Fatalf("HWLOC_FSROOT=%s %s: %v: %s", root, bin, err, stderr.String())
		}
		return time.Since(start)
	}
	discover := func(root string, opts ...Option) time.Duration {
		start := time.Now()
		if _, err := Discover(context.Background(), append([]Option{WithRoot(root)}, opts...)...); err != nil {
			b.Fatalf("Discover(%s): %v", root, err)
		}
		return time.Since(start)
	}
	median := func(d []time.Duration) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		return s[len(s)/2]
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
	for b.Loop() {
		var sb strings.Builder
		sb.WriteString("| tree | Discover | Discover WithoutNames | lstopo | ours/lstopo | WithoutNames/lstopo |\n|---|---|---|---|---|---|\n")
		var ratios, ratiosNN []float64
		for _, tr := range trees {
			discover(tr.root)
			lstopo(tr.root)
			var ours, oursNN, theirs []time.Duration
			for range 5 {
				ours = append(ours, discover(tr.root))
				oursNN = append(oursNN, discover(tr.root, WithoutNames()))
				theirs = append(theirs, lstopo(tr.root))
			}
			o, nn, l := median(ours), median(oursNN), median(theirs)
			r, rnn := float64(o)/float64(l), float64(nn)/float64(l)
			ratios, ratiosNN = append(ratios, r), append(ratiosNN, rnn)
			fmt.Fprintf(&sb, "| %s | %s | %s | %s | %.2f | %.2f |\n", tr.name, ms(o), ms(nn), ms(l), r, rnn)
		}
		slices.Sort(ratios)
		slices.Sort(ratiosNN)
		over := 0
		for _, r := range ratios {
			if r > 1 {
				over++
			}
		}
		fmt.Fprintf(&sb, "\n%d trees; ours/lstopo median %.2f, max %.2f (%d above 1); WithoutNames/lstopo median %.2f, max %.2f\n",
			len(ratios), ratios[len(ratios)/2], ratios[len(ratios)-1], over, ratiosNN[len(ratiosNN)/2], ratiosNN[len(ratiosNN)-1])
		fmt.Print(sb.String())
	}
}

const bigTreeName = "synthetic-1024cpu-16n"

// writeBigTree writes a synthetic 1,024-CPU host as the kernel lays it out:
// 8 packages of 64 cores × 2 threads, 2 NUMA nodes (and 2 L3s) per
// package, 16 nodes with a SLIT matrix, and one PCIe root port with an
// NVMe drive per node. CPUs are numbered as on Intel: first threads of
// every core, then second threads.
func writeBigTree(t testing.TB) string {
	t.Helper()
	const (
		pkgs, coresPerPkg, threads = 8, 64, 2
		nodesPerPkg                = 2
		ncpu                       = pkgs * coresPerPkg * threads
		nnodes                     = pkgs * nodesPerPkg
		coresPerNode               = coresPerPkg / nodesPerPkg
	)
	root := filepath.Join(treeTempDir(t), "root")
	put := func(p, content string) {
		t.Helper()
		writeFile(t, root, p, content)
	}
	link := func(p, target string) {
		t.Helper()
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, full); err != nil {
			t.Fatal(err)
		}
	}
	// Global core g = pkg*coresPerPkg + core; its CPUs are g and g+ncpu/2.
	coreCPUs := func(g int) CPUSet { return NewCPUSet(g, g+ncpu/threads) }
	nodeCPUs := func(n int) CPUSet {
		var ids []int
		for g := n * coresPerNode; g < (n+1)*coresPerNode; g++ {
			ids = append(ids, coreCPUs(g).List()...)
		}
		return NewCPUSet(ids...)
	}
	pkgCPUs := func(p int) CPUSet { return nodeCPUs(p * nodesPerPkg).Union(nodeCPUs(p*nodesPerPkg + 1)) }
	all := NewCPUSet()
	for c := range ncpu {
		all = all.Union(NewCPUSet(c))
	}
	const sysCPUDir = "/sys/devices/system/cpu"
	for _, f := range []string{"online", "present", "possible"} {
		put(sysCPUDir+"/"+f, all.String()+"\n")
	}
	var cpuinfo strings.Builder
	for c := range ncpu {
		g := c % (ncpu / threads)
		p, core := g/coresPerPkg, g%coresPerPkg
		n := g / coresPerNode
		dir := fmt.Sprintf("%s/cpu%d", sysCPUDir, c)
		if c > 0 {
			put(dir+"/online", "1\n")
		}
		top := dir + "/topology"
		sib, pc := coreCPUs(g), pkgCPUs(p)
		for _, f := range []struct{ name, val string }{
			{"core_id", fmt.Sprint(core)},
			{"physical_package_id", fmt.Sprint(p)},
			{"die_id", "0"},
			{"core_cpus", cpuMaskString(sib)}, {"core_cpus_list", sib.String()},
			{"thread_siblings", cpuMaskString(sib)}, {"thread_siblings_list", sib.String()},
			{"core_siblings", cpuMaskString(pc)}, {"core_siblings_list", pc.String()},
			{"package_cpus", cpuMaskString(pc)}, {"package_cpus_list", pc.String()},
			{"die_cpus", cpuMaskString(pc)}, {"die_cpus_list", pc.String()},
		} {
			put(top+"/"+f.name, f.val+"\n")
		}
		for i, cache := range []struct {
			level     int
			typ, size string
			shared    CPUSet
		}{
			{1, "Data", "48K", sib}, {1, "Instruction", "32K", sib}, {2, "Unified", "2048K", sib}, {3, "Unified", "61440K", nodeCPUs(n)},
		} {
			cd := fmt.Sprintf("%s/cache/index%d", dir, i)
			put(cd+"/level", fmt.Sprint(cache.level)+"\n")
			put(cd+"/type", cache.typ+"\n")
			put(cd+"/size", cache.size+"\n")
			put(cd+"/shared_cpu_map", cpuMaskString(cache.shared)+"\n")
			put(cd+"/shared_cpu_list", cache.shared.String()+"\n")
			put(cd+"/coherency_line_size", "64\n")
			put(cd+"/ways_of_associativity", "12\n")
		}
		fmt.Fprintf(&cpuinfo, "processor\t: %d\nvendor_id\t: GenuineIntel\nphysical id\t: %d\ncore id\t\t: %d\n\n", c, p, core)
	}
	put("/proc/cpuinfo", cpuinfo.String())
	const sysNodeDir = "/sys/devices/system/node"
	const nodeKiB = 64 << 20 // 64 GiB
	put(sysNodeDir+"/online", fmt.Sprintf("0-%d\n", nnodes-1))
	put(sysNodeDir+"/possible", fmt.Sprintf("0-%d\n", nnodes-1))
	for n := range nnodes {
		dir := fmt.Sprintf("%s/node%d", sysNodeDir, n)
		cs := nodeCPUs(n)
		put(dir+"/cpumap", cpuMaskString(cs)+"\n")
		put(dir+"/cpulist", cs.String()+"\n")
		put(dir+"/meminfo", fmt.Sprintf("Node %d MemTotal:       %d kB\nNode %d MemFree:        %d kB\n", n, nodeKiB, n, nodeKiB/2))
		var row []string
		for m := range nnodes {
			switch {
			case m == n:
				row = append(row, "10")
			case m/nodesPerPkg == n/nodesPerPkg:
				row = append(row, "12")
			default:
				row = append(row, "32")
			}
		}
		put(dir+"/distance", strings.Join(row, " ")+"\n")
	}
	put("/proc/meminfo", fmt.Sprintf("MemTotal:       %d kB\nMemFree:        %d kB\n", nodeKiB*nnodes, nodeKiB*nnodes/2))
	// One host bridge per node with a root port and an NVMe drive behind it.
	config := func(vendor, device uint16, class uint32, bridge bool, secondary int) string {
		c := make([]byte, 64)
		c[0], c[1], c[2], c[3] = byte(vendor), byte(vendor>>8), byte(device), byte(device>>8)
		c[9], c[10], c[11] = byte(class), byte(class>>8), byte(class>>16)
		if bridge {
			c[14] = 1
			c[24], c[25], c[26] = byte(secondary-1), byte(secondary), byte(secondary)
		}
		return string(c)
	}
	for n := range nnodes {
		bus := n * 16
		hb := fmt.Sprintf("pci0000:%02x", bus)
		rp := fmt.Sprintf("0000:%02x:01.0", bus)
		ep := fmt.Sprintf("0000:%02x:00.0", bus+1)
		cs := nodeCPUs(n)
		for _, dev := range []struct {
			addr, path string
			device     uint16
			class      uint32
			bridge     bool
		}{
			{rp, "/sys/devices/" + hb + "/" + rp, 0x352a, 0x060400, true},
			{ep, "/sys/devices/" + hb + "/" + rp + "/" + ep, 0x0b60, 0x010802, false},
		} {
			vendor := uint16(0x8086)
			if !dev.bridge {
				vendor = 0x144d
			}
			put(dev.path+"/vendor", fmt.Sprintf("0x%04x\n", vendor))
			put(dev.path+"/device", fmt.Sprintf("0x%04x\n", dev.device))
			put(dev.path+"/class", fmt.Sprintf("0x%06x\n", dev.class))
			put(dev.path+"/numa_node", fmt.Sprint(n)+"\n")
			put(dev.path+"/local_cpus", cpuMaskString(cs)+"\n")
			put(dev.path+"/local_cpulist", cs.String()+"\n")
			put(dev.path+"/current_link_speed", "16.0 GT/s PCIe\n")
			put(dev.path+"/max_link_speed", "16.0 GT/s PCIe\n")
			put(dev.path+"/current_link_width", "4\n")
			put(dev.path+"/max_link_width", "4\n")
			put(dev.path+"/config", config(vendor, dev.device, dev.class, dev.bridge, bus+1))
			link("/sys/bus/pci/devices/"+dev.addr, "../../.."+strings.TrimPrefix(dev.path, "/sys"))
		}
	}
	put("/proc/sys/kernel/hostname", "synthetic-1024\n")
	return root
}

// BenchmarkDiscoverTree runs Discover (default options) on one tree per
// sub-benchmark, for profiling a tree:
//
//	go test ./topology -run '^$' -bench 'DiscoverTree/256ppc' -cpuprofile /tmp/cpu.out
func BenchmarkDiscoverTree(b *testing.B) {
	names := []string{bigTreeName}
	src := map[string]hwlocTree{}
	for _, tr := range hwlocTrees(b) {
		names = append(names, tr.name)
		src[tr.name] = tr
	}
	for _, name := range names {
		b.Run(name, func(b *testing.B) {
			var root string
			if name == bigTreeName {
				root = writeBigTree(b)
			} else {
				root = unpackBz2Tree(b, src[name].dir, src[name].source)
			}
			for b.Loop() {
				if _, err := Discover(context.Background(), WithRoot(root)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// The synthetic benchmark tree is what it says, and hwloc reads it as
// fusiond does: 1,024 CPUs in 512 cores, 8 packages, 16 nodes and L3s,
// 32 PCI functions on their nodes.
func TestBigTree(t *testing.T) {
	root := writeBigTree(t)
	h, err := Discover(context.Background(), WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	if h.OnlineCPUs.Len() != 1024 || len(h.Cores) != 512 || len(h.Sockets) != 8 || len(h.Nodes) != 16 || len(h.L3) != 16 || len(h.Devices) != 32 || len(h.Warnings) != 0 {
		t.Fatalf("model: %d CPUs, %d cores, %d sockets, %d nodes, %d L3, %d devices, warnings %q",
			h.OnlineCPUs.Len(), len(h.Cores), len(h.Sockets), len(h.Nodes), len(h.L3), len(h.Devices), h.Warnings)
	}
	for _, d := range h.Devices {
		if d.Node == NoNode || d.VendorName == "" {
			t.Errorf("device %s: node %d, vendor name %q", d.Addr, d.Node, d.VendorName)
		}
	}
	live, err := liveHwloc(root)
	if err != nil {
		t.Fatal(err)
	}
	if diffs := compareFacts(factsOfModel(h), factsOfHwloc(live), h, nil, false); len(diffs) > 0 {
		t.Errorf("fusiond and lstopo disagree on the synthetic tree: %+v", diffs)
	}
}

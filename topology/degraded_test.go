package topology

import (
	"encoding/xml"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/topology/simhost"
)

// Degraded inputs: each test takes a real machine's tree (one of hwloc's
// vendored trees, or the simhost tree), damages it the way one class of
// broken firmware, kernel or capture does, and compares fusiond's model
// with what hwloc 2.9 (`HWLOC_COMPONENTS=linux,stop HWLOC_FSROOT=TREE
// lstopo-no-graphics --of xml --whole-io -`, run live) makes of the same
// damaged tree. Where fusiond deliberately does better than hwloc, the
// test says why and compares with hwloc's answer on the undamaged tree
// instead (the truth the damage hid). docs/topology.md, "How problems are
// handled", lists the classes.

// hwlocLiveFacts runs lstopo on root and reduces its tree to treeFacts.
func hwlocLiveFacts(t *testing.T, root string, env ...string) treeFacts {
	t.Helper()
	o, err := liveHwloc(root, env...)
	if err != nil {
		t.Fatalf("lstopo (apt-get install -y hwloc): %v", err)
	}
	return factsOfHwloc(o)
}

// hwlocDistances is hwloc's NUMALatency matrix of root: (from, to) node
// OS indexes → distance; nil when hwloc has none.
func hwlocDistances(t *testing.T, root string) map[[2]int]int {
	t.Helper()
	b, err := liveHwlocXML(root)
	if err != nil {
		t.Fatalf("lstopo: %v", err)
	}
	var doc struct {
		Distances []struct {
			Name    string   `xml:"name,attr"`
			Indexes string   `xml:"indexes"`
			Values  []string `xml:"u64values"`
		} `xml:"distances2"`
	}
	if err := xml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("lstopo XML: %v", err)
	}
	for _, d := range doc.Distances {
		if d.Name != "NUMALatency" {
			continue
		}
		idx := ints(t, d.Indexes)
		vals := ints(t, strings.Join(d.Values, " "))
		if len(vals) != len(idx)*len(idx) {
			t.Fatalf("hwloc distances: %d values for %d nodes", len(vals), len(idx))
		}
		out := map[[2]int]int{}
		for i, a := range idx {
			for j, b := range idx {
				out[[2]int{a, b}] = vals[i*len(idx)+j]
			}
		}
		return out
	}
	return nil
}

func ints(t *testing.T, s string) []int {
	t.Helper()
	var out []int
	for _, f := range strings.Fields(s) {
		n, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("%q: %v", f, err)
		}
		out = append(out, n)
	}
	return out
}

// modelDistances is our SLIT matrix in the same shape.
func modelDistances(h *Host) map[[2]int]int {
	out := map[[2]int]int{}
	for _, a := range h.Nodes {
		for j, d := range a.Distances {
			out[[2]int{int(a.ID), int(h.Nodes[j].ID)}] = d
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// mustAgree fails on any field on which ours and theirs disagree.
func mustAgree(t *testing.T, what string, h *Host, theirs treeFacts) {
	t.Helper()
	if diffs := compareFacts(factsOfModel(h), theirs, h, nil, false); len(diffs) > 0 {
		for _, d := range diffs {
			t.Errorf("%s: %s disagrees with hwloc:\n  fusiond: %s\n  hwloc:   %s", what, d.field, d.ours, d.theirs)
		}
		t.Logf("warnings: %q", h.Warnings)
	}
}

// warned fails unless a warning contains every one of parts, and checks
// that every warning is one line under 400 bytes.
func warned(t *testing.T, h *Host, parts ...string) {
	t.Helper()
	for _, w := range h.Warnings {
		if len(w) >= 400 || strings.Contains(w, "\n") {
			t.Errorf("warning not one short line (%d bytes): %.300s", len(w), w)
		}
	}
	if !slices.ContainsFunc(h.Warnings, func(w string) bool {
		for _, p := range parts {
			if !strings.Contains(w, p) {
				return false
			}
		}
		return true
	}) {
		t.Errorf("no warning containing all of %q in %q", parts, h.Warnings)
	}
}

func mkdir(t *testing.T, root, p string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(root, p), 0o755); err != nil {
		t.Fatal(err)
	}
}

func rm(t *testing.T, root string, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if err := os.RemoveAll(filepath.Join(root, p)); err != nil {
			t.Fatal(err)
		}
	}
}

// Class 1: an online CPU whose cpuN/topology is missing, and an empty
// cpuN directory. hwloc leaves both out; so does fusiond now (before, the
// CPU was its own core while its sibling's core_cpus still named it: one
// CPU in two cores; and the empty directory was an offline CPU).
func TestDegradedCPUWithoutTopology(t *testing.T) {
	root := unpackBz2Tree(t, hwlocTreeDir, "16em64t-4s2c2t")
	rm(t, root, sysCPU+"/cpu3/topology")
	mkdir(t, root, sysCPU+"/cpu16")
	h := discoverAt(t, root, WithoutNames())
	mustAgree(t, "16em64t-4s2c2t without cpu3/topology, with an empty cpu16", h, hwlocLiveFacts(t, root))
	if h.OnlineCPUs.Contains(3) || h.OfflineCPUs.Contains(16) || h.OfflineCPUs.Contains(3) {
		t.Errorf("online %s, offline %s: CPUs 3 and 16 must be in neither", h.OnlineCPUs, h.OfflineCPUs)
	}
	var seen CPUSet
	for _, c := range h.Cores {
		if c.CPUs.Intersects(seen) {
			t.Errorf("core %s overlaps another core", c.CPUs)
		}
		seen = seen.Union(c.CPUs)
	}
	if seen.Contains(3) || !seen.Equal(h.OnlineCPUs) {
		t.Errorf("cores cover %s, online %s", seen, h.OnlineCPUs)
	}
	warned(t, h, sysCPU+"/cpuN/topology is missing for online CPUs 3;")
	warned(t, h, "CPUs 16 are empty")

	// The same on a tree with cpu/online and cpu/present (the simhost's).
	root = writeSimhost(t, simhost.WithCoresPerSocket(2))
	rm(t, root, sysCPU+"/cpu5/topology")
	mkdir(t, root, sysCPU+"/cpu99")
	h = discoverAt(t, root, WithoutNames())
	mustAgree(t, "simhost without cpu5/topology, with an empty cpu99", h, hwlocLiveFacts(t, root))
	if h.OnlineCPUs.Contains(5) || h.OfflineCPUs.Contains(99) {
		t.Errorf("online %s, offline %s", h.OnlineCPUs, h.OfflineCPUs)
	}
	warned(t, h, sysCPU+"/cpuN/topology is missing for online CPUs 5;")
	warned(t, h, "CPUs 99 are empty")
}

// Class 2: a stray nodeN directory. With node/online, hwloc lists nodes
// from it and so does fusiond: no phantom node, every distance kept.
// Without node/online hwloc also drops the stray directory but then
// drops every distance (node9 has no distance file); fusiond ignores a
// directory without any node file and keeps the distances, which the
// test compares with hwloc's on the undamaged tree.
func TestDegradedStrayNodeDirectory(t *testing.T) {
	root := unpackBz2Tree(t, hwlocTreeDir, "16ia64-8n2s")
	truth := hwlocDistances(t, root)
	if len(truth) != 64 {
		t.Fatalf("hwloc has %d distances on the undamaged tree, want 64", len(truth))
	}
	mkdir(t, root, sysNode+"/node9")
	h := discoverAt(t, root, WithoutNames())
	mustAgree(t, "16ia64-8n2s with a stray node9", h, hwlocLiveFacts(t, root))
	if got, theirs := modelDistances(h), hwlocDistances(t, root); fmt.Sprint(got) != fmt.Sprint(theirs) {
		t.Errorf("distances: fusiond %v, hwloc %v", got, theirs)
	}
	warned(t, h, "node9", "not in "+sysNode+"/online (0-7)")

	rm(t, root, sysNode+"/online")
	h = discoverAt(t, root, WithoutNames())
	mustAgree(t, "16ia64-8n2s with a stray node9 and no node/online", h, hwlocLiveFacts(t, root))
	if theirs := hwlocDistances(t, root); theirs != nil {
		t.Errorf("hwloc now keeps distances (%v): the documented difference is gone, update docs/topology.md", theirs)
	}
	if got := modelDistances(h); fmt.Sprint(got) != fmt.Sprint(truth) {
		t.Errorf("distances: fusiond %v, hwloc on the undamaged tree %v", got, truth)
	}
	warned(t, h, "node9", "hold none of cpumap, cpulist, meminfo, distance")
}

// Class 3: numa_node naming a node that does not exist. hwloc places the
// device by local_cpus; fusiond falls back to local_cpulist the same way
// (before: no node at all), and the warning names the value in the file.
func TestDegradedNumaNodeMissingNode(t *testing.T) {
	root := writeSimhost(t)
	gpu := simhost.GPUAddrs()[5] // node 1
	writeFile(t, root, sysPCI+"/"+gpu+"/numa_node", "7\n")
	crossCheck(t, root)
	h := discoverAt(t, root, WithoutNames())
	if d := h.Device(PCIAddr(gpu)); d == nil || d.Node != 1 {
		t.Fatalf("GPU with numa_node 7: %+v, want node 1 from local_cpulist", d)
	}
	warned(t, h, sysPCI+"/"+gpu+"/numa_node is 7", "nodes: 0-1")
}

// Class 4: NVIDIA GPU memory exposed as NUMA nodes (POWER9 here; Grace
// Hopper does the same). hwloc locates each through
// /proc/driver/nvidia/gpus/ADDR/numa_status and the GPU's local_cpus
// (and on POWER hides them unless HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES=1);
// fusiond keeps them and locates them the same way (before: no locality,
// as every SLIT distance from them is equal).
func TestDegradedNvidiaGPUMemoryNodes(t *testing.T) {
	const keep = "HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES=1"
	root := unpackBz2Tree(t, hwlocTreeDir, "nvidiagpunumanodes")
	h := discoverAt(t, root, WithoutNames())
	ours, theirs := factsOfModel(h), hwlocLiveFacts(t, root, keep)
	if fmtNodes(ours.nodes) != fmtNodes(theirs.nodes) {
		t.Errorf("nodes: fusiond %s, hwloc %s", fmtNodes(ours.nodes), fmtNodes(theirs.nodes))
	}
	gpus := 0
	for _, n := range h.Nodes {
		if n.GPU != "" {
			gpus++
			if n.Initiators.IsEmpty() || !n.CPUs.IsEmpty() {
				t.Errorf("GPU memory node %d: %+v", n.ID, n)
			}
		}
	}
	if gpus != 6 || h.Node(250).GPU != "0035:05:00.0" {
		t.Errorf("%d GPU memory nodes (want 6), node250 GPU %q", gpus, h.Node(250).GPU)
	}

	// numa_status naming a node the kernel does not have: that GPU's
	// memory is not located; hwloc puts node 250 in a CPU-less group of
	// its own, fusiond leaves its initiators empty: no locality in both.
	st := "/proc/driver/nvidia/gpus/0035:05:00.0/numa_status"
	writeFile(t, root, st, "Node:      7\nStatus:    online\n")
	h = discoverAt(t, root, WithoutNames())
	ours, theirs = factsOfModel(h), hwlocLiveFacts(t, root, keep)
	if fmtNodes(ours.nodes) != fmtNodes(theirs.nodes) {
		t.Errorf("nodes after the damage: fusiond %s, hwloc %s", fmtNodes(ours.nodes), fmtNodes(theirs.nodes))
	}
	if n := h.Node(250); n.GPU != "" || !n.Initiators.IsEmpty() {
		t.Errorf("node250 after the damage: %+v", n)
	}
	warned(t, h, st+": Node 7 is not a NUMA node here")
}

// Class 5: a node whose CPU files (cpumap, cpulist) cannot be read.
// hwloc drops the node, memory and all. fusiond takes its CPUs from the
// nodeN/cpuM links the kernel makes; the model then equals hwloc's on
// the undamaged tree. Without the links either, the node's CPUs are
// unknown: it keeps its memory and distances but gets no initiators
// guessed by distance (before: the SLIT-nearest nodes' CPUs, which left
// out its own).
func TestDegradedNodeCPUFilesUnreadable(t *testing.T) {
	root := unpackBz2Tree(t, hwlocTreeDir, "16amd64-8n2c")
	truth := hwlocLiveFacts(t, root)
	n1 := sysNode + "/node1"
	rm(t, root, n1+"/cpumap", n1+"/cpulist")
	mkdir(t, root, n1+"/cpumap") // reading a directory fails: unreadable
	h := discoverAt(t, root, WithoutNames())
	mustAgree(t, "16amd64-8n2c with node1's CPU files unreadable, against the undamaged tree", h, truth)
	diffs := compareFacts(factsOfModel(h), hwlocLiveFacts(t, root), h, nil, false)
	if len(diffs) != 1 || diffs[0].field != "nodes" || strings.Contains(diffs[0].theirs, "1:") {
		t.Errorf("against hwloc on the damaged tree want only node1 missing there, got %+v", diffs)
	}
	warned(t, h, n1+"/cpumap", "node1 CPUs 2-3 taken from its cpuM links")

	root = unpackBz2Tree(t, hwlocTreeDir, "16ia64-8n2s")
	rm(t, root, n1+"/cpumap", n1+"/cpulist")
	mkdir(t, root, n1+"/cpumap")
	if ents, _ := filepath.Glob(filepath.Join(root, n1, "cpu[0-9]*")); len(ents) > 0 {
		t.Fatalf("16ia64-8n2s has cpuM links under node1 (%v): pick a tree without", ents)
	}
	h = discoverAt(t, root, WithoutNames())
	n := h.Node(1)
	if n == nil || !n.CPUs.IsEmpty() || !n.Initiators.IsEmpty() || n.MemoryBytes == 0 || len(n.Distances) != 8 {
		t.Fatalf("node1 without CPU files or links: %+v", n)
	}
	if _, ok := hwlocLiveFacts(t, root).nodes[1]; ok {
		t.Errorf("hwloc now keeps node1: the documented difference changed")
	}
	warned(t, h, n1+"/cpumap", "node1 CPUs unknown")
	warned(t, h, "online CPUs", "belong to no NUMA node")
}

// Class 6: die_cpus naming only the CPU itself. hwloc ignores such dies
// (no Die objects); fusiond groups the CPUs by die_id instead and warns:
// on hwloc's 2-package, 4-dies-per-package tree that gives back the 8
// dies of the undamaged tree. Without die_id as well, no dies, as hwloc.
func TestDegradedSingleCPUDies(t *testing.T) {
	const name = "fakecpuid1f-64intel64-2p4d2n2c2t"
	root := unpackBz2Tree(t, hwlocTreeDir, name)
	truth := hwlocLiveFacts(t, root)
	if len(truth.dies) != 8 {
		t.Fatalf("hwloc has %d dies on the undamaged tree, want 8", len(truth.dies))
	}
	cpus, _ := filepath.Glob(filepath.Join(root, sysCPU, "cpu[0-9]*"))
	for _, dir := range cpus {
		c, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(dir), "cpu"))
		if err != nil {
			t.Fatal(err)
		}
		rel := strings.TrimPrefix(dir, root)
		writeFile(t, root, rel+"/topology/die_cpus", cpuMaskString(NewCPUSet(c))+"\n")
		writeFile(t, root, rel+"/topology/die_cpus_list", strconv.Itoa(c)+"\n")
	}
	h := discoverAt(t, root, WithoutNames())
	mustAgree(t, name+" with single-CPU die_cpus, against the undamaged tree", h, truth)
	if theirs := hwlocLiveFacts(t, root); len(theirs.dies) != 0 {
		t.Errorf("hwloc keeps %d dies on the damaged tree: the documented difference changed", len(theirs.dies))
	}
	warned(t, h, "die_cpus names only the CPU itself", "grouped by (package, die_id)")

	for _, dir := range cpus {
		rm(t, root, strings.TrimPrefix(dir, root)+"/topology/die_id")
	}
	h = discoverAt(t, root, WithoutNames())
	mustAgree(t, name+" with single-CPU die_cpus and no die_id", h, hwlocLiveFacts(t, root))
	if len(h.Dies) != 0 {
		t.Errorf("dies %+v, want none", h.Dies)
	}
}

// Die changes are Watcher events: on hwloc's multi-die tree, die 1 of
// package 0 splits in two (CPUs 12-15 get die_id 9).
func TestWatcherDieEvents(t *testing.T) {
	root := unpackBz2Tree(t, hwlocTreeDir, "fakecpuid1f-64intel64-2p4d2n2c2t")
	w := NewWatcher(WatcherConfig{Options: []Option{WithRoot(root), WithoutNames()}})
	ch, cancel := w.Subscribe()
	defer cancel()
	if _, err := w.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	for c := 8; c < 16; c++ {
		dir := fmt.Sprintf("%s/cpu%d/topology/", sysCPU, c)
		die := NewCPUSet(8, 9, 10, 11)
		if c >= 12 {
			die = NewCPUSet(12, 13, 14, 15)
			writeFile(t, root, dir+"die_id", "9\n")
		}
		writeFile(t, root, dir+"die_cpus", cpuMaskString(die)+"\n")
		writeFile(t, root, dir+"die_cpus_list", die.String()+"\n")
	}
	ev, err := w.Refresh(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ev {
		got = append(got, e.String())
	}
	want := []string{`die-changed cpus 8-11: socket 0 die 1: cpus "8-15" -> "8-11"`, "die-added cpus 12-15: socket 0 die 9"}
	if !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
	if e := <-ch; e.Kind != DieChanged {
		t.Errorf("first published event %v", e)
	}
}

// A memory-less CPU node's jobs allocate from the nearest node with
// memory (cpuset.mems): by SLIT distance, else by initiators; never a
// GPU's memory node.
func TestMemoryNodesFor(t *testing.T) {
	root := writeSimhost(t, simhost.WithCoresPerSocket(2))
	writeFile(t, root, sysNode+"/node1/meminfo", "Node 1 MemTotal:       0 kB\n")
	h := discoverAt(t, root, WithoutNames())
	for id, want := range map[NodeID][]NodeID{0: {0}, 1: {0}, 7: nil} {
		if got := h.MemoryNodesFor(id); !slices.Equal(got, want) {
			t.Errorf("simhost with memory-less node1: MemoryNodesFor(%d) = %v, want %v", id, got, want)
		}
	}

	// No distances: a CPU-less memory node whose initiator is node 1.
	writeFile(t, root, sysNode+"/online", "0-2\n")
	writeFile(t, root, sysNode+"/node2/cpulist", "\n")
	writeFile(t, root, sysNode+"/node2/meminfo", "Node 2 MemTotal: 1048576 kB\n")
	mkdir(t, root, sysNode+"/node2/access0/initiators")
	if err := os.Symlink("../../../node1", filepath.Join(root, sysNode, "node2/access0/initiators/node1")); err != nil {
		t.Fatal(err)
	}
	rm(t, root, sysNode+"/node0/distance", sysNode+"/node1/distance")
	h = discoverAt(t, root, WithoutNames())
	if got := h.MemoryNodesFor(1); !slices.Equal(got, []NodeID{2}) {
		t.Errorf("no distances, node2's initiator node1: MemoryNodesFor(1) = %v, want [2]", got)
	}

	// POWER9 with GPU memory nodes nearer than the other socket's DRAM:
	// still the DRAM.
	root = unpackBz2Tree(t, hwlocTreeDir, "nvidiagpunumanodes")
	writeFile(t, root, sysNode+"/node8/meminfo", "Node 8 MemTotal:       0 kB\n")
	writeFile(t, root, sysNode+"/node8/distance", "40 10 20 20 20 80 80 80\n")
	h = discoverAt(t, root, WithoutNames())
	if got := h.MemoryNodesFor(8); !slices.Equal(got, []NodeID{0}) {
		t.Errorf("memory-less node8 next to GPU memory: MemoryNodesFor(8) = %v, want [0]", got)
	}
}

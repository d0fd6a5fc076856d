package topology

import (
	"context"
	"encoding/xml"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jaypipes/ghw/pkg/snapshot"
	ghwtestdata "github.com/jaypipes/ghw/testdata"

	"github.com/fusiond/fusiond/topology/simhost"
)

// hwlocObject is one <object> of lstopo's XML output.
type hwlocObject struct {
	Type     string        `xml:"type,attr"`
	OSIndex  string        `xml:"os_index,attr"`
	CPUSet   string        `xml:"cpuset,attr"`
	NodeSet  string        `xml:"nodeset,attr"`
	BusID    string        `xml:"pci_busid,attr"`
	Children []hwlocObject `xml:"object"`
}

// hwlocView is what the cross-check compares: NUMA nodes with their CPUs,
// and PCI functions with their NUMA node (NoNode when hwloc attaches the
// device above a single node).
type hwlocView struct {
	nodes   map[NodeID]string
	devices map[PCIAddr]NodeID
}

func (v hwlocView) String() string {
	var sb strings.Builder
	ids := make([]int, 0, len(v.nodes))
	for id := range v.nodes {
		ids = append(ids, int(id))
	}
	slices.Sort(ids)
	for _, id := range ids {
		fmt.Fprintf(&sb, "  node%d cpus=%q\n", id, v.nodes[NodeID(id)])
	}
	addrs := make([]string, 0, len(v.devices))
	for a := range v.devices {
		addrs = append(addrs, string(a))
	}
	slices.Sort(addrs)
	for _, a := range addrs {
		fmt.Fprintf(&sb, "  %s node=%d\n", a, v.devices[PCIAddr(a)])
	}
	return sb.String()
}

// parseHwlocBitmap parses hwloc's "0x00000003,0xffffffff" bitmaps
// (32-bit words, most significant first, each 0x-prefixed).
func parseHwlocBitmap(s string) (CPUSet, error) {
	if s == "" || s == "0x0" {
		return CPUSet{}, nil
	}
	words := strings.Split(s, ",")
	for i, w := range words {
		words[i] = strings.TrimPrefix(w, "0x")
		if words[i] == "" {
			words[i] = "0"
		}
		if strings.HasPrefix(words[i], "f...f") {
			return CPUSet{}, fmt.Errorf("infinite hwloc bitmap %q", s)
		}
	}
	return ParseCPUMask(strings.Join(words, ","))
}

// runHwloc runs lstopo on a tree and reduces its XML to a hwlocView.
func runHwloc(t *testing.T, root string) hwlocView {
	t.Helper()
	bin, err := exec.LookPath("lstopo-no-graphics")
	if err != nil {
		t.Fatalf("lstopo-no-graphics not found (apt-get install -y hwloc): %v", err)
	}
	cmd := exec.Command(bin, "--of", "xml", "--whole-io", "-")
	// linux,stop: only the Linux backend reads the tree (without it hwloc
	// mixes this machine's x86 CPUID cache sizes into fixture trees).
	cmd.Env = append(os.Environ(), "HWLOC_COMPONENTS=linux,stop", "HWLOC_FSROOT="+root)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("HWLOC_FSROOT=%s %s: %v", root, bin, err)
	}
	var doc struct {
		Objects []hwlocObject `xml:"object"`
	}
	if err := xml.Unmarshal(out, &doc); err != nil {
		t.Fatalf("lstopo XML: %v", err)
	}
	v := hwlocView{nodes: map[NodeID]string{}, devices: map[PCIAddr]NodeID{}}
	var walk func(o hwlocObject, nodes CPUSet)
	walk = func(o hwlocObject, nodes CPUSet) {
		if o.NodeSet != "" {
			ns, err := parseHwlocBitmap(o.NodeSet)
			if err != nil {
				t.Fatalf("nodeset of %s: %v", o.Type, err)
			}
			nodes = ns
		}
		switch o.Type {
		case "NUMANode":
			id, err := strconv.Atoi(o.OSIndex)
			if err != nil {
				t.Fatalf("NUMANode os_index %q", o.OSIndex)
			}
			cpus, err := parseHwlocBitmap(o.CPUSet)
			if err != nil {
				t.Fatalf("NUMANode cpuset: %v", err)
			}
			v.nodes[NodeID(id)] = cpus.String()
		case "PCIDev", "Bridge":
			if o.BusID != "" {
				node := NoNode
				if nodes.Len() == 1 {
					node = NodeID(nodes.List()[0])
				}
				v.devices[PCIAddr(o.BusID)] = node
			}
		}
		for _, c := range o.Children {
			walk(c, nodes)
		}
	}
	for _, o := range doc.Objects {
		walk(o, CPUSet{})
	}
	return v
}

// modelView reduces our Host to the same shape as hwlocView.
func modelView(h *Host) hwlocView {
	v := hwlocView{nodes: map[NodeID]string{}, devices: map[PCIAddr]NodeID{}}
	for _, n := range h.Nodes {
		v.nodes[n.ID] = n.CPUs.String()
	}
	for _, d := range h.Devices {
		v.devices[d.Addr] = d.Node
	}
	return v
}

// crossCheck fails the test when hwloc and our model disagree on NUMA
// nodes, their CPUs, the set of PCI functions or a function's node,
// including a device hwloc leaves above the nodes (no single node) while
// our model places it: that is a disagreement too.
//
// allowAbove, when not empty, is the reason why devices hwloc leaves above
// the nodes may be placed by our model on this tree; they are then logged
// with the reason instead of failing (see hwlocCrossCheckAllow).
func crossCheck(t *testing.T, root string, allowAbove ...string) {
	t.Helper()
	h, err := Discover(context.Background(), WithRoot(root), WithoutNames())
	if err != nil {
		t.Fatalf("Discover(%s): %v", root, err)
	}
	ours, theirs := modelView(h), runHwloc(t, root)
	problems, unplaced := compareViews(ours, theirs)
	if len(allowAbove) > 0 && allowAbove[0] != "" {
		problems = slices.DeleteFunc(problems, func(p string) bool {
			if strings.Contains(p, "above the NUMA nodes") {
				t.Logf("allowed (%s): %s", allowAbove[0], p)
				return true
			}
			return false
		})
	}
	if len(problems) > 0 {
		t.Errorf("topology and hwloc disagree on %s:\n  %s\n--- topology:\n%s--- hwloc:\n%s--- topology warnings:\n  %s",
			root, strings.Join(problems, "\n  "), ours, theirs, strings.Join(h.Warnings, "\n  "))
	}
	if len(ours.nodes) == 0 {
		t.Errorf("%s: no NUMA node in the model", root)
	}
	t.Logf("%s: %d nodes, %d PCI functions agree (%d placed by numa_node where hwloc has no single node)",
		root, len(ours.nodes), len(ours.devices), unplaced)
}

// compareViews lists the disagreements between our view and hwloc's.
func compareViews(ours, theirs hwlocView) (problems []string, unplaced int) {
	if !maps.Equal(ours.nodes, theirs.nodes) {
		problems = append(problems, "NUMA nodes or their CPUs differ")
	}
	for a, n := range ours.devices {
		hn, ok := theirs.devices[a]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("%s missing in hwloc", a))
		case hn == NoNode && n != NoNode:
			unplaced++
			problems = append(problems, fmt.Sprintf("%s: node %d here, above the NUMA nodes (no single node) in hwloc", a, n))
		case hn != n:
			problems = append(problems, fmt.Sprintf("%s: node %d here, %d in hwloc", a, n, hn))
		}
	}
	for a := range theirs.devices {
		if _, ok := ours.devices[a]; !ok {
			problems = append(problems, fmt.Sprintf("%s missing here", a))
		}
	}
	slices.Sort(problems)
	return problems, unplaced
}

func TestHwlocCrossCheckLiveHost(t *testing.T) {
	crossCheck(t, "/")
}

func TestHwlocCrossCheckSimhost(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "root")
	if err := simhost.Plan().Write(dir); err != nil { // full size: 224 CPUs
		t.Fatal(err)
	}
	crossCheck(t, dir)
}

// ghwSnapshots lists ghw's real-machine snapshots (testdata module).
func ghwSnapshots(t *testing.T) []string {
	t.Helper()
	dir, err := ghwtestdata.SnapshotsDirectory()
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := filepath.Glob(filepath.Join(dir, "linux-*.tar.gz"))
	if err != nil || len(snaps) == 0 {
		t.Fatalf("no ghw snapshots in %s: %v", dir, err)
	}
	return snaps
}

func unpackSnapshot(t *testing.T, snap string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "root")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := snapshot.UnpackInto(snap, dir); err != nil {
		t.Fatalf("unpack %s: %v", snap, err)
	}
	return dir
}

// hwlocCrossCheckAllow lists the ghw snapshots on which hwloc may leave
// devices above the nodes that our model places, and why we are right.
var hwlocCrossCheckAllow = map[string]string{
	"linux-amd64-8581cf3a529e5d8b97ea876eade2f60d": "the snapshot has no local_cpus files, which is all hwloc places devices by; the kernel's numa_node names the node and fusiond uses it",
}

func TestHwlocCrossCheckGhwSnapshots(t *testing.T) {
	for _, snap := range ghwSnapshots(t) {
		t.Run(strings.TrimSuffix(filepath.Base(snap), ".tar.gz"), func(t *testing.T) {
			t.Parallel()
			crossCheck(t, unpackSnapshot(t, snap), hwlocCrossCheckAllow[strings.TrimSuffix(filepath.Base(snap), ".tar.gz")])
		})
	}
}

// TestHwlocCrossCheckDetectsDisagreement makes sure the cross-check can
// fail: a GPU whose numa_node contradicts its local_cpus is placed by
// numa_node here and by local_cpus in hwloc.
func TestHwlocCrossCheckDetectsDisagreement(t *testing.T) {
	root := writeSimhost(t)
	gpu := simhost.GPUAddrs()[0]
	writeFile(t, root, "/sys/bus/pci/devices/"+gpu+"/numa_node", "1\n")
	h := discoverAt(t, root, WithoutNames())
	problems, _ := compareViews(modelView(h), runHwloc(t, root))
	want := fmt.Sprintf("%s: node 1 here, 0 in hwloc", gpu)
	if !slices.Contains(problems, want) {
		t.Fatalf("problems = %q, want one to be %q", problems, want)
	}
}

// TestHwlocCrossCheckNumaNodeUnknown: with numa_node -1 our model falls
// back to local_cpulist, as hwloc does, and both agree.
func TestHwlocCrossCheckNumaNodeUnknown(t *testing.T) {
	root := writeSimhost(t)
	for _, gpu := range simhost.GPUAddrs() {
		writeFile(t, root, "/sys/bus/pci/devices/"+gpu+"/numa_node", "-1\n")
	}
	crossCheck(t, root)
	h := discoverAt(t, root, WithoutNames())
	if d := h.Device(PCIAddr(simhost.GPUAddrs()[5])); d == nil || d.Node != 1 {
		t.Fatalf("GPU 5 with numa_node -1: %+v, want node 1 from local_cpulist", d)
	}
}

// TestCompareViewsStrict: a device hwloc leaves above the nodes while our
// model places it is a disagreement (it used to count as agreeing).
func TestCompareViewsStrict(t *testing.T) {
	ours := hwlocView{nodes: map[NodeID]string{0: "0", 1: "1"}, devices: map[PCIAddr]NodeID{"0000:01:00.0": 1}}
	theirs := hwlocView{nodes: map[NodeID]string{0: "0", 1: "1"}, devices: map[PCIAddr]NodeID{"0000:01:00.0": NoNode}}
	problems, unplaced := compareViews(ours, theirs)
	if unplaced != 1 || len(problems) != 1 || !strings.Contains(problems[0], "above the NUMA nodes") {
		t.Fatalf("problems %q, unplaced %d", problems, unplaced)
	}
}

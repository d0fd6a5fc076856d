package topology

import (
	"archive/tar"
	"bufio"
	"compress/bzip2"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The trees under testdata/hwloc are hwloc 2.9.0's own test machines
// (tests/hwloc/linux, see testdata/hwloc/PROVENANCE.md). Each TREE.tar.bz2
// comes with TREE.output, what `lstopo` printed for it (text, or XML where
// TREE.options says --of xml), made with TREE.options and TREE.env when
// those exist. TestHwlocTrees compares our model with that output and,
// with lstopo-no-graphics installed, with a live
// `HWLOC_COMPONENTS=linux,stop HWLOC_FSROOT=TREE lstopo-no-graphics --of xml --whole-io -`.
// Every disagreement fails the test unless testdata/hwloc/allow.txt lists
// it with a reason; an allow-list entry that no longer matches a
// disagreement fails too, so the list only shrinks.

const hwlocTreeDir = "testdata/hwloc"

// hwObj is one object of an lstopo topology (text or XML output).
type hwObj struct {
	Type     string
	OS       int // P#, -1 when not printed
	BusID    string
	Children []*hwObj
	Kinds    []hwKind // the root's: the topology's CPU kinds
}

// hwKind is one hwloc CPU kind (hwloc_cpukinds): its PUs and its
// efficiency rank (higher is more performant; -1 unknown).
type hwKind struct {
	cpus       CPUSet
	efficiency int
}

var hwKindLine = regexp.MustCompile(`^CPU kind #\d+ efficiency (-?\d+) cpuset (\S+)$`)

var (
	hwTextLine = regexp.MustCompile(`^( *)([A-Za-z][A-Za-z0-9]*)(\([^)]*\))?(.*)$`)
	hwPNum     = regexp.MustCompile(`P#(\d+)`)
	hwBusID    = regexp.MustCompile(`busid=([0-9a-fA-F]+:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])`)
)

// parseHwlocText reads lstopo's text output (`lstopo -v -` or `-p`): one
// object per line, children indented by two more spaces than their parent.
func parseHwlocText(s string) (*hwObj, error) {
	var root *hwObj
	var stack []*hwObj // stack[i] is the last object at depth i
	for i, line := range strings.Split(s, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		if strings.HasPrefix(line, "depth ") {
			// The per-depth summary, CPU kinds and matrices follow the tree.
			if root == nil {
				break
			}
			for _, l := range strings.Split(s, "\n") {
				km := hwKindLine.FindStringSubmatch(strings.TrimSpace(l))
				if km == nil {
					continue
				}
				eff, _ := strconv.Atoi(km[1])
				cpus, err := parseHwlocBitmap(km[2])
				if err != nil {
					return nil, fmt.Errorf("%q: %w", l, err)
				}
				root.Kinds = append(root.Kinds, hwKind{cpus: cpus, efficiency: eff})
			}
			break
		}
		m := hwTextLine.FindStringSubmatch(line)
		if m == nil || len(m[1])%2 != 0 {
			return nil, fmt.Errorf("line %d: %q is not an object line", i+1, line)
		}
		depth := len(m[1]) / 2
		o := &hwObj{Type: m[2], OS: -1}
		rest := m[4]
		// The P# of an object is the first one on its line, before
		// attributes such as "cpuset=" (never printed here) could hold one.
		if pm := hwPNum.FindStringSubmatch(rest); pm != nil {
			o.OS, _ = strconv.Atoi(pm[1])
		}
		if bm := hwBusID.FindStringSubmatch(rest); bm != nil {
			o.BusID = strings.ToLower(bm[1])
		}
		switch {
		case depth == 0:
			if root != nil {
				break // memory attributes and matrices follow the tree
			}
			root, stack = o, []*hwObj{o}
		case depth > len(stack):
			return nil, fmt.Errorf("line %d: indented too far", i+1)
		default:
			parent := stack[depth-1]
			parent.Children = append(parent.Children, o)
			stack = append(stack[:depth], o)
		}
	}
	if root == nil {
		return nil, errors.New("no objects")
	}
	return root, nil
}

// parseHwlocXML reads lstopo's XML output.
func parseHwlocXML(b []byte) (*hwObj, error) {
	var doc struct {
		Objects []hwlocObject `xml:"object"`
		Kinds   []struct {
			CPUSet string `xml:"cpuset,attr"`
			Forced string `xml:"forced_efficiency,attr"`
			Infos  []struct {
				Name  string `xml:"name,attr"`
				Value string `xml:"value,attr"`
			} `xml:"info"`
		} `xml:"cpukind"`
	}
	if err := xml.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	// The XML export keeps a kind's forced efficiency but not the rank
	// hwloc computed; rank the others as hwloc does: by CoreType
	// (IntelAtom below IntelCore), else base frequency, else max frequency.
	var kinds []hwKind
	rank := map[string]map[int]int{} // info name → kind index → value
	for i, k := range doc.Kinds {
		cpus, err := parseHwlocBitmap(k.CPUSet)
		if err != nil {
			return nil, fmt.Errorf("cpukind %q: %w", k.CPUSet, err)
		}
		eff := -1
		if n, err := strconv.Atoi(k.Forced); err == nil {
			eff = n
		}
		for _, in := range k.Infos {
			v, err := strconv.Atoi(in.Value)
			if in.Name == "CoreType" {
				v, err = 0, nil
				if in.Value == "IntelCore" {
					v = 1
				}
			}
			if err == nil {
				if rank[in.Name] == nil {
					rank[in.Name] = map[int]int{}
				}
				rank[in.Name][i] = v
			}
		}
		kinds = append(kinds, hwKind{cpus: cpus, efficiency: eff})
	}
	if !slices.ContainsFunc(kinds, func(k hwKind) bool { return k.efficiency >= 0 }) {
		for _, by := range []string{"CoreType", "FrequencyBaseMHz", "FrequencyMaxMHz"} {
			if vs := rank[by]; len(vs) == len(kinds) {
				for i := range kinds {
					kinds[i].efficiency = vs[i]
				}
				break
			}
		}
	}
	if len(doc.Objects) != 1 {
		return nil, fmt.Errorf("%d root objects", len(doc.Objects))
	}
	var conv func(x hwlocObject) *hwObj
	conv = func(x hwlocObject) *hwObj {
		o := &hwObj{Type: x.Type, OS: -1, BusID: strings.ToLower(x.BusID)}
		if n, err := strconv.Atoi(x.OSIndex); err == nil {
			o.OS = n
		}
		if o.Type == "PCIDev" {
			o.Type = "PCI"
		}
		for _, c := range x.Children {
			o.Children = append(o.Children, conv(c))
		}
		return o
	}
	root := conv(doc.Objects[0])
	root.Kinds = kinds
	return root, nil
}

// treeFacts is what the comparison looks at, for our model and for hwloc.
// CPU sets are kernel cpulist strings; lists are sorted.
type treeFacts struct {
	nodes    map[int]string // NUMA node id → CPUs (hwloc: its parent's PUs)
	packages []string
	dies     []string
	cores    []string
	l3       []string
	kinds    string         // "performance CPUS efficiency CPUS"; "" when not hybrid
	devices  map[string]int // PCI function → NUMA node (-1: none single)
}

// fmtKinds is the kinds fact: the performance CPUs and the others.
func fmtKinds(perf, eff CPUSet) string {
	if perf.IsEmpty() || eff.IsEmpty() {
		return ""
	}
	return "performance " + perf.String() + " efficiency " + eff.String()
}

// hwlocKinds is hwloc's kinds fact: its most efficient-ranked kinds are
// the performance CPUs, the rest efficiency CPUs; "" with fewer than two
// kinds. Kinds hwloc could not rank are listed as such.
func hwlocKinds(ks []hwKind) string {
	if len(ks) < 2 {
		return ""
	}
	top := -1
	for _, k := range ks {
		top = max(top, k.efficiency)
	}
	if top < 0 {
		var parts []string
		for _, k := range ks {
			parts = append(parts, k.cpus.String())
		}
		slices.Sort(parts)
		return "unranked " + strings.Join(parts, " ")
	}
	var perf, eff CPUSet
	for _, k := range ks {
		if k.efficiency == top {
			perf = perf.Union(k.cpus)
		} else {
			eff = eff.Union(k.cpus)
		}
	}
	return fmtKinds(perf, eff)
}

var hwCPUTypes = map[string]bool{"Machine": true, "Package": true, "Die": true, "Core": true, "PU": true, "Group": true, "NUMANode": true, "MemCache": true}

func isHwCPUType(t string) bool {
	return hwCPUTypes[t] || strings.HasSuffix(t, "Cache") || strings.HasPrefix(t, "Group")
}

// factsOfHwloc reduces an lstopo tree to treeFacts. An object's CPUs are
// the PUs below it; a NUMA node's are its parent's (hwloc attaches memory
// to the object whose CPUs are local to it), looking through memory-side
// caches. A PCI function's node is the
// single NUMA node found below its nearest CPU-side ancestor (walking up
// until one has nodes below it); -1 when that ancestor has several.
func factsOfHwloc(root *hwObj) treeFacts {
	f := treeFacts{nodes: map[int]string{}, devices: map[string]int{}}
	pus := map[*hwObj]CPUSet{}
	nodesBelow := map[*hwObj][]int{}
	var sets func(o *hwObj) (CPUSet, []int)
	sets = func(o *hwObj) (CPUSet, []int) {
		var c CPUSet
		var ns []int
		if o.Type == "PU" && o.OS >= 0 {
			c = NewCPUSet(o.OS)
		}
		if o.Type == "NUMANode" && o.OS >= 0 {
			ns = append(ns, o.OS)
		}
		for _, ch := range o.Children {
			cc, cn := sets(ch)
			c = c.Union(cc)
			ns = append(ns, cn...)
		}
		pus[o], nodesBelow[o] = c, ns
		return c, ns
	}
	sets(root)
	var walk func(o *hwObj, ancestors []*hwObj)
	walk = func(o *hwObj, ancestors []*hwObj) {
		switch {
		case o.Type == "NUMANode" && o.OS >= 0 && len(ancestors) > 0:
			// A memory-side cache (MemCache, hwloc 2.1+) sits between a
			// node and the object it is attached to; it has no PUs.
			p := len(ancestors) - 1
			for p > 0 && ancestors[p].Type == "MemCache" {
				p--
			}
			f.nodes[o.OS] = pus[ancestors[p]].String()
		case o.Type == "Package":
			f.packages = append(f.packages, pus[o].String())
		case o.Type == "Die":
			f.dies = append(f.dies, pus[o].String())
		case o.Type == "Core":
			f.cores = append(f.cores, pus[o].String())
		case o.Type == "L3Cache":
			f.l3 = append(f.l3, pus[o].String())
		case o.BusID != "":
			node := -1
			for i := len(ancestors) - 1; i >= 0; i-- {
				a := ancestors[i]
				if !isHwCPUType(a.Type) {
					continue
				}
				if ns := nodesBelow[a]; len(ns) > 0 {
					if len(ns) == 1 {
						node = ns[0]
					}
					break
				}
			}
			f.devices[o.BusID] = node
		}
		for _, ch := range o.Children {
			walk(ch, append(ancestors[:len(ancestors):len(ancestors)], o))
		}
	}
	walk(root, nil)
	f.kinds = hwlocKinds(root.Kinds)
	slices.Sort(f.packages)
	slices.Sort(f.dies)
	slices.Sort(f.cores)
	slices.Sort(f.l3)
	return f
}

// factsOfModel reduces our Host to treeFacts. A CPU-less node is compared
// by the CPUs it is local to (Node.Initiators: access0/initiators). A die
// holding all of its package's CPUs is left out: hwloc makes no Die object
// where die_cpus equals package_cpus (single-die packages).
func factsOfModel(h *Host) treeFacts {
	f := treeFacts{nodes: map[int]string{}, devices: map[string]int{}}
	for _, n := range h.Nodes {
		c := n.CPUs
		if c.IsEmpty() {
			c = n.Initiators
		}
		f.nodes[int(n.ID)] = c.String()
	}
	for _, s := range h.Sockets {
		f.packages = append(f.packages, s.CPUs.String())
	}
	for _, d := range h.Dies {
		if i := slices.IndexFunc(h.Sockets, func(s Socket) bool { return s.ID == d.Socket }); i >= 0 && h.Sockets[i].CPUs.Equal(d.CPUs) {
			continue
		}
		f.dies = append(f.dies, d.CPUs.String())
	}
	for _, c := range h.Cores {
		f.cores = append(f.cores, c.CPUs.String())
	}
	for _, g := range h.L3 {
		f.l3 = append(f.l3, g.CPUs.String())
	}
	for _, d := range h.Devices {
		f.devices[string(d.Addr)] = int(d.Node)
	}
	f.kinds = fmtKinds(h.CoreKindCPUs(CoreKindPerformance), h.CoreKindCPUs(CoreKindEfficiency))
	slices.Sort(f.packages)
	slices.Sort(f.dies)
	slices.Sort(f.cores)
	slices.Sort(f.l3)
	return f
}

func fmtNodes(m map[int]string) string {
	ids := make([]int, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var parts []string
	for _, id := range ids {
		parts = append(parts, fmt.Sprintf("%d:%s", id, m[id]))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func fmtDevices(m map[string]int, keys []string) string {
	var parts []string
	for _, k := range keys {
		if n, ok := m[k]; ok {
			parts = append(parts, fmt.Sprintf("%s@%d", k, n))
		} else {
			parts = append(parts, k+"@absent")
		}
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// fieldDiff is one disagreement on one field.
type fieldDiff struct {
	field, ours, theirs string
}

// compareFacts lists the fields on which ours and theirs disagree. skip
// names fields hwloc's output does not have. With subsetPCI, hwloc's PCI
// functions need only be a subset of ours (lstopo's default I/O filter
// hides most functions); each must still be on the same node.
func compareFacts(ours, theirs treeFacts, h *Host, skip map[string]bool, subsetPCI bool) []fieldDiff {
	var out []fieldDiff
	add := func(field, o, t string) {
		if !skip[field] && o != t {
			out = append(out, fieldDiff{field, o, t})
		}
	}
	add("nodes", fmtNodes(ours.nodes), fmtNodes(theirs.nodes))
	add("packages", fmt.Sprint(ours.packages), fmt.Sprint(theirs.packages))
	add("dies", fmt.Sprint(ours.dies), fmt.Sprint(theirs.dies))
	add("cores", fmt.Sprint(ours.cores), fmt.Sprint(theirs.cores))
	add("l3", fmt.Sprint(ours.l3), fmt.Sprint(theirs.l3))
	add("kinds", ours.kinds, theirs.kinds)
	// Cores spanning two nodes: a model error unless hwloc has that core.
	for _, c := range h.Cores {
		var in []string
		for _, n := range h.Nodes {
			if n.CPUs.Intersects(c.CPUs) {
				in = append(in, strconv.Itoa(int(n.ID)))
			}
		}
		if len(in) > 1 && !slices.Contains(theirs.cores, c.CPUs.String()) {
			add("core-nodes", fmt.Sprintf("core %s in nodes %s", c.CPUs, strings.Join(in, ",")), "no such core")
		}
	}
	var diffKeys []string
	for a, n := range theirs.devices {
		if on, ok := ours.devices[a]; !ok || on != n {
			diffKeys = append(diffKeys, a)
		}
	}
	if !subsetPCI {
		for a := range ours.devices {
			if _, ok := theirs.devices[a]; !ok {
				diffKeys = append(diffKeys, a)
			}
		}
	}
	slices.Sort(diffKeys)
	if len(diffKeys) > 0 {
		add("pci", fmtDevices(ours.devices, diffKeys), fmtDevices(theirs.devices, diffKeys))
	}
	return out
}

// hwlocTree is one vendored test: a tarball and the output lstopo
// printed for it.
type hwlocTree struct {
	name    string // the test's name (unique across both sets)
	dir     string // hwlocTreeDir or hwlocMasterDir
	source  string // the tarball's name without .tar.bz2
	output  string // the expected output file's name
	options string
	env     []string
}

// hwlocMasterDir holds hwloc master's trees that are new or renamed
// relative to the 2.9.0 set (testdata/hwloc-master/PROVENANCE.md). Each
// NAME.test names its tarball (source:), its expected output (target:,
// NAME.console for `lstopo --of console`, NAME.xml for --of xml) and its
// lstopo options: and env: lines, as hwloc's test-topology.sh reads them.
const hwlocMasterDir = "testdata/hwloc-master"

func hwlocTrees(t testing.TB) []hwlocTree {
	t.Helper()
	tars, err := filepath.Glob(filepath.Join(hwlocTreeDir, "*.tar.bz2"))
	if err != nil || len(tars) == 0 {
		t.Fatalf("no trees in %s: %v", hwlocTreeDir, err)
	}
	var out []hwlocTree
	for _, p := range tars {
		tr := hwlocTree{name: strings.TrimSuffix(filepath.Base(p), ".tar.bz2"), dir: hwlocTreeDir}
		tr.source = tr.name
		tr.output = tr.name + ".output"
		opts := tr.name + ".options"
		if _, err := os.Stat(filepath.Join(hwlocTreeDir, tr.output)); err != nil {
			// Trees tested only through their XML export.
			tr.output, opts = tr.name+".xml.output", tr.name+".xml.options"
		}
		if b, err := os.ReadFile(filepath.Join(hwlocTreeDir, opts)); err == nil {
			tr.options = strings.TrimSpace(string(b))
		}
		if b, err := os.ReadFile(filepath.Join(hwlocTreeDir, tr.name+".env")); err == nil {
			for _, l := range strings.Split(string(b), "\n") {
				if k, v, ok := strings.Cut(l, "="); ok && !strings.HasPrefix(l, "export") {
					tr.env = append(tr.env, k+"="+strings.Trim(v, `"`))
				}
			}
		}
		out = append(out, tr)
	}
	tests, err := filepath.Glob(filepath.Join(hwlocMasterDir, "*.test"))
	if err != nil || len(tests) == 0 {
		t.Fatalf("no tests in %s: %v", hwlocMasterDir, err)
	}
	for _, p := range tests {
		tr, err := parseHwlocTest(p)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, tr)
	}
	seen := map[string]bool{}
	for _, tr := range out {
		if seen[tr.name] {
			t.Fatalf("test %s is in both %s and %s: allow-list keys would be ambiguous", tr.name, hwlocTreeDir, hwlocMasterDir)
		}
		seen[tr.name] = true
	}
	return out
}

// parseHwlocTest reads one hwloc master NAME.test file ("key: value"
// lines, # comments). Its source and target must exist beside it.
func parseHwlocTest(path string) (hwlocTree, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return hwlocTree{}, err
	}
	tr := hwlocTree{name: strings.TrimSuffix(filepath.Base(path), ".test"), dir: filepath.Dir(path)}
	for i, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		key, val, ok := strings.Cut(l, ":")
		if !ok {
			return hwlocTree{}, fmt.Errorf("%s line %d: %q is not \"key: value\"", path, i+1, l)
		}
		val = strings.TrimSpace(val)
		switch key {
		case "source":
			tr.source = strings.TrimSuffix(val, ".tar.bz2")
		case "target":
			tr.output = val
		case "options":
			tr.options = val
		case "env":
			if k, v, ok := strings.Cut(val, "="); ok && !strings.HasPrefix(val, "export") {
				tr.env = append(tr.env, k+"="+strings.Trim(v, `"`))
			}
		case "exclude":
			return hwlocTree{}, fmt.Errorf("%s: exclude: is not supported by this harness", path)
		default:
			return hwlocTree{}, fmt.Errorf("%s line %d: unknown key %q", path, i+1, key)
		}
	}
	if tr.source == "" || tr.output == "" {
		return hwlocTree{}, fmt.Errorf("%s: needs source: and target:", path)
	}
	for _, f := range []string{tr.source + ".tar.bz2", tr.output} {
		if _, err := os.Stat(filepath.Join(tr.dir, f)); err != nil {
			return hwlocTree{}, fmt.Errorf("%s: %w", path, err)
		}
	}
	return tr, nil
}

// unpackBz2Tree unpacks a vendored tree into a fresh directory and returns
// the directory holding its sys/ and proc/.
func unpackBz2Tree(t testing.TB, srcDir, name string) string {
	t.Helper()
	f, err := os.Open(filepath.Join(srcDir, name+".tar.bz2"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dir := treeTempDir(t)
	tr := tar.NewReader(bzip2.NewReader(bufio.NewReader(f)))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		clean := filepath.Clean("/" + hdr.Name)
		dst := filepath.Join(dir, clean)
		switch hdr.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(dst, 0o755)
		case tar.TypeReg:
			if err = os.MkdirAll(filepath.Dir(dst), 0o755); err == nil {
				var w *os.File
				if w, err = os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644); err == nil {
					_, err = io.Copy(w, tr)
					err = errors.Join(err, w.Close())
				}
			}
		case tar.TypeSymlink:
			if err = os.MkdirAll(filepath.Dir(dst), 0o755); err == nil {
				err = os.Symlink(hdr.Linkname, dst)
			}
		}
		if err != nil {
			t.Fatalf("%s: %s: %v", name, hdr.Name, err)
		}
	}
	// Trees are stored as NAME/{sys,proc}.
	root := filepath.Join(dir, name)
	if _, err := os.Stat(filepath.Join(root, "sys")); err != nil {
		ents, _ := os.ReadDir(dir)
		if len(ents) == 1 && ents[0].IsDir() {
			root = filepath.Join(dir, ents[0].Name())
		} else {
			root = dir
		}
	}
	return root
}

// treeTempDir is t.TempDir(), but on tmpfs (/dev/shm) where there is
// one: the trees hold up to 16k small files, and creating them on a busy
// disk file system took 15 s per tree on the shared build machine
// against 0.6 s on tmpfs.
func treeTempDir(t testing.TB) string {
	t.Helper()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() && os.Getenv("TMPDIR") == "" {
		if dir, err := os.MkdirTemp("/dev/shm", "fusiond-hwloc-tree-"); err == nil {
			t.Cleanup(func() {
				if err := os.RemoveAll(dir); err != nil {
					t.Errorf("removing %s: %v", dir, err)
				}
			})
			return dir
		}
	}
	return t.TempDir()
}

// hwlocAllow is the checked-in allow-list: "TREE FIELD SOURCE: reason"
// where SOURCE is "expected" (the vendored .output), "live" (this host's
// lstopo) or "both".
func hwlocAllow(t testing.TB) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, dir := range []string{hwlocTreeDir, hwlocMasterDir} {
		readHwlocAllow(t, filepath.Join(dir, "allow.txt"), out)
	}
	return out
}

// readHwlocAllow adds the entries of one allow.txt to out.
func readHwlocAllow(t testing.TB, path string, out map[string]string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		key, reason, ok := strings.Cut(l, ":")
		f := strings.Fields(key)
		if !ok || len(f) != 3 || strings.TrimSpace(reason) == "" || !slices.Contains([]string{"expected", "live", "both"}, f[2]) {
			t.Fatalf("%s line %d: want \"TREE FIELD expected|live|both: reason\", got %q", path, i+1, l)
		}
		k := f[0] + " " + f[1] + " " + f[2]
		if _, dup := out[k]; dup {
			t.Fatalf("%s line %d: %q listed twice", path, i+1, k)
		}
		out[k] = strings.TrimSpace(reason)
	}
}

// skippedFields lists the fields an expected output lacks, from its options.
func skippedFields(options string) map[string]bool {
	skip := map[string]bool{}
	if strings.Contains(options, "--no-io") {
		skip["pci"] = true
	}
	if strings.Contains(options, "--ignore Core") {
		skip["cores"] = true
	}
	if strings.Contains(options, "--no-caches") {
		skip["l3"] = true
	}
	if strings.Contains(options, "package:none") {
		skip["packages"] = true
	}
	return skip
}

// liveHwloc runs lstopo on root (with env added, e.g.
// HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES=1) and parses its XML.
func liveHwloc(root string, env ...string) (*hwObj, error) {
	out, err := liveHwlocXML(root, env...)
	if err != nil {
		return nil, err
	}
	return parseHwlocXML(out)
}

// liveHwlocXML is lstopo's XML for root.
func liveHwlocXML(root string, env ...string) ([]byte, error) {
	bin, err := exec.LookPath("lstopo-no-graphics")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--of", "xml", "--whole-io", "-")
	cmd.Env = append(append(os.Environ(), "HWLOC_COMPONENTS=linux,stop", "HWLOC_FSROOT="+root, "HWLOC_DUMPED_HWDATA_DIR=/nonexistent"), env...)
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("HWLOC_COMPONENTS=linux,stop HWLOC_FSROOT=%s %s --of xml --whole-io -: %w", root, bin, err)
	}
	return out, nil
}

// treeResult is the outcome of one tree, for the agreement table.
type treeResult struct {
	name   string
	diffs  map[string][]fieldDiff // "expected"/"live" → disagreements
	median time.Duration
}

func TestHwlocTrees(t *testing.T) {
	allow := hwlocAllow(t)
	_, lstopoErr := exec.LookPath("lstopo-no-graphics")
	if lstopoErr != nil {
		t.Logf("lstopo-no-graphics not installed: comparing with the vendored expected outputs only (%v)", lstopoErr)
	}
	var mu sync.Mutex
	used := map[string]bool{}
	var results []treeResult
	t.Run("trees", func(t *testing.T) {
		for _, tr := range hwlocTrees(t) {
			t.Run(tr.name, func(t *testing.T) {
				t.Parallel()
				root := unpackBz2Tree(t, tr.dir, tr.source)
				h, err := Discover(context.Background(), WithRoot(root), WithoutNames())
				if err != nil {
					t.Fatalf("Discover: %v", err)
				}
				ours := factsOfModel(h)
				res := treeResult{name: tr.name, diffs: map[string][]fieldDiff{}}
				check := func(source string, theirs treeFacts, skip map[string]bool, subset bool) {
					diffs := compareFacts(ours, theirs, h, skip, subset)
					res.diffs[source] = diffs
					for _, d := range diffs {
						key := tr.name + " " + d.field
						mu.Lock()
						_, a1 := allow[key+" "+source]
						_, a2 := allow[key+" both"]
						if a1 {
							used[key+" "+source] = true
						}
						if a2 {
							used[key+" both"] = true
						}
						mu.Unlock()
						if !a1 && !a2 {
							t.Errorf("%s: %s disagrees with hwloc (%s):\n  fusiond: %s\n  hwloc:   %s\n  warnings: %q",
								tr.name, d.field, source, d.ours, d.theirs, h.Warnings)
						}
					}
				}
				b, err := os.ReadFile(filepath.Join(tr.dir, tr.output))
				if err != nil {
					t.Fatal(err)
				}
				var exp *hwObj
				if strings.HasPrefix(string(b), "<?xml") {
					exp, err = parseHwlocXML(b)
				} else {
					exp, err = parseHwlocText(string(b))
				}
				if err != nil {
					t.Fatalf("%s: %v", tr.output, err)
				}
				check("expected", factsOfHwloc(exp), skippedFields(tr.options), !strings.Contains(tr.options, "--whole-io"))
				if lstopoErr == nil {
					live, err := liveHwloc(root)
					if err != nil {
						t.Fatal(err)
					}
					check("live", factsOfHwloc(live), nil, false)
				}
				// Warnings stay readable: one line per problem, none huge.
				for _, w := range h.Warnings {
					if len(w) > 400 || strings.Contains(w, "\n") {
						t.Errorf("warning too long or multi-line (%d bytes): %.200s…", len(w), w)
					}
				}
				var times []time.Duration
				for range 3 {
					start := time.Now()
					if _, err := Discover(context.Background(), WithRoot(root), WithoutNames()); err != nil {
						t.Fatal(err)
					}
					times = append(times, time.Since(start))
				}
				slices.Sort(times)
				res.median = times[1]
				mu.Lock()
				results = append(results, res)
				mu.Unlock()
			})
		}
	})
	for key := range allow {
		src := strings.Fields(key)[2]
		if src == "live" && lstopoErr != nil {
			continue
		}
		if !used[key] {
			t.Errorf("allow.txt entry %q matches no disagreement: remove it", key)
		}
	}
	slices.SortFunc(results, func(a, b treeResult) int { return strings.Compare(a.name, b.name) })
	if os.Getenv("HWLOC_TREES_TABLE") != "" {
		fmt.Println(agreementTable(results, lstopoErr == nil))
	}
}

// agreementTable renders the results as the markdown table in
// docs/topology.md (HWLOC_TREES_TABLE=1 go test ./topology -run TestHwlocTrees -v).
func agreementTable(results []treeResult, live bool) string {
	fields := []string{"nodes", "packages", "dies", "cores", "l3", "kinds", "core-nodes", "pci"}
	var sb strings.Builder
	sb.WriteString("| tree | " + strings.Join(fields, " | ") + " | discovery (median of 3) |\n|---|")
	sb.WriteString(strings.Repeat("---|", len(fields)+1) + "\n")
	for _, r := range results {
		sb.WriteString("| " + r.name + " |")
		for _, f := range fields {
			var bad []string
			for _, src := range []string{"expected", "live"} {
				if src == "live" && !live {
					continue
				}
				for _, d := range r.diffs[src] {
					if d.field == f {
						bad = append(bad, src)
					}
				}
			}
			cell := " ✓ |"
			if len(bad) > 0 {
				cell = " allowed (" + strings.Join(bad, ", ") + ") |"
			}
			sb.WriteString(cell)
		}
		fmt.Fprintf(&sb, " %.1f ms |\n", float64(r.median.Microseconds())/1000)
	}
	return sb.String()
}

// The die comparison is not vacuous: on hwloc's 2-package, 4-dies-per-package
// tree both sides have 8 dies and agree, and a model missing a die's CPUs
// is a "dies" disagreement.
func TestHwlocTreeDiesCompared(t *testing.T) {
	const name = "fakecpuid1f-64intel64-2p4d2n2c2t"
	root := unpackBz2Tree(t, hwlocTreeDir, name)
	h, err := Discover(context.Background(), WithRoot(root), WithoutNames())
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(hwlocTreeDir, name+".output"))
	if err != nil {
		t.Fatal(err)
	}
	exp, err := parseHwlocText(string(b))
	if err != nil {
		t.Fatal(err)
	}
	theirs, ours := factsOfHwloc(exp), factsOfModel(h)
	if len(theirs.dies) != 8 || len(h.Dies) != 8 || fmt.Sprint(ours.dies) != fmt.Sprint(theirs.dies) {
		t.Fatalf("dies: fusiond %v (model %+v), hwloc %v", ours.dies, h.Dies, theirs.dies)
	}
	h.Dies = h.Dies[1:]
	diffs := compareFacts(factsOfModel(h), theirs, h, nil, true)
	if len(diffs) != 1 || diffs[0].field != "dies" {
		t.Fatalf("a missing die gives %+v, want one dies disagreement", diffs)
	}
}

package topology

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
)

// The CPU reader: cores, packages and L3 groups straight from
// /sys/devices/system/cpu/cpuN/{topology,cache}, the files hwloc reads
// (see docs/topology.md for the precedence). ghw is not used for CPUs: it
// drops every CPU without a "processor : N" line in /proc/cpuinfo and
// keys cores by (package, core_id).

// readCPUSetFile reads the first of the files (relative to dir) that
// exists: names ending in _list are cpulists, others hex masks. It
// returns the file read ("" when none exists).
func (d *discovery) readCPUSetFile(dir string, names ...string) (CPUSet, string, error) {
	for _, n := range names {
		p := dir + "/" + n
		var c CPUSet
		var err error
		if strings.HasSuffix(n, "list") {
			c, err = d.fs.readCPUList(p)
		} else {
			c, err = d.fs.readCPUMask(p)
		}
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		return c, p, err
	}
	return CPUSet{}, "", nil
}

// cpuProblems collects per-CPU read problems so that each becomes one
// warning line listing the CPUs, never one line per CPU.
type cpuProblems map[string][]int

func (p cpuProblems) add(what string, cpus ...int) { p[what] = append(p[what], cpus...) }

func (d *discovery) flush(p cpuProblems) {
	keys := make([]string, 0, len(p))
	for k := range p {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		d.warn("%s: CPUs %s", k, NewCPUSet(p[k]...))
	}
}

// cores builds cores, sockets and L3 groups from sysfs.
func (d *discovery) cores() {
	online := d.host.OnlineCPUs
	probs := cpuProblems{}
	type pkg struct {
		id   int
		cpus CPUSet
	}
	var cores []Core
	var pkgs []pkg
	var l3 []CacheGroup
	var dies []dieInfo
	seenCore := map[string]bool{}
	for _, c := range online.List() {
		dir := fmt.Sprintf("%s/cpu%d/topology", sysCPU, c)
		sib, file, err := d.readCPUSetFile(dir, "core_cpus", "thread_siblings", "core_cpus_list", "thread_siblings_list")
		if err != nil {
			probs.add(fmt.Sprintf("%v; core siblings unknown", errors.Unwrap(err)), c)
		}
		if file == "" {
			probs.add(dir+"/{core_cpus,thread_siblings}[_list] missing; each CPU is its own core", c)
		}
		sib = sib.Intersection(online)
		if !sib.Contains(c) {
			sib = NewCPUSet(c)
		}
		coreID, err := d.fs.readInt(dir + "/core_id")
		if err != nil {
			coreID = -1
		}
		if !seenCore[sib.String()] {
			seenCore[sib.String()] = true
			cores = append(cores, d.splitByCoreID(sib, c, coreID)...)
		}
		// Package: package_cpus / core_siblings; else physical_package_id.
		pid, err := d.fs.readInt(dir + "/physical_package_id")
		if err != nil {
			pid = -1
		}
		pc, file, err := d.readCPUSetFile(dir, "package_cpus", "core_siblings", "package_cpus_list", "core_siblings_list")
		pc = pc.Intersection(online)
		if err != nil || file == "" || !pc.Contains(c) {
			pc = CPUSet{}
		}
		found := false
		for i := range pkgs {
			if !pc.IsEmpty() && pkgs[i].cpus.Intersects(pc) || pc.IsEmpty() && pid >= 0 && pkgs[i].id == pid {
				pkgs[i].cpus = pkgs[i].cpus.Union(pc).Union(NewCPUSet(c))
				found = true
				break
			}
		}
		if !found {
			if pc.IsEmpty() && pid < 0 {
				probs.add(dir+"/{package_cpus,core_siblings}[_list] and physical_package_id missing; CPU in no package", c)
			} else {
				pkgs = append(pkgs, pkg{id: pid, cpus: pc.Union(NewCPUSet(c))})
			}
		}
		dies = append(dies, d.dieOf(c, dir))
		// L3: the unified or data cache of level 3 this CPU sits in.
		if g, ok := d.l3Of(c, sib); ok && !slices.ContainsFunc(l3, func(x CacheGroup) bool { return x.CPUs.Equal(g.CPUs) }) {
			l3 = append(l3, g)
		}
	}
	slices.SortFunc(cores, func(a, b Core) int { return cmp.Compare(a.CPUs.List()[0], b.CPUs.List()[0]) })
	// Sockets: IDs are physical_package_id where valid and unique, else
	// the package's position.
	slices.SortFunc(pkgs, func(a, b pkg) int { return cmp.Compare(a.cpus.List()[0], b.cpus.List()[0]) })
	ids := map[int]bool{}
	valid := true
	for _, p := range pkgs {
		if p.id < 0 || ids[p.id] {
			valid = false
		}
		ids[p.id] = true
	}
	if !valid && len(pkgs) > 0 {
		d.warn("%s/cpuN/topology/physical_package_id is -1 or repeats across packages; sockets numbered in CPU order", sysCPU)
	}
	for i, p := range pkgs {
		id := SocketID(p.id)
		if !valid {
			id = SocketID(i)
		}
		d.host.Sockets = append(d.host.Sockets, Socket{ID: id, CPUs: p.cpus})
	}
	slices.SortFunc(d.host.Sockets, func(a, b Socket) int { return cmp.Compare(a.ID, b.ID) })
	for i := range cores {
		cores[i].Socket = NoSocket
		for _, s := range d.host.Sockets {
			if s.CPUs.Contains(cores[i].CPUs.List()[0]) {
				cores[i].Socket = s.ID
			}
		}
	}
	slices.SortFunc(cores, func(a, b Core) int {
		return cmp.Or(cmp.Compare(a.Socket, b.Socket), cmp.Compare(a.ID, b.ID), cmp.Compare(a.CPUs.List()[0], b.CPUs.List()[0]))
	})
	d.host.Cores = cores
	d.host.Dies = d.buildDies(dies, probs)
	d.flush(probs)
	slices.SortFunc(l3, func(a, b CacheGroup) int { return cmp.Compare(a.CPUs.List()[0], b.CPUs.List()[0]) })
	for i := range l3 {
		l3[i].ID = CacheID(i)
	}
	d.host.L3 = l3
	if len(l3) == 0 {
		d.warn("no L3 cache under %s/cpuN/cache/index*/ (level 3); cores have l3 -1", sysCPU)
	}
	for i := range d.host.Cores {
		for _, g := range d.host.L3 {
			if d.host.Cores[i].CPUs.IsSubsetOf(g.CPUs) {
				d.host.Cores[i].L3 = g.ID
			}
		}
	}
}

// dieInfo is what one CPU's topology directory says about its die.
type dieInfo struct {
	cpu  int
	id   int    // die_id, -1 when absent or malformed
	cpus CPUSet // die_cpus / die_cpus_list (online, holding cpu); empty when absent
	file string // the die_cpus file read, "" when none
	none bool   // die_id is -1: the kernel says the CPU has no die
}

// dieOf reads cpuN/topology/{die_cpus,die_cpus_list,die_id}: the mask
// first, as hwloc reads it.
func (d *discovery) dieOf(c int, dir string) dieInfo {
	di := dieInfo{cpu: c, id: -1}
	if v, err := d.fs.readInt(dir + "/die_id"); err == nil {
		if v < 0 {
			// arm64 and other architectures without dies write die_id -1
			// and a die_cpus of the CPU alone: no die (hwloc ignores it too).
			di.none = true
			return di
		}
		di.id = v
	}
	set, file, err := d.readCPUSetFile(dir, "die_cpus", "die_cpus_list")
	if err == nil && file != "" {
		set = set.Intersection(d.host.OnlineCPUs)
		if set.Contains(c) {
			di.cpus, di.file = set, file
		}
	}
	return di
}

// buildDies groups CPUs into dies: CPUs whose die_cpus sets overlap share
// a die; CPUs with only a die_id are grouped by (package, die_id); a CPU
// whose die_id is -1 is in no die. A die
// is cut to its package's CPUs (a die never spans packages). No file at
// all on any CPU: no dies (older kernels). A CPU without die files that
// no other CPU's die_cpus names is in no die; such CPUs are listed in one
// warning.
func (d *discovery) buildDies(infos []dieInfo, probs cpuProblems) []Die {
	socketOf := func(c int) (SocketID, CPUSet) {
		for _, s := range d.host.Sockets {
			if s.CPUs.Contains(c) {
				return s.ID, s.CPUs
			}
		}
		return NoSocket, CPUSet{}
	}
	have := false
	for _, di := range infos {
		if di.file != "" || di.id >= 0 {
			have = true
		}
	}
	if !have {
		return nil
	}
	var dies []Die
	var missing, alone []int
	for _, di := range infos {
		sid, scpus := socketOf(di.cpu)
		if sid == NoSocket {
			continue // the CPU is in no package (warned already)
		}
		own := NewCPUSet(di.cpu)
		set := di.cpus.Intersection(scpus)
		if di.none {
			continue
		}
		if set.Equal(own) && scpus.Len() > 1 {
			// die_cpus naming the CPU alone in a package of several
			// CPUs (a kernel or VM reporting no real die): hwloc
			// ignores such a die; here the CPU is grouped by die_id
			// instead, and a die left with one CPU is dropped below.
			alone = append(alone, di.cpu)
			set, di.file = CPUSet{}, ""
			if di.id < 0 {
				continue // no die_id to group by either: in no die
			}
		}
		if di.file == "" && di.id < 0 {
			missing = append(missing, di.cpu)
			continue
		}
		found := false
		for i := range dies {
			x := &dies[i]
			if x.Socket != sid {
				continue
			}
			if !set.IsEmpty() && x.CPUs.Intersects(set) || set.IsEmpty() && x.ID == di.id {
				x.CPUs = x.CPUs.Union(set).Union(own)
				if x.ID < 0 {
					x.ID = di.id
				}
				found = true
				break
			}
		}
		if !found {
			dies = append(dies, Die{Socket: sid, ID: di.id, CPUs: set.Union(own)})
		}
	}
	if len(alone) > 0 {
		var dropped []int
		dies = slices.DeleteFunc(dies, func(x Die) bool {
			if x.CPUs.Len() == 1 && d.socketCPUs(x.Socket).Len() > 1 {
				dropped = append(dropped, x.CPUs.List()[0])
				return true
			}
			return false
		})
		what := "grouped by (package, die_id) where there is one"
		if len(dropped) > 0 {
			what = fmt.Sprintf("grouped by (package, die_id) where there is one; CPUs %s left in a die of one CPU are in no die (as hwloc)", NewCPUSet(dropped...))
		}
		probs.add(fmt.Sprintf("%s/cpuN/topology/die_cpus names only the CPU itself in a package of several CPUs; %s", sysCPU, what), alone...)
	}
	for _, c := range missing {
		// Another CPU's die_cpus may name it: then it is in that die.
		if !slices.ContainsFunc(dies, func(x Die) bool { return x.CPUs.Contains(c) }) {
			probs.add(fmt.Sprintf("%s/cpuN/topology/{die_cpus,die_cpus_list,die_id} missing; CPU in no die", sysCPU), c)
		}
	}
	slices.SortFunc(dies, func(a, b Die) int {
		return cmp.Or(cmp.Compare(a.Socket, b.Socket), cmp.Compare(a.ID, b.ID), cmp.Compare(a.CPUs.List()[0], b.CPUs.List()[0]))
	})
	return dies
}

// socketCPUs returns the CPUs of socket id (empty when unknown).
func (d *discovery) socketCPUs(id SocketID) CPUSet {
	for _, s := range d.host.Sockets {
		if s.ID == id {
			return s.CPUs
		}
	}
	return CPUSet{}
}

// splitByCoreID returns the cores of one sibling set. Siblings normally
// share a core_id; where they do not (AMD Bulldozer compute units list
// both integer cores in thread_siblings, each with its own core_id) the
// set is split by core_id, as hwloc does. core_id is only compared
// within one sibling set, never across packages or dies.
func (d *discovery) splitByCoreID(sib CPUSet, first, firstID int) []Core {
	byID := map[int][]int{}
	var order []int
	for _, m := range sib.List() {
		id := firstID
		if m != first {
			v, err := d.fs.readInt(fmt.Sprintf("%s/cpu%d/topology/core_id", sysCPU, m))
			if err != nil {
				id = firstID // unknown: keep it with the first
			} else {
				id = v
			}
		}
		if _, ok := byID[id]; !ok {
			order = append(order, id)
		}
		byID[id] = append(byID[id], m)
	}
	var out []Core
	for _, id := range order {
		cpus := NewCPUSet(byID[id]...)
		out = append(out, Core{ID: id, CPUs: cpus, Node: d.host.nodeOfCPU(cpus.List()[0]), L3: -1})
	}
	return out
}

// l3Of returns the level-3 data/unified cache CPU c shares, from
// cpuN/cache/indexM/{level,type,shared_cpu_list|shared_cpu_map,size}.
// An empty shared_cpu_map (ia64 kernels write all zeros) means a
// core-wide cache, as hwloc assumes: the group is the CPU's core.
func (d *discovery) l3Of(c int, core CPUSet) (CacheGroup, bool) {
	base := fmt.Sprintf("%s/cpu%d/cache", sysCPU, c)
	ents, err := d.fs.readDir(base)
	if err != nil {
		return CacheGroup{}, false
	}
	for _, e := range ents {
		if _, ok := numberedEntry(e.Name(), "index"); !ok {
			continue
		}
		dir := base + "/" + e.Name()
		if lvl, err := d.fs.readInt(dir + "/level"); err != nil || lvl != 3 {
			continue
		}
		if t, err := d.fs.read(dir + "/type"); err == nil && t == "Instruction" {
			continue
		}
		cpus, file, err := d.readCPUSetFile(dir, "shared_cpu_map", "shared_cpu_list")
		if err != nil || file == "" || cpus.IsEmpty() {
			cpus = core
		}
		cpus = cpus.Intersection(d.host.OnlineCPUs)
		if !cpus.Contains(c) {
			continue // the cache's CPU list does not hold the CPU: ignore it
		}
		g := CacheGroup{Level: 3, CPUs: cpus}
		if s, err := d.fs.read(dir + "/size"); err == nil {
			g.SizeBytes = parseCacheSize(s)
		}
		return g, true
	}
	return CacheGroup{}, false
}

// parseCacheSize reads "32768K" / "30M" / "1024"; 0 when malformed.
func parseCacheSize(s string) uint64 {
	mult := uint64(1)
	switch {
	case strings.HasSuffix(s, "K"):
		mult, s = 1024, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	case strings.HasSuffix(s, "G"):
		mult, s = 1<<30, strings.TrimSuffix(s, "G")
	}
	var n uint64
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0
		}
		n = n*10 + uint64(r-'0')
		if n > 1<<40 {
			return 0
		}
	}
	return n * mult
}

package sim

import (
	"math/rand/v2"
	"strconv"

	"github.com/fusiond/fusiond/daemon/sched"
)

// nodeView speeds up a replay without changing any decision: nodes in the
// same state (same capacity, same free CPU, memory and per-GPU share, in
// GPU order) score alike under a policy whose score depends only on the
// node (no random draw, no per-node memory), and with ranked tie-breaking
// the engine then picks the one ranked first among them. So only that one
// (the group's representative) needs scoring: the view hands the engine a
// slice in which every other member of a group is nil (skipped, indices
// unchanged). A 1213-node openb cluster starts as a handful of groups and
// fills one node at a time.
//
// As it fills, most groups cannot take a given pod: for each request
// (forRequest) the view also leaves out the groups that a compact summary
// of their state (fitSummary) shows sched.Filter would reject, which
// changes no decision either (such a node is never chosen) and spares the
// engine reading them.
type nodeView struct {
	nodes  []*sched.Node
	rank   []uint32
	key    []string
	groups map[string][]int // members of a state, any order
	buf    []byte
	// reps are the groups' representatives, repAt[i] node i's place in
	// reps (-1: not one); sum[i] summarises node i.
	reps  []int
	repAt []int
	sum   []fitSummary
	// cand is the slice forRequest hands the engine: the representatives
	// that may fit the request, nil elsewhere; shown are the indices it
	// holds.
	cand  []*sched.Node
	shown []int
}

// summaryGPUs is how many of a node's free GPU shares a fitSummary keeps.
const summaryGPUs = 8

// fitSummary is what sched.Filter's first checks read of a node, packed
// so that the view can test every group for a request cheaply: free CPU
// and memory, and the largest summaryGPUs free shares of its GPUs that
// are not in MIG mode, largest first.
type fitSummary struct {
	cpu, mem int64
	free     [summaryGPUs]int64
	gpus     int  // GPUs in free
	allGPUs  bool // free holds every non-MIG GPU
}

// fitSummaryOf summarises n.
func fitSummaryOf(n *sched.Node) fitSummary {
	s := fitSummary{cpu: n.CPUFreeMilli, mem: n.MemFreeMiB, allGPUs: true}
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if g.MIG != nil {
			continue
		}
		m := g.MilliFree
		if s.gpus == summaryGPUs {
			s.allGPUs = false
			if m <= s.free[summaryGPUs-1] {
				continue
			}
			s.gpus--
		}
		j := s.gpus
		for j > 0 && s.free[j-1] < m {
			s.free[j] = s.free[j-1]
			j--
		}
		s.free[j] = m
		s.gpus++
	}
	return s
}

// mayFit is false only where sched.Filter rejects req: too little free
// CPU (exclusive cores included) or memory, or fewer than req.GPUs
// non-MIG GPUs with req.GPUMilli free (Filter counts a subset of those).
func (s *fitSummary) mayFit(req *sched.Request) bool {
	if req.CPUMilli+int64(req.ExclusiveCores)*1000 > s.cpu || req.MemMiB > s.mem {
		return false
	}
	k := req.GPUs
	switch {
	case k <= 0:
		return true
	case k <= s.gpus:
		return s.free[k-1] >= req.GPUMilli
	}
	return !s.allGPUs // fewer GPUs than k, unless some were left out
}

// dedupable says whether p's scores depend only on the node's state, so
// that equal nodes score equal (Random draws per node; GpuClustering
// remembers what it placed where).
func dedupable(p sched.Policy, tie sched.TieBreak) bool {
	if tie != sched.TieRanked {
		return false
	}
	if _, ok := p.(sched.Observer); ok {
		return false
	}
	_, random := p.(sched.Random)
	return !random
}

// newNodeView groups nodes by state. seed is the engine's: the ranking is
// the engine's TieRanked order (a seeded permutation of node indices,
// sched.Engine.rankOf), which TestNodeViewMatchesEngine keeps in step.
func newNodeView(nodes []*sched.Node, seed uint64) *nodeView {
	v := &nodeView{nodes: nodes, rank: make([]uint32, len(nodes)), key: make([]string, len(nodes)), groups: map[string][]int{},
		repAt: make([]int, len(nodes)), sum: make([]fitSummary, len(nodes)), cand: make([]*sched.Node, len(nodes))}
	for i := range v.repAt {
		v.repAt[i] = -1
	}
	perm := rand.New(rand.NewPCG(seed, 0x7a4c)).Perm(len(nodes))
	for j, p := range perm {
		v.rank[j] = uint32(p)
	}
	for i := range nodes {
		v.add(i)
	}
	return v
}

func (v *nodeView) stateKey(n *sched.Node) string {
	b := v.buf[:0]
	b = strconv.AppendInt(b, n.CPUMilli, 36)
	b = append(b, ',')
	b = strconv.AppendInt(b, n.CPUFreeMilli, 36)
	b = append(b, ',')
	b = strconv.AppendInt(b, n.MemMiB, 36)
	b = append(b, ',')
	b = strconv.AppendInt(b, n.MemFreeMiB, 36)
	b = append(b, ',')
	b = append(b, n.GPUModel...)
	for i := range n.GPUs {
		g := &n.GPUs[i]
		b = append(b, '|')
		if g.Model != "" {
			b = append(b, g.Model...)
			b = append(b, ':')
		}
		b = strconv.AppendInt(b, g.MilliFree, 36)
		b = append(b, ',')
		b = strconv.AppendInt(b, g.MemFreeMiB, 36)
	}
	v.buf = b
	return string(b)
}

func (v *nodeView) add(i int) {
	k := v.stateKey(v.nodes[i])
	v.key[i] = k
	v.sum[i] = fitSummaryOf(v.nodes[i])
	g := append(v.groups[k], i)
	v.groups[k] = g
	v.refresh(g)
}

func (v *nodeView) remove(i int) {
	k := v.key[i]
	g := v.groups[k]
	for j, m := range g {
		if m == i {
			g[j] = g[len(g)-1]
			g = g[:len(g)-1]
			break
		}
	}
	v.hide(i)
	if len(g) == 0 {
		delete(v.groups, k)
		return
	}
	v.groups[k] = g
	v.refresh(g)
}

// refresh shows only the first-ranked member of group g.
func (v *nodeView) refresh(g []int) {
	best := g[0]
	for _, m := range g {
		if v.rank[m] < v.rank[best] {
			best = m
		}
	}
	for _, m := range g {
		if m != best {
			v.hide(m)
		}
	}
	if v.repAt[best] < 0 {
		v.repAt[best] = len(v.reps)
		v.reps = append(v.reps, best)
	}
}

// hide takes node i out of reps.
func (v *nodeView) hide(i int) {
	if at := v.repAt[i]; at >= 0 {
		last := v.reps[len(v.reps)-1]
		v.reps[at], v.repAt[last] = last, at
		v.reps = v.reps[:len(v.reps)-1]
		v.repAt[i] = -1
	}
}

// forRequest is the view for req: the representatives that may fit it
// (fitSummary.mayFit), every other entry nil. The slice is reused by the
// next call.
func (v *nodeView) forRequest(req *sched.Request) []*sched.Node {
	for _, i := range v.shown {
		v.cand[i] = nil
	}
	v.shown = v.shown[:0]
	for _, i := range v.reps {
		if v.sum[i].mayFit(req) {
			v.cand[i] = v.nodes[i]
			v.shown = append(v.shown, i)
		}
	}
	return v.cand
}

// changed regroups node i after its state changed.
func (v *nodeView) changed(i int) {
	v.remove(i)
	v.add(i)
}

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
// needs scoring: the view hands the engine a slice in which every other
// member of a group is nil (skipped, indices unchanged). A 1213-node openb
// cluster starts as a handful of groups and fills one node at a time.
type nodeView struct {
	nodes  []*sched.Node
	view   []*sched.Node
	rank   []uint32
	key    []string
	groups map[string][]int // members of a state, any order
	buf    []byte
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
	v := &nodeView{nodes: nodes, view: make([]*sched.Node, len(nodes)), rank: make([]uint32, len(nodes)), key: make([]string, len(nodes)), groups: map[string][]int{}}
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
	v.view[i] = nil
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
		v.view[m] = nil
		if v.rank[m] < v.rank[best] {
			best = m
		}
	}
	v.view[best] = v.nodes[best]
}

// changed regroups node i after its state changed.
func (v *nodeView) changed(i int) {
	v.remove(i)
	v.add(i)
}

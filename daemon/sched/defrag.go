package sched

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Movable is placed work the planner may move: its request and where it runs now.
type Movable struct {
	ID  string
	Req Request
	Asg Assignment
}

// Move relocates one movable item.
type Move struct {
	ID       string
	From, To Assignment
}

// MovePlan is what PlanMoves found: the moves, in order, then where the head goes.
type MovePlan struct {
	Moves []Move
	Head  Assignment
	// HeadScore is the engine's score of the head's assignment on the
	// target after the victims left it.
	HeadScore float64
	Why       string // one line a human reads: which node, what blocked the head, what the moves free
}

// defragExactMoves is the largest number of victims PlanMoves searches
// exhaustively on a node (every subset of that size); above it a greedy
// pass by size picks the victims.
const defragExactMoves = 2

// defragExactCandidates bounds the movable items of one node that the
// exhaustive search considers (the most relevant to the head's shortfall):
// all of them for one victim, this many for two; the greedy pass
// considers them all.
const defragExactCandidates = 12

// defragScored bounds the candidates PlanMoves scores for one number of
// moves (nodes in index order); the rest are not considered.
const defragScored = 64

// defragTries bounds, per number of moves, the (node, victims) candidates
// whose victims PlanMoves tries to re-place, best head score first.
const defragTries = 8

// defragCand is one way to make the head fit: a target node and the
// victims (indices into the movable slice) to take off it.
type defragCand struct {
	node    int
	victims []int
	head    Assignment
	score   float64
}

// PlanMoves finds the fewest moves (at most maxMoves) of movable work after which req fits,
// and where everything goes. It does not modify nodes (it works on clones). ok is false when
// no plan within maxMoves exists (or req already fits: then the caller should just place it).
//
// It chooses a target node, takes the fewest movable items off it (a clone)
// for req to pass Filter there, places req on it with the engine's policy,
// then re-places each removed item, largest first, with the engine's
// policy over all nodes (the target included), each on the state the
// previous left; a plan is valid only if every item is re-placed. Of the
// valid plans with the fewest moves it returns the one whose head scores
// best (then the lowest node index), within these bounds: targets are
// pruned first (the node with all its movable items removed must pass
// Filter) and only items that give back something the head lacks there
// are considered; victims are searched exhaustively for one (every item)
// and two (the 12 most relevant items of a node), then greedily (most
// relevant first, pruned to a minimal set); a set holding an item that
// alone suffices is skipped; each victim must fit on another node as the
// nodes are, or beside the head on the target, before the head is scored;
// at most 64 candidates are scored per number of moves and the 8 best
// tried.
//
// Movable items whose assignment names no node of nodes (index out of
// range, nil node, another name) or whose request is invalid are ignored.
// Releasing MIG work leaves its instance on the GPU, idle (Node.Release),
// and a new instance may take slices that only idle instances hold
// (destroying them, MIGPick.Destroy), so moving MIG work frees its slices
// for a larger profile; MIG nodes are otherwise handled like any other. Scoring on clones may advance the
// engine's tie-breaking generator (TieRandom) and invalidate policies'
// per-node caches, never their observers (nothing is committed).
func (e *Engine) PlanMoves(req *Request, nodes []*Node, movable []Movable, maxMoves int) (plan MovePlan, ok bool) {
	if req == nil || maxMoves <= 0 || len(movable) == 0 || req.Validate() != nil {
		return MovePlan{}, false
	}
	for _, n := range nodes {
		if n != nil && Filter(req, n) == Fits {
			return MovePlan{}, false
		}
	}
	byNode := map[int][]int{}
	for i := range movable {
		m := &movable[i]
		ni := m.Asg.NodeIdx
		if ni < 0 || ni >= len(nodes) || nodes[ni] == nil || (m.Asg.Node != "" && m.Asg.Node != nodes[ni].Name) ||
			m.ID == req.ID || m.Req.Validate() != nil {
			continue
		}
		byNode[ni] = append(byNode[ni], i)
	}
	pl := &planner{e: e, req: req, nodes: nodes, movable: movable, fits: map[MoveShape][2]int{}, alone: map[int]bool{}}
	targets := make([]int, 0, len(byNode))
	for ni, items := range byNode {
		if pl.targetPossible(nodes[ni], items) {
			targets = append(targets, ni)
		}
	}
	if len(targets) == 0 {
		return MovePlan{}, false
	}
	slices.Sort(targets)
	for _, ni := range targets {
		short := pl.shortfallOn(nodes[ni])
		items := slices.DeleteFunc(byNode[ni], func(i int) bool { return !short.useful(&movable[i]) })
		slices.SortStableFunc(items, func(a, b int) int {
			return cmp.Compare(relevance(req, nodes[ni], &movable[b]), relevance(req, nodes[ni], &movable[a]))
		})
		byNode[ni] = items
	}
	// Exhaustive search for one and two victims, node by node.
	for k := 1; k <= min(defragExactMoves, maxMoves); k++ {
		var cands []defragCand
		for _, ni := range targets {
			cands = pl.exactCands(ni, byNode[ni], k, cands)
		}
		if p, found := pl.tryCands(cands); found {
			return p, true
		}
	}
	if maxMoves <= defragExactMoves {
		return MovePlan{}, false
	}
	// Greedy for more: one minimal set per node, fewest victims first.
	var cands []defragCand
	for _, ni := range targets {
		if c, found := pl.greedyCand(ni, byNode[ni]); found && len(c.victims) > defragExactMoves && len(c.victims) <= maxMoves {
			cands = append(cands, c)
		}
	}
	slices.SortStableFunc(cands, func(a, b defragCand) int { return cmp.Compare(len(a.victims), len(b.victims)) })
	for len(cands) > 0 {
		k := len(cands[0].victims)
		j := 0
		for j < len(cands) && len(cands[j].victims) == k {
			j++
		}
		if p, found := pl.tryCands(cands[:j]); found {
			return p, true
		}
		cands = cands[j:]
	}
	return MovePlan{}, false
}

// planner is one PlanMoves call's state: its input, a scratch node for
// filter checks and, per shape of movable request, where it fits now.
type planner struct {
	e       *Engine
	req     *Request
	nodes   []*Node
	movable []Movable
	scratch Node
	// fits holds, per request shape, the first two node indices it fits
	// on as the nodes are (-1: none), for fitsElsewhere.
	fits map[MoveShape][2]int
	// alone marks the items whose removal alone lets the head pass
	// Filter on their node: a larger set holding one is not minimal.
	alone map[int]bool
}

// shortfall is what the head lacks on one node: CPU, memory, or the rest
// (GPUs, MIG, cores, FPGA: it fails Filter even with all CPU and memory
// free).
type shortfall struct{ cpu, mem, devices bool }

func (p *planner) shortfallOn(n *Node) shortfall {
	req := p.req
	c := p.released(n, nil)
	c.CPUFreeMilli, c.MemFreeMiB = c.CPUMilli, c.MemMiB
	return shortfall{cpu: n.CPUFreeMilli < req.CPUMilli+int64(req.ExclusiveCores)*1000, mem: n.MemFreeMiB < req.MemMiB, devices: Filter(req, c) != Fits}
}

// useful reports whether taking m off its node could help the head: it
// gives back something the head lacks there.
func (s shortfall) useful(m *Movable) bool {
	a := &m.Asg
	return (s.cpu && a.CPUMilli > 0) || (s.mem && a.MemMiB > 0) ||
		(s.devices && (len(a.GPUs) > 0 || a.MIG != nil || len(a.Cores) > 0 || a.FPGA >= 0))
}

// MoveShape is what Filter reads of a request.
// MoveShape is what the planner reads of a request, comparable: callers
// that remember planning per request shape (the simulator's no-plan memo)
// key on it.
type MoveShape struct {
	cpu, mem, gpuMilli, gpuMem int64
	gpus, cores, migSlices     int
	models, owner, mig, bits   string
	topo                       TopologyPolicy
}

// MoveShapeOf is r's MoveShape.
func MoveShapeOf(r *Request) MoveShape {
	return MoveShape{cpu: r.CPUMilli, mem: r.MemMiB, gpuMilli: r.GPUMilli, gpuMem: r.GPUMemMiB, gpus: r.GPUs, cores: r.ExclusiveCores,
		migSlices: r.MIGSlices, models: strings.Join(r.GPUModels, "|"), owner: r.Owner, mig: r.MIGProfile, bits: r.Bitstream, topo: r.Topology}
}

// fitsElsewhere reports whether movable item v fits, as the nodes are,
// on a node other than ni (the one it is taken off).
func (p *planner) fitsElsewhere(v, ni int) bool {
	r := &p.movable[v].Req
	k := MoveShapeOf(r)
	f, ok := p.fits[k]
	if !ok {
		f = [2]int{-1, -1}
		for i, n := range p.nodes {
			if n != nil && Filter(r, n) == Fits {
				if f[0] < 0 {
					f[0] = i
				} else {
					f[1] = i
					break
				}
			}
		}
		p.fits[k] = f
	}
	return (f[0] >= 0 && f[0] != ni) || f[1] >= 0
}

// released is the scratch node set to n with the items' assignments
// released, for filter checks only (it is reused: never score it, never
// keep it). Nodes with MIG GPUs get a fresh clone.
func (p *planner) released(n *Node, items []int) *Node {
	var c *Node
	if slices.ContainsFunc(n.GPUs, func(g GPU) bool { return g.MIG != nil }) {
		c = n.Clone()
	} else {
		c = &p.scratch
		gpus, cores, fpgas := c.GPUs, c.FreeCores, c.FPGAs
		*c = *n // NVLink and NUMALoad are shared: Release reads neither
		c.GPUs = append(gpus[:0], n.GPUs...)
		c.FreeCores = append(cores[:0], n.FreeCores...)
		c.FPGAs = append(fpgas[:0], n.FPGAs...)
	}
	for _, i := range items {
		c.Release(&p.movable[i].Asg)
	}
	return c
}

// targetPossible is the cheap pruning of a target node: with every movable
// item on it removed, req must pass Filter; before that, the node's free
// CPU and memory plus the items' must cover req's.
func (p *planner) targetPossible(n *Node, items []int) bool {
	req := p.req
	if (req.GPUs > 0 || req.MIGProfile != "") && !n.anyModelAllowed(req) {
		return false
	}
	cpu, mem := n.CPUFreeMilli, n.MemFreeMiB
	for _, i := range items {
		cpu += p.movable[i].Asg.CPUMilli
		mem += p.movable[i].Asg.MemMiB
	}
	if cpu < req.CPUMilli+int64(req.ExclusiveCores)*1000 || mem < req.MemMiB {
		return false
	}
	return Filter(req, p.released(n, items)) == Fits
}

// releasedClone is a clone of n with the items' assignments released.
func releasedClone(n *Node, movable []Movable, items []int) *Node {
	c := n.Clone()
	for _, i := range items {
		c.Release(&movable[i].Asg)
	}
	return c
}

// relevance orders a node's movable items for the head: how much of what
// the head lacks on the node each would give back (CPU, memory and GPU,
// each as a fraction of the shortfall, capped at 1), then its size.
func relevance(req *Request, n *Node, m *Movable) float64 {
	part := func(give, short int64) float64 {
		if short <= 0 || give <= 0 {
			return 0
		}
		return min(1, float64(give)/float64(short))
	}
	s := part(m.Asg.CPUMilli, req.CPUMilli+int64(req.ExclusiveCores)*1000-n.CPUFreeMilli)
	s += part(m.Asg.MemMiB, req.MemMiB-n.MemFreeMiB)
	if req.GPUs > 0 {
		s += part(m.Asg.GPUMilli*int64(len(m.Asg.GPUs)), req.GPUMilliTotal()-n.GPUMilliFree()+1)
	}
	size := float64(m.Asg.CPUMilli)/float64(max(n.CPUMilli, 1)) + float64(m.Asg.MemMiB)/float64(max(n.MemMiB, 1)) +
		float64(m.Asg.GPUMilli*int64(len(m.Asg.GPUs)))/float64(max(len(n.GPUs), 1)*MilliPerGPU)
	return 4*s + size
}

// candidate checks one set of victims on node ni: req must pass Filter
// with them removed; the head's assignment and score come from the
// engine's policy on a clone; each victim must fit on another node as the
// nodes are (fitsElsewhere), or else all such victims together beside the
// head (default assignments). replace makes the final check.
func (p *planner) candidate(ni int, victims []int) (defragCand, bool) {
	if len(victims) > 1 && slices.ContainsFunc(victims, func(v int) bool { return p.alone[v] }) {
		return defragCand{}, false
	}
	free := p.released(p.nodes[ni], victims)
	if Filter(p.req, free) != Fits {
		return defragCand{}, false
	}
	if len(victims) == 1 {
		p.alone[victims[0]] = true
	}
	// Cheap first: each victim fits on another node as the nodes are, or
	// on the freed node beside the head's default (best-fit) assignment.
	var stay []int
	for _, v := range victims {
		if !p.fitsElsewhere(v, ni) {
			stay = append(stay, v)
		}
	}
	if len(stay) > 0 {
		a, _ := assign(p.req, free, ni, -1)
		if free.Apply(&a) != nil {
			return defragCand{}, false
		}
		for _, v := range stay {
			if Filter(&p.movable[v].Req, free) != Fits {
				return defragCand{}, false
			}
		}
	}
	c := releasedClone(p.nodes[ni], p.movable, victims)
	a, s, fits := p.e.placeOn(p.req, c, ni)
	if !fits || c.Apply(&a) != nil {
		return defragCand{}, false
	}
	// The victims with nowhere else to go must fit beside the head all
	// together (default assignments, largest first, as replace orders them).
	slices.SortStableFunc(stay, func(a, b int) int { return cmp.Compare(size(&p.movable[b].Req), size(&p.movable[a].Req)) })
	for _, v := range stay {
		r := &p.movable[v].Req
		if Filter(r, c) != Fits {
			return defragCand{}, false
		}
		if va, _ := assign(r, c, ni, -1); c.Apply(&va) != nil {
			return defragCand{}, false
		}
	}
	return defragCand{node: ni, victims: slices.Clone(victims), head: a, score: s}, true
}

// exactCands appends every set of k of the node's items (for k > 1 of
// the defragExactCandidates most relevant) that is a candidate and holds
// no item that is one alone, until out holds defragScored.
func (p *planner) exactCands(ni int, items []int, k int, out []defragCand) []defragCand {
	if k > 1 {
		items = items[:min(len(items), defragExactCandidates)]
	}
	if k > len(items) {
		return out
	}
	pick := make([]int, k)
	var rec func(start, depth int)
	rec = func(start, depth int) {
		if depth == k {
			if len(out) >= defragScored {
				return
			}
			if c, ok := p.candidate(ni, pick); ok {
				out = append(out, c)
			}
			return
		}
		for i := start; i < len(items); i++ {
			pick[depth] = items[i]
			rec(i+1, depth+1)
		}
	}
	rec(0, 0)
	return out
}

// greedyCand removes the node's items, most relevant first, until req
// fits, then puts back each it can spare (last removed first), so that no
// victim of the set is unnecessary.
func (p *planner) greedyCand(ni int, items []int) (defragCand, bool) {
	var chosen []int
	for _, i := range items {
		if Filter(p.req, p.released(p.nodes[ni], chosen)) == Fits {
			break
		}
		chosen = append(chosen, i)
	}
	if Filter(p.req, p.released(p.nodes[ni], chosen)) != Fits {
		return defragCand{}, false
	}
	for j := len(chosen) - 1; j >= 0; j-- {
		rest := slices.Delete(slices.Clone(chosen), j, j+1)
		if Filter(p.req, p.released(p.nodes[ni], rest)) == Fits {
			chosen = rest
		}
	}
	return p.candidate(ni, chosen)
}

// tryCands tries candidates best head score first (lowest node index on
// ties), at most defragTries of them, and returns the first whose victims
// can all be re-placed.
func (p *planner) tryCands(cands []defragCand) (MovePlan, bool) {
	slices.SortStableFunc(cands, func(a, b defragCand) int {
		return cmp.Or(cmp.Compare(b.score, a.score), cmp.Compare(a.node, b.node))
	})
	for i := range cands[:min(len(cands), defragTries)] {
		if plan, ok := p.e.replace(p.req, p.nodes, p.movable, &cands[i]); ok {
			return plan, true
		}
	}
	return MovePlan{}, false
}

// replace builds the plan of one candidate: the head on the target (a
// clone without the victims), then each victim, largest first, placed by
// the engine over every node as the previous steps left them (clones).
func (e *Engine) replace(req *Request, nodes []*Node, movable []Movable, c *defragCand) (MovePlan, bool) {
	view := slices.Clone(nodes)
	target := releasedClone(nodes[c.node], movable, c.victims)
	if target.Apply(&c.head) != nil {
		return MovePlan{}, false
	}
	view[c.node] = target
	owned := map[int]bool{c.node: true}
	order := slices.Clone(c.victims)
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(size(&movable[b].Req), size(&movable[a].Req)), cmp.Compare(movable[a].ID, movable[b].ID))
	})
	plan := MovePlan{Head: c.head, HeadScore: c.score}
	for _, v := range order {
		m := &movable[v]
		d, err := e.Place(&m.Req, view)
		if err != nil {
			return MovePlan{}, false
		}
		to := d.Assignment.NodeIdx
		if !owned[to] {
			view[to], owned[to] = view[to].Clone(), true
		}
		if view[to].Apply(&d.Assignment) != nil {
			return MovePlan{}, false
		}
		plan.Moves = append(plan.Moves, Move{ID: m.ID, From: m.Asg, To: d.Assignment})
	}
	plan.Why = why(req, nodes[c.node], &plan)
	return plan, true
}

// size orders victims for re-placement: GPU first, then CPU and memory.
func size(r *Request) float64 {
	return float64(r.GPUMilliTotal())*1e6 + float64(r.MIGSlices)*1e9 + float64(r.CPUMilli+int64(r.ExclusiveCores)*1000) + float64(r.MemMiB)/1024
}

// why is the plan's one line for humans.
func why(req *Request, target *Node, p *MovePlan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s blocked on %s (%s); moving", req.ID, target.Name, Filter(req, target))
	for i, m := range p.Moves {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, " %s (%s%s → %s%s)", m.ID, m.From.Node, m.From.devices(), m.To.Node, m.To.devices())
	}
	fmt.Fprintf(&b, " frees%s for it", freed(req, &p.Head))
	return b.String()
}

// freed names what the head takes, for why.
func freed(req *Request, a *Assignment) string {
	var b strings.Builder
	switch {
	case req.GPUs > 0 && req.Shared():
		fmt.Fprintf(&b, " %d milli of gpu %v", a.GPUMilli, a.GPUs)
	case req.GPUs > 0:
		fmt.Fprintf(&b, " gpus %v", a.GPUs)
	case a.MIG != nil:
		fmt.Fprintf(&b, " mig slices %d+%d of gpu %d", a.MIG.Start, a.MIG.Slices, a.MIG.GPU)
	}
	if b.Len() > 0 {
		b.WriteString(" and")
	}
	fmt.Fprintf(&b, " %d millicores, %d MiB", a.CPUMilli, a.MemMiB)
	return b.String()
}

// placeOn scores req on the one node n (index i), as Place would: the
// policy's best assignment there and its score; false when n does not
// pass Filter or the policy has no assignment for it.
func (e *Engine) placeOn(req *Request, n *Node, i int) (Assignment, float64, bool) {
	if Filter(req, n) != Fits {
		return Assignment{}, 0, false
	}
	if ap, ok := e.policy.(AssignmentPolicy); ok {
		e.choices = ap.Choices(req, n, i, 0, e.choices[:0])
		if len(e.choices) == 0 {
			return Assignment{}, 0, false
		}
		c := &e.choices[0]
		return c.Assignment(req, n, i), c.Score, true
	}
	s := e.policy.Score(req, n, i, e.rng)
	a, _ := assign(req, n, i, s.GPU)
	return a, s.Score, true
}

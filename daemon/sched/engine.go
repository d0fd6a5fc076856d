package sched

import (
	"cmp"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
)

// Candidate is one scored candidate of a decision: a node, and with an
// AssignmentPolicy the concrete assignment inside it.
type Candidate struct {
	Node  string  `json:"node"`
	Index int     `json:"index"`
	Score float64 `json:"score"`
	// Parts holds each dimension's contribution w_d·s_d.
	Parts [NumDims]float64 `json:"parts"`
	// Assignment is the candidate's devices and cores (nil for a policy
	// that scores whole nodes).
	Assignment *Assignment `json:"assignment,omitempty"`
	seq        int
}

// Rejection says why one node was filtered out.
type Rejection struct {
	Node   string       `json:"node"`
	Reason FilterReason `json:"reason"`
}

// Decision is the outcome of Engine.Place, able to explain itself.
type Decision struct {
	Request    string     `json:"request"`
	Policy     string     `json:"policy"`
	Assignment Assignment `json:"assignment"`
	Score      float64    `json:"score"`
	Locality   float64    `json:"locality"`
	// Candidates are the best-scored nodes, best first (Options.Explain of
	// them).
	Candidates []Candidate `json:"candidates,omitempty"`
	// Filtered counts the nodes each filter rule removed; Rejected gives up
	// to Options.Explain examples.
	Filtered map[FilterReason]int `json:"filtered,omitempty"`
	Rejected []Rejection          `json:"rejected,omitempty"`
	Feasible int                  `json:"feasible"`
}

// Explain renders the decision for humans (fusionctl show JOB).
func (d *Decision) Explain() string {
	var b strings.Builder
	if d.Feasible == 0 {
		fmt.Fprintf(&b, "%s: waiting: %s\n", d.Request, d.WaitReason())
	} else {
		fmt.Fprintf(&b, "%s: placed on %s by %s (score %.4f)", d.Request, d.Assignment.Node, d.Policy, d.Score)
		if len(d.Assignment.GPUs) > 0 {
			fmt.Fprintf(&b, " gpus %v", d.Assignment.GPUs)
		}
		if d.Assignment.GPUModel != "" {
			fmt.Fprintf(&b, " (%s)", d.Assignment.GPUModel)
		}
		if d.Assignment.MIG != nil {
			fmt.Fprintf(&b, " mig gpu %d slices %d+%d create=%v", d.Assignment.MIG.GPU, d.Assignment.MIG.Start, d.Assignment.MIG.Slices, d.Assignment.MIG.Create)
			if len(d.Assignment.MIG.Destroy) > 0 {
				fmt.Fprintf(&b, " destroying idle %v", d.Assignment.MIG.Destroy)
			}
		}
		if d.Assignment.FPGA >= 0 {
			fmt.Fprintf(&b, " fpga region %d program=%v", d.Assignment.FPGA, d.Assignment.Program)
		}
		b.WriteString("\n")
	}
	if len(d.Candidates) > 0 {
		what := "candidates"
		if d.Candidates[0].Assignment == nil {
			what = "nodes"
		}
		fmt.Fprintf(&b, "  top %d %s (%d feasible nodes), score = Σ weight·score per dimension:\n", len(d.Candidates), what, d.Feasible)
		for _, c := range d.Candidates {
			fmt.Fprintf(&b, "    %-20s %.4f", c.Node+c.Assignment.devices(), c.Score)
			for dim, p := range c.Parts {
				if p != 0 {
					fmt.Fprintf(&b, "  %s=%.4f", Dimension(dim), p)
				}
			}
			b.WriteString("\n")
		}
	}
	for _, r := range sortedReasons(d.Filtered) {
		fmt.Fprintf(&b, "  filtered %d node(s): %s\n", d.Filtered[r], r)
	}
	for _, r := range d.Rejected {
		fmt.Fprintf(&b, "    e.g. %s: %s\n", r.Node, r.Reason)
	}
	return b.String()
}

// devices names what an assignment takes, for Explain ("" for nil).
func (a *Assignment) devices() string {
	if a == nil {
		return ""
	}
	var b strings.Builder
	if len(a.GPUs) > 0 {
		fmt.Fprintf(&b, " gpus %v", a.GPUs)
		if a.GPUMilli < MilliPerGPU {
			fmt.Fprintf(&b, " (%d milli)", a.GPUMilli)
		}
	}
	if a.GPUModel != "" {
		fmt.Fprintf(&b, " %s", a.GPUModel)
	}
	if m := a.MIG; m != nil {
		verb := "use"
		if m.Create {
			verb = "create"
		}
		fmt.Fprintf(&b, " mig gpu %d slices %d+%d (%s)", m.GPU, m.Start, m.Slices, verb)
		if len(m.Destroy) > 0 {
			fmt.Fprintf(&b, " destroying idle %v", m.Destroy)
		}
	}
	if a.FPGA >= 0 {
		fmt.Fprintf(&b, " fpga %d", a.FPGA)
		if a.Program {
			b.WriteString(" (program)")
		}
	}
	if len(a.Cores) > 0 {
		numas := slices.Sorted(maps.Keys(a.Cores))
		b.WriteString(" cores")
		for _, n := range numas {
			fmt.Fprintf(&b, " %d@numa%d", a.Cores[n], n)
		}
	}
	return b.String()
}

// WaitReason summarises why nothing fitted: the most common filter reason.
func (d *Decision) WaitReason() string {
	rs := sortedReasons(d.Filtered)
	if len(rs) == 0 {
		return "no nodes"
	}
	return fmt.Sprintf("%s (%d of %d nodes)", rs[0], d.Filtered[rs[0]], d.total())
}

func (d *Decision) total() int {
	t := d.Feasible
	for _, c := range d.Filtered {
		t += c
	}
	return t
}

func sortedReasons(m map[FilterReason]int) []FilterReason {
	rs := make([]FilterReason, 0, len(m))
	for r := range m {
		rs = append(rs, r)
	}
	slices.SortFunc(rs, func(a, b FilterReason) int { return cmp.Or(cmp.Compare(m[b], m[a]), cmp.Compare(a, b)) })
	return rs
}

// Options configure an Engine.
type Options struct {
	Policy Policy
	// Seed seeds the tie-breaking generator.
	Seed uint64
	// Explain is how many top candidates and rejected nodes a decision
	// keeps (0: none, fastest).
	Explain int
	// TieBreak chooses among equal scores: TieRandom (each decision draws,
	// as the Kubernetes scheduler does) or TieRanked (a fixed seeded ranking
	// of node indices, so ties consistently favour the same nodes, which
	// packs; the FGD paper's simulator behaves this way).
	TieBreak TieBreak
}

// TieBreak is how an Engine breaks ties between equal scores.
type TieBreak int

// Tie-breaking rules.
const (
	TieRandom TieBreak = iota
	TieRanked
)

// Engine places requests with one policy. It is not safe for concurrent
// use; its state is the seeded generator and the policy's caches.
type Engine struct {
	policy  Policy
	rng     *rand.Rand
	explain int
	tie     TieBreak
	seed    uint64
	rank    []uint32
	// choices is the buffer an AssignmentPolicy fills per node.
	choices []Choice
}

// NewEngine returns an engine. A nil policy means fusiond's own with the
// default profiles and no learned shapes.
func NewEngine(o Options) *Engine {
	p := o.Policy
	if p == nil {
		p = NewWeighted(nil, nil)
	}
	return &Engine{policy: p, rng: rand.New(rand.NewPCG(o.Seed, 0x5eed)), explain: o.Explain, tie: o.TieBreak, seed: o.Seed}
}

// Policy returns the engine's policy.
func (e *Engine) Policy() Policy { return e.policy }

// Place filters nodes, scores the rest and chooses. It changes nothing;
// apply the decision with Commit. When no node fits it returns the
// decision (with the filter counts) and an error wrapping ErrUnschedulable.
func (e *Engine) Place(req *Request, nodes []*Node) (Decision, error) {
	return e.PlaceExcept(req, nodes, nil)
}

// PlaceExcept is Place with the nodes whose index is in skip left out
// (reserved for a waiting job); those that would fit count as
// ReasonReserved, the others under their own filter reason.
func (e *Engine) PlaceExcept(req *Request, nodes []*Node, skip map[int]bool) (Decision, error) {
	d := Decision{Request: req.ID, Policy: e.policy.Name(), Assignment: Assignment{NodeIdx: -1, FPGA: -1}}
	if err := req.Validate(); err != nil {
		return d, err
	}
	best, bestScore, ties := -1, 0.0, 0
	var bestScored Scored
	ap, _ := e.policy.(AssignmentPolicy)
	// Without explanation only a node that can beat or tie the best so
	// far matters: a bounded policy skips scoring the others.
	var bc boundedChooser
	if e.explain == 0 {
		bc, _ = e.policy.(boundedChooser)
	}
	var bestChoice Choice
	seq := 0
	var counts [len(allReasons)]int
	for i, n := range nodes {
		if n == nil {
			continue
		}
		r := Filter(req, n)
		if r == Fits && skip[i] {
			r = ReasonReserved
		}
		if r != Fits {
			counts[reasonIndex(r)]++
			if len(d.Rejected) < e.explain {
				d.Rejected = append(d.Rejected, Rejection{Node: n.Name, Reason: r})
			}
			continue
		}
		var s Scored
		if ap != nil {
			if bc != nil && best >= 0 {
				var below bool
				if e.choices, below = bc.choicesAbove(req, n, i, bestScore, e.choices[:0]); below {
					d.Feasible++ // scores below the best: neither wins nor ties
					continue
				}
			} else {
				e.choices = ap.Choices(req, n, i, e.explain, e.choices[:0])
			}
			if len(e.choices) == 0 {
				counts[reasonIndex(ReasonTopology)]++
				continue
			}
			s = e.choices[0].Scored
		} else {
			s = e.policy.Score(req, n, i, e.rng)
		}
		d.Feasible++
		won := false
		switch {
		case best < 0 || s.Score > bestScore:
			best, bestScore, ties, bestScored, won = i, s.Score, 1, s, true
		case s.Score == bestScore:
			ties++
			if e.tie == TieRanked {
				if e.rankOf(i, len(nodes)) < e.rankOf(best, len(nodes)) {
					best, bestScored, won = i, s, true
				}
			} else if e.rng.IntN(ties) == 0 {
				best, bestScored, won = i, s, true
			}
		}
		if won && ap != nil {
			bestChoice = e.choices[0]
		}
		if e.explain == 0 {
			continue
		}
		if ap == nil {
			d.Candidates = insertTop(d.Candidates, Candidate{Node: n.Name, Index: i, Score: s.Score, Parts: s.Parts}, e.explain)
			continue
		}
		for k := range e.choices {
			c := &e.choices[k]
			seq++
			if len(d.Candidates) == e.explain && c.Score < d.Candidates[e.explain-1].Score {
				break // best first: the rest cannot enter
			}
			a := c.Assignment(req, n, i)
			d.Candidates = insertTop(d.Candidates, Candidate{Node: n.Name, Index: i, Score: c.Score, Parts: c.Parts, Assignment: &a, seq: seq}, e.explain)
		}
	}
	for i, c := range counts {
		if c > 0 {
			if d.Filtered == nil {
				d.Filtered = map[FilterReason]int{}
			}
			d.Filtered[allReasons[i]] = c
		}
	}
	if best < 0 {
		return d, fmt.Errorf("%w: %s", ErrUnschedulable, d.WaitReason())
	}
	d.Score = bestScore
	if ap != nil {
		d.Assignment, d.Locality = bestChoice.Assignment(req, nodes[best], best), bestChoice.Locality
	} else {
		d.Assignment, d.Locality = assign(req, nodes[best], best, bestScored.GPU)
	}
	return d, nil
}

// rankOf returns node index i's place in the engine's seeded ranking.
func (e *Engine) rankOf(i, n int) uint32 {
	if len(e.rank) < n {
		r := rand.New(rand.NewPCG(e.seed, 0x7a4c))
		perm := r.Perm(n)
		e.rank = make([]uint32, n)
		for j, p := range perm {
			e.rank[j] = uint32(p)
		}
	}
	return e.rank[i]
}

func insertTop(top []Candidate, c Candidate, k int) []Candidate {
	i, _ := slices.BinarySearchFunc(top, c, func(a, b Candidate) int {
		return cmp.Or(cmp.Compare(b.Score, a.Score), cmp.Compare(a.Index, b.Index), cmp.Compare(a.seq, b.seq))
	})
	if i >= k {
		return top
	}
	top = slices.Insert(top, i, c)
	if len(top) > k {
		top = top[:k]
	}
	return top
}

// Commit applies a placed decision's assignment to its node and tells the
// policy.
func (e *Engine) Commit(req *Request, a *Assignment, nodes []*Node) error {
	if a.NodeIdx < 0 || a.NodeIdx >= len(nodes) {
		return fmt.Errorf("%w: node index %d", ErrDoesNotFit, a.NodeIdx)
	}
	n := nodes[a.NodeIdx]
	if n == nil {
		return fmt.Errorf("%w: node %d is nil", ErrDoesNotFit, a.NodeIdx)
	}
	if err := n.Apply(a); err != nil {
		return err
	}
	if o, ok := e.policy.(Observer); ok {
		o.Placed(req, n, a.NodeIdx)
	}
	return nil
}

// Release returns an assignment's resources and tells the policy.
func (e *Engine) Release(req *Request, a *Assignment, nodes []*Node) {
	if a.NodeIdx < 0 || a.NodeIdx >= len(nodes) {
		return
	}
	n := nodes[a.NodeIdx]
	if n == nil {
		return
	}
	n.Release(a)
	if o, ok := e.policy.(Observer); ok {
		o.Released(req, n, a.NodeIdx)
	}
}

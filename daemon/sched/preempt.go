package sched

import (
	"cmp"
	"fmt"
	"slices"
)

// Running is a placed job that might be preempted.
type Running struct {
	Request    Request
	Assignment Assignment
	// Cost is what preempting it loses (e.g. work since its checkpoint).
	Cost float64
	// End is when it is expected to end, in the queue's logical time,
	// when EndKnown (its run-time estimate from its start; see
	// Queue.ScheduleRunning). Preemption does not use it.
	End      int64
	EndKnown bool
}

// Preemption is a plan: evict Victims (IDs) from node Node, then place.
type Preemption struct {
	Node    int      `json:"node"`
	Victims []string `json:"victims"`
	Cost    float64  `json:"cost"`
}

// PlanPreemption finds, for a request that fits nowhere, the node where
// evicting the fewest jobs of strictly lower tiers makes it fit — of as
// many, the lowest tiers (best-effort first), then the cheapest — with at
// most budget victims. It changes
// nothing: it works on copies of the nodes.
func PlanPreemption(req *Request, nodes []*Node, running []Running, budget int) (Preemption, error) {
	byNode := map[int][]int{}
	for i := range running {
		r := &running[i]
		if r.Request.Tier.Rank() < req.Tier.Rank() && r.Assignment.NodeIdx >= 0 && r.Assignment.NodeIdx < len(nodes) {
			byNode[r.Assignment.NodeIdx] = append(byNode[r.Assignment.NodeIdx], i)
		}
	}
	best := Preemption{Node: -1}
	idxs := make([]int, 0, len(byNode))
	for ni := range byNode {
		idxs = append(idxs, ni)
	}
	slices.Sort(idxs)
	for _, ni := range idxs {
		cand := byNode[ni]
		slices.SortFunc(cand, func(a, b int) int {
			return cmp.Or(cmp.Compare(running[a].Request.Tier.Rank(), running[b].Request.Tier.Rank()), cmp.Compare(running[a].Cost, running[b].Cost), cmp.Compare(running[a].Request.ID, running[b].Request.ID))
		})
		victims, ok := minimalVictims(req, nodes[ni], running, cand, budget)
		if !ok {
			continue
		}
		p := Preemption{Node: ni}
		for _, v := range victims {
			p.Victims = append(p.Victims, running[v].Request.ID)
			p.Cost += running[v].Cost
		}
		if best.Node < 0 || len(p.Victims) < len(best.Victims) || (len(p.Victims) == len(best.Victims) && p.Cost < best.Cost) {
			best = p
		}
	}
	if best.Node < 0 {
		return best, fmt.Errorf("%w (budget %d)", ErrNoPreemption, budget)
	}
	return best, nil
}

// exactSearchLimit bounds the candidates for which minimalVictims searches
// every subset by increasing size (guaranteeing the fewest victims, then
// the cheapest); above it a greedy pass is used.
const exactSearchLimit = 12

// minimalVictims returns the victims to evict from n for req.
func minimalVictims(req *Request, n *Node, running []Running, cand []int, budget int) ([]int, bool) {
	if len(cand) <= exactSearchLimit {
		return exactVictims(req, n, running, cand, budget)
	}
	return greedyVictims(req, n, running, cand, budget)
}

func exactVictims(req *Request, n *Node, running []Running, cand []int, budget int) ([]int, bool) {
	if Filter(req, n) == Fits {
		return nil, true
	}
	for k := 1; k <= min(budget, len(cand)); k++ {
		var best []int
		bestCost, bestRanks := 0.0, 0
		pick := make([]int, k)
		var rec func(start, depth int)
		rec = func(start, depth int) {
			if depth == k {
				c := n.Clone()
				cost, ranks := 0.0, 0
				for _, p := range pick {
					c.Release(&running[p].Assignment)
					cost += running[p].Cost
					ranks += running[p].Request.Tier.Rank()
				}
				// Of as many victims, the lowest tiers (best-effort
				// first), then the cheapest.
				if Filter(req, c) == Fits && (best == nil || ranks < bestRanks || ranks == bestRanks && cost < bestCost) {
					best, bestCost, bestRanks = slices.Clone(pick), cost, ranks
				}
				return
			}
			for i := start; i < len(cand); i++ {
				pick[depth] = cand[i]
				rec(i+1, depth+1)
			}
		}
		rec(0, 0)
		if best != nil {
			return best, true
		}
	}
	return nil, false
}

// greedyVictims evicts candidates in order until req fits, then tries to
// spare each chosen victim again (most expensive first), keeping the set
// minimal: no victim can be spared.
func greedyVictims(req *Request, n *Node, running []Running, cand []int, budget int) ([]int, bool) {
	c := n.Clone()
	var chosen []int
	for _, v := range cand {
		if Filter(req, c) == Fits {
			break
		}
		c.Release(&running[v].Assignment)
		chosen = append(chosen, v)
	}
	if Filter(req, c) != Fits {
		return nil, false
	}
	for i := len(chosen) - 1; i >= 0; i-- {
		a := running[chosen[i]].Assignment
		if c.Apply(&a) == nil {
			if Filter(req, c) == Fits {
				chosen = slices.Delete(chosen, i, i+1)
				continue
			}
			c.Release(&a)
		}
	}
	if len(chosen) > budget {
		return nil, false
	}
	return chosen, true
}

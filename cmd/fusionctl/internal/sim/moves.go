package sim

import (
	"fmt"
	"strconv"

	"github.com/fusiond/fusiond/daemon/sched"
)

// mover is the --moves variant of the protocol replay: it remembers where
// each placed movable pod runs and, when an arriving pod fits nowhere,
// asks the engine for a plan (sched.Engine.PlanMoves) within the budget
// left and carries it out. Movable pods are the trace's best-effort ones
// (qos BE, sched.TierBestEffort): the trace marks them as work that may
// be stopped, so restarting one elsewhere is within what it asked for.
// The budget is at most perMille moves per 1,000 arrivals: after i
// arrivals, at most perMille·i/1000 moves (rounded down) in all.
type mover struct {
	perMille int
	eng      *sched.Engine
	nodes    []*sched.Node
	view     *nodeView // nil without deduplication
	items    []sched.Movable
	at       map[string]int // Movable.ID ("#" and the arrival's index) → index in items
	moved    map[string]bool
	used     int
	byMoves  int
	// noPlan remembers, per pod shape (sched.MoveShape), the moves made, the
	// budget and the movable pods placed when planning for it last found
	// nothing.
	noPlan map[sched.MoveShape][3]int
}

func newMover(perMille int, eng *sched.Engine, nodes []*sched.Node, view *nodeView) *mover {
	return &mover{perMille: perMille, eng: eng, nodes: nodes, view: view, at: map[string]int{}, moved: map[string]bool{}, noPlan: map[sched.MoveShape][3]int{}}
}

// movable says whether a pod may be moved: best-effort ones only.
func movable(req *sched.Request) bool { return req.Tier == sched.TierBestEffort }

// allowed is the budget left once arrived pods have arrived.
func (m *mover) allowed(arrived int) int {
	return m.perMille*arrived/1000 - m.used
}

// placed records where the arrival-th pod went (if it is movable). Items
// are named by arrival, so pods of one name stay apart.
func (m *mover) placed(req *sched.Request, a *sched.Assignment, arrival int) {
	if !movable(req) {
		return
	}
	id := "#" + strconv.Itoa(arrival)
	m.at[id] = len(m.items)
	m.items = append(m.items, sched.Movable{ID: id, Req: *req, Asg: *a})
}

// tryMoves plans and applies moves for req, the arrived-th arrival, which
// fits nowhere. Moves are spent only on pods that ask for GPU: the
// protocol measures GPU allocation, which a CPU-only pod does not raise.
// A pod of a shape for which planning found nothing is not planned again
// until a move is made, the budget grows or another movable pod is
// placed: in the protocol nothing else frees resources or adds victims, so
// the cluster has only filled up since (the bounded search could in
// principle find a plan there that it missed before). It returns req's assignment when it placed it; an error
// only when a plan does not apply (a planner bug, not a missing plan).
func (m *mover) tryMoves(req *sched.Request, arrived int) (sched.Assignment, bool, error) {
	budget := m.allowed(arrived)
	if budget <= 0 || (req.GPUs == 0 && req.MIGProfile == "") {
		return sched.Assignment{}, false, nil
	}
	key := sched.MoveShapeOf(req)
	if last, seen := m.noPlan[key]; seen && last[0] == m.used && budget <= last[1] && last[2] == len(m.items) {
		return sched.Assignment{}, false, nil
	}
	plan, ok := m.eng.PlanMoves(req, m.nodes, m.items, budget)
	if !ok {
		m.noPlan[key] = [3]int{m.used, budget, len(m.items)}
		return sched.Assignment{}, false, nil
	}
	if len(plan.Moves) > budget {
		return sched.Assignment{}, false, fmt.Errorf("sim: plan for %s has %d moves, budget %d", req.ID, len(plan.Moves), budget)
	}
	for _, mv := range plan.Moves {
		i, ok := m.at[mv.ID]
		if !ok {
			return sched.Assignment{}, false, fmt.Errorf("sim: plan for %s moves %s, which is not movable", req.ID, mv.ID)
		}
		m.eng.Release(&m.items[i].Req, &mv.From, m.nodes)
		m.changed(mv.From.NodeIdx)
	}
	for _, mv := range plan.Moves {
		i := m.at[mv.ID]
		if err := m.eng.Commit(&m.items[i].Req, &mv.To, m.nodes); err != nil {
			return sched.Assignment{}, false, fmt.Errorf("sim: moving %s for %s: %w", mv.ID, req.ID, err)
		}
		m.changed(mv.To.NodeIdx)
		m.items[i].Asg = mv.To
		m.moved[mv.ID] = true
	}
	if err := m.eng.Commit(req, &plan.Head, m.nodes); err != nil {
		return sched.Assignment{}, false, fmt.Errorf("sim: placing %s after its moves: %w", req.ID, err)
	}
	m.changed(plan.Head.NodeIdx)
	m.used += len(plan.Moves)
	m.byMoves++
	m.placed(req, &plan.Head, arrived)
	return plan.Head, true, nil
}

func (m *mover) changed(i int) {
	if m.view != nil {
		m.view.changed(i)
	}
}

// report writes the moves' figures into res.
func (m *mover) report(res *RunResult) {
	res.MovesUsed, res.PodsMoved, res.PlacedByMoves = m.used, len(m.moved), m.byMoves
}

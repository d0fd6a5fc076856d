package hostplacer

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/sched"
)

var _ jobs.Defragmenter = (*Placer)(nil)

// PlanMoves plans the fewest moves (at most budget) of the held jobs named
// in movable after which j fits on this host: sched.Engine.PlanMoves over
// what each holds (pods' holds are never moved). It changes nothing.
func (p *Placer) PlanMoves(j *api.Job, movable []string, budget int) (jobs.MovePlan, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	req := p.jobRequest(j)
	var ms []sched.Movable
	for _, id := range slices.Sorted(slices.Values(movable)) {
		h, ok := p.held[id]
		if !ok || h.pod != nil {
			continue
		}
		ms = append(ms, sched.Movable{ID: id, Req: h.req, Asg: h.assign})
	}
	plan, ok := p.eng.PlanMoves(&req, []*sched.Node{p.node}, ms, budget)
	if !ok {
		return jobs.MovePlan{}, fmt.Errorf("job %s: %w", j.ID, jobs.ErrNoMoves)
	}
	out := jobs.MovePlan{For: j.ID, Head: p.where(&req, &plan.Head), Why: plan.Why, Pins: map[string]sched.Assignment{j.ID: plan.Head}}
	for _, mv := range plan.Moves {
		r := p.held[mv.ID].req
		out.Moves = append(out.Moves, jobs.JobMove{ID: mv.ID, From: p.where(&r, &mv.From), To: p.where(&r, &mv.To)})
		out.Pins[mv.ID] = mv.To
	}
	return out, nil
}

// Pin keeps plan's assignments for the next placement of each job it
// names (placeOnPin); it replaces every earlier pin.
func (p *Placer) Pin(plan jobs.MovePlan) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pins = maps.Clone(plan.Pins)
}

// Unpin drops the pins of the jobs named.
func (p *Placer) Unpin(ids []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ids {
		delete(p.pins, id)
	}
}

// placeOnPin commits the assignment pinned for job id, if any and free
// now, and reports whether it did. A pin not free yet (a job moved out of
// it still stopping) is kept for the next try; any placement of the job
// uses it up (place). The caller holds p.mu.
func (p *Placer) placeOnPin(id string, req *sched.Request, nodes []*sched.Node) (sched.Assignment, bool) {
	a, ok := p.pins[id]
	if !ok {
		return sched.Assignment{}, false
	}
	if err := p.eng.Commit(req, &a, nodes); err != nil {
		return sched.Assignment{}, false
	}
	return a, true
}

// where names what an assignment holds, in words: its devices, else its
// CPU and memory. The caller holds p.mu.
func (p *Placer) where(req *sched.Request, a *sched.Assignment) string {
	al := p.allocation(req, a, "")
	if len(al.Devices) > 0 {
		return strings.Join(al.Devices, ", ")
	}
	return fmt.Sprintf("cpu %s, memory %s", al.CPU, al.Memory)
}

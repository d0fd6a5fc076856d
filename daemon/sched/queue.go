package sched

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// Queue holds jobs waiting for placement. Order is effective priority
// (priority plus Aging per unit of logical time waited, so nothing
// starves), then arrival, then ID. Schedule places in that order; when the
// head job does not fit it gets a reservation (EASY backfill): the node
// that could hold it and has the most free GPU share is kept from later
// jobs, which are placed elsewhere if they fit now (backfill), so they
// never delay the head job.
type Queue struct {
	// Aging is the priority gained per unit of logical time waited.
	Aging float64
	// MaxTries bounds how many jobs one Schedule call tries (0: all), to
	// keep a call cheap when the queue is long; the rest keep their place.
	MaxTries int
	jobs     []*waitingJob
}

type waitingJob struct {
	req      Request
	enqueued int64
}

// Placement is a job Schedule placed.
type Placement struct {
	Request  Request
	Decision Decision
	Waited   int64
}

// Waiting is a job still queued, with why.
type Waiting struct {
	ID       string
	Ahead    int
	Reason   string
	Reserved string // the node reserved for it, if any
}

// Push enqueues a job at logical time now.
func (q *Queue) Push(req Request, now int64) {
	q.jobs = append(q.jobs, &waitingJob{req: req, enqueued: now})
}

// Len is the number of waiting jobs.
func (q *Queue) Len() int { return len(q.jobs) }

// Remove drops a waiting job by ID and reports whether it was queued.
func (q *Queue) Remove(id string) bool {
	for i, j := range q.jobs {
		if j.req.ID == id {
			q.jobs = slices.Delete(q.jobs, i, i+1)
			return true
		}
	}
	return false
}

// Effective is a job's priority at time now.
func (q *Queue) effective(j *waitingJob, now int64) float64 {
	return float64(j.req.Priority) + q.Aging*float64(max(0, now-j.enqueued))
}

func (q *Queue) order(now int64) {
	slices.SortStableFunc(q.jobs, func(a, b *waitingJob) int {
		return cmp.Or(cmp.Compare(q.effective(b, now), q.effective(a, now)), cmp.Compare(a.enqueued, b.enqueued), cmp.Compare(a.req.ID, b.req.ID))
	})
}

// Schedule places what it can at time now, committing each placement to
// nodes through e, and returns the placements and the jobs still waiting
// with their reasons.
func (q *Queue) Schedule(now int64, e *Engine, nodes []*Node) ([]Placement, []Waiting) {
	q.order(now)
	var placed []Placement
	reserved := map[int]bool{}
	reservedFor := ""
	keep := q.jobs[:0]
	var waiting []Waiting
	for n, j := range q.jobs {
		if q.MaxTries > 0 && n >= q.MaxTries {
			keep = append(keep, j)
			waiting = append(waiting, Waiting{ID: j.req.ID, Ahead: len(keep) - 1, Reason: "not tried this round"})
			continue
		}
		d, err := e.PlaceExcept(&j.req, nodes, reserved)
		if err == nil {
			err = e.Commit(&j.req, &d.Assignment, nodes)
		}
		if err == nil {
			placed = append(placed, Placement{Request: j.req, Decision: d, Waited: now - j.enqueued})
			continue
		}
		keep = append(keep, j)
		w := Waiting{ID: j.req.ID, Ahead: len(keep) - 1, Reason: reasonText(err, &d, &j.req)}
		if reservedFor == "" && errors.Is(err, ErrUnschedulable) {
			if r := reserveFor(&j.req, nodes); r >= 0 {
				reserved[r] = true
				reservedFor = j.req.ID
				w.Reserved = nodes[r].Name
			}
		}
		waiting = append(waiting, w)
	}
	clear(q.jobs[len(keep):])
	q.jobs = keep
	return placed, waiting
}

func reasonText(err error, d *Decision, req *Request) string {
	if !errors.Is(err, ErrUnschedulable) {
		return fmt.Sprint(err)
	}
	if rs := sortedReasons(d.Filtered); len(rs) > 0 && rs[0] == ReasonMIG {
		return fmt.Sprintf("no GPU with a free %s", req.MIGProfile)
	}
	return d.WaitReason()
}

// String renders the wait for `fusionctl show JOB`, e.g.
// "waiting: no GPU with a free 1g.18gb; 3 jobs ahead".
func (w Waiting) String() string {
	s := "waiting: " + w.Reason
	switch w.Ahead {
	case 0:
	case 1:
		s += "; 1 job ahead"
	default:
		s += fmt.Sprintf("; %d jobs ahead", w.Ahead)
	}
	if w.Reserved != "" {
		s += "; " + w.Reserved + " reserved for it"
	}
	return s
}

// reserveFor picks the node to reserve for a job that fits nowhere now:
// one whose total capacity could hold it, with the most free GPU share
// (then CPU) so it frees up soonest; -1 if no node could ever hold it.
func reserveFor(req *Request, nodes []*Node) int {
	best := -1
	for i, n := range nodes {
		if n.CPUMilli < req.CPUMilli || n.MemMiB < req.MemMiB || len(n.GPUs) < req.GPUs || (req.GPUs > 0 && !req.ModelAllowed(n.GPUModel)) {
			continue
		}
		if best < 0 || n.GPUMilliFree() > nodes[best].GPUMilliFree() ||
			(n.GPUMilliFree() == nodes[best].GPUMilliFree() && n.CPUFreeMilli > nodes[best].CPUFreeMilli) {
			best = i
		}
	}
	return best
}

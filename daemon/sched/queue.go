package sched

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// Queue holds jobs waiting for placement, in the order CompareQueued
// defines (effective priority: priority plus Aging per unit of logical
// time waited, so nothing starves; then arrival; then ID). The daemon's
// queue orders its pending jobs with the same CompareQueued. Schedule
// places in that order; when the
// head job does not fit it gets a reservation (EASY backfill): the node
// that could hold it and has the most free GPU share is kept from later
// jobs, which are placed elsewhere if they fit now (backfill), so they
// never delay the head job. With run-time estimates (ScheduleRunning) the
// head reserves the node where it is expected to fit soonest, and that
// node is backfilled too, EASY's way: by jobs expected to end before the
// head can start there, or that leave what the head needs then.
type Queue struct {
	// Aging is the priority gained per unit of logical time waited.
	Aging float64
	// MaxTries bounds how many jobs one Schedule call tries (0: all), to
	// keep a call cheap when the queue is long; the rest keep their place.
	MaxTries int
	// Estimate is a queued job's expected run time in logical time units
	// (false: unknown), for ScheduleRunning's backfill of the reserved
	// node; nil: none known. The caller decides where it comes from
	// (docs/scheduling.md, "Run-time estimates").
	Estimate func(*Request) (int64, bool)
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

// Queued is what ordering a waiting job needs: its priority, when it was
// queued (logical time) and a tie-breaker (its ID, or any key that sorts
// the way IDs should).
type Queued struct {
	Priority int
	Enqueued int64
	Tie      string
}

// Effective is a waiting job's priority at time now: its priority plus
// aging per unit of time waited.
func Effective(q Queued, now int64, aging float64) float64 {
	return float64(q.Priority) + aging*float64(max(0, now-q.Enqueued))
}

// CompareQueued orders two waiting jobs at time now: higher effective
// priority first, then earlier arrival, then Tie. It is the one ordering
// rule of every queue (the simulator's Queue, the daemon's). With one
// aging rate for all, two jobs that both wait age alike, so their order
// never changes while they wait: it is the order of Priority −
// aging·Enqueued. A job therefore stays behind only the jobs that were
// queued before it or arrived less than (their priority − its
// priority)/aging after it, a finite set when aging > 0.
func CompareQueued(a, b Queued, now int64, aging float64) int {
	return cmp.Or(cmp.Compare(Effective(b, now, aging), Effective(a, now, aging)), cmp.Compare(a.Enqueued, b.Enqueued), cmp.Compare(a.Tie, b.Tie))
}

func (j *waitingJob) queued() Queued {
	return Queued{Priority: j.req.Priority, Enqueued: j.enqueued, Tie: j.req.ID}
}

func (q *Queue) order(now int64) {
	slices.SortStableFunc(q.jobs, func(a, b *waitingJob) int {
		return CompareQueued(a.queued(), b.queued(), now, q.Aging)
	})
}

// Schedule places what it can at time now, committing each placement to
// nodes through e, and returns the placements and the jobs still waiting
// with their reasons. The node reserved for the head is left alone (no
// run times known): ScheduleRunning with nil running.
func (q *Queue) Schedule(now int64, e *Engine, nodes []*Node) ([]Placement, []Waiting) {
	return q.ScheduleRunning(now, e, nodes, nil)
}

// ScheduleRunning is Schedule with run times: running(i) lists the jobs
// running on node i, each with its expected end when known (Running.End).
// The head's shadow time on a node is when it would fit there if those
// jobs ended as expected (Shadow); the head reserves the node where that
// is soonest (ties, and when no node has one: Schedule's choice). A job
// behind the head that fits nowhere else may then take the reserved node
// if it is expected to end by the shadow time (now + q.Estimate ≤
// shadow), or if what it takes leaves the head fitting at the shadow time
// (the "extra" resources, no estimate of its own needed). With estimates
// that hold, the head still starts by its shadow time; an estimate that
// is too short can delay it (EASY's known trade). When no node has a
// shadow time (jobs of unknown end in the way), or running is nil, the
// reserved node is left to the head alone, as Schedule does.
func (q *Queue) ScheduleRunning(now int64, e *Engine, nodes []*Node, running func(node int) []Running) ([]Placement, []Waiting) {
	q.order(now)
	var placed []Placement
	reserved := map[int]bool{}
	reservedFor := ""
	var bf *shadowFill
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
		if bf != nil && errors.Is(err, ErrUnschedulable) {
			if d2, ok := bf.place(q, e, &j.req, nodes, now); ok {
				placed = append(placed, Placement{Request: j.req, Decision: d2, Waited: now - j.enqueued})
				continue
			}
		}
		keep = append(keep, j)
		w := Waiting{ID: j.req.ID, Ahead: len(keep) - 1, Reason: reasonText(err, &d, &j.req)}
		if reservedFor == "" && errors.Is(err, ErrUnschedulable) {
			r := -1
			if running != nil {
				if bf = earliestShadow(&j.req, nodes, running, now); bf != nil {
					r = bf.idx
				}
			}
			if r < 0 {
				r = reserveFor(&j.req, nodes)
			}
			if r >= 0 {
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

// shadowFill is the head's reservation on node idx with run times: the
// shadow time and the node as it would be then (jobs backfilled for their
// "extra" resources applied to it).
type shadowFill struct {
	head   *Request
	idx    int
	shadow int64
	at     *Node
	others map[int]bool // every node but idx, for PlaceExcept
}

// earliestShadow is the head's reservation with run times: among the
// nodes that could ever hold it, the one where it is expected to fit
// soonest (Shadow), ties to the one reserveFor would pick; nil when no
// node has a shadow time.
func earliestShadow(head *Request, nodes []*Node, running func(node int) []Running, now int64) *shadowFill {
	var best *shadowFill
	for i, n := range nodes {
		if !couldHold(head, n) {
			continue
		}
		shadow, at, ok := Shadow(head, n, running(i), now)
		if !ok {
			continue
		}
		if best == nil || shadow < best.shadow || shadow == best.shadow && freerThan(n, nodes[best.idx]) {
			best = &shadowFill{head: head, idx: i, shadow: shadow, at: at}
		}
	}
	if best != nil {
		best.others = make(map[int]bool, len(nodes))
		for i := range nodes {
			if i != best.idx {
				best.others[i] = true
			}
		}
	}
	return best
}

// place places req on the reserved node if EASY allows it (see
// ScheduleRunning) and commits it.
func (f *shadowFill) place(q *Queue, e *Engine, req *Request, nodes []*Node, now int64) (Decision, bool) {
	d, err := e.PlaceExcept(req, nodes, f.others)
	if err != nil || d.Assignment.NodeIdx != f.idx {
		return d, false
	}
	endsFirst := false
	if q.Estimate != nil {
		if est, ok := q.Estimate(req); ok && est >= 0 && now <= f.shadow-est {
			endsFirst = true
		}
	}
	if !endsFirst {
		c := f.at.Clone()
		if c.Apply(&d.Assignment) != nil || Filter(f.head, c) != Fits {
			return d, false
		}
		if e.Commit(req, &d.Assignment, nodes) != nil {
			return d, false
		}
		f.at = c
		return d, true
	}
	return d, e.Commit(req, &d.Assignment, nodes) == nil
}

// Shadow is EASY backfill's shadow time for head on node n: when head
// first fits n if the jobs running there (running, each with its
// Assignment on n) end when expected. It releases them from a copy of n
// in order of expected end, an end already past counting as now, until
// head fits, and returns that time (now if head fits already) and the
// copy as it is then. ok is false when head still does not fit once every
// job of known end has gone (a job of unknown end stands in the way, or n
// is too small).
func Shadow(head *Request, n *Node, running []Running, now int64) (int64, *Node, bool) {
	c := n.Clone()
	if Filter(head, c) == Fits {
		return now, c, true
	}
	ends := make([]*Running, 0, len(running))
	for i := range running {
		if running[i].EndKnown {
			ends = append(ends, &running[i])
		}
	}
	slices.SortStableFunc(ends, func(a, b *Running) int { return cmp.Compare(a.End, b.End) })
	for _, r := range ends {
		c.Release(&r.Assignment)
		if Filter(head, c) == Fits {
			return max(now, r.End), c, true
		}
	}
	return 0, nil, false
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

// String renders the wait for `fusionctl show JOB` (the daemon's queue
// writes every waiting job's reason with it), e.g.
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
		if !couldHold(req, n) {
			continue
		}
		if best < 0 || freerThan(n, nodes[best]) {
			best = i
		}
	}
	return best
}

// couldHold reports whether n's total capacity could hold req.
func couldHold(req *Request, n *Node) bool {
	return n != nil && n.CPUMilli >= req.CPUMilli && n.MemMiB >= req.MemMiB && (req.GPUs == 0 || n.gpusOfOneModel(req) >= req.GPUs)
}

// freerThan orders reservation candidates: more free GPU share, then CPU.
func freerThan(a, b *Node) bool {
	return a.GPUMilliFree() > b.GPUMilliFree() || a.GPUMilliFree() == b.GPUMilliFree() && a.CPUFreeMilli > b.CPUFreeMilli
}

// BackfillAllowed is the daemon's EASY-backfill rule on one node, where
// the head job's reservation is resources, not a node: a job behind the
// head may start (after is the node with it applied) only if, in every
// resource it takes, what the head needs of that resource still fits on
// after. The resources are CPU (shared and exclusive cores), memory, GPUs
// (whole, shares and MIG, with the head's GPU model and topology rule)
// and FPGA regions. Resources a backfilled job does not take are as they
// would be without it, and in those it does take the head's need stays
// free whatever ends when, so without runtimes backfill never delays the
// head: it starts as soon as it would have with no backfill. (The one
// exception is a rule across resources — exclusive cores on the NUMA
// node of the GPUs — which each resource alone does not see.)
func BackfillAllowed(head, cand *Request, after *Node) bool {
	for _, d := range dimensions {
		if d.uses(cand) && d.uses(head) && Filter(d.project(head), after) != Fits {
			return false
		}
	}
	return true
}

type dimension struct {
	uses    func(*Request) bool
	project func(*Request) *Request
}

var dimensions = [...]dimension{
	{ // CPU: shared millicores and exclusive cores both draw on it
		uses: func(r *Request) bool { return r.CPUMilli > 0 || r.ExclusiveCores > 0 },
		project: func(r *Request) *Request {
			return &Request{ID: r.ID, CPUMilli: r.CPUMilli, ExclusiveCores: r.ExclusiveCores}
		},
	},
	{
		uses:    func(r *Request) bool { return r.MemMiB > 0 },
		project: func(r *Request) *Request { return &Request{ID: r.ID, MemMiB: r.MemMiB} },
	},
	{ // GPUs: whole, shared, MIG
		uses: func(r *Request) bool { return r.GPUs > 0 || r.MIGProfile != "" },
		project: func(r *Request) *Request {
			return &Request{ID: r.ID, GPUs: r.GPUs, GPUMilli: r.GPUMilli, GPUMemMiB: r.GPUMemMiB, MIGProfile: r.MIGProfile,
				MIGSlices: r.MIGSlices, GPUModels: r.GPUModels, Topology: r.Topology}
		},
	},
	{
		uses:    func(r *Request) bool { return r.Bitstream != "" },
		project: func(r *Request) *Request { return &Request{ID: r.ID, Bitstream: r.Bitstream} },
	},
}

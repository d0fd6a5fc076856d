package sched

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// randomJob is a request that fits an empty node of 8 CPUs, 32 GiB and 4
// GPUs: CPU and memory, and whole GPUs or one GPU share, or none.
func randomJob(r *rand.Rand, id string) Request {
	req := Request{ID: id, CPUMilli: int64(500 * (1 + r.IntN(8))), MemMiB: int64(1024 * (1 + r.IntN(16)))}
	switch r.IntN(3) {
	case 0:
		req.GPUs, req.GPUMilli = 1+r.IntN(4), MilliPerGPU
	case 1:
		req.GPUs, req.GPUMilli = 1, int64(100*(1+r.IntN(9)))
	}
	return req
}

func testNode() *Node { return NewNode("host", 8000, 32768, 4, "H200") }

type runningJob struct {
	req Request
	a   Assignment
	end int
}

// place places req on n with e and keeps it if keep (given the node with
// it applied) allows, releasing it otherwise.
func place(e *Engine, n *Node, req *Request, keep func(*Node) bool) (Assignment, bool) {
	nodes := []*Node{n}
	d, err := e.Place(req, nodes)
	if err != nil {
		return Assignment{}, false
	}
	if err := e.Commit(req, &d.Assignment, nodes); err != nil {
		return Assignment{}, false
	}
	if keep != nil && !keep(n) {
		e.Release(req, &d.Assignment, nodes)
		return Assignment{}, false
	}
	return d.Assignment, true
}

// Property: EASY backfill under BackfillAllowed never delays the head job.
// On one node with random running jobs, a head job that fits the empty
// node but not now starts, with a random stream of jobs behind it
// backfilled where the rule allows, no later than with nothing
// backfilled at all.
func TestPropertyBackfillNeverDelaysHead(t *testing.T) {
	r := rand.New(rand.NewPCG(12, 1))
	backfilled, refused := 0, 0
	for trial := range 300 {
		e := NewEngine(Options{Seed: uint64(trial)})
		base := testNode()
		var running []runningJob
		for i := range 2 + r.IntN(6) {
			req := randomJob(r, fmt.Sprint("r", i))
			if a, ok := place(e, base, &req, nil); ok {
				running = append(running, runningJob{req: req, a: a, end: 1 + r.IntN(40)})
			}
		}
		head := randomJob(r, "head")
		if Filter(&head, base) == Fits {
			continue
		}
		// Without backfill: the head starts when enough running jobs end.
		alone := base.Clone()
		startAlone := -1
		for now := 0; startAlone < 0; now++ {
			for _, j := range running {
				if j.end == now {
					alone.Release(&j.a)
				}
			}
			if Filter(&head, alone) == Fits {
				startAlone = now
			}
		}
		// With backfill.
		n := base.Clone()
		jobs := slices.Clone(running)
		var waiting []Request
		next := 0
		startWith := -1
		for now := 0; startWith < 0; now++ {
			for _, j := range jobs {
				if j.end == now {
					n.Release(&j.a)
				}
			}
			if Filter(&head, n) == Fits {
				startWith = now
				break
			}
			for range r.IntN(3) {
				waiting = append(waiting, randomJob(r, fmt.Sprint("b", next)))
				next++
			}
			keep := waiting[:0]
			for i := range waiting {
				c := waiting[i]
				a, ok := place(e, n, &c, func(after *Node) bool { return BackfillAllowed(&head, &c, after) })
				if !ok {
					if Filter(&c, n) == Fits {
						refused++
					}
					keep = append(keep, c)
					continue
				}
				backfilled++
				jobs = append(jobs, runningJob{req: c, a: a, end: now + 1 + r.IntN(80)})
			}
			waiting = keep
			if now > 1000 {
				t.Fatalf("trial %d: head never started", trial)
			}
		}
		if startWith > startAlone {
			t.Fatalf("trial %d: backfill delayed the head from %d to %d (head %+v)", trial, startAlone, startWith, head)
		}
	}
	if backfilled == 0 || refused == 0 {
		t.Fatalf("vacuous: %d jobs backfilled, %d that fit refused", backfilled, refused)
	}
}

// Property: with aging, the wait of every job is bounded. On one node
// with a steady random stream of jobs of random priorities (each fits the
// empty node, runs 1..maxRun steps), scheduled like the daemon's queue
// (CompareQueued order, the first job that does not fit holds the
// reservation, the rest backfill under BackfillAllowed), every job
// starts within (2·A + 1)·maxRun steps of arriving, where A is the number
// of jobs ordered ahead of it — which aging limits to the jobs queued
// before it and those arriving less than (their priority − its
// priority)/aging after it.
func TestPropertyAgingBoundsWait(t *testing.T) {
	const maxRun, steps, aging = 20, 300, 0.5
	r := rand.New(rand.NewPCG(42, 7))
	for trial := range 6 {
		e := NewEngine(Options{Seed: uint64(trial)})
		n := testNode()
		type job struct {
			req          Request
			q            Queued
			arrived, dur int
			start        int
			a            Assignment
		}
		var all []*job
		var waiting, running []*job
		for now := 0; now < steps || len(waiting) > 0; now++ {
			if now > 20*steps {
				t.Fatalf("trial %d: %d jobs still waiting at %d", trial, len(waiting), now)
			}
			running = slices.DeleteFunc(running, func(j *job) bool {
				if j.start+j.dur == now {
					n.Release(&j.a)
					return true
				}
				return false
			})
			for k := 0; now < steps && k < r.IntN(3); k++ {
				j := &job{req: randomJob(r, fmt.Sprintf("j%05d", len(all))), arrived: now, dur: 1 + r.IntN(maxRun), start: -1}
				if r.IntN(10) == 0 {
					j.req.CPUMilli, j.req.MemMiB, j.req.GPUs, j.req.GPUMilli = 8000, 32768, 4, MilliPerGPU // the whole node
				}
				j.req.Priority = r.IntN(101)
				j.q = Queued{Priority: j.req.Priority, Enqueued: int64(now), Tie: j.req.ID}
				all = append(all, j)
				waiting = append(waiting, j)
			}
			slices.SortFunc(waiting, func(a, b *job) int { return CompareQueued(a.q, b.q, int64(now), aging) })
			var head *Request
			waiting = slices.DeleteFunc(waiting, func(j *job) bool {
				var keep func(*Node) bool
				if head != nil {
					keep = func(after *Node) bool { return BackfillAllowed(head, &j.req, after) }
				}
				a, ok := place(e, n, &j.req, keep)
				if !ok {
					if head == nil {
						head = &j.req
					}
					return false
				}
				j.a, j.start = a, now
				running = append(running, j)
				return true
			})
		}
		longest := 0
		for _, j := range all {
			ahead := 0
			for _, k := range all {
				if k != j && k.arrived <= j.start && CompareQueued(k.q, j.q, 1<<40, aging) < 0 {
					ahead++
				}
			}
			wait := j.start - j.arrived
			longest = max(longest, wait)
			if bound := (2*ahead + 1) * maxRun; wait > bound {
				t.Fatalf("trial %d: job %s (priority %d) waited %d steps, bound %d (%d jobs ahead)", trial, j.req.ID, j.req.Priority, wait, bound, ahead)
			}
		}
		if longest < 2*maxRun {
			t.Fatalf("trial %d: vacuous, the longest wait was %d steps", trial, longest)
		}
		t.Logf("trial %d: %d jobs, longest wait %d steps", trial, len(all), longest)
	}
}

// Property: preemption never picks a job of the preemptor's tier or a
// higher one, never more victims than the budget, frees enough room, and
// finds a plan whenever one within the budget exists.
func TestPropertyPreemptionTierAndBudget(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 9))
	tiers := []Tier{TierGuaranteed, TierBurstable, TierBestEffort}
	planned := 0
	for trial := range 500 {
		e := NewEngine(Options{Seed: uint64(trial)})
		n := testNode()
		var running []Running
		for i := range 2 + r.IntN(6) {
			req := randomJob(r, fmt.Sprint("r", i))
			req.Tier = tiers[r.IntN(3)]
			if a, ok := place(e, n, &req, nil); ok {
				running = append(running, Running{Request: req, Assignment: a, Cost: float64(r.IntN(100))})
			}
		}
		req := randomJob(r, "new")
		req.Tier = tiers[r.IntN(2)]
		if Filter(&req, n) == Fits {
			continue
		}
		budget := r.IntN(5)
		p, err := PlanPreemption(&req, []*Node{n}, running, budget)
		// Brute force: is there a set of at most budget lower-tier jobs
		// whose eviction makes room?
		exists := false
		for mask := 1; mask < 1<<len(running) && !exists; mask++ {
			c, k, ok := n.Clone(), 0, true
			for i := range running {
				if mask&(1<<i) != 0 {
					k++
					ok = ok && running[i].Request.Tier.Rank() < req.Tier.Rank()
					c.Release(&running[i].Assignment)
				}
			}
			exists = ok && k <= budget && Filter(&req, c) == Fits
		}
		if err != nil {
			if exists {
				t.Fatalf("trial %d: no plan (%v) though one within budget %d exists", trial, err, budget)
			}
			continue
		}
		planned++
		if len(p.Victims) > budget {
			t.Fatalf("trial %d: %d victims over budget %d", trial, len(p.Victims), budget)
		}
		c := n.Clone()
		for _, v := range p.Victims {
			i := slices.IndexFunc(running, func(x Running) bool { return x.Request.ID == v })
			if running[i].Request.Tier.Rank() >= req.Tier.Rank() {
				t.Fatalf("trial %d: victim %s of tier %s for a %s job", trial, v, running[i].Request.Tier, req.Tier)
			}
			c.Release(&running[i].Assignment)
		}
		if Filter(&req, c) != Fits {
			t.Fatalf("trial %d: evicting %v does not make room", trial, p.Victims)
		}
	}
	if planned == 0 {
		t.Fatal("vacuous: no preemption planned")
	}
}

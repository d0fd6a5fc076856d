package sched

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// runningOn lists the jobs of jobs on node idx as Running with their ends.
func runningOn(jobs []runningJob, idx int) []Running {
	var out []Running
	for _, j := range jobs {
		if j.a.NodeIdx == idx {
			out = append(out, Running{Request: j.req, Assignment: j.a, End: int64(j.end), EndKnown: j.end >= 0})
		}
	}
	return out
}

// On the head's reserved node a short job (expected to end before the
// head can start) is backfilled, a long one is not, and nothing is when
// the running job's end is unknown or no run times are given.
func TestScheduleRunningBackfillsReservedNode(t *testing.T) {
	for _, tc := range []struct {
		name        string
		endKnown    bool
		withRunning bool
		want        []string
	}{
		{"end known", true, true, []string{"short"}},
		{"end unknown", false, true, nil},
		{"no run times (Schedule)", true, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := NewNode("a", 16000, 1<<16, 4, "T4")
			nodes := []*Node{n}
			e := NewEngine(Options{Seed: 1, Policy: BestFit{}})
			busy := Request{ID: "busy", GPUs: 2, GPUMilli: 1000}
			d, err := e.Place(&busy, nodes)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Commit(&busy, &d.Assignment, nodes); err != nil {
				t.Fatal(err)
			}
			end := 100
			if !tc.endKnown {
				end = -1
			}
			jobs := []runningJob{{req: busy, a: d.Assignment, end: end}}
			est := map[string]int64{"short": 50, "long": 500}
			q := &Queue{Estimate: func(r *Request) (int64, bool) { v, ok := est[r.ID]; return v, ok }}
			q.Push(Request{ID: "head", Priority: 10, GPUs: 4, GPUMilli: 1000}, 0)
			q.Push(Request{ID: "long", Priority: 5, GPUs: 1, GPUMilli: 1000}, 0)
			q.Push(Request{ID: "short", Priority: 1, GPUs: 1, GPUMilli: 1000}, 0)
			var running func(int) []Running
			if tc.withRunning {
				running = func(i int) []Running { return runningOn(jobs, i) }
			}
			placed, waiting := q.ScheduleRunning(0, e, nodes, running)
			var got []string
			for _, p := range placed {
				got = append(got, p.Request.ID)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("placed %v, want %v", got, tc.want)
			}
			if waiting[0].ID != "head" || waiting[0].Reserved != "a" {
				t.Fatalf("waiting %+v", waiting)
			}
		})
	}
}

// A job of unknown run time is backfilled on the reserved node when what
// it takes leaves the head fitting at its shadow time (EASY's extra
// resources), and refused when it would not.
func TestScheduleRunningExtraResources(t *testing.T) {
	n := NewNode("a", 16000, 1<<16, 4, "T4")
	nodes := []*Node{n}
	e := NewEngine(Options{Seed: 1, Policy: BestFit{}})
	busy := Request{ID: "busy", CPUMilli: 2000, GPUs: 4, GPUMilli: 1000}
	d, err := e.Place(&busy, nodes)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Commit(&busy, &d.Assignment, nodes); err != nil {
		t.Fatal(err)
	}
	jobs := []runningJob{{req: busy, a: d.Assignment, end: 100}}
	q := &Queue{} // no estimates for queued jobs
	q.Push(Request{ID: "head", Priority: 10, CPUMilli: 8000, GPUs: 4, GPUMilli: 1000}, 0)
	q.Push(Request{ID: "cpu-hog", Priority: 5, CPUMilli: 10000}, 0)
	q.Push(Request{ID: "cpu-small", Priority: 1, CPUMilli: 4000}, 0)
	placed, _ := q.ScheduleRunning(0, e, nodes, func(i int) []Running { return runningOn(jobs, i) })
	if len(placed) != 1 || placed[0].Request.ID != "cpu-small" {
		t.Fatalf("placed %+v, want cpu-small only (cpu-hog would leave the head 2000m short)", placed)
	}
}

// Shadow: the head fits once enough jobs of known end have gone; a job of
// unknown end in the way gives no shadow time; an end already past counts
// as now.
func TestShadow(t *testing.T) {
	n := NewNode("a", 16000, 1<<16, 4, "T4")
	var running []Running
	for i, end := range []int64{30, 10, 20} {
		a := Assignment{Node: "a", GPUs: []int{i}, GPUMilli: 1000, FPGA: -1}
		if err := n.Apply(&a); err != nil {
			t.Fatal(err)
		}
		running = append(running, Running{Request: Request{ID: fmt.Sprint(i)}, Assignment: a, End: end, EndKnown: true})
	}
	head := Request{ID: "head", GPUs: 3, GPUMilli: 1000}
	if s, at, ok := Shadow(&head, n, running, 0); !ok || s != 20 || at.GPUMilliFree() != 3000 {
		t.Fatalf("shadow %d %v", s, ok)
	}
	if n.GPUMilliFree() != 1000 {
		t.Fatal("Shadow changed the node")
	}
	if s, _, ok := Shadow(&head, n, running, 25); !ok || s != 25 {
		t.Fatalf("past ends: shadow %d %v, want 25", s, ok)
	}
	all := Request{ID: "all", GPUs: 4, GPUMilli: 1000}
	if s, _, ok := Shadow(&all, n, running, 0); !ok || s != 30 {
		t.Fatalf("shadow for all GPUs %d %v, want 30", s, ok)
	}
	running[2].EndKnown = false
	if s, _, ok := Shadow(&head, n, running, 0); !ok || s != 30 {
		t.Fatalf("shadow around a job of unknown end %d %v, want 30", s, ok)
	}
	if _, _, ok := Shadow(&all, n, running, 0); ok {
		t.Fatal("shadow with a job of unknown end in the way")
	}
	five := Request{ID: "five", GPUs: 5, GPUMilli: 1000}
	if _, _, ok := Shadow(&five, n, running, 0); ok {
		t.Fatal("shadow for a head larger than the node")
	}
}

// Property: with exact run times, EASY backfill through ScheduleRunning
// never delays the head. On one node with random running jobs of known
// end, a head that does not fit now, and a random stream of jobs behind it
// (each with its exact run time as the estimate), the head starts no
// later than it would with nothing backfilled; and jobs do get
// backfilled on the reserved node (the test is not vacuous).
func TestPropertyEstimatesNeverDelayHead(t *testing.T) {
	r := rand.New(rand.NewPCG(29, 2))
	backfilled, refused := 0, 0
	for trial := range 300 {
		e := NewEngine(Options{Seed: uint64(trial)})
		n := testNode()
		nodes := []*Node{n}
		var jobs []runningJob
		for i := range 2 + r.IntN(6) {
			req := randomJob(r, fmt.Sprint("r", i))
			if a, ok := place(e, n, &req, nil); ok {
				jobs = append(jobs, runningJob{req: req, a: a, end: 1 + r.IntN(40)})
			}
		}
		head := randomJob(r, "head")
		if Filter(&head, n) == Fits {
			continue
		}
		alone := n.Clone()
		startAlone := -1
		for now := 0; startAlone < 0; now++ {
			for _, j := range jobs {
				if j.end == now {
					alone.Release(&j.a)
				}
			}
			if Filter(&head, alone) == Fits {
				startAlone = now
			}
		}
		dur := map[string]int64{}
		q := &Queue{Estimate: func(req *Request) (int64, bool) { v, ok := dur[req.ID]; return v, ok }}
		q.Push(head, 0)
		head.Priority = 0
		startWith, next := -1, 0
		for now := 0; startWith < 0; now++ {
			keep := jobs[:0]
			for _, j := range jobs {
				if j.end == now {
					n.Release(&j.a)
					continue
				}
				keep = append(keep, j)
			}
			jobs = keep
			for range r.IntN(3) {
				id := fmt.Sprint("b", next)
				req := randomJob(r, id)
				req.Priority = -1 // behind the head
				dur[id] = int64(1 + r.IntN(80))
				q.Push(req, int64(now))
				next++
			}
			placed, waiting := q.ScheduleRunning(int64(now), e, nodes, func(i int) []Running { return runningOn(jobs, i) })
			for _, p := range placed {
				if p.Request.ID == "head" {
					startWith = now
					continue
				}
				backfilled++
				jobs = append(jobs, runningJob{req: p.Request, a: p.Decision.Assignment, end: now + int(dur[p.Request.ID])})
			}
			for _, w := range waiting {
				if w.ID != "head" {
					refused++
				}
			}
			if now > 1000 {
				t.Fatalf("trial %d: head never started", trial)
			}
		}
		if startWith > startAlone {
			t.Fatalf("trial %d: backfill with exact estimates delayed the head from %d to %d (head %+v)", trial, startAlone, startWith, head)
		}
	}
	if backfilled == 0 || refused == 0 {
		t.Fatalf("vacuous: %d jobs backfilled, %d left waiting", backfilled, refused)
	}
}

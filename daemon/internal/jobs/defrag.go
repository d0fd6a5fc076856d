package jobs

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/sched"
)

// Defragmentation (docs/scheduling.md, "Defragmentation"): the head of
// the queue, a single job that does not fit, when preemption does not
// apply, may have movable jobs moved out of its way: running jobs of its
// tier or below that said they tolerate a restart (spec.movable) or are
// best-effort, not gang members, pods' holds or peers' jobs, and not
// moved within DefragConfig.MinInterval. The Defragmenter plans the
// fewest moves within what is left of DefragConfig.MaxMoves per Window;
// each moved job is marked (MovingFor, stored before it is signalled, so
// a crash cannot turn its stop into a failure), and only the jobs marked
// are counted against the budget and pinned (with the head), get SIGTERM
// and SIGKILL after CancelGrace, and when they end are queued again (not
// counted as a retry, their Moves counted). The head is then tried first
// and the moved jobs right after it while it waits, each at its pinned
// place while that is free; once the head is placed or gone the queue
// forgets the move and drops the pins (schedule). One move is in flight
// at a time, and none while a preemption is.

// DefragConfig tunes defragmentation: the `scheduling.defrag` config
// section.
type DefragConfig struct {
	// Enabled turns defragmentation on.
	Enabled bool
	// MaxMoves bounds the jobs moved per Window (4 and 10 minutes when
	// zero).
	MaxMoves int
	Window   time.Duration
	// MinInterval is how long a moved job is not moved again (30
	// minutes when zero).
	MinInterval time.Duration
}

const (
	defaultMaxMoves          = 4
	defaultDefragWindow      = 10 * time.Minute
	defaultDefragMinInterval = 30 * time.Minute
)

// moveBudget is defragmentation's accounting: the moves of the current
// window and when each job was last moved. Times are the caller's
// (monotonic readings in the manager). Guarded by m.mu.
type moveBudget struct {
	max         int
	window      time.Duration
	minInterval time.Duration
	moves       []time.Time
	last        map[string]time.Time
}

// newMoveBudget is the accounting for c, its zero values defaulted.
func newMoveBudget(c DefragConfig) moveBudget {
	b := moveBudget{max: c.MaxMoves, window: c.Window, minInterval: c.MinInterval, last: map[string]time.Time{}}
	if b.max <= 0 {
		b.max = defaultMaxMoves
	}
	if b.window <= 0 {
		b.window = defaultDefragWindow
	}
	if b.minInterval <= 0 {
		b.minInterval = defaultDefragMinInterval
	}
	return b
}

// left is how many jobs may still be moved in the window ending now.
func (b *moveBudget) left(now time.Time) int {
	b.moves = slices.DeleteFunc(b.moves, func(t time.Time) bool { return now.Sub(t) >= b.window })
	for id, t := range b.last {
		if now.Sub(t) >= b.minInterval {
			delete(b.last, id)
		}
	}
	return max(0, b.max-len(b.moves))
}

// rested reports whether job id may be moved now: it was not moved within
// the minimum interval.
func (b *moveBudget) rested(id string, now time.Time) bool {
	t, ok := b.last[id]
	return !ok || now.Sub(t) >= b.minInterval
}

// spend counts a move of job id at now.
func (b *moveBudget) spend(id string, now time.Time) {
	b.moves = append(b.moves, now)
	b.last[id] = now
}

// spent says in words that the budget is spent.
func (b *moveBudget) spent() string {
	return fmt.Sprintf("defragmentation budget spent (%d moves per %s)", b.max, b.window)
}

// defrag starts moving movable jobs out of head's way if that makes it
// fit, and says in words what head waits for ("" when defragmentation is
// off or nothing applies).
func (m *Manager) defrag(head *api.Job) string {
	pl, ok := m.placer.(Defragmenter)
	if !ok || !m.cfg.Queue.Defrag.Enabled || head.Spec.Pod != nil || head.Origin != nil {
		return ""
	}
	now := time.Now()
	m.mu.Lock()
	q := &m.queue
	var stopping []string
	for v, by := range q.moving {
		if j := m.jobs[v]; j != nil && (j.State == api.StateRunning || j.State == api.StateStarting) && j.MovingFor != "" {
			if by != head.ID {
				m.mu.Unlock()
				return "" // a move for another job is in flight
			}
			stopping = append(stopping, v)
		}
	}
	if len(stopping) > 0 {
		m.mu.Unlock()
		slices.SortFunc(stopping, cmpID)
		return fmt.Sprintf("moving %s to make room for it; waiting for them to stop", strings.Join(stopping, ", "))
	}
	if len(q.preempting) > 0 {
		m.mu.Unlock()
		return "" // a preemption is in flight
	}
	var ids []string
	procs := map[string]Process{}
	for id, j := range m.jobs {
		p := m.procs[id]
		// Only jobs of the head's tier or below: a best-effort head
		// never stops a guaranteed job, movable or not.
		if j.State != api.StateRunning || p == nil || id == head.ID || !j.CanMove() || j.Origin != nil || j.Handover != nil || j.Tier.Rank() > head.Tier.Rank() ||
			m.cancels[id] || m.overtimeStopping(id) || q.reclaiming[id] != "" || q.preempting[id] != "" || j.MovingFor != "" || !q.budget.rested(id, now) {
			continue
		}
		ids = append(ids, id)
		procs[id] = p
	}
	left := q.budget.left(now)
	spent := q.budget.spent()
	m.mu.Unlock()
	if len(ids) == 0 {
		return ""
	}
	if left <= 0 {
		return spent
	}
	slices.SortFunc(ids, cmpID)
	plan, err := pl.PlanMoves(head, ids, left)
	if err != nil {
		if !errors.Is(err, ErrNoMoves) {
			m.log.Warn("planning moves", "job", head.ID, "err", err)
		}
		return ""
	}
	if len(plan.Moves) == 0 {
		return ""
	}
	m.mu.Lock()
	for _, mv := range plan.Moves {
		if j := m.jobs[mv.ID]; j == nil || j.State != api.StateRunning || m.procs[mv.ID] != procs[mv.ID] {
			// Ended since it was looked up: the plan is stale; the next
			// pass plans again.
			m.mu.Unlock()
			return ""
		}
	}
	m.mu.Unlock()
	// Each job is marked first, durably, before it is signalled: a daemon
	// that crashes now finds the mark and queues the job again when it
	// ends. The mark applies only while the job runs the process this
	// pass saw (supervise forgets it before finish reads the mark), so a
	// job that ended meanwhile is never left marked.
	var marked []JobMove
	for _, mv := range plan.Moves {
		m.mu.Lock()
		vj := m.jobs[mv.ID]
		m.mu.Unlock()
		proc := procs[mv.ID]
		if err := m.annotateIf(vj, fmt.Sprintf("moving: to make room for job %s (%s); from %s to %s; stopping: SIGTERM, SIGKILL after %s",
			head.ID, plan.Why, mv.From, mv.To, m.cfg.CancelGrace), func(j *api.Job) error {
			if j.State != api.StateRunning || m.procs[j.ID] != proc {
				return errMoveStale
			}
			return nil
		}, func(j *api.Job) {
			j.MovingFor = head.ID
		}); err != nil {
			m.log.Warn("could not mark a job for a move; leaving it running", "job", mv.ID, "err", err)
			continue
		}
		marked = append(marked, mv)
	}
	if len(marked) == 0 {
		return ""
	}
	// The budget, the queue's order and the pins follow the jobs marked.
	var moved []string
	pinned := MovePlan{For: plan.For, Head: plan.Head, Why: plan.Why, Moves: marked, Pins: map[string]sched.Assignment{}}
	if a, ok := plan.Pins[head.ID]; ok {
		pinned.Pins[head.ID] = a
	}
	m.mu.Lock()
	for _, mv := range marked {
		q.moving[mv.ID] = head.ID
		q.budget.spend(mv.ID, now)
		moved = append(moved, mv.ID)
		if a, ok := plan.Pins[mv.ID]; ok {
			pinned.Pins[mv.ID] = a
		}
	}
	q.preemptor = head.ID // tried first, so what the moves free goes to it
	q.madeRoom[head.ID] = fmt.Sprintf("room made by moving %s (%s)", strings.Join(moved, ", "), plan.Why)
	m.mu.Unlock()
	pl.Pin(pinned)
	m.log.Info("moving jobs to make room", "job", head.ID, "moved", moved, "why", plan.Why)
	mo, _ := m.cfg.Observer.(MoveObserver)
	for _, mv := range marked {
		m.mu.Lock()
		tier := m.jobs[mv.ID].Tier
		m.mu.Unlock()
		if mo != nil {
			mo.Moved(tier)
		}
		_ = procs[mv.ID].Signal(syscall.SIGTERM)
		go m.killAfterGrace(mv.ID, procs[mv.ID])
	}
	return fmt.Sprintf("moving %s to make room for it (%s); waiting for them to stop", strings.Join(moved, ", "), plan.Why)
}

// errMoveStale refuses a move's mark on a job that no longer runs the
// process the plan saw.
var errMoveStale = errors.New("it ended or restarted since the move was planned")

// finishMoved queues a job stopped for a move again, however it exited:
// not counted as a retry, its Moves counted and its mark cleared.
func (m *Manager) finishMoved(j *api.Job, by, desc string, record func(*api.Job)) error {
	return m.transition(j, api.StatePending, fmt.Sprintf("moved: stopped to make room for job %s (%s); queued again to start where the plan puts it (not counted as a retry)", by, desc), func(j *api.Job) {
		record(j)
		j.FinishedAt = nil
		j.Allocation = nil
		j.PID = 0
		j.MovingFor = ""
		j.Moves++
	})
}

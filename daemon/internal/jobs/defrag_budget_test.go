package jobs

import (
	"testing"
	"time"
)

// The move budget on a clock the test sets: at most max moves per window
// (a move leaves the window when window has passed since it), and no job
// moved again before its minimum interval has passed; zero settings take
// the defaults.
func TestMoveBudget(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	b := newMoveBudget(DefragConfig{MaxMoves: 2, Window: 10 * time.Minute, MinInterval: 30 * time.Minute})

	if n := b.left(at(0)); n != 2 {
		t.Fatalf("fresh budget: %d left, want 2", n)
	}
	b.spend("1", at(0))
	b.spend("2", at(time.Minute))
	if n := b.left(at(2 * time.Minute)); n != 0 {
		t.Errorf("after 2 moves in the window: %d left, want 0", n)
	}
	if n := b.left(at(10*time.Minute - time.Nanosecond)); n != 0 {
		t.Errorf("just before the first move leaves the window: %d left, want 0", n)
	}
	if n := b.left(at(10 * time.Minute)); n != 1 {
		t.Errorf("the first move's window over: %d left, want 1", n)
	}
	if n := b.left(at(11 * time.Minute)); n != 2 {
		t.Errorf("both moves' windows over: %d left, want 2", n)
	}
	// Per job: not again within 30 minutes of its move, whatever the
	// window's budget says.
	if b.rested("1", at(29*time.Minute)) || !b.rested("3", at(29*time.Minute)) {
		t.Errorf("at 29m: job 1 rested %v (moved at 0), job 3 rested %v (never moved); want false, true",
			b.rested("1", at(29*time.Minute)), b.rested("3", at(29*time.Minute)))
	}
	if !b.rested("1", at(30*time.Minute)) || b.rested("2", at(30*time.Minute)) {
		t.Errorf("at 30m: job 1 rested %v (moved at 0), job 2 %v (moved at 1m); want true, false",
			b.rested("1", at(30*time.Minute)), b.rested("2", at(30*time.Minute)))
	}
	b.spend("1", at(30*time.Minute))
	if b.rested("1", at(59*time.Minute)) || !b.rested("1", at(60*time.Minute)) {
		t.Errorf("a second move restarts the job's interval")
	}

	d := newMoveBudget(DefragConfig{})
	if d.max != defaultMaxMoves || d.window != defaultDefragWindow || d.minInterval != defaultDefragMinInterval {
		t.Errorf("zero config: max %d, window %s, interval %s; want the defaults", d.max, d.window, d.minInterval)
	}
	if got, want := b.spent(), "defragmentation budget spent (2 moves per 10m0s)"; got != want {
		t.Errorf("spent says %q, want %q", got, want)
	}
}

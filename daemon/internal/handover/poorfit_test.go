package handover_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/admission"
	"github.com/fusiond/fusiond/daemon/internal/handover"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/jobs/jobstest"
	"github.com/fusiond/fusiond/daemon/internal/store"
)

// rankedPeers is fakePeers that also ranks (handover.Ranker): its best
// peer scores best; OfferAbove offers only when that is at least min, and
// refuses everything when refuse is set.
type rankedPeers struct {
	*fakePeers
	best   float64
	refuse bool

	rmu   sync.Mutex
	ranks int
	mins  []float64
}

func (r *rankedPeers) Best(api.JobSpec) (string, float64, bool) {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	r.ranks++
	return "p1", r.best, true
}

func (r *rankedPeers) OfferAbove(ctx context.Context, local string, job api.Job, min float64) (api.Handover, error) {
	r.rmu.Lock()
	r.mins = append(r.mins, min)
	r.rmu.Unlock()
	if r.refuse {
		return api.Handover{}, errors.New("p1 refused (full)")
	}
	if r.best < min {
		return api.Handover{}, fmt.Errorf("p1: ranks %.2f, below %.2f", r.best, min)
	}
	return r.Offer(ctx, local, job)
}

func (r *rankedPeers) counts() (int, []float64) {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	return r.ranks, append([]float64(nil), r.mins...)
}

// newRuleManager is a manager of a 4-core host (the daemon's placer)
// with peers o, every class's wait budget an hour (so only the poor-fit
// rule offers a job that fits), and rule.
func newRuleManager(t *testing.T, o handover.Overflow, rule handover.RankSelf) *node {
	t.Helper()
	dir := t.TempDir()
	runner := jobstest.Runner(t, filepath.Join(dir, "logs"), time.Second)
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	mgr := jobs.New(jobs.Config{LogDir: filepath.Join(dir, "logs"), CancelGrace: time.Second}, st,
		runner, jobstest.Placer(4000, 4<<30), slog.New(slog.DiscardHandler))
	b := map[api.Class]time.Duration{}
	for _, c := range api.Classes {
		b[c] = time.Hour
	}
	m := withPeers(mgr, o, handover.Config{Budget: b, Poll: 20 * time.Millisecond, Lost: 300 * time.Millisecond,
		Retry: time.Hour, RankSelf: rule}, jobs.PeerPolicy{Users: admission.PeerUsers{MinUID: 1000, MaxUID: 65534}})
	jobstest.Run(t, m)
	return m
}

// The poor-fit rule (docs/peers.md, "Hand-over" step 1) on the daemon's
// placer: a batch job of 1 core on an empty 4-core host scores 0.28 (the
// engine packs), one of 4 cores 1.0. With below 0.5 and margin 0.1:
//   - 1 core, the best peer ranking 0.5: offered (to peers ranking at
//     least 0.38), handed over, never placed here;
//   - 1 core, the best peer ranking 0.35 (not 0.1 better): runs here;
//   - 4 cores (above below): runs here, the peers not even ranked;
//   - 1 core, every peer refusing: runs here, ranked once (not again
//     after the refusal);
//   - below 0 (off): runs here, the peers not ranked.
func TestPoorFitRule(t *testing.T) {
	on := handover.RankSelf{Below: 0.5, Margin: 0.1}
	for _, tc := range []struct {
		name     string
		rule     handover.RankSelf
		cpu      api.MilliCPU
		best     float64
		refuse   bool
		peer     bool // handed over
		ranks    int
		minAbove float64 // the min OfferAbove was given (0: not called)
	}{
		{name: "poor fit, better peer", rule: on, cpu: 1000, best: 0.5, peer: true, ranks: 1, minAbove: 0.38},
		{name: "poor fit, peer not better by the margin", rule: on, cpu: 1000, best: 0.35, ranks: 1},
		{name: "good fit", rule: on, cpu: 4000, best: 1},
		{name: "poor fit, every peer refuses", rule: on, cpu: 1000, best: 0.9, refuse: true, ranks: 1, minAbove: 0.38},
		{name: "rule off", rule: handover.RankSelf{Below: 0, Margin: 0.1}, cpu: 1000, best: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &rankedPeers{fakePeers: &fakePeers{order: []string{"p1"}, polls: map[string]int{}, scripts: map[string][]pollAnswer{
				"p1": {remote(api.StateRunning, ""), remote(api.StateSucceeded, "")},
			}}, best: tc.best, refuse: tc.refuse}
			m := newRuleManager(t, f, tc.rule)
			j := submit(t, m, api.JobSpec{Name: "fit", Class: api.ClassBatch, Command: []string{"true"}, Resources: api.Resources{CPU: tc.cpu}})
			j = waitFor(t, m, j.ID, state(api.StateSucceeded))
			r := reasons(j)
			placedHere := strings.Contains(r, "placed: placed: ") // the placer's reason, not a hand-over
			if tc.peer {
				if j.Handover == nil || j.Handover.Peer != "p1" || placedHere || !strings.Contains(r, "fits here poorly (engine score 0.28") {
					t.Fatalf("handover %+v, events:\n%s", j.Handover, r)
				}
			} else if j.Handover != nil || !placedHere {
				t.Fatalf("want it run here: handover %+v, events:\n%s", j.Handover, r)
			}
			ranks, mins := f.counts()
			if ranks != tc.ranks {
				t.Errorf("peers ranked %d times, want %d", ranks, tc.ranks)
			}
			if tc.minAbove == 0 && len(mins) != 0 || tc.minAbove != 0 && (len(mins) != 1 || fmt.Sprintf("%.2f", mins[0]) != fmt.Sprintf("%.2f", tc.minAbove)) {
				t.Errorf("offered with minimum scores %v, want %v", mins, tc.minAbove)
			}
		})
	}
}

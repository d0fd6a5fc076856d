package peers

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
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

func TestMain(m *testing.M) {
	jobstest.Reexec() // the monitors of the benchmark's peer manager
	os.Exit(m.Run())
}

// BenchmarkHandover measures one hand-over on loopback: the origin ranks
// its peers by gossiped load and offers the job over mutual TLS; the peer
// admits and places it with its own job manager (placer, store writes)
// and answers. Jobs go one at a time; each accepted job runs `true` on
// the peer. The peer's state directory is on disk ("disk", the test's
// temporary directory) or in memory ("tmpfs", /dev/shm): the difference
// is the synced store writes. Back to back, each hand-over meets the
// start of the job before it (a monitor, a cgroup, its state writes);
// "-spaced", each waits 30 ms after the one before (not timed), so that
// start is over: the hand-over's own latency.
//
//	go test -run '^$' -bench Handover -benchtime 200x ./daemon/internal/peers/
func BenchmarkHandover(b *testing.B) {
	for _, gap := range []time.Duration{0, 30 * time.Millisecond} {
		suffix := ""
		if gap > 0 {
			suffix = "-spaced"
		}
		b.Run("disk"+suffix, func(b *testing.B) { benchHandover(b, b.TempDir(), gap) })
		b.Run("tmpfs"+suffix, func(b *testing.B) {
			dir, err := os.MkdirTemp("/dev/shm", "handover")
			if err != nil {
				b.Fatal(err)
			}
			defer os.RemoveAll(dir)
			benchHandover(b, dir, gap)
		})
	}
}

func benchHandover(b *testing.B, dir string, gap time.Duration) {
	ca := newTestCA(b, b.TempDir())
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	mgr := jobs.New(jobs.Config{LogDir: filepath.Join(dir, "logs"), CancelGrace: time.Second}, st,
		jobstest.Runner(b, filepath.Join(dir, "logs"), time.Second), jobstest.Placer(64000, 64<<30), slog.New(slog.DiscardHandler))
	start := func(name string, j Jobs, h Host, join ...string) *Node {
		cert, key := ca.issue(b, name)
		n, err := New(Config{NodeName: name, Gossip: "127.0.0.1:0", API: "127.0.0.1:0", Profile: "local", Join: join, InsecureGossip: true,
			CertFile: cert, KeyFile: key, CAFile: filepath.Join(ca.dir, "ca.pem"), Broadcast: 100 * time.Millisecond}, j, h, nil)
		if err != nil {
			b.Fatal(err)
		}
		n.Start()
		return n
	}
	origin := start("origin", newFakeJobs(), &fakeHost{cpu: 1000})
	defer origin.Close()
	ho := handover.New(mgr.Records(), handover.Config{}, slog.New(slog.DiscardHandler))
	timed := &timedJobs{Jobs: struct {
		*jobs.Manager
		*handover.Agent
	}{mgr, ho}}
	peer := start("peer", timed, &fakeHost{cpu: 64000}, origin.GossipAddr())
	defer peer.Close()
	ho.Connect(peer)
	mgr.SetHandover(ho, jobs.PeerPolicy{Users: admission.PeerUsers{AcceptRoot: true}}) // the jobs run as root
	if err := mgr.Recover(); err != nil {
		b.Fatal(err)
	}
	mgr.Start()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		mgr.Stop(ctx)
	}()
	for deadline := time.Now().Add(10 * time.Second); len(origin.candidates()) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("the origin never saw the peer's load")
		}
	}
	spec := api.JobSpec{Name: "x", Class: api.ClassBatch, Command: []string{"true"}, Resources: api.Resources{CPU: 100, Memory: 16 << 20}}
	var took []time.Duration
	i := 0
	for b.Loop() {
		i++
		t0 := time.Now()
		h, err := origin.Offer(context.Background(), fmt.Sprintf("%d#1", i), api.Job{ID: fmt.Sprint(i), Spec: spec, Owner: api.Owner{User: "root"}})
		if err != nil || h.RemoteID == "" {
			b.Fatalf("hand-over %d: %+v, %v", i, h, err)
		}
		took = append(took, time.Since(t0))
		time.Sleep(gap)
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "ms-p50")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "ms-p99")
	timed.mu.Lock()
	defer timed.mu.Unlock()
	slices.Sort(timed.took)
	b.ReportMetric(float64(timed.took[len(timed.took)/2].Microseconds())/1000, "ms-accept-p50")
	b.ReportMetric(float64(timed.took[len(timed.took)*99/100].Microseconds())/1000, "ms-accept-p99")
}

// timedJobs times the peer's job manager accepting each hand-over (its
// placement and durable store writes): the rest of a hand-over is the
// origin's ranking and the peer API's round trip.
type timedJobs struct {
	Jobs
	mu   sync.Mutex
	took []time.Duration
}

func (t *timedJobs) AcceptHandover(ctx context.Context, o jobs.Offer, spec api.JobSpec) (api.Job, error) {
	t0 := time.Now()
	j, err := t.Jobs.AcceptHandover(ctx, o, spec)
	t.mu.Lock()
	t.took = append(t.took, time.Since(t0))
	t.mu.Unlock()
	return j, err
}

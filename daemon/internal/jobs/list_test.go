package jobs

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/store"
)

var listRoot = api.Caller{UID: 0, Admin: true, User: "root"}

// listManager is a manager over a store in a temporary directory, neither
// started nor placing: the tests below move its records themselves.
func listManager(t testing.TB) *Manager {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return New(Config{LogDir: t.TempDir()}, st, nil, nil, slog.New(slog.DiscardHandler))
}

// liveOnTwice names every device two live jobs of page hold (the chaos
// test's meaning of a double booking: finished jobs keep their allocation
// as a record and do not count).
func liveOnTwice(page []api.Job) []string {
	holder := map[string]string{}
	var out []string
	for _, j := range page {
		if !active(j.State) {
			continue
		}
		for _, d := range allocationDevices(j.Allocation) {
			if other, ok := holder[d]; ok {
				out = append(out, fmt.Sprintf("%s under jobs %s and %s", d, other, j.ID))
			}
			holder[d] = j.ID
		}
	}
	return out
}

// TestListPageIsOneSnapshot: while GPUs change hands without pause (the
// holder finishes, keeping its allocation as a record, then a queued job is
// placed on the GPU, starts and runs), no page of a listing, paginated or
// not, ever shows a GPU under two live jobs. The old listing (IDs chosen,
// then each job read on its own) did.
func TestListPageIsOneSnapshot(t *testing.T) {
	m := listManager(t)
	// Per GPU a chain of jobs, each pending until the one before it
	// releases the GPU: the first running, the rest queued. The chains'
	// jobs are scattered (in a random order) among finished ones, so a
	// listing takes a while to get from one holder to the next.
	const gpus, perGPU, finished = 4, 40, 1500
	chains := make([][]*api.Job, gpus)
	n := gpus*perGPU + finished
	specs := make([]api.JobSpec, n)
	for i := range specs {
		specs[i] = api.JobSpec{Command: []string{"true"}, Resources: api.Resources{CPU: 100, Memory: 16 << 20}}
	}
	created, err := m.store.CreateJobs(n, func(i int, id string) api.Job {
		return api.Job{ID: id, Spec: specs[i], State: api.StatePending, Version: 1,
			Events: []api.Event{{To: api.StatePending, Reason: "submitted"}}}
	})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for k, i := range rng.Perm(n) {
		j := created[i]
		if k >= gpus*perGPU {
			j.State = api.StateSucceeded
		}
		m.jobs[j.ID] = &j
		if k < gpus*perGPU {
			chains[k%gpus] = append(chains[k%gpus], &j)
		}
	}
	gpu := func(g int) string { return "GPU-" + strconv.Itoa(g) }
	place := func(j *api.Job, g int) {
		for _, step := range []struct {
			to    api.State
			alloc bool
		}{{api.StatePlaced, true}, {api.StateStarting, false}, {api.StateRunning, false}} {
			if err := m.transition(j, step.to, "test", func(j *api.Job) {
				if step.alloc {
					j.Allocation = &api.Allocation{CPU: 100, Memory: 16 << 20, GPUs: []string{gpu(g)}, Devices: []string{gpu(g)}}
				}
			}); err != nil {
				t.Error(err)
			}
		}
	}
	for g := range gpus {
		place(chains[g][0], g)
	}

	var moved atomic.Int64
	done := make(chan struct{})
	var movers sync.WaitGroup
	quit := make(chan struct{})
	t.Cleanup(func() { close(quit); movers.Wait() }) // before the store closes
	for g := range gpus {
		movers.Add(1)
		go func() {
			defer movers.Done()
			for k := 1; k < perGPU; k++ {
				select {
				case <-quit:
					return
				default:
				}
				// The holder ends first (its record keeps the GPU), then
				// the next job gets it: never two live holders at once.
				if err := m.transition(chains[g][k-1], api.StateSucceeded, "test", nil); err != nil {
					t.Error(err)
				}
				place(chains[g][k], g)
				moved.Add(1)
			}
		}()
	}
	go func() { movers.Wait(); close(done) }()

	var listings, pages int
	for running := true; running; {
		select {
		case <-done:
			running = false // one more listing after the last move
		default:
		}
		opts := api.ListOptions{Limit: []int{0, 100, api.MaxPageSize}[listings%3]}
		var all []api.Job
		for {
			page, next, err := m.ListPage(context.Background(), listRoot, opts)
			if err != nil {
				t.Fatal(err)
			}
			pages++
			if bad := liveOnTwice(page); len(bad) > 0 {
				t.Fatalf("listing %d (limit %d), page %d: %v", listings, opts.Limit, pages, bad)
			}
			all = append(all, page...)
			if next == "" {
				break
			}
			opts.Continue = next
		}
		if len(all) != n {
			t.Fatalf("listing %d has %d jobs, want %d", listings, len(all), n)
		}
		if !slices.IsSortedFunc(all, func(a, b api.Job) int { return cmp.Compare(idNum(b.ID), idNum(a.ID)) }) {
			t.Fatalf("listing %d not newest first", listings)
		}
		listings++
	}
	if n := moved.Load(); n != gpus*(perGPU-1) {
		t.Fatalf("%d hand-overs, want %d", n, gpus*(perGPU-1))
	}
	t.Logf("%d listings (%d pages) during %d hand-overs of a GPU", listings, pages, moved.Load())
}

// benchJobs fills m with n finished jobs shaped like a busy node's: six
// events, a one-GPU allocation, a spec with ten environment variables; one
// in ten is running.
func benchJobs(m *Manager, n int) {
	env := map[string]string{}
	for i := range 10 {
		env["VAR"+strconv.Itoa(i)] = "value-of-some-length-" + strconv.Itoa(i)
	}
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := 1; i <= n; i++ {
		id := strconv.Itoa(i)
		state := api.StateSucceeded
		if i%10 == 0 {
			state = api.StateRunning
		}
		g := "GPU-" + strconv.Itoa(i%8)
		j := &api.Job{
			ID: id, State: state, Tier: api.TierBurstable, Version: 6, CreatedAt: t0,
			Spec: api.JobSpec{Name: "job-" + id, Command: []string{"python", "train.py", "--epochs", "3"}, Env: env,
				Resources: api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 1}}},
			Allocation: &api.Allocation{CPU: 1000, Memory: 1 << 30, NUMANode: 0, CPUSet: "0-3",
				GPUs: []string{g}, Devices: []string{g}, GPUPCI: map[string]string{g: "0000:1b:00.0"}, Explain: "score 0.93"},
			Exit: &api.ExitStatus{},
		}
		for k, s := range []api.State{api.StatePending, api.StatePlaced, api.StateStarting, api.StateRunning, api.StateSucceeded, api.StateSucceeded} {
			j.Events = append(j.Events, api.Event{Time: t0.Add(time.Duration(k) * time.Second), To: s, Reason: "a reason of typical length: placed on GPU 3"})
		}
		m.jobs[id] = j
	}
}

// listByGet is the listing as it was before a page was one snapshot (the
// code of ListPage then, and the server's loop): the page's IDs chosen
// and sorted under the lock, then each job copied by Get, taking the lock
// once per job. Kept for the benchmarks' comparison.
func listByGet(m *Manager, c api.Caller, size int) []api.Job {
	m.mu.Lock()
	hits := make([]uint64, 0, min(len(m.jobs), 4*size))
	for _, j := range m.jobs {
		if visible(c, j) {
			hits = append(hits, idNum(j.ID))
		}
	}
	slices.SortFunc(hits, func(a, b uint64) int { return cmp.Compare(b, a) })
	hits = hits[:min(len(hits), size)]
	ids := make([]string, len(hits))
	for i, n := range hits {
		ids[i] = strconv.FormatUint(n, 10)
	}
	m.mu.Unlock()
	out := make([]api.Job, 0, len(ids))
	for _, id := range ids {
		if j, err := m.Get(context.Background(), c, id); err == nil {
			out = append(out, j)
		}
	}
	return out
}

// TestSelectNewest: the first k entries are the k highest IDs, for every
// k, on shuffled, sorted and reversed inputs.
func TestSelectNewest(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{2, 3, 5, 17, 100, 1000} {
		for _, order := range []string{"shuffled", "ascending", "descending"} {
			ids := make([]uint64, n)
			for i := range ids {
				ids[i] = uint64(i+1) * 3
			}
			switch order {
			case "shuffled":
				rng.Shuffle(n, func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
			case "descending":
				slices.Reverse(ids)
			}
			for k := 1; k < n; k++ {
				h := make([]listHit, n)
				for i, id := range ids {
					h[i] = listHit{n: id}
				}
				selectNewest(h, k)
				got := make([]uint64, k)
				for i := range k {
					got[i] = h[i].n
				}
				slices.Sort(got)
				want := slices.Sorted(slices.Values(ids))[n-k:]
				if !slices.Equal(got, want) {
					t.Fatalf("n=%d %s k=%d: first k %v, want %v", n, order, k, got, want)
				}
			}
		}
	}
}

// BenchmarkListPage copies one page of a node with 10,000 jobs: as one
// snapshot (ListPage) and, for comparison, the old way (listByGet). The
// JSON encoding, the same for both, is left out.
func BenchmarkListPage(b *testing.B) {
	m := listManager(b)
	benchJobs(m, 10_000)
	for _, size := range []int{api.DefaultPageSize, api.MaxPageSize} {
		b.Run(fmt.Sprintf("snapshot/page=%d", size), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if page, _, _ := m.ListPage(context.Background(), listRoot, api.ListOptions{Limit: size}); len(page) != size {
					b.Fatal(len(page))
				}
			}
		})
		b.Run(fmt.Sprintf("ids-then-get/page=%d", size), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if page := listByGet(m, listRoot, size); len(page) != size {
					b.Fatal(len(page))
				}
			}
		})
	}
}

// BenchmarkListPageContended measures what a listing costs everyone else:
// while two goroutines list pages of 1,000 jobs without pause, how long
// another caller waits for the manager's lock (a LogPath, a map lookup
// under it). Reported: its p50, p99 and worst wait per operation.
func BenchmarkListPageContended(b *testing.B) {
	m := listManager(b)
	benchJobs(m, 10_000)
	for _, mode := range []string{"snapshot", "ids-then-get"} {
		b.Run(mode+"/page=1000", func(b *testing.B) {
			stop := make(chan struct{})
			var listers sync.WaitGroup
			for range 2 {
				listers.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						if mode == "snapshot" {
							_, _, _ = m.ListPage(context.Background(), listRoot, api.ListOptions{Limit: api.MaxPageSize})
						} else {
							listByGet(m, listRoot, api.MaxPageSize)
						}
					}
				})
			}
			var waits []time.Duration
			for b.Loop() {
				s := time.Now()
				if _, _, err := m.LogPath(listRoot, "5000"); err != nil {
					b.Fatal(err)
				}
				waits = append(waits, time.Since(s))
				time.Sleep(20 * time.Microsecond) // a caller now and then, not a third lister
			}
			close(stop)
			listers.Wait()
			slices.Sort(waits)
			b.ReportMetric(float64(waits[len(waits)/2].Nanoseconds()), "p50-wait-ns")
			b.ReportMetric(float64(waits[len(waits)*99/100].Nanoseconds()), "p99-wait-ns")
			b.ReportMetric(float64(waits[len(waits)-1].Nanoseconds()), "max-wait-ns")
		})
	}
}

// BenchmarkRunning is the pollers' view (QoS, telemetry, reclaim,
// elastic, best-effort CPU: each calls Running once a second) on a node
// with 10,000 jobs, one in ten of them running.
func BenchmarkRunning(b *testing.B) {
	m := listManager(b)
	benchJobs(m, 10_000)
	b.ReportAllocs()
	for b.Loop() {
		if r := m.Running(); len(r) != 1000 {
			b.Fatal(len(r))
		}
	}
}

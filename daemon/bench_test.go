package daemon

import (
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// startBench runs a whole daemon in-process on a temporary socket, cordoned
// so that submitted jobs stay queued and the benchmark measures the API and
// the store, not process start-up.
func startBench(b *testing.B) *api.Client {
	b.Helper()
	dir := b.TempDir()
	cfg := DefaultConfig()
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.Socket = filepath.Join(dir, "s.sock")
	cfg.SocketGroup = ""
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Config: cfg, Logger: slog.New(slog.DiscardHandler), OnReady: func() { close(ready) }})
	}()
	select {
	case <-ready:
	case err := <-done:
		b.Fatal(err)
	}
	b.Cleanup(func() { cancel(); <-done })
	c := api.NewClient(cfg.Socket)
	b.Cleanup(c.Close)
	if _, err := c.SetCordoned(context.Background(), true); err != nil {
		b.Fatal(err)
	}
	return c
}

var benchSpec = api.JobSpec{Name: "bench", Command: []string{"true"}, Resources: api.Resources{CPU: 100, Memory: 16 << 20}}

// BenchmarkSubmit measures acknowledged (fsynced) submissions over the
// socket from 16 concurrent clients.
func BenchmarkSubmit(b *testing.B) {
	c := startBench(b)
	b.SetParallelism(8) // 8 × GOMAXPROCS goroutines
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Submit(context.Background(), benchSpec); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "submits/s")
}

// BenchmarkSubmitSerial is one client submitting one job at a time: each
// acknowledgement waits for its own fsync.
func BenchmarkSubmitSerial(b *testing.B) {
	c := startBench(b)
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		if _, err := c.Submit(context.Background(), benchSpec); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "submits/s")
}

// BenchmarkQueries10k measures get and list latency with 10,000 jobs in
// the store, reporting p50 and p99 per operation.
func BenchmarkQueries10k(b *testing.B) {
	c := startBench(b)
	const n = 10000
	var wg sync.WaitGroup
	ids := make([]string, n)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 16 {
				j, err := c.Submit(context.Background(), benchSpec)
				if err != nil {
					b.Error(err)
					return
				}
				ids[i] = j.ID
			}
		}()
	}
	wg.Wait()
	ops := map[string]func(i int) error{
		"get": func(i int) error { _, err := c.Get(context.Background(), ids[i%n]); return err },
		"list-limit-100": func(int) error {
			_, err := c.List(context.Background(), api.ListOptions{Limit: 100})
			return err
		},
		"list-all-10k": func(int) error {
			_, err := c.List(context.Background(), api.ListOptions{})
			return err
		},
	}
	for _, name := range []string{"get", "list-limit-100", "list-all-10k"} {
		op := ops[name]
		b.Run(name, func(b *testing.B) {
			lat := make([]time.Duration, 0, b.N)
			for i := range b.N {
				t0 := time.Now()
				if err := op(i); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}

package store

import (
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// BenchmarkPutJob measures a job record's write (PutJob, returned once
// fsynced) alone and with 8 writers at once, on the test's temporary
// directory: the latency of each write (p50, p99) and the writes per
// second. With group commit the 8 share commits.
//
//	go test -run '^$' -bench PutJob -benchtime 400x ./daemon/internal/store/
func BenchmarkPutJob(b *testing.B) {
	for _, writers := range []int{1, 8} {
		b.Run(fmt.Sprintf("writers-%d", writers), func(b *testing.B) {
			s, err := Open(filepath.Join(b.TempDir(), "db"), Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			jobs, err := s.CreateJobs(writers, func(_ int, id string) api.Job {
				return api.Job{ID: id, State: api.StatePending, Version: 1}
			})
			if err != nil {
				b.Fatal(err)
			}
			var mu sync.Mutex
			var took []time.Duration
			b.ResetTimer()
			t0 := time.Now()
			var wg sync.WaitGroup
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					j := jobs[w]
					for i := w; i < b.N; i += writers {
						j.Version++
						start := time.Now()
						if err := s.PutJob(j); err != nil {
							b.Error(err)
							return
						}
						d := time.Since(start)
						mu.Lock()
						took = append(took, d)
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(t0)
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "ms-p50")
			b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "ms-p99")
			b.ReportMetric(float64(len(took))/elapsed.Seconds(), "writes/s")
		})
	}
}

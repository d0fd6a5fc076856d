package profile

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// benchBook is a book of n profiles of 50 runs each, with usage spread
// uniformly over two decades: the worst case for the histograms' size
// (every run in a bucket of its own until they merge).
func benchBook(b *testing.B, n int) *Book { return benchBookSpread(b, n, 99) }

// benchBookSpread is benchBook with usage spread over [x, (1+spread)x].
func benchBookSpread(b *testing.B, n int, spread float64) *Book {
	b.Helper()
	bk := New(Options{Now: func() time.Time { return t0.Add(7 * 24 * time.Hour) }, MaxProfiles: n})
	r := rand.New(rand.NewPCG(1, 1))
	for i := range n * 50 {
		u := func(scale float64) float64 { return scale * (1 + spread*r.Float64()) }
		err := bk.Observe(Observation{Key: Key{Owner: fmt.Sprint("u", i%n%17), Name: fmt.Sprint("job-", i%n), Class: "batch"},
			At: t0.Add(time.Duration(i) * time.Second), RunSeconds: u(10), Failed: r.IntN(20) == 0,
			Requested: Usage{CPUMilli: 4000, MemMiB: 8192, GPUMilli: 1000},
			Typical:   Usage{CPUMilli: u(10), MemMiB: u(20), GPUMilli: u(5), GPUMemMiB: u(100)},
			Peak:      Usage{CPUMilli: u(20), MemMiB: u(40), GPUMilli: u(10), GPUMemMiB: u(200)}})
		if err != nil {
			b.Fatal(err)
		}
	}
	return bk
}

func BenchmarkObserve(b *testing.B) {
	bk := benchBook(b, 1000)
	o := Observation{Key: Key{Owner: "u1", Name: "job-1", Class: "batch"}, At: t0.Add(8 * 24 * time.Hour), RunSeconds: 100,
		Typical: Usage{CPUMilli: 300, MemMiB: 500}, Peak: Usage{CPUMilli: 900, MemMiB: 700}}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		o.At = o.At.Add(time.Second)
		if err := bk.Observe(o); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRecommend(b *testing.B) {
	bk := benchBook(b, 1000)
	k := Key{Owner: "u1", Name: "job-1", Class: "batch"}
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := bk.Recommend(k, Usage{CPUMilli: 4000, MemMiB: 8192}); !ok {
			b.Fatal("no recommendation")
		}
	}
}

// BenchmarkSaveLoad reports the saved file's bytes per profile: runs
// spread over two decades (the worst case), and over ±10% (runs of one
// job alike).
func BenchmarkSaveLoad(b *testing.B) {
	b.Run("spread=100x", func(b *testing.B) { benchSaveLoad(b, benchBook(b, 1000)) })
	b.Run("spread=20%", func(b *testing.B) { benchSaveLoad(b, benchBookSpread(b, 1000, 0.2)) })
}

func benchSaveLoad(b *testing.B, bk *Book) {
	var buf bytes.Buffer
	for b.Loop() {
		buf.Reset()
		if err := bk.Save(&buf); err != nil {
			b.Fatal(err)
		}
		if _, err := Load(bytes.NewReader(buf.Bytes()), Options{MaxProfiles: 1000}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(buf.Len())/1000, "file-bytes/profile")
}

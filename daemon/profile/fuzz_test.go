package profile

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// FuzzLoad: whatever the file holds, Load answers a book or an error,
// never a panic, and a book it answers saves and loads again to the same
// profiles.
func FuzzLoad(f *testing.F) {
	b := New(Options{Now: func() time.Time { return t0 }})
	for i, v := range []float64{0, 3, 7, 1e6} {
		_ = b.Observe(Observation{Key: Key{Owner: "o", Name: strings.Repeat("n", i+1), Class: "batch"}, At: t0, RunSeconds: v, Failed: i == 2,
			Typical: Usage{CPUMilli: v, MemMiB: v / 2}, Peak: Usage{CPUMilli: 2 * v, GPUMemMiB: v}})
	}
	var buf bytes.Buffer
	if err := b.Save(&buf); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Add([]byte(`{"format":"fusiond-profiles","version":1,"profiles":[]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		opts := Options{Now: func() time.Time { return t0 }, MaxProfiles: 8}
		bk, err := Load(bytes.NewReader(data), opts)
		if err != nil {
			return
		}
		all := bk.All()
		for _, p := range all {
			_, _ = bk.EstimateRuntime(p.Key, 0)
			_, _ = bk.Recommend(p.Key, Usage{CPUMilli: 1000, MemMiB: 1000, GPUMilli: 1000, GPUMemMiB: 1000})
		}
		var out bytes.Buffer
		if err := bk.Save(&out); err != nil {
			t.Fatal(err)
		}
		again, err := Load(&out, opts)
		if err != nil {
			t.Fatalf("a loaded book saved does not load: %v", err)
		}
		if a2 := again.All(); len(a2) != len(all) {
			t.Fatalf("%d profiles, then %d", len(all), len(a2))
		}
	})
}

package telemetry

import "testing"

// BenchmarkSample is the cost of one host sample on this machine's real
// /proc (stat, meminfo, three pressure files), without GPUs, RAPL or
// jobs: the 10 Hz loop's cost per tick.
func BenchmarkSample(b *testing.B) {
	bus, err := New(Config{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := bus.Sample(); err != nil {
			b.Fatal(err)
		}
	}
}

package sched

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// reportLatency runs op b.N times, timing each, and reports p50/p99 in µs.
func reportLatency(b *testing.B, op func(i int)) {
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		op(i)
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(lat)
	q := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(q(0.50), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
}

// BenchmarkPlaceOneMIGNode is one decision on the daemon's own 8-GPU,
// 2-NUMA, NVLink, MIG-capable host as the daemon makes it: fusiond's
// policy scoring concrete assignments, with the GPU model table, a shape
// model like the daemon's prior, live loads that differ per GPU and NUMA
// node (so no candidates collapse) and explanation of the top 3
// candidates, for a mix of requests. It reports p50 and p99 per decision.
func BenchmarkPlaceOneMIGNode(b *testing.B) {
	nodes := []*Node{migNode()}
	n := nodes[0]
	n.GPUModel = "NVIDIA A100-SXM4-40GB"
	n.GPUs[3].MilliFree = 400
	for i := range n.GPUs {
		n.GPUs[i].Load, n.GPUs[i].PowerW, n.GPUs[i].IdleWatts = float64(i)/10, 60+float64(i)*20, 50
	}
	n.Load, n.NUMALoad = 0.3, []float64{0.2, 0.4}
	p := NewWeighted(nil, NewFragModel([]Shape{
		{CPUMilli: 4000, GPUs: 1, GPUMilli: 1000, P: 0.3}, {CPUMilli: 32000, GPUs: 8, GPUMilli: 1000, P: 0.15},
		{CPUMilli: 2000, GPUs: 1, GPUMilli: 500, P: 0.2}, {CPUMilli: 1000, GPUs: 1, GPUMilli: 142, P: 0.15}, {CPUMilli: 2000, P: 0.2},
	}))
	p.ModelTable = true
	e := NewEngine(Options{Policy: p, Seed: 1, Explain: 3})
	reqs := []Request{
		{ID: "train", Class: ClassTraining, CPUMilli: 8000, MemMiB: 65536, GPUs: 2, GPUMilli: 1000, ExclusiveCores: 4, Topology: TopologySingleNUMANode},
		{ID: "infer", Class: ClassInference, CPUMilli: 2000, MemMiB: 8192, GPUs: 1, GPUMilli: 300, GPUMemMiB: 8000},
		{ID: "mig", Class: ClassInference, CPUMilli: 1000, MemMiB: 4096, MIGProfile: "3g.20gb", MIGSlices: 3},
		{ID: "fpga", Class: ClassService, CPUMilli: 1000, MemMiB: 1024, Bitstream: "fft"},
		{ID: "one", Class: ClassTraining, CPUMilli: 4000, MemMiB: 8192, GPUs: 1, GPUMilli: 1000},
		{ID: "four", Class: ClassTraining, CPUMilli: 16000, MemMiB: 65536, GPUs: 4, GPUMilli: 1000, ExclusiveCores: 8},
		{ID: "cpu", Class: ClassService, CPUMilli: 1000, MemMiB: 1024, ExclusiveCores: 2},
	}
	reportLatency(b, func(i int) {
		if _, err := e.Place(&reqs[i%len(reqs)], nodes); err != nil {
			b.Fatal(err)
		}
	})
}

// BenchmarkPlace1213Nodes measures decisions per second on a synthetic
// cluster shaped like openb (1213 nodes), placing and committing until
// full, then starting over.
func BenchmarkPlace1213Nodes(b *testing.B) {
	for _, pol := range []string{"fusiond", "fgd", "bestfit"} {
		b.Run(pol, func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			build := func() []*Node {
				nodes := make([]*Node, 1213)
				for i := range nodes {
					switch i % 3 {
					case 0:
						nodes[i] = NewNode("g2", 96000, 393216, 8, "G2")
					case 1:
						nodes[i] = NewNode("t4", 104000, 524288, 2, "T4")
					default:
						nodes[i] = NewNode("p100", 16000, 122880, 2, "P100")
					}
				}
				return nodes
			}
			shapes := []Shape{{CPUMilli: 4000, GPUs: 1, GPUMilli: 810, P: 0.3}, {CPUMilli: 12000, GPUs: 1, GPUMilli: 1000, P: 0.4}, {CPUMilli: 8000, GPUs: 1, GPUMilli: 470, P: 0.2}, {CPUMilli: 12000, P: 0.1}}
			p, _ := PolicyByName(pol, NewFragModel(shapes), nil)
			e := NewEngine(Options{Policy: p, Seed: 1, TieBreak: TieRanked})
			nodes := build()
			fails := 0
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				s := shapes[r.IntN(len(shapes))]
				req := Request{CPUMilli: s.CPUMilli, MemMiB: 1024, GPUs: s.GPUs, GPUMilli: s.GPUMilli}
				d, err := e.Place(&req, nodes)
				if err == nil {
					_ = e.Commit(&req, &d.Assignment, nodes)
					continue
				}
				if fails++; fails > 50 {
					b.StopTimer()
					nodes, fails = build(), 0
					b.StartTimer()
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
}

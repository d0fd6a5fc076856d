package sim

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/fusiond/fusiond/daemon/sched"
)

// BenchmarkDefaultRun130 is one 130% run (seed 42) of the default openb
// trace on its 1213 nodes, per policy; it reports decisions per second.
func BenchmarkDefaultRun130(b *testing.B) {
	dir := openbDir(b)
	nf, err := os.Open(filepath.Join(dir, "openb_node_list_gpu_node.csv"))
	if err != nil {
		b.Fatal(err)
	}
	specs, err := ReadNodes(nf)
	nf.Close()
	if err != nil {
		b.Fatal(err)
	}
	pf, err := os.Open(filepath.Join(dir, "openb_pod_list_default.csv"))
	if err != nil {
		b.Fatal(err)
	}
	pods, err := ReadPods(pf)
	pf.Close()
	if err != nil {
		b.Fatal(err)
	}
	wl := Workload(pods, 42, 130, 6212*sched.MilliPerGPU)
	frag := ShapeModel(wl, 0.95)
	for _, pol := range []string{"fusiond", "fgd", "bestfit"} {
		b.Run(pol, func(b *testing.B) {
			for b.Loop() {
				if _, err := RunProtocol(context.Background(), specs, wl, pol, 42, frag, []float64{100, 130}, sched.TieRanked); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(wl)*b.N)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
}

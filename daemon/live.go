package daemon

import (
	"time"

	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
	"github.com/fusiond/fusiond/daemon/internal/telemetry"
)

// liveOver is the window of telemetry the placer's live load averages:
// long enough to smooth one noisy 100 ms sample, short enough to follow a
// job that just started.
const liveOver = time.Second

// busLive is the placer's live load (hostplacer.LiveSource) read from the
// telemetry bus: each GPU's SM and memory utilisation and power (and the
// power limit in force), and the
// CPU busy share of each NUMA node and of the host, as means over the last
// liveOver.
type busLive struct {
	r    telemetry.Reader
	over time.Duration
}

// Live implements hostplacer.LiveSource.
func (l busLive) Live() hostplacer.Live {
	out := hostplacer.Live{GPUs: map[string]hostplacer.GPULive{}, NUMABusy: map[int]float64{}}
	w := l.r.Window(l.over)
	if len(w) == 0 {
		return out
	}
	gpuN := map[string]int{}
	nodeN := map[int]int{}
	for i := range w {
		s := &w[i]
		out.HostBusy += s.CPUBusy
		for n, v := range s.Nodes {
			out.NUMABusy[n] += v
			nodeN[n]++
		}
		for _, g := range s.GPUs {
			x := out.GPUs[g.ID]
			x.SMUtil += g.SMUtil / 100
			x.MemUtil += g.MemUtil / 100
			x.PowerW += g.PowerW
			x.LimitW = g.LimitW // the cap in force: the latest, not a mean
			out.GPUs[g.ID] = x
			gpuN[g.ID]++
		}
	}
	out.HostBusy /= float64(len(w))
	for n, c := range nodeN {
		out.NUMABusy[n] /= float64(c)
	}
	for id, c := range gpuN {
		x := out.GPUs[id]
		x.SMUtil /= float64(c)
		x.MemUtil /= float64(c)
		x.PowerW /= float64(c)
		out.GPUs[id] = x
	}
	return out
}

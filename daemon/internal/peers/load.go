package peers

import (
	"context"
	"math"
	"slices"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
)

// Host is the placer's view of this host (hostplacer.Placer).
type Host interface {
	Capacity() api.NodeResources
	Allocated() api.NodeResources
	Hardware() hostplacer.Hardware
	LiveLoad() (host float64, gpus map[string]float64)
	PowerHeadroom() map[string]float64
}

// Jobs is the job manager and its hand-over as peers use them (jobs.Manager,
// handover.Agent for the held gang members): the queue's
// load, and the jobs peers hand over here.
type Jobs interface {
	QueueLoad() (pending int, oldest time.Duration, shares map[string]int, cordoned bool)
	HeldDevices() map[string]bool
	Ready() error
	AcceptHandover(ctx context.Context, o jobs.Offer, spec api.JobSpec) (api.Job, error)
	CommitHeld(key string, barrier time.Duration) (started bool, err error)
	StartCommitted(key string) error
	ReleaseHeld(key, why string) bool
	AcceptedByKey(key string) (api.Job, bool)
	Accepted() []api.Job
	Cancel(ctx context.Context, c api.Caller, id string) (api.Job, error)
	LogPath(c api.Caller, id string) (string, bool, error)
}

// localLoad measures this host's free resources per device class and its
// queue: what it gossips.
func localLoad(h Host, j Jobs) api.PeerLoad {
	capa, used := h.Capacity(), h.Allocated()
	hw := h.Hardware()
	held := j.HeldDevices()
	pending, oldest, shares, cordoned := j.QueueLoad()
	l := api.PeerLoad{
		CPU: max(capa.CPU-used.CPU, 0), Memory: max(capa.Memory-used.Memory, 0),
		Queue: pending, Wait: api.Duration(oldest.Round(time.Millisecond)),
		Health: "ok",
	}
	switch err := j.Ready(); {
	case err != nil:
		l.Health = "not ready: " + err.Error()
	case cordoned:
		l.Health = "cordoned"
	}
	cpuLoad, gpuLoad := h.LiveLoad()
	l.CPULoad = hundredths(cpuLoad)
	headroom := h.PowerHeadroom()
	var loadSum, wattsSum float64
	loadN := 0
	// could counts a GPU a new job could get in the load and power
	// headroom.
	could := func(id string) {
		loadSum += gpuLoad[id]
		loadN++
		if w, ok := headroom[id]; ok {
			wattsSum += w
			l.PowerMeasured = true
		}
	}
	free := map[int]bool{} // indices of free whole GPUs, for NVLink
	for gi, g := range hw.GPUs {
		if !g.Health.Healthy || held[g.ID] && g.MIG != nil {
			continue
		}
		if m := g.MIG; m != nil {
			// Existing instances nobody holds can be taken; the slots no
			// instance covers can hold new ones.
			free := m.Slots
			for _, in := range m.Instances {
				free -= in.Slots
				if !held[in.ID] && (in.Health == nil || in.Health.Healthy) {
					addCount(&l.MIG, in.Profile, 1)
				}
			}
			for p, slots := range m.Profiles {
				if slots > 0 && free >= slots {
					addCount(&l.MIG, p, free/slots)
				}
			}
			continue
		}
		if held[g.ID] {
			if s, ok := shares[g.ID]; ok && s < 1000 {
				l.GPUShareMilli += 1000 - s
				could(g.ID)
			}
			continue
		}
		addCount(&l.GPUs, g.Model, 1)
		l.GPUShareMilli += 1000
		could(g.ID)
		free[gi] = true
	}
	if loadN > 0 {
		l.GPULoad = hundredths(loadSum / float64(loadN))
	}
	l.EnergyHeadroomWatts = int(min(math.Round(wattsSum), maxGossipWatts))
	if len(hw.NVLink) > 0 {
		// Only a host that knows its links says how its free GPUs are
		// linked (1: none of them is); without it the engine assumes
		// nothing.
		for model, k := range nvlinkGroups(hw, free) {
			addCount(&l.NVLink, model, k)
		}
	}
	for _, f := range hw.FPGAs {
		if !f.Health.Healthy || held[f.ID] {
			continue
		}
		l.FPGAFree++
		if f.Bitstream != "" && !slices.Contains(l.Bitstreams, f.Bitstream) {
			l.Bitstreams = append(l.Bitstreams, f.Bitstream)
		}
	}
	slices.Sort(l.Bitstreams)
	return l
}

func addCount(m *map[string]int, k string, n int) {
	if *m == nil {
		*m = map[string]int{}
	}
	(*m)[k] += n
}

// hundredths rounds a load to 0.01 so that noise does not count as a
// change worth gossiping.
func hundredths(v float64) float64 { return math.Round(min(max(v, 0), 1)*100) / 100 }

// nvlinkGroups is, per model, the size of the largest set of free GPUs
// (indices into hw.GPUs) connected by NVLink among themselves.
func nvlinkGroups(hw hostplacer.Hardware, free map[int]bool) map[string]int {
	parent := map[int]int{}
	var find func(int) int
	find = func(i int) int {
		if p, ok := parent[i]; ok && p != i {
			r := find(p)
			parent[i] = r
			return r
		}
		return i
	}
	for _, e := range hw.NVLink {
		a, b := e[0], e[1]
		if !free[a] || !free[b] || hw.GPUs[a].Model != hw.GPUs[b].Model {
			continue
		}
		parent[find(a)] = find(b)
	}
	size := map[int]int{}
	for i := range free {
		size[find(i)]++
	}
	out := map[string]int{}
	for root, k := range size {
		m := hw.GPUs[root].Model
		out[m] = max(out[m], k)
	}
	return out
}

package peers

import (
	"context"
	"slices"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
)

// Host is the placer's view of this host (hostplacer.Placer).
type Host interface {
	Capacity() api.NodeResources
	Allocated() api.NodeResources
	Hardware() hostplacer.Hardware
}

// Jobs is the job manager as peers use it (jobs.Manager): the queue's
// load, and the jobs peers hand over here.
type Jobs interface {
	QueueLoad() (pending int, oldest time.Duration, shares map[string]int, cordoned bool)
	HeldDevices() map[string]bool
	Ready() error
	AcceptHandover(from api.Provenance, userName string, spec api.JobSpec, hold time.Duration) (api.Job, error)
	CommitHeld(key string) error
	ReleaseHeld(key string) bool
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
	for _, g := range hw.GPUs {
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
			if s, ok := shares[g.ID]; ok {
				l.GPUShareMilli += max(1000-s, 0)
			}
			continue
		}
		addCount(&l.GPUs, g.Model, 1)
		l.GPUShareMilli += 1000
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

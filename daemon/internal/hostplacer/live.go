package hostplacer

import (
	"math"
	"slices"
	"time"

	"github.com/fusiond/fusiond/daemon/profile"
	"github.com/fusiond/fusiond/daemon/sched"
)

// GPULive is one GPU's live state, as its telemetry reports it.
type GPULive struct {
	// SMUtil and MemUtil are the SM and memory-controller utilisation,
	// 0..1.
	SMUtil, MemUtil float64
	// PowerW is the measured power draw (0: not measured).
	PowerW float64
	// IdleW is the GPU's idle draw where it is known from the device
	// (0: the GPU model table's typical idle draw).
	IdleW float64
	// LimitW is the power limit the GPU enforces (its cap: the board's,
	// or the lower one a power policy set), 0 when not read.
	LimitW float64
}

// Live is the host's live load: what the engine's load and energy
// dimensions read.
type Live struct {
	// GPUs is each GPU's state by device ID; a GPU not in it counts as
	// unloaded and unmeasured.
	GPUs map[string]GPULive
	// NUMABusy is the share of each NUMA node's CPU time that was busy
	// (0..1) over the source's last interval; HostBusy the host's.
	NUMABusy map[int]float64
	HostBusy float64
}

// LiveSource reports the host's live load. Live is called at decision
// time, at most every LiveEvery, under the placer's lock: it must be cheap
// and must not call the placer.
type LiveSource interface {
	Live() Live
}

// LiveEvery is how long the placer keeps one reading of the live load.
const LiveEvery = 100 * time.Millisecond

// refreshLive reads the live source into the node when the last reading is
// older than LiveEvery. The caller holds p.mu.
func (p *Placer) refreshLive() {
	if p.opts.Live == nil {
		return
	}
	now := time.Now()
	if !p.liveAt.IsZero() && now.Sub(p.liveAt) < LiveEvery {
		return
	}
	p.liveAt = now
	p.applyLive(p.opts.Live.Live())
}

// applyLive writes a reading into the node: each GPU's load (the higher of
// its SM and memory utilisation), power draw, idle draw and power limit,
// and the CPU load of the host and of each NUMA node. The caller holds
// p.mu.
func (p *Placer) applyLive(l Live) {
	n := p.node
	p.limitW = slices.Grow(p.limitW[:0], len(n.GPUs))[:len(n.GPUs)]
	for gi := range n.GPUs {
		g := &n.GPUs[gi]
		gl := l.GPUs[p.hw.GPUs[gi].ID]
		g.Load = clamp01(max(gl.SMUtil, gl.MemUtil))
		g.PowerW = max(gl.PowerW, 0)
		p.limitW[gi] = max(gl.LimitW, 0)
		g.IdleWatts = p.base.GPUs[gi].IdleWatts
		if gl.IdleW > 0 {
			g.IdleWatts = gl.IdleW
		}
	}
	n.Load = clamp01(l.HostBusy)
	n.NUMALoad = n.NUMALoad[:0]
	for numa, b := range l.NUMABusy {
		if numa < 0 || numa > 1024 {
			continue
		}
		for len(n.NUMALoad) <= numa {
			n.NUMALoad = append(n.NUMALoad, n.Load)
		}
		n.NUMALoad[numa] = clamp01(b)
	}
}

func clamp01(v float64) float64 { return min(1, max(0, v)) }

// Fragmentation is judged against the request shapes this host has seen:
// a prior until learnAfter jobs were seen, then the shape learner's model,
// rebuilt every relearnEvery further jobs.
const (
	learnAfter   = 20
	relearnEvery = 16
	// shapeCoverage is the share of seen requests the learned shapes
	// cover (the most popular first).
	shapeCoverage = 0.95
	// maxSeen bounds the jobs remembered as seen (seen jobs are not
	// counted twice when they are placed again).
	maxSeen = 100000
)

// priorShapes are the typical shapes before the host has seen enough jobs:
// one whole GPU, eight whole GPUs, half a GPU, a 1g MIG slice (as a
// seventh of a GPU: the shape model counts GPU shares) and CPU-only work.
func priorShapes() []sched.Shape {
	return []sched.Shape{
		{CPUMilli: 4000, GPUs: 1, GPUMilli: sched.MilliPerGPU, P: 0.3},
		{CPUMilli: 32000, GPUs: 8, GPUMilli: sched.MilliPerGPU, P: 0.15},
		{CPUMilli: 2000, GPUs: 1, GPUMilli: sched.MilliPerGPU / 2, P: 0.2},
		{CPUMilli: 1000, GPUs: 1, GPUMilli: sched.MilliPerGPU / 7, P: 0.15},
		{CPUMilli: 2000, P: 0.2},
	}
}

// observe counts a job's request shape once and refreshes the shape model
// when due. The caller holds p.mu.
func (p *Placer) observe(r *sched.Request) {
	if p.seen[r.ID] {
		return
	}
	if len(p.seen) >= maxSeen {
		clear(p.seen)
	}
	p.seen[r.ID] = true
	p.learner.Observe(r)
	p.observed++
	if n := p.observed + p.seeded; n >= learnAfter && (n-learnAfter)%relearnEvery == 0 {
		p.relearn()
	}
}

// relearn judges fragmentation against the learned shapes from now on.
// The caller holds p.mu.
func (p *Placer) relearn() {
	p.shapes = p.learner.Model(shapeCoverage)
	p.policy.SetFragModel(p.shapes)
}

// SeedProfiles primes the shape learner with the request shapes of task
// profiles (a restarted daemon's, loaded from its state directory), each
// weighted by its decayed weight: the host starts with the mix of jobs it
// learned rather than the prior. A profile's shape is its latest request:
// its CPU and its GPUs (whole GPUs from 1000 milli-GPUs up, else one
// shared GPU); MIG requests carry no GPU in a profile and count as
// CPU-only. When the seeded weight reaches learnAfter jobs, the model is
// rebuilt from it at once; jobs observed later add to it as usual.
func (p *Placer) SeedProfiles(profiles []profile.Profile) {
	p.mu.Lock()
	defer p.mu.Unlock()
	before := p.learner.Total()
	for _, pr := range profiles {
		if s, ok := profileShape(pr.Requested); ok {
			p.learner.Add(s, pr.Weight)
		}
	}
	added := p.learner.Total() - before
	if added <= 0 {
		return
	}
	p.seeded += int(math.Round(added))
	if p.observed+p.seeded >= learnAfter {
		p.relearn()
	}
}

// profileShape is the request shape of a profile's request; false for a
// request of nothing or of a non-finite or negative amount.
func profileShape(u profile.Usage) (sched.Shape, bool) {
	if !(u.CPUMilli >= 0) || !(u.GPUMilli >= 0) || math.IsInf(u.CPUMilli, 0) || math.IsInf(u.GPUMilli, 0) || u.CPUMilli == 0 && u.GPUMilli == 0 {
		return sched.Shape{}, false
	}
	s := sched.Shape{CPUMilli: int64(math.Round(u.CPUMilli))}
	switch g := math.Round(u.GPUMilli); {
	case g >= sched.MilliPerGPU:
		s.GPUs, s.GPUMilli = int(math.Round(g/sched.MilliPerGPU)), sched.MilliPerGPU
	case g > 0:
		s.GPUs, s.GPUMilli = 1, int64(g)
	}
	return s, true
}

// LiveLoad is the live load the placer scores with (0..1): the host's CPU
// load and each GPU's by device ID, refreshed as for a decision. Peers
// gossip it.
func (p *Placer) LiveLoad() (host float64, gpus map[string]float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refreshLive()
	gpus = make(map[string]float64, len(p.node.GPUs))
	for i := range p.node.GPUs {
		if i < len(p.hw.GPUs) {
			gpus[p.hw.GPUs[i].ID] = p.node.GPUs[i].Load
		}
	}
	return p.node.Load, gpus
}

// PowerHeadroom is, by GPU device ID, how many watts each GPU may draw
// beyond what it draws now before its power limit in force holds it back
// (the limit less the measured draw, never below 0), refreshed as for a
// decision. A GPU whose draw or limit is not measured is not in it. Peers
// gossip the sum over the GPUs a new job could get.
func (p *Placer) PowerHeadroom() map[string]float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refreshLive()
	out := map[string]float64{}
	for i := range p.node.GPUs {
		if i >= len(p.hw.GPUs) || i >= len(p.limitW) {
			break
		}
		if w, lim := p.node.GPUs[i].PowerW, p.limitW[i]; w > 0 && lim > 0 {
			out[p.hw.GPUs[i].ID] = max(lim-w, 0)
		}
	}
	return out
}

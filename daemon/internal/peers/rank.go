package peers

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
	"github.com/fusiond/fusiond/daemon/sched"
)

// candidate is a peer that, by its gossiped load, could take a job.
type candidate struct {
	name, api string
	load      api.PeerLoad
	// age is how old the view of load is.
	age time.Duration
	// score is the placement engine's on the peer's gossiped load, less
	// the penalties (queue, wait, age); parts the engine's per dimension.
	score   float64
	engine  float64
	parts   [sched.NumDims]float64
	penalty float64
	// powerNeed is what the job would draw on the peer's GPUs the engine
	// chose (jobWatts), 0 when not known.
	powerNeed float64
}

// jobWatts is the power a job placed by a would add on its GPUs: each
// GPU's active draw beyond idle by the GPU model table (TDP less typical
// idle), times the share of the GPU it takes. 0 for CPU-only and FPGA
// work, MIG slices (the gossip names no model for them) and models the
// table does not know.
func jobWatts(a *sched.Assignment) float64 {
	if len(a.GPUs) == 0 || a.GPUModel == "" {
		return 0
	}
	spec, ok := sched.LookupGPU(a.GPUModel)
	if !ok {
		return 0
	}
	share := float64(min(max(a.GPUMilli, 0), sched.MilliPerGPU)) / sched.MilliPerGPU
	return float64(len(a.GPUs)) * max(spec.TDPW-spec.IdleW, 0) * share
}

// powerShort is the part of need (watts) the peer's gossiped power
// headroom cannot give, 0..1: 0 when the headroom covers it, or when the
// peer measured no power or the need is unknown (nothing is assumed), 1
// when the peer has no headroom left, so a job goes to a peer whose GPUs
// can run it at full power before one whose power limits would hold it
// back.
func powerShort(need float64, l api.PeerLoad) float64 {
	if need <= 0 || !l.PowerMeasured {
		return 0
	}
	return 1 - min(max(float64(l.EnergyHeadroomWatts), 0)/need, 1)
}

// Penalties on the engine's score (0..1) for what the engine does not
// see: each job queued on the peer, each second its oldest has waited,
// the age of the view (0.1 at MaxLoadAge, past which the peer is not
// offered at all), and the power the job would draw beyond the peer's
// measured headroom (0.1 when it has none; see powerShort).
const (
	queuePenalty  = 0.1
	waitPenalty   = 0.1
	agePenalty    = 0.1
	energyPenalty = 0.1
)

// ranker ranks peers for a job with the placement engine (sched.Weighted
// with the daemon's class profiles and the GPU model table) over engine
// nodes built from each peer's gossiped load: the same scoring the
// daemon's placer uses for this host. Offers walk the ranking in the
// order of the spread choice, drawn with rng.
type ranker struct {
	profiles sched.Profiles
	maxAge   time.Duration
	spread   sched.SpreadChoice
	rng      *rand.Rand
}

// offerOrder is the order in which Offer offers the job to ranked (best
// first): the spread choice over their scores, so that origins deciding
// on the same gossiped view do not all offer to the same best peer.
func (rk ranker) offerOrder(ranked []candidate) []int {
	scores := make([]float64, len(ranked))
	for i, c := range ranked {
		scores[i] = c.score
	}
	return rk.spread.Order(scores, 0, rk.rng)
}

// offerSpread is the daemon's spread choice of offers: the simulator's
// (sched.DefaultSpread, uniform between the two best-ranked peers not yet
// offered) with the draw kept to peers within spreadWithin of the best
// left, so that origins split between peers the engine scores about
// alike, while a clearly better one (linked GPUs for a multi-GPU job, 0.3
// ahead; an H200 before an A100 for training, 0.1; idle GPUs before busy
// ones for an inference share, 0.14) is still offered first.
func offerSpread() sched.SpreadChoice {
	s := sched.DefaultSpread()
	s.Within = spreadWithin
	return s
}

// spreadWithin bounds the spread choice's draw (offerSpread).
const spreadWithin = 0.05

// offerRand is the spread choice's randomness for one offer: the injected
// source's (tests), else seeded from this node's name and the time, so
// origins draw independently.
func (n *Node) offerRand() *rand.Rand {
	if n.spreadRand != nil {
		return n.spreadRand()
	}
	h := fnv.New64a()
	h.Write([]byte(n.cfg.NodeName))
	return rand.New(rand.NewPCG(h.Sum64(), uint64(time.Now().UnixNano())))
}

// peerTarget is what the gossip tells of a peer's GPUs for converting a
// spec to an engine request: the models it has free.
func peerTarget(l api.PeerLoad) hostplacer.Target {
	return hostplacer.Target{GPUModels: slices.Sorted(maps.Keys(l.GPUs))}
}

// peerNode builds the engine's node for a peer's gossiped load, as the
// peer's own placer sees its host: one node whose GPUs each name their
// model (a peer may hold several models, and a job's GPUs are of one of
// them). The free CPU and memory are its capacity; each free whole GPU
// carries the peer's GPU load; the NVLink group of a model's free GPUs is
// joined all to all (where the peer knows its links); the share headroom
// beyond whole GPUs becomes shared GPUs of the first model; the MIG
// instances it could give are free instances of their profile (the
// gossip names no model for them); its free FPGA regions hold each loaded
// bitstream.
func peerNode(name string, l api.PeerLoad) *sched.Node {
	n := sched.NewNode(name, int64(l.CPU), l.Memory.WholeMiB(), 0, "")
	n.Load = min(max(l.CPULoad, 0), 1)
	for i := range min(l.FPGAFree, 64) { // gossiped: bounded
		r := sched.FPGARegion{}
		if i < len(l.Bitstreams) {
			r.Bitstream = l.Bitstreams[i]
		}
		n.FPGAs = append(n.FPGAs, r)
	}
	gpuLoad := min(max(l.GPULoad, 0), 1)
	whole := 0
	models := slices.Sorted(maps.Keys(l.GPUs))
	linksKnown := false
	for _, model := range models {
		k := min(max(l.GPUs[model], 0), 64-len(n.GPUs)) // the engine models up to 64 GPUs
		if k <= 0 {
			continue
		}
		whole += k
		idle := 0.0
		if spec, ok := sched.LookupGPU(model); ok {
			idle = spec.IdleW
		}
		first := len(n.GPUs)
		for range k {
			n.GPUs = append(n.GPUs, sched.GPU{Model: model, MilliFree: sched.MilliPerGPU, Load: gpuLoad, IdleWatts: idle})
		}
		if g, known := l.NVLink[model]; known {
			linksKnown = true
			linked := min(g, k)
			for a := range linked {
				for b := a + 1; b < linked; b++ {
					n.NVLink = append(n.NVLink, [2]int{first + a, first + b})
				}
			}
		}
	}
	if linksKnown && len(n.NVLink) == 0 {
		// The peer knows its links and none joins two free GPUs: a pair
		// the engine skips (out of range) says links are known, so sets
		// of unlinked GPUs score no locality.
		n.NVLink = [][2]int{{-1, -1}}
	}
	firstModel := ""
	if len(models) > 0 {
		firstModel = models[0]
	}
	if shared := l.GPUShareMilli - whole*sched.MilliPerGPU; shared > 0 {
		for left := shared; left > 0 && len(n.GPUs) < 64; left -= sched.MilliPerGPU - 1 {
			n.GPUs = append(n.GPUs, sched.GPU{Model: firstModel, MilliFree: int64(min(left, sched.MilliPerGPU-1)), Load: gpuLoad})
		}
	}
	for _, p := range slices.Sorted(maps.Keys(l.MIG)) {
		s, k := max(hostplacer.MIGSlicesOf(p), 1), min(max(l.MIG[p], 0), 64)
		if k == 0 || len(n.GPUs) >= 64 {
			continue
		}
		k = min(k, 64/s) // the engine models up to 64 slices a GPU
		m := &sched.MIG{TotalSlices: s * k}
		for i := range k {
			m.Instances = append(m.Instances, sched.MIGInstance{Profile: p, Start: i * s, Slices: s})
		}
		n.GPUs = append(n.GPUs, sched.GPU{MilliFree: sched.MilliPerGPU, MIG: m, Load: gpuLoad})
	}
	return n
}

// rank orders the peers that fit spec by their gossiped load, best first
// (ties by name), and says of the others why they were left out. A peer
// fits when its engine node passes the engine's filter; its score is the
// engine's.
func (rk ranker) rank(spec api.JobSpec, peers []candidate) ([]candidate, []string) {
	tier := spec.Tier
	if tier == "" {
		tier = api.TierBurstable
	}
	var out []candidate
	var skipped []string
	for _, p := range peers {
		if p.load.Health != "ok" {
			skipped = append(skipped, p.name+": "+p.load.Health)
			continue
		}
		if spec.Resources.FPGA != nil && p.load.FPGAFree == 0 {
			skipped = append(skipped, p.name+": no FPGA region free")
			continue
		}
		req := hostplacer.EngineRequest("offer", spec, tier, peerTarget(p.load))
		if req.MIGProfile != "" {
			req.GPUModels = nil // the gossip names no model for MIG GPUs; the peer re-checks
		}
		d, err := rk.place(&req, peerNode(p.name, p.load))
		if err != nil {
			skipped = append(skipped, p.name+": "+refusal(d, p.load))
			continue
		}
		p.engine = d.Score
		if len(d.Candidates) > 0 {
			p.parts = d.Candidates[0].Parts
		}
		// Never a bonus: a negative queue or wait (refused on decode)
		// counts as none.
		p.penalty = queuePenalty*float64(max(p.load.Queue, 0)) + waitPenalty*max(time.Duration(p.load.Wait), 0).Seconds()
		if rk.maxAge > 0 {
			p.penalty += agePenalty * min(float64(p.age)/float64(rk.maxAge), 1)
		}
		p.powerNeed = jobWatts(&d.Assignment)
		p.penalty += energyPenalty * powerShort(p.powerNeed, p.load)
		p.score = p.engine - p.penalty
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b candidate) int {
		if c := cmp.Compare(b.score, a.score); c != 0 {
			return c
		}
		return cmp.Compare(a.name, b.name)
	})
	return out, skipped
}

// refusal says why the engine's filter left a peer's node out, with the
// gossiped amount the reason is about.
func refusal(d sched.Decision, l api.PeerLoad) string {
	if len(d.Rejected) == 0 {
		return d.WaitReason()
	}
	r := d.Rejected[0].Reason
	switch r {
	case sched.ReasonCPU:
		return fmt.Sprintf("%s (%dm free)", r, l.CPU)
	case sched.ReasonMemory:
		return fmt.Sprintf("%s (%s free)", r, l.Memory)
	case sched.ReasonGPUs, sched.ReasonGPUModel:
		return fmt.Sprintf("%s (free: %v)", r, l.GPUs)
	case sched.ReasonGPUShare:
		return fmt.Sprintf("%s (%d milli-GPU of share headroom)", r, l.GPUShareMilli)
	}
	return string(r)
}

// place runs the engine on one node. The policy is new for each: it caches
// per node index and state version, which peers' nodes do not keep.
func (rk ranker) place(req *sched.Request, n *sched.Node) (sched.Decision, error) {
	policy := sched.NewWeighted(rk.profiles, nil)
	policy.ModelTable = true
	return sched.NewEngine(sched.Options{Policy: policy, Explain: 1}).Place(req, []*sched.Node{n})
}

// explain says how c scored: the engine's score by dimension and the
// penalties.
func (c candidate) explain() string {
	var parts []string
	for d := range sched.NumDims {
		if v := c.parts[d]; v != 0 {
			parts = append(parts, fmt.Sprintf("%s %.2f", d, v))
		}
	}
	s := fmt.Sprintf("score %.2f: engine %.2f", c.score, c.engine)
	if len(parts) > 0 {
		s += " (" + strings.Join(parts, ", ") + ")"
	}
	if c.penalty >= 0.005 {
		s += fmt.Sprintf(" less %.2f for queue, wait and age", c.penalty)
		if c.powerNeed > 0 && c.load.PowerMeasured {
			s = strings.TrimSuffix(s, " and age") + fmt.Sprintf(", age and power (needs %.0f W, %d W of headroom)", c.powerNeed, c.load.EnergyHeadroomWatts)
		}
	}
	return s
}

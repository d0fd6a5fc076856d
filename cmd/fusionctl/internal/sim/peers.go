package sim

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/fusiond/fusiond/daemon/sched"
)

// DecentralOptions model fusiond's peers in a replay: every node is a
// daemon of its own, pods arrive at a daemon chosen at random, and a pod
// that does not fit there is handed over the way peers do it
// (docs/peers.md).
type DecentralOptions struct {
	// Delay is the gossip delay, in arrivals: every daemon's view of the
	// others' free resources is the cluster as it was up to Delay pods
	// ago (refreshed every Delay arrivals). 0 means 1 (fresh).
	Delay int
	// MaxOffers bounds the peers one pod is offered to (0: 8).
	MaxOffers int
	// Spread makes the arrival daemon rank itself with its peers (its own
	// node live, the others as gossiped) instead of placing on its own
	// node whenever the job fits there, as the daemon does within its
	// wait budget.
	Spread bool
	// Choice is the order of offers over the ranked candidates (the
	// daemon's peers.DefaultSpread; the zero value: always the best).
	Choice sched.SpreadChoice
	// NoCarryBack models answers that carry no fresh load: an origin sees
	// the peers it offered to as gossiped until the next refresh. By
	// default, as the daemon does, every acceptance or refusal carries
	// the peer's live load back and the origin sees that peer as it was
	// then until the next refresh.
	NoCarryBack bool
	// RankSelfBelow and RankSelfMargin are the poor-fit rule
	// (peers.rank_self.below, .margin) for a daemon that keeps what fits
	// (Spread false): when the engine's score of the pod on its own node
	// is below RankSelfBelow, it offers the pod to peers only if the best
	// peer by its view scores at least RankSelfMargin more, and places it
	// here when they all refuse. RankSelfBelow 0: off.
	RankSelfBelow, RankSelfMargin float64
}

// describe says what o models, for a table header.
func (o DecentralOptions) describe() string {
	s := fmt.Sprintf("delay %d, ", max(o.Delay, 1))
	if o.Spread {
		s += "ranked with peers"
	} else {
		s += "local first"
		if o.RankSelfBelow > 0 {
			s += fmt.Sprintf(", poor fit below %g by %g", o.RankSelfBelow, o.RankSelfMargin)
		}
	}
	s += fmt.Sprintf(", offers to 1 of the best %d", max(o.Choice.Top, 1))
	if o.Choice.Choices > 1 {
		s += fmt.Sprintf(" (best of %d sampled)", o.Choice.Choices)
	}
	if o.Choice.Within > 0 {
		s += fmt.Sprintf(" within %g", o.Choice.Within)
	}
	if o.NoCarryBack {
		s += ", no load carried back"
	}
	return s
}

// DecentralResult is RunDecentralised's account: the protocol's result
// and how the pods were placed.
type DecentralResult struct {
	RunResult
	// Local pods were placed on the daemon they arrived at; HandedOver
	// went to a peer; Refusals counts the offers peers refused because
	// their live state (re-checked) no longer had room the stale view
	// showed. RankedSelf counts the pods that fit locally and that the
	// poor-fit rule offered to peers (placed here again when every peer
	// refused).
	Local, HandedOver, Refusals, RankedSelf int
}

// healed is what an origin has learnt from its peers' answers since the
// last refresh: each answering peer's live node at its answer.
type healed struct {
	peer int
	node *sched.Node
}

// RunDecentralised replays workload over one daemon per node (in one
// process): each pod arrives at a random daemon (seeded), which places it
// on its own node with the policy if it fits (unless the poor-fit rule
// ranks it against its peers); otherwise it ranks its peers with the same
// policy over its gossiped, Delay-old view, offers the pod to one of the
// best by the spread choice, and the peer re-checks on its live node and
// accepts or refuses, its answer carrying its live load back to the
// origin; then the next, up to MaxOffers. The measurements are the
// protocol's (RunProtocol), so the two compare point for point.
func RunDecentralised(ctx context.Context, specs []NodeSpec, workload []Pod, policy string, seed uint64, frag *sched.FragModel, thresholds []float64, tie sched.TieBreak, o DecentralOptions) (DecentralResult, error) {
	p, ok := sched.PolicyByName(policy, frag, nil)
	if !ok {
		return DecentralResult{}, fmt.Errorf("%w: unknown policy %q", ErrBadOption, policy)
	}
	if err := o.Choice.Validate(); err != nil {
		return DecentralResult{}, fmt.Errorf("%w: %w", ErrBadOption, err)
	}
	if math.IsNaN(o.RankSelfBelow) || math.IsNaN(o.RankSelfMargin) || o.RankSelfBelow < 0 || o.RankSelfBelow > 1 || o.RankSelfMargin < 0 || o.RankSelfMargin > 1 {
		return DecentralResult{}, fmt.Errorf("%w: rank-self below %v, margin %v: each between 0 and 1", ErrBadOption, o.RankSelfBelow, o.RankSelfMargin)
	}
	o.Delay = max(o.Delay, 1)
	if o.MaxOffers <= 0 {
		o.MaxOffers = 8
	}
	live := BuildNodes(specs)
	if len(live) == 0 {
		return DecentralResult{}, fmt.Errorf("%w: no nodes", ErrBadOption)
	}
	view := make([]*sched.Node, len(live))
	// learnt[origin] holds what its peers' answers told it since the last
	// refresh (bounded: at most Delay·MaxOffers entries in all).
	learnt := make([][]healed, len(live))
	var touched []int
	refresh := func() {
		for i, n := range live {
			view[i] = n.Clone()
		}
		for _, i := range touched {
			learnt[i] = learnt[i][:0]
		}
		touched = touched[:0]
	}
	refresh()
	explain := 0
	if o.Choice.Top > 1 {
		explain = o.Choice.Top * o.Choice.Top // several choices may share a node
	}
	eng := sched.NewEngine(sched.Options{Policy: p, Seed: seed, TieBreak: tie, Explain: explain})
	rng := rand.New(rand.NewPCG(seed, 0x9ee75))
	choiceRng := rand.New(rand.NewPCG(seed, 0x5b7ead))
	res := DecentralResult{RunResult: RunResult{Policy: policy + "/peers", Seed: seed, Pods: len(workload), Thresholds: thresholds}}
	meter := newProtocolMeter(&res.RunResult, live, frag)
	// scoreOn scores req on live node i alone (the daemon's own check).
	scoreOn := func(req *sched.Request, i int) (float64, bool) {
		d, err := eng.Place(req, []*sched.Node{live[i]})
		return d.Score, err == nil
	}
	// placeOn places req on live node i alone.
	placeOn := func(req *sched.Request, i int) bool {
		one := []*sched.Node{live[i]}
		d, err := eng.Place(req, one)
		if err == nil {
			err = eng.Commit(req, &d.Assignment, one)
		}
		return err == nil
	}
	// answer records peer's answer to origin: its live load from now on.
	answer := func(origin, peer int) {
		if o.NoCarryBack {
			return
		}
		if len(learnt[origin]) == 0 {
			touched = append(touched, origin)
		}
		for k := range learnt[origin] {
			if learnt[origin][k].peer == peer {
				learnt[origin][k].node = live[peer].Clone()
				return
			}
		}
		learnt[origin] = append(learnt[origin], healed{peer, live[peer].Clone()})
	}
	var scores []float64
	var idx []int
	// choose ranks the nodes of view not in skip and picks one by the
	// spread choice; ok false when none has room by the view.
	choose := func(req *sched.Request, skip map[int]bool) (int, float64, bool) {
		d, err := eng.PlaceExcept(req, view, skip)
		if err != nil {
			return -1, 0, false
		}
		best := d.Assignment.NodeIdx
		if explain == 0 {
			return best, d.Score, true
		}
		scores, idx = append(scores[:0], d.Score), append(idx[:0], best)
		for _, c := range d.Candidates {
			if len(idx) < o.Choice.Top && !slices.Contains(idx, c.Index) {
				scores, idx = append(scores, c.Score), append(idx, c.Index)
			}
		}
		k := o.Choice.Order(scores, 1, choiceRng)[0]
		return idx[k], d.Score, true
	}
	start := time.Now()
	for i := range workload {
		if i%256 == 0 && ctx.Err() != nil {
			return res, ctx.Err()
		}
		if i%o.Delay == 0 {
			refresh()
		}
		req := workload[i].Request()
		origin := rng.IntN(len(live))
		// The origin's view: what its peers' answers told it, and its own
		// node live when it ranks itself with them.
		saved := learnt[origin][:0:0]
		for _, h := range learnt[origin] {
			saved = append(saved, healed{h.peer, view[h.peer]})
			view[h.peer] = h.node
		}
		placed, offer, poorFit := false, true, false
		skip := map[int]bool{}
		if !o.Spread {
			skip[origin] = true
			if s, fits := scoreOn(&req, origin); fits {
				offer = false
				if o.RankSelfBelow > 0 && s < o.RankSelfBelow {
					if _, best, ok := choose(&req, skip); ok && best-s >= o.RankSelfMargin {
						offer, poorFit = true, true
						res.RankedSelf++
					}
				}
				if !offer {
					placed = placeOn(&req, origin)
					res.Local++
				}
			}
		} else {
			view[origin] = live[origin]
		}
		for k := 0; offer && k < o.MaxOffers; k++ {
			peer, _, ok := choose(&req, skip)
			if !ok {
				break // no peer has room by the gossiped view
			}
			if placeOn(&req, peer) {
				placed = true
				if peer == origin {
					res.Local++
				} else {
					res.HandedOver++
					answer(origin, peer)
				}
				break
			}
			res.Refusals++
			skip[peer] = true
			answer(origin, peer)
		}
		if !placed && poorFit {
			// Every peer refused a pod that fits here: it is placed here.
			placed = placeOn(&req, origin)
			res.Local++
		}
		for _, h := range saved {
			view[h.peer] = h.node
		}
		if o.Spread {
			view[origin] = live[origin].Clone()
		}
		meter.pod(&req, placed)
	}
	res.Seconds = time.Since(start).Seconds()
	if res.Seconds > 0 {
		res.DecisionsPerSec = float64(len(workload)) / res.Seconds
	}
	return res, nil
}

// NewPeersCommand returns `simulate peers`: the decentralised replay
// beside the centralised one, one seed.
func NewPeersCommand() *cobra.Command {
	var (
		nodes, pods, trace, policy string
		seed                       uint64
		target                     float64
		o                          DecentralOptions
	)
	cmd := &cobra.Command{
		Use:   "peers",
		Short: "Replay a trace over one daemon per node handing pods over to peers, beside the centralised policy",
		Long: `simulate peers replays the protocol of fusionctl simulate over one fusiond per
node in one process: each pod arrives at a random daemon, which places it on
its own node when it fits (or, with --spread, ranks itself with its peers;
without it, the poor-fit rule --rank-self-below/--rank-self-margin ranks a
pod that fits poorly here against the peers), else offers it to peers
ranked by the same policy over a gossiped view --delay arrivals old, each
offer to one of the --offer-top best left (the daemon's spread choice); a
peer re-checks on its live node and accepts or refuses, and its answer
carries its live load back to the origin (--no-carry-back: not). The
defaults are what the daemon does. It prints the GPU allocation at each
threshold beside the centralised policy's, and the refused offers
(docs/peers.md).`,
		Example: "  fusionctl simulate peers --delay 50 --spread\n  fusionctl simulate peers --trace multigpu50 --delay 10",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts := Options{NodesPath: nodes, PodsPath: pods, Trace: trace, TargetPct: target}
			if err := opts.defaults(); err != nil {
				return err
			}
			specs, ps, err := load(&opts)
			if err != nil {
				return err
			}
			var capMilli int64
			for _, s := range specs {
				capMilli += int64(s.GPUs) * sched.MilliPerGPU
			}
			wl := Workload(ps, seed, target, capMilli)
			frag := ShapeModel(wl, opts.Coverage)
			central, err := RunProtocol(cmd.Context(), specs, wl, policy, seed, frag, opts.Thresholds, sched.TieRanked)
			if err != nil {
				return err
			}
			dec, err := RunDecentralised(cmd.Context(), specs, wl, policy, seed, frag, opts.Thresholds, sched.TieRanked, o)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "input: %s\n", describeInput(&opts, len(ps), len(specs)))
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "ARRIVED\tCENTRALISED %s\tPEERS (%s)\n", policy, o.describe())
			for i, th := range opts.Thresholds {
				fmt.Fprintf(w, "%.0f%%\t%s\t%s\n", th, fmtPct(central.AllocPct[i]), fmtPct(dec.AllocPct[i]))
			}
			fmt.Fprintf(w, "\npods %d: placed where they arrived %d, handed over %d, failed %d (centralised %d); offers refused on re-check %d; fitting pods the poor-fit rule offered to peers %d\n",
				len(wl), dec.Local, dec.HandedOver, dec.Failed, central.Failed, dec.Refusals, dec.RankedSelf)
			return w.Flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&nodes, "nodes", "", "node list CSV (openb format; plain, zstd or gzip); default: the embedded openb node list")
	f.StringVar(&pods, "pods", "", "pod list CSV (openb format; plain, zstd or gzip) instead of an embedded trace")
	f.StringVar(&trace, "trace", "", "the embedded openb pod list when --pods is not given (default \"default\"; fusionctl simulate --list-traces)")
	f.StringVar(&policy, "policy", "fusiond", "the policy every daemon ranks with")
	f.Uint64Var(&seed, "seed", 42, "seed of the workload and the arrival daemons")
	f.Float64Var(&target, "target", 130, "resample the workload to this % of GPU capacity")
	f.IntVar(&o.Delay, "delay", 50, "gossip delay: each daemon's view of its peers is this many arrivals old")
	f.IntVar(&o.MaxOffers, "max-offers", 8, "peers one pod is offered to at most")
	f.BoolVar(&o.Spread, "spread", false, "the arrival daemon ranks itself with its peers instead of keeping every pod that fits")
	def := sched.DefaultSpread()
	f.IntVar(&o.Choice.Top, "offer-top", def.Top, "spread choice of offers: each offer goes to one of this many best-ranked candidates left (1: always the best)")
	f.IntVar(&o.Choice.Choices, "offer-choices", def.Choices, "spread choice: sample this many of them and offer to the best-ranked sampled (0 or 1: a uniform pick)")
	f.Float64Var(&o.Choice.Within, "offer-within", def.Within, "spread choice: leave out of the draw candidates scoring more than this below the best left (0: no bound)")
	f.BoolVar(&o.NoCarryBack, "no-carry-back", false, "answers carry no fresh load back (the origin sees the peers it offered to as gossiped until the next refresh)")
	f.Float64Var(&o.RankSelfBelow, "rank-self-below", 0.5, "poor-fit rule without --spread (peers.rank_self.below): a pod that fits here with an engine score below this is offered to peers when the best scores --rank-self-margin more (0: off)")
	f.Float64Var(&o.RankSelfMargin, "rank-self-margin", 0.1, "poor-fit rule: the margin a peer's score must exceed the local score by (peers.rank_self.margin)")
	return cmd
}

package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
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
}

// DecentralResult is RunDecentralised's account: the protocol's result
// and how the pods were placed.
type DecentralResult struct {
	RunResult
	// Local pods fit on the daemon they arrived at; HandedOver went to a
	// peer; Refusals counts the offers peers refused because their live
	// state (re-checked) no longer had room the stale view showed.
	Local, HandedOver, Refusals int
}

// RunDecentralised replays workload over one daemon per node (in one
// process): each pod arrives at a random daemon (seeded), which places it
// on its own node with the policy if it fits; otherwise it ranks its
// peers with the same policy over its gossiped, Delay-old view, offers the
// pod to the best, and the peer re-checks on its live node and accepts or
// refuses; then the next, up to MaxOffers. The measurements are the
// protocol's (RunProtocol), so the two compare point for point.
func RunDecentralised(ctx context.Context, specs []NodeSpec, workload []Pod, policy string, seed uint64, frag *sched.FragModel, thresholds []float64, tie sched.TieBreak, o DecentralOptions) (DecentralResult, error) {
	p, ok := sched.PolicyByName(policy, frag, nil)
	if !ok {
		return DecentralResult{}, fmt.Errorf("%w: unknown policy %q", ErrBadOption, policy)
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
	refresh := func() {
		for i, n := range live {
			view[i] = n.Clone()
		}
	}
	refresh()
	eng := sched.NewEngine(sched.Options{Policy: p, Seed: seed, TieBreak: tie})
	rng := rand.New(rand.NewPCG(seed, 0x9ee75))
	res := DecentralResult{RunResult: RunResult{Policy: policy + "/peers", Seed: seed, Pods: len(workload), Thresholds: thresholds}}
	meter := newProtocolMeter(&res.RunResult, live, frag)
	// placeOn places req on live node i alone (the daemon's own check).
	placeOn := func(req *sched.Request, i int) bool {
		one := []*sched.Node{live[i]}
		d, err := eng.Place(req, one)
		if err == nil {
			err = eng.Commit(req, &d.Assignment, one)
		}
		return err == nil
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
		placed := false
		skip := map[int]bool{}
		if !o.Spread {
			placed = placeOn(&req, origin)
			skip[origin] = true
		} else {
			view[origin] = live[origin]
		}
		if placed {
			res.Local++
		} else {
			for range o.MaxOffers {
				d, err := eng.PlaceExcept(&req, view, skip)
				if err != nil {
					break // no peer has room by the gossiped view
				}
				peer := d.Assignment.NodeIdx
				if placeOn(&req, peer) {
					placed = true
					if peer == origin {
						res.Local++
					} else {
						res.HandedOver++
					}
					break
				}
				res.Refusals++
				skip[peer] = true
			}
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
its own node when it fits (or, with --spread, ranks itself with its peers),
else offers it to peers ranked by the same policy over a gossiped view
--delay arrivals old; a peer re-checks on its live node and accepts or
refuses. It prints the GPU allocation at each threshold beside the
centralised policy's (docs/peers.md).`,
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
			fmt.Fprintf(w, "ARRIVED\tCENTRALISED %s\tPEERS (delay %d, spread %v)\n", policy, max(o.Delay, 1), o.Spread)
			for i, th := range opts.Thresholds {
				fmt.Fprintf(w, "%.0f%%\t%s\t%s\n", th, fmtPct(central.AllocPct[i]), fmtPct(dec.AllocPct[i]))
			}
			fmt.Fprintf(w, "\npods %d: placed where they arrived %d, handed over %d, failed %d (centralised %d); offers refused on re-check %d\n",
				len(wl), dec.Local, dec.HandedOver, dec.Failed, central.Failed, dec.Refusals)
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
	return cmd
}

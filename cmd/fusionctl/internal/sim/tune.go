package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/fusiond/fusiond/daemon/sched"
)

// TuneOptions configure Tune: a search over fusiond's fragmentation
// parameters (sched.FragParams) on the protocol's replay, choosing on the
// train seeds and reporting the test seeds only.
type TuneOptions struct {
	// NodesPath is the node list ("": the embedded openb one); the
	// traces scored together are the files PodsPaths and the embedded
	// pod lists Traces names (openb.Traces), one or more in all.
	NodesPath  string
	PodsPaths  []string
	Traces     []string
	TrainSeeds []uint64
	TestSeeds  []uint64
	TargetPct  float64 // 130 by default
	Coverage   float64 // 0.95 by default
	Workers    int
	// Passes bounds the coordinate-descent passes (0: 2).
	Passes int
	// Start is the point the search starts from (nil: the defaults).
	Start *sched.FragParams
	// Only names the parameters searched (as ParseFragParams takes
	// them; empty: all of tuneGrid).
	Only []string
}

// tuneTrace is one trace's inputs, with each seed's workload and shapes.
type tuneTrace struct {
	name  string
	specs []NodeSpec
	wl    map[uint64][]Pod
	frag  map[uint64]*sched.FragModel
}

// tuneScore is the mean over a trace's seeds of one variant: allocation at
// the target and 8-GPU pods failed by 100 % arrived.
type tuneScore struct {
	alloc, big100 float64
}

// tuneParam is one searched parameter: its name (as ParseFragParams
// takes it) and the values tried, each a setter returning the value's text.
type tuneParam struct {
	name   string
	values []func(*sched.FragParams) string
}

// tuneGrid is what the search tries, one parameter at a time (coordinate
// descent from the defaults, two passes).
var tuneGrid = []tuneParam{
	{"reserve_steps", []func(*sched.FragParams) string{
		setSteps(3), setSteps(5), setSteps(10), setSteps(20), setSteps(50)}},
	{"reserve_frac", []func(*sched.FragParams) string{
		setFrac(0.25), setFrac(0.5), setFrac(0.75), setFrac(1)}},
	{"reserve_max_share", []func(*sched.FragParams) string{
		setMaxShare(0.02), setMaxShare(0.03), setMaxShare(0.04), setMaxShare(0.05), setMaxShare(0.1), setMaxShare(1)}},
	{"reserve_uncovered", []func(*sched.FragParams) string{setUncovered(false), setUncovered(true)}},
	{"tail", []func(*sched.FragParams) string{
		setTail(sched.TailCapacityCPUOnly), setTail(sched.TailNone), setTail(sched.TailCapacityAll), setTail(sched.TailStrandAll), setTail(sched.TailStrandGPU)}},
	{"sliver_mass", []func(*sched.FragParams) string{
		setSliver(0), setSliver(0.05), setSliver(0.2), setSliver(0.5)}},
	{"full_nodes_as_fgd", []func(*sched.FragParams) string{setFullNodes(false), setFullNodes(true)}},
	{"exact_last", []func(*sched.FragParams) string{setExact(false), setExact(true)}},
	// The CPU-only rule's thresholds lie between the CPU-only shares of
	// the openb pod lists' typical shapes (0 to 0.31); 1 is never.
	{"cpu_only_tail_max", cpuOnlyGrid(setTailMax)},
	{"cpu_only_full_max", cpuOnlyGrid(setFullMax)},
	{"reserve_off_keeps_cpu_keys", []func(*sched.FragParams) string{setKeepCPUKeys(false), setKeepCPUKeys(true)}},
}

func setSteps(v int) func(*sched.FragParams) string {
	return func(p *sched.FragParams) string { p.ReserveSteps = v; return fmt.Sprint(v) }
}
func setFrac(v float64) func(*sched.FragParams) string {
	return func(p *sched.FragParams) string { p.ReserveFrac = v; return fmt.Sprint(v) }
}
func setMaxShare(v float64) func(*sched.FragParams) string {
	return func(p *sched.FragParams) string { p.ReserveMaxShare = v; return fmt.Sprint(v) }
}
func setUncovered(v bool) func(*sched.FragParams) string {
	return func(p *sched.FragParams) string { p.ReserveUncovered = v; return fmt.Sprint(v) }
}
func setTail(v sched.TailKey) func(*sched.FragParams) string {
	return func(p *sched.FragParams) string { p.Tail = v; return v.String() }
}
func setSliver(v float64) func(*sched.FragParams) string {
	return func(p *sched.FragParams) string { p.SliverMass = v; return fmt.Sprint(v) }
}
func setFullNodes(v bool) func(*sched.FragParams) string {
	return func(p *sched.FragParams) string { p.FullNodesAsFGD = v; return fmt.Sprint(v) }
}
func setExact(v bool) func(*sched.FragParams) string {
	return func(p *sched.FragParams) string { p.ExactLast = v; return fmt.Sprint(v) }
}

func setTailMax(v float64) func(*sched.FragParams) string {
	return func(p *sched.FragParams) string { p.CPUOnlyTailMax = v; return fmt.Sprint(v) }
}
func setFullMax(v float64) func(*sched.FragParams) string {
	return func(p *sched.FragParams) string { p.CPUOnlyFullMax = v; return fmt.Sprint(v) }
}

func setKeepCPUKeys(v bool) func(*sched.FragParams) string {
	return func(p *sched.FragParams) string { p.ReserveOffKeepsCPUKeys = v; return fmt.Sprint(v) }
}

// cpuOnlyGrid is the CPU-only rule's thresholds tried, for one of its
// setters.
func cpuOnlyGrid(set func(float64) func(*sched.FragParams) string) []func(*sched.FragParams) string {
	var out []func(*sched.FragParams) string
	for _, v := range []float64{0.05, 0.1, 0.15, 0.175, 0.2, 0.225, 0.25, 0.275, 0.3, 1} {
		out = append(out, set(v))
	}
	return out
}

func fmtParams(p sched.FragParams) string {
	return fmt.Sprintf("reserve_steps=%d reserve_frac=%g reserve_max_share=%g reserve_uncovered=%t tail=%s sliver_mass=%g full_nodes_as_fgd=%t exact_last=%t cpu_only_tail_max=%g cpu_only_full_max=%g reserve_off_keeps_cpu_keys=%t", p.ReserveSteps, p.ReserveFrac, p.ReserveMaxShare, p.ReserveUncovered, p.Tail, p.SliverMass, p.FullNodesAsFGD, p.ExactLast, p.CPUOnlyTailMax, p.CPUOnlyFullMax, p.ReserveOffKeepsCPUKeys)
}

// Tune searches sched.FragParams by coordinate descent from the defaults
// on the train seeds: the objective is the mean over traces of fusiond's
// allocation at the target minus FGD's, less one point per 8-GPU pod
// (mean over seeds, summed over traces) fusiond fails by 100 % arrived
// beyond FGD. It then writes, for the test seeds only, the defaults, the
// chosen parameters and FGD per trace.
func Tune(ctx context.Context, o TuneOptions, w io.Writer) error {
	if o.TargetPct == 0 {
		o.TargetPct = 130
	}
	if o.Coverage == 0 {
		o.Coverage = 0.95
	}
	if o.Workers <= 0 {
		o.Workers = 1
	}
	var inputs []Options
	for _, pp := range o.PodsPaths {
		inputs = append(inputs, Options{NodesPath: o.NodesPath, PodsPath: pp})
	}
	for _, tr := range o.Traces {
		inputs = append(inputs, Options{NodesPath: o.NodesPath, Trace: tr})
	}
	if len(inputs) == 0 {
		return fmt.Errorf("%w: --tune needs one or more traces (--trace or --pods)", ErrBadOption)
	}
	grid := tuneGrid
	if len(o.Only) > 0 {
		grid = nil
		for _, name := range o.Only {
			i := slices.IndexFunc(tuneGrid, func(g tuneParam) bool { return g.name == name })
			if i < 0 {
				return fmt.Errorf("%w: --tune-only %q: not a parameter --tune searches", ErrBadOption, name)
			}
			grid = append(grid, tuneGrid[i])
		}
	}
	if len(o.TrainSeeds) == 0 || len(o.TestSeeds) == 0 {
		return fmt.Errorf("%w: --tune needs train and test seeds", ErrBadOption)
	}
	for _, a := range o.TrainSeeds {
		for _, b := range o.TestSeeds {
			if a == b {
				return fmt.Errorf("%w: seed %d is both a train and a test seed", ErrBadOption, a)
			}
		}
	}
	var traces []*tuneTrace
	for i := range inputs {
		in := &inputs[i]
		specs, pods, err := load(in)
		if err != nil {
			return err
		}
		var capMilli int64
		for _, s := range specs {
			capMilli += int64(s.GPUs) * sched.MilliPerGPU
		}
		t := &tuneTrace{name: strings.TrimPrefix(traceName(in), "openb_pod_list_"), specs: specs, wl: map[uint64][]Pod{}, frag: map[uint64]*sched.FragModel{}}
		for _, s := range append(append([]uint64{}, o.TrainSeeds...), o.TestSeeds...) {
			t.wl[s] = Workload(pods, s, o.TargetPct, capMilli)
			t.frag[s] = ShapeModel(t.wl[s], o.Coverage)
		}
		traces = append(traces, t)
	}
	th := []float64{o.TargetPct}
	// eval runs fusiond with params (fgd when nil) on every trace × seed.
	// memo holds each run's score by trace, seed and the parameters the
	// policy resolves on that seed's shapes (FragParams.Effective; FGD
	// has none): variants that resolve alike on a trace — thresholds of
	// the CPU-only rule on the same side of its CPU-only share — make
	// the same decisions, so they run once.
	type memoKey struct {
		t      int
		seed   uint64
		fgd    bool
		params sched.FragParams
	}
	memo := map[memoKey]tuneScore{}
	eval := func(params *sched.FragParams, seeds []uint64) ([]tuneScore, error) {
		type job struct{ t, s int }
		out := make([]tuneScore, len(traces))
		key := func(j job) memoKey {
			t, seed := traces[j.t], seeds[j.s]
			if params == nil {
				return memoKey{t: j.t, seed: seed, fgd: true}
			}
			// The rule's thresholds have acted once resolved: variants
			// differing in them alone resolve to the same policy.
			e := params.Effective(t.frag[seed])
			e.CPUOnlyTailMax, e.CPUOnlyFullMax = 0, 0
			return memoKey{t: j.t, seed: seed, params: e}
		}
		add := func(j job, sc tuneScore) {
			out[j.t].alloc += sc.alloc / float64(len(seeds))
			out[j.t].big100 += sc.big100 / float64(len(seeds))
		}
		jobs := make(chan job)
		var mu sync.Mutex
		var firstErr error
		var wg sync.WaitGroup
		for range o.Workers {
			wg.Go(func() {
				for j := range jobs {
					t, seed := traces[j.t], seeds[j.s]
					var p sched.Policy
					name := "fgd"
					if params == nil {
						p = sched.NewFGD(t.frag[seed])
					} else {
						wp := sched.NewWeighted(nil, t.frag[seed])
						wp.Frag = *params
						p, name = wp, "fusiond"
					}
					r, err := runProtocol(ctx, t.specs, t.wl[seed], p, name, seed, t.frag[seed], th, sched.TieRanked, replayOpts{dedupe: dedupable(p, sched.TieRanked)})
					mu.Lock()
					if err != nil && firstErr == nil {
						firstErr = err
					}
					if err == nil {
						sc := tuneScore{alloc: r.AllocPct[0], big100: bigBy100(r)}
						memo[key(j)] = sc
						add(j, sc)
					}
					mu.Unlock()
				}
			})
		}
		for ti := range traces {
			for si := range seeds {
				j := job{ti, si}
				mu.Lock()
				sc, ok := memo[key(j)]
				if ok {
					add(j, sc)
				}
				mu.Unlock()
				if !ok {
					jobs <- j
				}
			}
		}
		close(jobs)
		wg.Wait()
		return out, firstErr
	}
	fgdTrain, err := eval(nil, o.TrainSeeds)
	if err != nil {
		return err
	}
	// detail is the mean allocation gain over FGD and the excess 8-GPU
	// pods, per trace.
	detail := func(s []tuneScore) string {
		var b strings.Builder
		for i := range s {
			fmt.Fprintf(&b, " %s %+.2f/%+.1f", traces[i].name, s[i].alloc-fgdTrain[i].alloc, s[i].big100-fgdTrain[i].big100)
		}
		return b.String()
	}
	objective := func(s []tuneScore) float64 {
		var v float64
		for i := range s {
			v += (s[i].alloc - fgdTrain[i].alloc) / float64(len(s))
			v -= max(0, s[i].big100-fgdTrain[i].big100)
		}
		return v
	}
	best := sched.DefaultFragParams()
	if o.Start != nil {
		best = *o.Start
	}
	bs, err := eval(&best, o.TrainSeeds)
	if err != nil {
		return err
	}
	bestObj := objective(bs)
	fmt.Fprintf(w, "train seeds %v, traces %d: objective = mean(fusiond − FGD at %.0f %%) − excess 8-GPU pods failed by 100 %%; per trace: allocation − FGD / 8-GPU pods failed by 100 %% − FGD's\n", o.TrainSeeds, len(traces), o.TargetPct)
	fmt.Fprintf(w, "start  %+.3f  %s |%s\n", bestObj, fmtParams(best), detail(bs))
	if o.Passes <= 0 {
		o.Passes = 2
	}
	for pass := 1; pass <= o.Passes; pass++ {
		improved := false
		for _, g := range grid {
			for _, set := range g.values {
				cand := best
				v := set(&cand)
				if cand == best {
					continue
				}
				s, err := eval(&cand, o.TrainSeeds)
				if err != nil {
					return err
				}
				obj := objective(s)
				fmt.Fprintf(w, "pass %d %s=%-12s %+.3f |%s\n", pass, g.name, v, obj, detail(s))
				if obj > bestObj+1e-9 {
					best, bestObj, improved = cand, obj, true
				}
			}
		}
		fmt.Fprintf(w, "after pass %d  %+.3f  %s\n", pass, bestObj, fmtParams(best))
		if !improved {
			break
		}
	}
	def := sched.DefaultFragParams()
	fgdTest, err := eval(nil, o.TestSeeds)
	if err != nil {
		return err
	}
	defTest, err := eval(&def, o.TestSeeds)
	if err != nil {
		return err
	}
	bestTest, err := eval(&best, o.TestSeeds)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "\ntest seeds %v only (allocation %% at %.0f %% / 8-GPU pods failed by 100 %% arrived)\n", o.TestSeeds, o.TargetPct)
	fmt.Fprintf(w, "chosen: %s\n\n| trace | fgd | fusiond defaults | fusiond chosen |\n|---|---|---|---|\n", fmtParams(best))
	for i, t := range traces {
		fmt.Fprintf(w, "| %s | %.2f / %.1f | %.2f / %.1f | %.2f / %.1f |\n", t.name, fgdTest[i].alloc, fgdTest[i].big100, defTest[i].alloc, defTest[i].big100, bestTest[i].alloc, bestTest[i].big100)
	}
	return nil
}

// bigBy100 is the 8-GPU (largest-node) pods r had failed when 100 % had
// arrived.
func bigBy100(r RunResult) float64 {
	for i, f := range r.FailAt {
		if i < len(FailThresholds) && FailThresholds[i] == 100 {
			return f.BigPods
		}
	}
	return 0
}

// ParseFragParams parses --frag: comma-separated name=value pairs over
// the defaults (sched.DefaultFragParams), names as fmtParams writes them.
func ParseFragParams(s string) (*sched.FragParams, error) {
	p := sched.DefaultFragParams()
	for kv := range strings.SplitSeq(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("%w: --frag %q: want name=value", ErrBadOption, kv)
		}
		var err error
		switch k {
		case "reserve_steps":
			p.ReserveSteps, err = strconv.Atoi(v)
			if err == nil && p.ReserveSteps < 1 {
				err = errors.New("below 1")
			}
		case "reserve_frac":
			p.ReserveFrac, err = strconv.ParseFloat(v, 64)
			if err == nil && (p.ReserveFrac <= 0 || p.ReserveFrac > 1) {
				err = errors.New("not in (0, 1]")
			}
		case "reserve_max_share":
			p.ReserveMaxShare, err = strconv.ParseFloat(v, 64)
			if err == nil && (p.ReserveMaxShare <= 0 || p.ReserveMaxShare > 1) {
				err = errors.New("not in (0, 1]")
			}
		case "reserve_uncovered":
			p.ReserveUncovered, err = strconv.ParseBool(v)
		case "tail":
			err = errors.New("unknown tail")
			for t := range sched.NumTails {
				if t.String() == v {
					p.Tail, err = t, nil
				}
			}
		case "sliver_mass":
			p.SliverMass, err = strconv.ParseFloat(v, 64)
			if err == nil && (p.SliverMass < 0 || p.SliverMass > 1) {
				err = errors.New("not in [0, 1]")
			}
		case "full_nodes_as_fgd":
			p.FullNodesAsFGD, err = strconv.ParseBool(v)
		case "reserve_off_keeps_cpu_keys":
			p.ReserveOffKeepsCPUKeys, err = strconv.ParseBool(v)
		case "exact_last":
			p.ExactLast, err = strconv.ParseBool(v)
		case "cpu_only_tail_max", "cpu_only_full_max":
			var f float64
			f, err = strconv.ParseFloat(v, 64)
			if err == nil && (f <= 0 || f > 1) {
				err = errors.New("not in (0, 1]")
			}
			if k == "cpu_only_tail_max" {
				p.CPUOnlyTailMax = f
			} else {
				p.CPUOnlyFullMax = f
			}
		default:
			err = errors.New("unknown parameter")
		}
		if err != nil {
			return nil, fmt.Errorf("%w: --frag %q: %w", ErrBadOption, kv, err)
		}
	}
	return &p, nil
}

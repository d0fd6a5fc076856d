package sim

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/fusiond/fusiond/cmd/fusionctl/internal/sim/openb"
	"github.com/fusiond/fusiond/daemon/sched"
)

// ErrBadOption means an option is invalid.
var ErrBadOption = errors.New("sim: bad option")

// Options configure Run.
type Options struct {
	// NodesPath and PodsPath are the node and pod list files (CSV, plain
	// or compressed with zstd or gzip). An empty NodesPath is the openb
	// node list embedded in fusionctl; an empty PodsPath is the embedded
	// pod list Trace names.
	NodesPath string
	PodsPath  string
	// Trace names an embedded openb pod list (openb.Traces: "default",
	// "multigpu50", ...), read when PodsPath is empty; openb.DefaultTrace
	// when both are empty.
	Trace    string
	Policies []string
	Seeds    []uint64
	// TargetPct is the resampling target (% of GPU capacity), 130 by default.
	TargetPct float64
	// Thresholds are the arrived-request points reported, 100/110/120/130
	// by default.
	Thresholds []float64
	// Coverage is the share of requests the typical shapes cover (0.95).
	Coverage float64
	// Format is table, json or csv.
	Format string
	// CSVDir, when set, receives one CSV file (the allocation curve) per run.
	CSVDir string
	// PlotPaths receive the pictures (.svg or .png by extension): the
	// allocation and failed-request curves of the protocol, or the
	// utilisation over time and (at WaitPlotPath) the wait CDF of the
	// time-ordered mode.
	PlotPaths []string
	// Timed selects the time-ordered mode; LoadPct scales its lifetimes
	// to that offered GPU load (see TimedOptions).
	Timed   bool
	LoadPct float64
	// Estimates are the timed mode's backfill run-time estimate modes
	// (TimedOptions.Estimates), each policy run once per mode; none: one
	// run without, and no estimates table.
	Estimates []string
	// GPUPower overrides the timed mode's power model (idle and TDP watts
	// per GPU model; see PowerModel).
	GPUPower map[string][2]float64
	// GPUTFLOPS overrides its dense FP16 TFLOPS per GPU model.
	GPUTFLOPS map[string]float64
	// Workers bounds parallel runs (GOMAXPROCS by default).
	Workers int
	// RandomTies breaks score ties at random per decision (the stock
	// Kubernetes scheduler) instead of by a seeded node ranking (the FGD
	// paper's simulator, the default).
	RandomTies bool
	// Frag, when set, replaces fusiond's fragmentation parameters
	// (--frag, ParseFragParams).
	Frag *sched.FragParams
	// Moves, when above 0, is the protocol's --moves variant: a pod that
	// fits nowhere may have best-effort pods moved for it, at most Moves
	// per 1,000 arrivals; every run is then also made without moves
	// (RunResult.NoMoveAllocPct).
	Moves  int
	Logger *slog.Logger
}

func (o *Options) defaults() error {
	if o.TargetPct == 0 {
		o.TargetPct = 130
	}
	if len(o.Thresholds) == 0 {
		o.Thresholds = []float64{100, 110, 120, 130}
	}
	if o.Coverage == 0 {
		o.Coverage = 0.95
	}
	if len(o.Seeds) == 0 {
		o.Seeds = []uint64{42}
	}
	if len(o.Policies) == 0 {
		o.Policies = []string{"fusiond"}
	}
	if o.Format == "" {
		o.Format = "table"
	}
	if o.Workers <= 0 {
		o.Workers = runtime.GOMAXPROCS(0)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case o.Moves < 0:
		return fmt.Errorf("%w: --moves %d: want 0 or more moves per 1,000 arrivals", ErrBadOption, o.Moves)
	case o.Moves > 1000:
		return fmt.Errorf("%w: --moves %d: at most 1000 moves per 1,000 arrivals", ErrBadOption, o.Moves)
	case o.Moves > 0 && o.Timed:
		return fmt.Errorf("%w: --moves applies to the protocol replay, not to --timed", ErrBadOption)
	}
	switch o.Format {
	case "table", "json", "csv":
	default:
		return fmt.Errorf("%w: output format %q (table|json|csv)", ErrBadOption, o.Format)
	}
	for _, p := range o.Policies {
		if _, ok := sched.PolicyByName(p, nil, nil); !ok {
			return fmt.Errorf("%w: unknown policy %q", ErrBadOption, p)
		}
	}
	switch {
	case o.PodsPath != "" && o.Trace != "":
		return fmt.Errorf("%w: --trace names an embedded pod list and --pods a file: give one", ErrBadOption)
	case o.PodsPath == "" && o.Trace == "":
		o.Trace = openb.DefaultTrace
	}
	if o.PodsPath == "" {
		if _, err := openb.PodList(o.Trace); err != nil {
			return fmt.Errorf("%w: --trace: %w", ErrBadOption, err)
		}
	}
	return nil
}

// Summary is the mean over seeds of one policy.
type Summary struct {
	Trace      string    `json:"trace"`
	Policy     string    `json:"policy"`
	Seeds      int       `json:"seeds"`
	Thresholds []float64 `json:"thresholds"`
	AllocPct   []float64 `json:"alloc_pct"`
	FragPct    []float64 `json:"frag_pct"`
	Failed     float64   `json:"failed"`
	// FailAt is the mean of the runs' FailAt (FailThresholds).
	FailAt          []FailPoint `json:"fail_at"`
	Seconds         float64     `json:"seconds"`
	DecisionsPerSec float64     `json:"decisions_per_sec"`
	// ToBoundPct is the distance to the bound at the last threshold:
	// the runs' BoundPct minus their allocation there, mean over seeds.
	ToBoundPct float64 `json:"to_bound_pct"`
	// Moves is the --moves budget (per 1,000 arrivals); the rest are means
	// over seeds of the runs' figures: moves made, the same per 1,000
	// arrivals, pods moved, arrivals placed thanks to moves, and the
	// allocation without moves.
	Moves          int       `json:"moves,omitempty"`
	MovesUsed      float64   `json:"moves_used,omitempty"`
	MovesPer1000   float64   `json:"moves_per_1000,omitempty"`
	PodsMoved      float64   `json:"pods_moved,omitempty"`
	PlacedByMoves  float64   `json:"placed_by_moves,omitempty"`
	NoMoveAllocPct []float64 `json:"no_move_alloc_pct,omitempty"`
	// Idle and NoMoveIdle are the runs' (RunResult), mean over seeds.
	Idle       *IdleGPUs `json:"idle,omitempty"`
	NoMoveIdle *IdleGPUs `json:"no_move_idle,omitempty"`
}

// Report is what Run writes.
type Report struct {
	Trace string `json:"trace"`
	Nodes int    `json:"nodes"`
	GPUs  int    `json:"gpus"`
	// Input says where the node and pod lists were read from.
	Input  string `json:"input"`
	Shapes string `json:"shapes"`
	// BigGPUs is the largest node's GPU count (a big pod asks for that many).
	BigGPUs int `json:"big_gpus"`
	// BoundPct is Bound's Pct at the last threshold, mean over seeds: no
	// policy can allocate more. LooseBoundPct is the same without forced
	// pods (Bound's LoosePct); ForcedPods and ArrivedGPUPods are Bound's
	// Forced and Arrived, mean over seeds.
	BoundPct       float64       `json:"bound_pct"`
	LooseBoundPct  float64       `json:"loose_bound_pct"`
	ForcedPods     float64       `json:"forced_pods"`
	ArrivedGPUPods float64       `json:"arrived_gpu_pods"`
	Summaries      []Summary     `json:"summaries"`
	Runs           []RunResult   `json:"runs"`
	Timed          []TimedResult `json:"timed,omitempty"`
}

func load(o *Options) ([]NodeSpec, []Pod, error) {
	specs, err := readInput(o.NodesPath, openb.NodeList, ReadNodes)
	if err != nil {
		return nil, nil, err
	}
	podList := ""
	if o.PodsPath == "" {
		if podList, err = openb.PodList(o.Trace); err != nil {
			return nil, nil, fmt.Errorf("%w: --trace: %w", ErrBadOption, err)
		}
	}
	pods, err := readInput(o.PodsPath, podList, ReadPods)
	if err != nil {
		return nil, nil, err
	}
	return specs, pods, nil
}

// readInput reads one list with read: the file at path (plain or
// compressed), or the embedded openb file when path is "".
func readInput[T any](path, embedded string, read func(io.Reader) ([]T, error)) ([]T, error) {
	var (
		r    io.ReadCloser
		err  error
		name = path
	)
	if path == "" {
		r, err = openb.Open(embedded)
		name = embedded + " (embedded)"
	} else {
		r, err = openb.OpenFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	defer r.Close()
	out, err := read(r)
	if err != nil {
		return nil, fmt.Errorf("sim: %s: %w", name, err)
	}
	return out, nil
}

// ReadTrace reads a pod list given as a file (plain or compressed) or,
// where no file has that name, as the name of an embedded openb trace
// ("default", "openb_pod_list_multigpu50", ...).
func ReadTrace(fileOrTrace string) ([]Pod, error) {
	if _, err := os.Stat(fileOrTrace); err == nil {
		return readInput(fileOrTrace, "", ReadPods)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("sim: %w", err)
	}
	name, err := openb.PodList(fileOrTrace)
	if err != nil {
		return nil, fmt.Errorf("sim: no file %s, and %w", fileOrTrace, err)
	}
	return readInput("", name, ReadPods)
}

// traceName is the name a report gives the pod list: its file name
// without ".csv" (and ".zst" or ".gz"), the same for the embedded file
// and a copy of it on disk.
func traceName(o *Options) string {
	p := o.PodsPath
	if p == "" {
		p, _ = openb.PodList(o.Trace) // checked by defaults
	}
	base := filepath.Base(p)
	for _, ext := range []string{".zst", ".gz", ".csv"} {
		base = strings.TrimSuffix(base, ext)
	}
	return base
}

// describeInput is Report.Input: which files were read, and how to pick
// others when they were the embedded ones.
func describeInput(o *Options, pods, nodes int) string {
	var parts []string
	if o.PodsPath == "" {
		parts = append(parts, fmt.Sprintf("embedded openb trace %q (%d pods)", strings.TrimPrefix(traceName(o), "openb_pod_list_"), pods))
	} else {
		parts = append(parts, fmt.Sprintf("pods from %s (%d)", o.PodsPath, pods))
	}
	if o.NodesPath == "" {
		parts = append(parts, fmt.Sprintf("the embedded openb node list (%d nodes)", nodes))
	} else {
		parts = append(parts, fmt.Sprintf("nodes from %s (%d)", o.NodesPath, nodes))
	}
	s := strings.Join(parts, " on ")
	if o.PodsPath == "" || o.NodesPath == "" {
		s += "; fusionctl simulate --list-traces lists the embedded traces, --nodes/--pods read your own files"
	}
	return s
}

// Simulate runs every policy × seed of the protocol and returns the
// report without writing it.
func Simulate(ctx context.Context, o Options) (*Report, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	specs, pods, err := load(&o)
	if err != nil {
		return nil, err
	}
	trace := traceName(&o)
	rep := &Report{Trace: trace, Input: describeInput(&o, len(pods), len(specs)), Nodes: len(specs), Shapes: fmt.Sprintf("learned from the resampled workload of each seed (top %.0f%% of requests), as FGD is primed", o.Coverage*100)}
	var capMilli int64
	for _, s := range specs {
		rep.BigGPUs = max(rep.BigGPUs, s.GPUs)
		rep.GPUs += s.GPUs
		capMilli += int64(s.GPUs) * sched.MilliPerGPU
	}
	if o.Timed {
		modes := o.Estimates
		if len(modes) == 0 {
			modes = []string{""}
		}
		for _, pol := range o.Policies {
			for _, m := range modes {
				r, err := RunTimed(ctx, specs, pods, pol, o.Seeds[0], o.Coverage, TimedOptions{LoadPct: o.LoadPct, Power: o.GPUPower, TFLOPS: o.GPUTFLOPS, Estimates: m})
				if err != nil {
					return nil, err
				}
				rep.Timed = append(rep.Timed, r)
			}
		}
		splitAgainstSpread(rep.Timed)
		return rep, nil
	}
	// The bound of each seed, o.Workers at a time.
	perSeed := make([]BoundResult, len(o.Seeds))
	errs := make([]error, len(o.Seeds))
	sem := make(chan struct{}, o.Workers)
	var bwg sync.WaitGroup
	for i, seed := range o.Seeds {
		bwg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			perSeed[i], errs[i] = Bound(specs, Workload(pods, seed, o.TargetPct, capMilli), o.Thresholds[len(o.Thresholds)-1])
		})
	}
	bwg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	bounds := map[uint64]float64{}
	for i, seed := range o.Seeds {
		b := perSeed[i]
		bounds[seed] = b.Pct
		k := float64(len(o.Seeds))
		rep.BoundPct += b.Pct / k
		rep.LooseBoundPct += b.LoosePct / k
		rep.ForcedPods += float64(b.Forced) / k
		rep.ArrivedGPUPods += float64(b.Arrived) / k
	}
	type job struct {
		pol  string
		seed uint64
		slot int
	}
	rep.Runs = make([]RunResult, len(o.Policies)*len(o.Seeds))
	jobs := make(chan job)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for range min(o.Workers, len(rep.Runs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				wl := Workload(pods, j.seed, o.TargetPct, capMilli)
				frag := ShapeModel(wl, o.Coverage)
				tie := sched.TieRanked
				if o.RandomTies {
					tie = sched.TieRandom
				}
				r, err := runOne(ctx, &o, specs, wl, j.pol, j.seed, frag, tie, o.Moves)
				if err == nil && o.Moves > 0 {
					var plain RunResult
					if plain, err = runOne(ctx, &o, specs, wl, j.pol, j.seed, frag, tie, 0); err == nil {
						r.NoMoveAllocPct, r.NoMoveIdle = plain.AllocPct, plain.Idle
					}
				}
				r.Trace = trace
				r.BoundPct = bounds[j.seed]
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				rep.Runs[j.slot] = r
				mu.Unlock()
				o.Logger.Info("run done", "trace", trace, "policy", j.pol, "seed", j.seed, "seconds", r.Seconds)
			}
		}()
	}
	slot := 0
	for _, pol := range o.Policies {
		for _, s := range o.Seeds {
			jobs <- job{pol: pol, seed: s, slot: slot}
			slot++
		}
	}
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	for i, pol := range o.Policies {
		rep.Summaries = append(rep.Summaries, summarise(trace, pol, o.Thresholds, rep.Runs[i*len(o.Seeds):(i+1)*len(o.Seeds)]))
	}
	return rep, nil
}

// runOne is one policy × seed run of the protocol with moves per 1,000
// arrivals (0: none).
func runOne(ctx context.Context, o *Options, specs []NodeSpec, wl []Pod, pol string, seed uint64, frag *sched.FragModel, tie sched.TieBreak, moves int) (RunResult, error) {
	p, ok := sched.PolicyByName(pol, frag, nil)
	if !ok {
		return RunResult{}, fmt.Errorf("%w: unknown policy %q", ErrBadOption, pol)
	}
	if o.Frag != nil && pol == "fusiond" {
		wp := sched.NewWeighted(nil, frag)
		wp.Frag = *o.Frag
		p = wp
	}
	return runProtocol(ctx, specs, wl, p, pol, seed, frag, o.Thresholds, tie, replayOpts{dedupe: dedupable(p, tie), moves: moves, idle: o.Moves > 0})
}

func summarise(trace, pol string, th []float64, runs []RunResult) Summary {
	s := Summary{Trace: trace, Policy: pol, Seeds: len(runs), Thresholds: th, AllocPct: make([]float64, len(th)), FragPct: make([]float64, len(th))}
	for _, r := range runs {
		for i := range th {
			s.AllocPct[i] += r.AllocPct[i] / float64(len(runs))
			s.FragPct[i] += r.FragPct[i] / float64(len(runs))
		}
		s.Failed += float64(r.Failed) / float64(len(runs))
		if s.FailAt == nil {
			s.FailAt = make([]FailPoint, len(r.FailAt))
			for i := range r.FailAt {
				s.FailAt[i].ArrivedPct = r.FailAt[i].ArrivedPct
			}
		}
		for i, f := range r.FailAt {
			if i < len(s.FailAt) {
				s.FailAt[i].Pods += f.Pods / float64(len(runs))
				s.FailAt[i].GPUs += f.GPUs / float64(len(runs))
				s.FailAt[i].BigPods += f.BigPods / float64(len(runs))
			}
		}
		if len(r.AllocPct) > 0 {
			s.ToBoundPct += (r.BoundPct - r.AllocPct[len(r.AllocPct)-1]) / float64(len(runs))
		}
		s.Seconds += r.Seconds / float64(len(runs))
		s.DecisionsPerSec += r.DecisionsPerSec / float64(len(runs))
		if r.Moves > 0 {
			s.Moves = r.Moves
			n := float64(len(runs))
			s.MovesUsed += float64(r.MovesUsed) / n
			if r.Pods > 0 {
				s.MovesPer1000 += 1000 * float64(r.MovesUsed) / float64(r.Pods) / n
			}
			s.PodsMoved += float64(r.PodsMoved) / n
			s.PlacedByMoves += float64(r.PlacedByMoves) / n
			if s.NoMoveAllocPct == nil {
				s.NoMoveAllocPct = make([]float64, len(th))
			}
			for i := range th {
				if i < len(r.NoMoveAllocPct) {
					s.NoMoveAllocPct[i] += r.NoMoveAllocPct[i] / n
				}
			}
			s.Idle = addIdle(s.Idle, r.Idle, n)
			s.NoMoveIdle = addIdle(s.NoMoveIdle, r.NoMoveIdle, n)
		}
	}
	return s
}

// Run simulates and writes the report to w in o.Format, plus the per-run
// CSV files and the SVG plot when asked.
func Run(ctx context.Context, o Options, w io.Writer) error {
	if err := checkPlotPaths(o.PlotPaths); err != nil {
		return err
	}
	rep, err := Simulate(ctx, o)
	if err != nil {
		return err
	}
	_ = o.defaults()
	if o.CSVDir != "" {
		if err := writeRunCSVs(o.CSVDir, rep); err != nil {
			return err
		}
	}
	if err := writePlots(rep, o.PlotPaths); err != nil {
		return err
	}
	return WriteReport(w, rep, o.Format)
}

// WriteReport writes rep as table, json or csv.
func WriteReport(w io.Writer, rep *Report, format string) error {
	switch format {
	case "json":
		e := json.NewEncoder(w)
		e.SetIndent("", "  ")
		return e.Encode(rep)
	case "csv":
		return writeCSV(w, rep)
	default:
		return writeTable(w, rep)
	}
}

func fmtPct(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

func writeTable(w io.Writer, rep *Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	if rep.Input != "" {
		fmt.Fprintf(w, "input: %s\n", rep.Input)
	}
	if len(rep.Timed) > 0 {
		t0 := rep.Timed[0]
		fmt.Fprintf(w, "trace %s, time-ordered: window %.1f days (median to last arrival), %d cop(ies) of the trace, lifetimes ×%.3g, offered GPU load in the window %.2f%%\n", rep.Trace, float64(t0.WindowS)/86400, t0.Copies, t0.Scale, t0.OfferedPct)
		writePowerModel(w, t0.Energy.Power)
		fmt.Fprintf(tw, "policy\tpods\tplaced\tnever placed\tmean GPU util %%\tpeak GPU util %%\tGPU-hours\twait p50 s\twait p95 s\twait p99 s\tmean wait s\tGPU MWh\tWh/GPU-hour\tidle GPU-hours\ton idle nodes\tWh/GPU-hour idle nodes off\t\n")
		for _, t := range rep.Timed {
			e := t.Energy
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.2f\t%.2f\t%.0f\t%.0f\t%.0f\t%.0f\t%.1f\t%.1f\t%.1f\t%.0f\t%.0f\t%.1f\t\n", t.Policy, t.Pods, t.Placed, t.NeverPlaced, t.MeanUtilPct, t.PeakUtilPct, t.GPUHours, t.WaitP50, t.WaitP95, t.WaitP99, t.WaitMean, e.KWh/1000, e.WhPerGPUHour, e.IdleGPUHours, e.IdleNodeGPUHours, e.WhPerGPUHourOff)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if err := writeComputeEnergy(w, rep.Timed); err != nil {
			return err
		}
		return writeEstimates(w, rep.Timed)
	}
	fmt.Fprintf(w, "trace %s: %d nodes, %d GPUs; typical shapes %s\n", rep.Trace, rep.Nodes, rep.GPUs, rep.Shapes)
	if len(rep.Summaries) > 0 {
		th := rep.Summaries[0].Thresholds
		fmt.Fprintf(w, "upper bound on allocation at %g%% arrived (any policy, LP relaxation with the forced pods placed): %.2f%% (%.2f%% if any pod could be dropped; %.0f of %.0f arrived GPU pods forced), mean over seeds\n", th[len(th)-1], rep.BoundPct, rep.LooseBoundPct, rep.ForcedPods, rep.ArrivedGPUPods)
	}
	hdr := "policy\tseeds"
	if len(rep.Summaries) > 0 {
		th := rep.Summaries[0].Thresholds
		for _, t := range th {
			hdr += fmt.Sprintf("\talloc@%g%%", t)
		}
		hdr += fmt.Sprintf("\tto bound@%g%%", th[len(th)-1])
		for _, t := range th {
			hdr += fmt.Sprintf("\tfrag@%g%%", t)
		}
	}
	fmt.Fprintln(tw, hdr+"\tfailed\ts/run\tdecisions/s\t")
	for _, s := range rep.Summaries {
		line := fmt.Sprintf("%s\t%d", s.Policy, s.Seeds)
		for _, v := range s.AllocPct {
			line += "\t" + fmtPct(v)
		}
		line += "\t" + fmtPct(s.ToBoundPct)
		for _, v := range s.FragPct {
			line += "\t" + fmtPct(v)
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%.2f\t%.0f\t\n", line, s.Failed, s.Seconds, s.DecisionsPerSec)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := writeMovesTable(w, rep); err != nil {
		return err
	}
	return writeFailTable(w, rep)
}

// addIdle adds x/n to sum (nil x: nothing).
func addIdle(sum, x *IdleGPUs, n float64) *IdleGPUs {
	if x == nil {
		return sum
	}
	if sum == nil {
		sum = &IdleGPUs{}
	}
	sum.Whole += x.Whole / n
	sum.Partial += x.Partial / n
	sum.Sliver += x.Sliver / n
	return sum
}

// fmtIdle renders IdleGPUs as whole/partial/sliver GPUs.
func fmtIdle(x *IdleGPUs) string {
	if x == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f/%.1f/%.1f", x.Whole, x.Partial, x.Sliver)
}

// writeMovesTable is the --moves figures beside the same runs without
// moves, mean over seeds (nothing without --moves).
func writeMovesTable(w io.Writer, rep *Report) error {
	if len(rep.Summaries) == 0 || rep.Summaries[0].Moves == 0 {
		return nil
	}
	s0 := rep.Summaries[0]
	fmt.Fprintf(w, "\nmoves: at most %d per 1,000 arrivals (best-effort pods are movable), beside the same runs without moves, mean over seeds; idle GPUs: whole, partial, sliver (under %d milli free beside work)\n", s0.Moves, SliverMilli)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	hdr := "policy"
	for _, t := range s0.Thresholds {
		hdr += fmt.Sprintf("\talloc@%g%%\tno moves", t)
	}
	last := s0.Thresholds[len(s0.Thresholds)-1]
	fmt.Fprintf(tw, "%s\tmoves\tper 1,000 arrivals\tpods moved\tplaced by moves\tidle@%g%% whole/partial/sliver\tno moves\t\n", hdr, last)
	for _, s := range rep.Summaries {
		line := s.Policy
		for i, v := range s.AllocPct {
			nm := math.NaN()
			if i < len(s.NoMoveAllocPct) {
				nm = s.NoMoveAllocPct[i]
			}
			line += "\t" + fmtPct(v) + "\t" + fmtPct(nm)
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%.2f\t%.1f\t%.1f\t%s\t%s\t\n", line, s.MovesUsed, s.MovesPer1000, s.PodsMoved, s.PlacedByMoves, fmtIdle(s.Idle), fmtIdle(s.NoMoveIdle))
	}
	return tw.Flush()
}

// writeFailTable is what failed by each FailThresholds point: pods, GPUs
// and big pods (as many whole GPUs as the largest node), mean over seeds.
func writeFailTable(w io.Writer, rep *Report) error {
	if len(rep.Summaries) == 0 || len(rep.Summaries[0].FailAt) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nfailed by arrived GPU request: pods / GPUs / big pods (%d whole GPUs), mean over seeds\n", rep.BigGPUs)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	hdr := "policy"
	for _, f := range rep.Summaries[0].FailAt {
		hdr += fmt.Sprintf("\t@%g%%", f.ArrivedPct)
	}
	fmt.Fprintln(tw, hdr+"\t")
	for _, s := range rep.Summaries {
		line := s.Policy
		for _, f := range s.FailAt {
			line += "\t" + fmtFail(f)
		}
		fmt.Fprintln(tw, line+"\t")
	}
	return tw.Flush()
}

// fmtFail renders a FailPoint as pods/GPUs/big pods.
func fmtFail(f FailPoint) string {
	if math.IsNaN(f.GPUs) {
		return "-"
	}
	return fmt.Sprintf("%.1f/%.1f/%.1f", f.Pods, f.GPUs, f.BigPods)
}

func runRecord(r *RunResult) []string {
	rec := []string{r.Trace, r.Policy, strconv.FormatUint(r.Seed, 10), strconv.Itoa(r.Pods), strconv.Itoa(r.Failed)}
	for _, v := range r.AllocPct {
		rec = append(rec, fmtPct(v))
	}
	for _, v := range r.FragPct {
		rec = append(rec, fmtPct(v))
	}
	rec = append(rec, strconv.FormatFloat(r.Seconds, 'f', 3, 64), strconv.FormatFloat(r.DecisionsPerSec, 'f', 0, 64))
	for _, f := range r.FailAt {
		rec = append(rec, strconv.FormatFloat(f.Pods, 'f', 0, 64), fmtPct(f.GPUs), strconv.FormatFloat(f.BigPods, 'f', 0, 64))
	}
	toBound := nan()
	if len(r.AllocPct) > 0 {
		toBound = r.BoundPct - r.AllocPct[len(r.AllocPct)-1]
	}
	rec = append(rec, fmtPct(r.BoundPct), fmtPct(toBound))
	if r.Moves > 0 {
		rec = append(rec, strconv.Itoa(r.Moves), strconv.Itoa(r.MovesUsed), strconv.Itoa(r.PodsMoved), strconv.Itoa(r.PlacedByMoves))
		for i := range r.Thresholds {
			v := math.NaN()
			if i < len(r.NoMoveAllocPct) {
				v = r.NoMoveAllocPct[i]
			}
			rec = append(rec, fmtPct(v))
		}
		for _, x := range []*IdleGPUs{r.Idle, r.NoMoveIdle} {
			if x == nil {
				rec = append(rec, "-", "-", "-")
				continue
			}
			rec = append(rec, strconv.FormatFloat(x.Whole, 'f', 3, 64), strconv.FormatFloat(x.Partial, 'f', 3, 64), strconv.FormatFloat(x.Sliver, 'f', 3, 64))
		}
	}
	return rec
}

func writeCSV(w io.Writer, rep *Report) error {
	cw := csv.NewWriter(w)
	if len(rep.Timed) > 0 {
		_ = cw.Write([]string{"policy", "time_s", "gpu_util_pct", "queued", "gpu_power_kw", "idle_gpus", "a100_eq"})
		for _, t := range rep.Timed {
			for _, p := range t.Util {
				_ = cw.Write([]string{t.Policy, strconv.FormatInt(p.Time, 10), fmtPct(p.UtilPct), strconv.Itoa(p.Queued), strconv.FormatFloat(p.PowerKW, 'f', 3, 64), strconv.Itoa(p.IdleGPUs), strconv.FormatFloat(p.A100Eq, 'f', 2, 64)})
			}
		}
		cw.Flush()
		return cw.Error()
	}
	hdr := []string{"trace", "policy", "seed", "pods", "failed"}
	if len(rep.Runs) > 0 {
		for _, t := range rep.Runs[0].Thresholds {
			hdr = append(hdr, fmt.Sprintf("alloc_%g", t))
		}
		for _, t := range rep.Runs[0].Thresholds {
			hdr = append(hdr, fmt.Sprintf("frag_%g", t))
		}
	}
	hdr = append(hdr, "seconds", "decisions_per_sec")
	if len(rep.Runs) > 0 {
		for _, f := range rep.Runs[0].FailAt {
			hdr = append(hdr, fmt.Sprintf("failed_pods_%g", f.ArrivedPct), fmt.Sprintf("failed_gpus_%g", f.ArrivedPct), fmt.Sprintf("failed_big_pods_%g", f.ArrivedPct))
		}
	}
	hdr = append(hdr, "bound_pct", "to_bound_pct")
	if len(rep.Runs) > 0 && rep.Runs[0].Moves > 0 {
		hdr = append(hdr, "moves_per_1000", "moves_used", "pods_moved", "placed_by_moves")
		for _, t := range rep.Runs[0].Thresholds {
			hdr = append(hdr, fmt.Sprintf("no_move_alloc_%g", t))
		}
		hdr = append(hdr, "idle_whole", "idle_partial", "idle_sliver", "no_move_idle_whole", "no_move_idle_partial", "no_move_idle_sliver")
	}
	_ = cw.Write(hdr)
	for i := range rep.Runs {
		_ = cw.Write(runRecord(&rep.Runs[i]))
	}
	cw.Flush()
	return cw.Error()
}

func writeRunCSVs(dir string, rep *Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("sim: csv dir: %w", err)
	}
	for i := range rep.Runs {
		r := &rep.Runs[i]
		name := filepath.Join(dir, fmt.Sprintf("%s_%s_seed%d.csv", r.Trace, r.Policy, r.Seed))
		var b strings.Builder
		cw := csv.NewWriter(&b)
		_ = cw.Write([]string{"arrived_pct", "alloc_pct", "failed_pct"})
		for _, p := range r.Curve {
			_ = cw.Write([]string{strconv.FormatFloat(p.ArrivedPct, 'f', 3, 64), strconv.FormatFloat(p.AllocPct, 'f', 3, 64), strconv.FormatFloat(p.FailedPct, 'f', 3, 64)})
		}
		cw.Flush()
		if err := os.WriteFile(name, []byte(b.String()), 0o644); err != nil {
			return fmt.Errorf("sim: csv: %w", err)
		}
	}
	return nil
}

func nan() float64 { return math.NaN() }

package sim

import (
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/fusiond/fusiond/cmd/fusionctl/internal/sim/openb"
	"github.com/fusiond/fusiond/daemon/sched"
)

// NewCommand returns `simulate`, to be registered in fusionctl. It needs
// no daemon.
func NewCommand() *cobra.Command {
	var (
		o         Options
		policies  string
		seeds     string
		verbose   bool
		gpuPower  string
		gpuTFLOPS string
		tune      bool
		testSeed  string
		frag      string
		passes    int
		list      bool
		estimate  string
		tuneOnly  string
	)
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Replay an openb GPU-cluster trace through the placement engine",
		Long: `simulate replays an openb trace (node list + pod list CSV) through the same
placement engine the daemon uses, offline. With no --nodes or --pods it
replays the openb trace embedded in fusionctl (the FGD paper's node list and
its "default" pod list; --trace picks another, --list-traces lists them), so
it needs no files. By default it runs the FGD paper's
protocol: pods resampled with each seed to --target % of GPU capacity,
shuffled, placed one by one, never leaving; it reports GPU allocation % as
the arrived request passes 100/110/120/130 %, the fragmentation ratio,
failed pods and decisions per second. --timed honours creation/deletion
times instead and reports GPU utilisation over time and queueing delay.`,
		Example: `  fusionctl simulate
  fusionctl simulate --trace multigpu50 --policy fusiond,bestfit,fgd --seeds 42-51 --plot alloc.svg --plot alloc.png
  fusionctl simulate --nodes nodes.csv --pods pods.csv.zst --timed --load 70`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if list {
				return ListTraces(cmd.OutOrStdout())
			}
			var err error
			if o.Seeds, err = ParseSeeds(seeds); err != nil {
				return err
			}
			if frag != "" {
				if o.Frag, err = ParseFragParams(frag); err != nil {
					return err
				}
			}
			if tune {
				if !cmd.Flags().Changed("seeds") {
					o.Seeds, _ = ParseSeeds("42-46")
				}
				to := TuneOptions{NodesPath: o.NodesPath, PodsPaths: splitList(o.PodsPath), Traces: splitList(o.Trace),
					TrainSeeds: o.Seeds, TargetPct: o.TargetPct, Workers: o.Workers, Start: o.Frag, Passes: passes, Only: splitList(tuneOnly)}
				if to.TestSeeds, err = ParseSeeds(testSeed); err != nil {
					return err
				}
				if len(to.PodsPaths) == 0 && len(to.Traces) == 0 {
					to.Traces = []string{openb.DefaultTrace}
				}
				if to.Workers <= 0 {
					to.Workers = runtime.GOMAXPROCS(0)
				}
				return Tune(cmd.Context(), to, cmd.OutOrStdout())
			}
			o.Policies = splitList(policies)
			if estimate != "" {
				if !o.Timed {
					return fmt.Errorf("%w: --estimates needs --timed", ErrBadOption)
				}
				if o.Estimates, err = ParseEstimates(estimate); err != nil {
					return err
				}
			}
			if o.GPUPower, err = ParsePowerOverrides(gpuPower); err != nil {
				return err
			}
			if o.GPUTFLOPS, err = ParseTFLOPS(gpuTFLOPS); err != nil {
				return err
			}
			if verbose {
				o.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			}
			return Run(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.NodesPath, "nodes", "", "node list CSV (openb format; plain, zstd or gzip); default: the openb node list embedded in fusionctl")
	f.StringVar(&o.PodsPath, "pods", "", "pod list CSV (openb format; plain, zstd or gzip) instead of an embedded trace; with --tune, several, comma-separated")
	f.StringVar(&o.Trace, "trace", "", "the embedded openb pod list to replay when --pods is not given (default \"default\"; --list-traces); with --tune, several, comma-separated")
	f.BoolVar(&list, "list-traces", false, "list the openb traces embedded in fusionctl, with their pod counts, and exit")
	f.StringVar(&policies, "policy", "fusiond", "comma-separated policies: fusiond,random,dotprod,gpuclustering,gpupacking,bestfit,fgd,spread")
	f.StringVar(&seeds, "seeds", "42", "seeds: a list and/or ranges, e.g. 42-51 or 1,5,7")
	f.Float64Var(&o.TargetPct, "target", 130, "resample the workload to this % of GPU capacity")
	f.StringVarP(&o.Format, "output", "o", "table", "output format: table|json|csv")
	f.StringVar(&o.CSVDir, "csv-dir", "", "write one CSV (allocation curve) per run into this directory")
	f.StringArrayVar(&o.PlotPaths, "plot", nil, "write a picture (FILE.svg or FILE.png; repeatable): allocation and failed-request curves, or with --timed utilisation over time (FILE) and the wait CDF (FILE-wait)")
	f.BoolVar(&o.Timed, "timed", false, "time-ordered mode: honour creation/deletion times")
	f.Float64Var(&o.LoadPct, "load", 0, "timed mode: scale every lifetime by one factor so the offered GPU load between the first and last arrival is this % of capacity (0: as traced); arrival times stay as traced")
	f.StringVar(&estimate, "estimates", "", "timed mode: the run-time estimates the queue's EASY backfill is given, comma-separated to compare: none (the head's reserved node left to it), profile (task profiles learned from the pods that ended, keyed by request shape and QoS; else longest), longest (the longest lifetime ended so far), exact (each pod's real lifetime); adds an estimates table")
	f.StringVar(&gpuPower, "gpu-power", "", "timed mode: idle and TDP watts per GPU model, e.g. G2=35:300,G3=50:400, replacing the power model's figures (docs/load.md \"Energy\")")
	f.StringVar(&gpuTFLOPS, "gpu-tflops", "", "timed mode: dense FP16 TFLOPS per GPU model, e.g. G2=312, replacing the model table's figure for delivered compute (docs/load.md \"Energy\")")
	f.IntVar(&o.Workers, "workers", 0, "parallel runs (default GOMAXPROCS)")
	f.IntVar(&o.Moves, "moves", 0, "protocol variant: when a pod fits nowhere, move best-effort (qos BE) pods to make room, at most N moves per 1,000 arrivals; each run is also made without moves and reported beside it")
	f.BoolVar(&o.RandomTies, "random-ties", false, "break score ties at random per decision instead of by a seeded node ranking")
	f.StringVar(&frag, "frag", "", "fusiond's fragmentation parameters over the defaults, e.g. reserve_steps=50,tail=none (names as --tune prints them); with --tune, the search's starting point")
	f.BoolVar(&tune, "tune", false, "search fusiond's fragmentation parameters (sched.FragParams) on the train seeds (--seeds, default 42-46 with --tune) and report the test seeds (--test-seeds) only; --pods may list several traces, comma-separated")
	f.StringVar(&tuneOnly, "tune-only", "", "with --tune: search only these parameters (comma-separated names as --frag takes them, e.g. cpu_only_tail_max,cpu_only_full_max); default all")
	f.IntVar(&passes, "tune-passes", 2, "with --tune: coordinate-descent passes over the parameters")
	f.StringVar(&testSeed, "test-seeds", "47-51", "with --tune: the seeds the chosen parameters are reported on")
	f.BoolVarP(&verbose, "verbose", "v", false, "log progress to stderr")
	return cmd
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// ListTraces writes the embedded openb traces: each pod list's name, its
// pods (all, GPU, shared-GPU, multi-GPU, limited to some GPU models) and
// the GPUs they request, whether the paper publishes results for it, and
// the node list's size.
func ListTraces(w io.Writer) error {
	specs, err := readInput("", openb.NodeList, ReadNodes)
	if err != nil {
		return err
	}
	gpus := 0
	for _, s := range specs {
		gpus += s.GPUs
	}
	fmt.Fprintf(w, "embedded openb traces (the FGD paper's data set, ATC'23; \"paper\": it publishes results for the trace); node list: %d nodes, %d GPUs\n", len(specs), gpus)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "trace\tpods\tGPU pods\tshared-GPU\tmulti-GPU\tmodel-limited\tGPUs requested\tpaper\t")
	for _, tr := range openb.Traces() {
		name, err := openb.PodList(tr)
		if err != nil {
			return err
		}
		pods, err := readInput("", name, ReadPods)
		if err != nil {
			return err
		}
		var withGPU, shared, multi, limited int
		var milli int64
		for _, p := range pods {
			if p.GPUs == 0 {
				continue
			}
			withGPU++
			milli += int64(p.GPUs) * p.GPUMilli
			if p.GPUMilli < sched.MilliPerGPU {
				shared++
			}
			if p.GPUs > 1 {
				multi++
			}
			if p.GPUSpec != "" {
				limited++
			}
		}
		paper := "-"
		if openb.Published(tr) {
			paper = "yes"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%.1f\t%s\t\n", tr, len(pods), withGPU, shared, multi, limited, float64(milli)/sched.MilliPerGPU, paper)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "fusionctl simulate replays %q unless --trace NAME or --pods FILE says otherwise\n", openb.DefaultTrace)
	return err
}

// ParseSeeds parses "42-51", "1,5,7" or a mix.
func ParseSeeds(s string) ([]uint64, error) {
	var out []uint64
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.ParseUint(lo, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: seed %q", ErrBadOption, part)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(hi, 10, 64); err != nil || b < a || b-a > 100000 {
				return nil, fmt.Errorf("%w: seed range %q", ErrBadOption, part)
			}
		}
		for v := a; v <= b; v++ {
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no seeds", ErrBadOption)
	}
	return out, nil
}

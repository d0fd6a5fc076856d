package sim

import (
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
)

// NewCommand returns `simulate`, to be registered in fusionctl. It needs
// no daemon.
func NewCommand() *cobra.Command {
	var (
		o        Options
		policies string
		seeds    string
		verbose  bool
		gpuPower string
		tune     bool
		testSeed string
		frag     string
		passes   int
	)
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Replay an openb GPU-cluster trace through the placement engine",
		Long: `simulate replays an openb trace (node list + pod list CSV) through the same
placement engine the daemon uses, offline. By default it runs the FGD paper's
protocol: pods resampled with each seed to --target % of GPU capacity,
shuffled, placed one by one, never leaving; it reports GPU allocation % as
the arrived request passes 100/110/120/130 %, the fragmentation ratio,
failed pods and decisions per second. --timed honours creation/deletion
times instead and reports GPU utilisation over time and queueing delay.`,
		Example: "  fusionctl simulate --nodes openb_node_list_gpu_node.csv --pods openb_pod_list_default.csv --policy fusiond,bestfit,fgd --seeds 42-51 --target 130 --plot alloc.svg --plot alloc.png",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
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
				to := TuneOptions{NodesPath: o.NodesPath, TrainSeeds: o.Seeds, TargetPct: o.TargetPct, Workers: o.Workers, Start: o.Frag, Passes: passes}
				if to.TestSeeds, err = ParseSeeds(testSeed); err != nil {
					return err
				}
				for p := range strings.SplitSeq(o.PodsPath, ",") {
					if p = strings.TrimSpace(p); p != "" {
						to.PodsPaths = append(to.PodsPaths, p)
					}
				}
				if to.Workers <= 0 {
					to.Workers = runtime.GOMAXPROCS(0)
				}
				return Tune(cmd.Context(), to, cmd.OutOrStdout())
			}
			for p := range strings.SplitSeq(policies, ",") {
				if p = strings.TrimSpace(p); p != "" {
					o.Policies = append(o.Policies, p)
				}
			}
			if o.GPUPower, err = ParsePowerOverrides(gpuPower); err != nil {
				return err
			}
			if verbose {
				o.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			}
			return Run(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.NodesPath, "nodes", "", "node list CSV (openb format)")
	f.StringVar(&o.PodsPath, "pods", "", "pod list CSV (openb format)")
	f.StringVar(&policies, "policy", "fusiond", "comma-separated policies: fusiond,random,dotprod,gpuclustering,gpupacking,bestfit,fgd,spread")
	f.StringVar(&seeds, "seeds", "42", "seeds: a list and/or ranges, e.g. 42-51 or 1,5,7")
	f.Float64Var(&o.TargetPct, "target", 130, "resample the workload to this % of GPU capacity")
	f.StringVarP(&o.Format, "output", "o", "table", "output format: table|json|csv")
	f.StringVar(&o.CSVDir, "csv-dir", "", "write one CSV (allocation curve) per run into this directory")
	f.StringArrayVar(&o.PlotPaths, "plot", nil, "write a picture (FILE.svg or FILE.png; repeatable): allocation and failed-request curves, or with --timed utilisation over time (FILE) and the wait CDF (FILE-wait)")
	f.BoolVar(&o.Timed, "timed", false, "time-ordered mode: honour creation/deletion times")
	f.Float64Var(&o.LoadPct, "load", 0, "timed mode: scale every lifetime by one factor so the offered GPU load between the first and last arrival is this % of capacity (0: as traced); arrival times stay as traced")
	f.StringVar(&gpuPower, "gpu-power", "", "timed mode: idle and TDP watts per GPU model, e.g. G2=35:300,G3=50:400, replacing the power model's figures (docs/load.md \"Energy\")")
	f.IntVar(&o.Workers, "workers", 0, "parallel runs (default GOMAXPROCS)")
	f.BoolVar(&o.RandomTies, "random-ties", false, "break score ties at random per decision instead of by a seeded node ranking")
	f.StringVar(&frag, "frag", "", "fusiond's fragmentation parameters over the defaults, e.g. reserve_steps=50,tail=none (names as --tune prints them); with --tune, the search's starting point")
	f.BoolVar(&tune, "tune", false, "search fusiond's fragmentation parameters (sched.FragParams) on the train seeds (--seeds, default 42-46 with --tune) and report the test seeds (--test-seeds) only; --pods may list several traces, comma-separated")
	f.IntVar(&passes, "tune-passes", 2, "with --tune: coordinate-descent passes over the parameters")
	f.StringVar(&testSeed, "test-seeds", "47-51", "with --tune: the seeds the chosen parameters are reported on")
	f.BoolVarP(&verbose, "verbose", "v", false, "log progress to stderr")
	_ = cmd.MarkFlagRequired("nodes")
	_ = cmd.MarkFlagRequired("pods")
	return cmd
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

package cli

import (
	"fmt"
	"io"
	"math"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/fusiond/fusiond/cmd/fusionctl/internal/sim"
	"github.com/fusiond/fusiond/daemon/forecast"
)

// demandSeries is the CPU (cores) and GPU (GPUs) that the pods of an
// openb trace request at the start of each step: a pod counts from its
// creation time until its deletion time (to the trace's end when it has
// none).
func demandSeries(pods []sim.Pod, step time.Duration) (cpu, gpu []float64) {
	if len(pods) == 0 {
		return nil, nil
	}
	s := int64(step / time.Second)
	var end int64
	for _, p := range pods {
		end = max(end, p.Creation, p.Deletion)
	}
	n := int(end/s) + 1
	dc, dg := make([]float64, n+1), make([]float64, n+1)
	for _, p := range pods {
		from := int((p.Creation + s - 1) / s) // the first step start at or after creation
		to := n
		if p.Deletion > 0 {
			to = int((p.Deletion + s - 1) / s)
		}
		if to <= from {
			continue
		}
		dc[from] += float64(p.CPUMilli) / 1000
		dc[to] -= float64(p.CPUMilli) / 1000
		dg[from] += float64(p.GPUMilliTotal()) / 1000
		dg[to] -= float64(p.GPUMilliTotal()) / 1000
	}
	cpu, gpu = make([]float64, n), make([]float64, n)
	var c, g float64
	for i := range n {
		c += dc[i]
		g += dg[i]
		cpu[i], gpu[i] = math.Max(c, 0), math.Max(g, 0)
	}
	return cpu, gpu
}

// seriesLen is how many steps demandSeries makes of pods.
func seriesLen(pods []sim.Pod, step time.Duration) int {
	cpu, _ := demandSeries(pods, step)
	return len(cpu)
}

// backtestRow is one line of the forecast back-test table.
type backtestRow struct {
	Series string  `json:"series"`
	Model  string  `json:"model"`
	Method string  `json:"method"`
	MAPE   float64 `json:"mape_pct"`
	SMAPE  float64 `json:"smape_pct"`
	MAE    float64 `json:"mae"`
	N      int     `json:"forecasts"`
}

type backtestReport struct {
	Trace   string         `json:"trace"`
	Step    string         `json:"step"`
	Horizon string         `json:"horizon"`
	Points  int            `json:"points"`
	Split   int            `json:"split"`
	Period  map[string]int `json:"period_steps"`
	// PeriodFrom says where each series' season came from.
	PeriodFrom map[string]string `json:"period_from"`
	Rows       []backtestRow     `json:"rows"`
}

func newForecastCmd(o *options) *cobra.Command {
	var (
		trace         string
		step, horizon time.Duration
		period        int
		trainFrac     float64
		bt            bool
	)
	cmd := &cobra.Command{
		Use:   "forecast --backtest [--trace FILE|NAME]",
		Short: "Back-test the daemon's forecasters on an openb trace's CPU and GPU demand",
		Long: `forecast builds the CPU and GPU demand of an openb pod list over time (a
pod requests its CPU and GPUs from its creation to its deletion time),
fits the forecasters the daemon runs (daemon/forecast: EWMA, Holt,
Holt-Winters, FFT periodicity) on the first part of the series and scores
their forecasts --horizon ahead on the rest, beside the naive and
seasonal-naive baselines. --trace is a pod list file or the name of an openb
trace embedded in fusionctl (fusionctl simulate --list-traces; "default"
unless told). It reads no daemon.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !bt {
				return fmt.Errorf("forecast: only --backtest is implemented; the daemon's own forecasts are in fusionctl status")
			}
			if step < time.Second || horizon < step || horizon%step != 0 {
				return fmt.Errorf("--step %v, --horizon %v: want a step of at least 1s and a horizon that is a multiple of it", step, horizon)
			}
			if trainFrac <= 0.1 || trainFrac >= 0.95 {
				return fmt.Errorf("--train %g: want a fraction between 0.1 and 0.95", trainFrac)
			}
			pods, err := sim.ReadTrace(trace)
			if err != nil {
				return fmt.Errorf("--trace: %w", err)
			}
			if n := seriesLen(pods, step); n < 20*int(horizon/step) {
				return fmt.Errorf("%s: its pods' creation and deletion times span %d steps of %v, too few to back-test a %v forecast (want at least %d)",
					trace, n, step, horizon, 20*int(horizon/step))
			}
			rep := backtest(pods, step, horizon, period, trainFrac)
			rep.Trace = trace
			return o.print(rep, func(w io.Writer) error { return backtestTable(w, rep) })
		},
	}
	f := cmd.Flags()
	f.BoolVar(&bt, "backtest", true, "back-test on a trace (the only mode; the daemon's live forecasts are in fusionctl status)")
	f.StringVar(&trace, "trace", "default", "openb pod list: a CSV file (plain, zstd or gzip) or an embedded trace's name (fusionctl simulate --list-traces)")
	f.DurationVar(&step, "step", 5*time.Minute, "series step")
	f.DurationVar(&horizon, "horizon", 15*time.Minute, "how far ahead to forecast")
	f.IntVar(&period, "period", 0, "season in steps (0: found by FFT on the training part)")
	f.Float64Var(&trainFrac, "train", 2.0/3, "share of the series that fits the models; the rest scores them")
	return cmd
}

func backtest(pods []sim.Pod, step, horizon time.Duration, period int, trainFrac float64) backtestReport {
	cpu, gpu := demandSeries(pods, step)
	h := int(horizon / step)
	rep := backtestReport{Step: step.String(), Horizon: horizon.String(), Points: len(cpu), Period: map[string]int{}, PeriodFrom: map[string]string{}}
	split := int(float64(len(cpu)) * trainFrac)
	rep.Split = split
	for _, s := range []struct {
		name string
		y    []float64
	}{{"cpu cores", cpu}, {"gpus", gpu}} {
		p, how := period, "--period"
		if p == 0 {
			if p, _ = forecast.DetectPeriod(s.y[:split], 2, split/3); p > 0 {
				how = "found by FFT"
			} else {
				// No season stands out: the seasonal baseline and models
				// use a day, the season of the loads they are meant for.
				p, how = int(24*time.Hour/step), "none found by FFT: one day"
			}
		}
		rep.Period[s.name] = p
		rep.PeriodFrom[s.name] = how
		for _, r := range forecast.Backtest(s.y, h, p, split) {
			rep.Rows = append(rep.Rows, backtestRow{Series: s.name, Model: r.Name, Method: r.Method.String(),
				MAPE: r.Errors.MAPE, SMAPE: r.Errors.SMAPE, MAE: r.Errors.MAE, N: r.Errors.N})
		}
	}
	return rep
}

func backtestTable(w io.Writer, rep backtestReport) error {
	fmt.Fprintf(w, "%s: %d steps of %s; fitted on the first %d, scored on %s-ahead forecasts over the rest\n",
		rep.Trace, rep.Points, rep.Step, rep.Split, rep.Horizon)
	for _, s := range []string{"cpu cores", "gpus"} {
		fmt.Fprintf(w, "season of %s: %d steps (%s)\n", s, rep.Period[s], rep.PeriodFrom[s])
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERIES\tMODEL\tMETHOD\tMAPE %\tsMAPE %\tMAE\tFORECASTS")
	for _, r := range rep.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f\t%.2f\t%.2f\t%d\n", r.Series, r.Model, r.Method, r.MAPE, r.SMAPE, r.MAE, r.N)
	}
	return tw.Flush()
}

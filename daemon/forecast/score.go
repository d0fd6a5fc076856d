package forecast

import (
	"math"
	"slices"
)

// Errors are a method's forecast errors over the points it forecast.
type Errors struct {
	// MAPE is the mean absolute percentage error over the points whose
	// actual value is not 0; SMAPE the symmetric one, 200·|F−A|/(|F|+|A|)
	// (0 where both are 0). Both in percent.
	MAPE, SMAPE float64
	// MAE is the mean absolute error.
	MAE float64
	// N is how many forecasts were scored.
	N int
}

// Score compares p[t] (a forecast of y[t+h]) with y[t+h] for every t in
// [from, to) with t+h inside y and p[t] known.
func Score(y, p []float64, h, from, to int) Errors {
	var e Errors
	mapeN := 0
	for t := max(from, 0); t < to && t+h < len(y); t++ {
		f, a := p[t], y[t+h]
		if math.IsNaN(f) {
			continue
		}
		d := math.Abs(f - a)
		e.MAE += d
		if a != 0 {
			e.MAPE += d / math.Abs(a)
			mapeN++
		}
		if s := math.Abs(f) + math.Abs(a); s > 0 {
			e.SMAPE += 2 * d / s
		}
		e.N++
	}
	if e.N == 0 {
		return Errors{MAPE: math.NaN(), SMAPE: math.NaN(), MAE: math.NaN()}
	}
	e.MAE /= float64(e.N)
	e.SMAPE *= 100 / float64(e.N)
	if mapeN > 0 {
		e.MAPE *= 100 / float64(mapeN)
	} else {
		e.MAPE = math.NaN()
	}
	return e
}

// Candidates is the grid the back-test chooses from: EWMA and Holt
// (plain and damped) always, and with a period of at least 2 the
// seasonal models at it.
func Candidates(period int) []Method {
	var out []Method
	weights := []float64{0.05, 0.1, 0.2, 0.4, 0.7, 1}
	for _, a := range weights {
		out = append(out, Method{Kind: EWMA, Alpha: a})
	}
	for _, a := range []float64{0.1, 0.3, 0.6, 0.9} {
		for _, b := range []float64{0.01, 0.05, 0.2} {
			for _, phi := range []float64{1, 0.9} {
				out = append(out, Method{Kind: Holt, Alpha: a, Beta: b, Phi: phi})
			}
		}
	}
	if period >= 2 {
		for _, a := range []float64{0.1, 0.3, 0.6, 0.9} {
			for _, g := range []float64{0.05, 0.2, 0.5} {
				out = append(out, Method{Kind: HoltWinters, Alpha: a, Beta: 0.01, Gamma: g, Period: period})
			}
		}
		for _, k := range []int{1, 2, 3, 5} {
			out = append(out, Method{Kind: Periodic, Period: period, Cycles: k})
		}
	}
	return out
}

// Choice is a method and its back-test errors.
type Choice struct {
	Method Method
	Errors Errors
}

// Select back-tests every candidate that can forecast within y on the
// points from 'from' on and returns the one of least sMAPE (ties: the
// earlier candidate). ok is false when none scored any point.
func Select(y []float64, h, from int, cands []Method) (best Choice, ok bool) {
	for _, m := range cands {
		if m.Warmup() > from {
			continue
		}
		e := Score(y, m.Run(y, h), h, from, len(y))
		if e.N == 0 || math.IsNaN(e.SMAPE) {
			continue
		}
		if !ok || e.SMAPE < best.Errors.SMAPE {
			best, ok = Choice{Method: m, Errors: e}, true
		}
	}
	return best, ok
}

// Model is a series' chosen method and its forecast.
type Model struct {
	Choice
	// Period is the season FFT found (0: none).
	Period int
	// Value is the forecast h steps after the series' end.
	Value float64
}

// Fit picks a model for y by back-test and forecasts h steps past its
// end. The season is the strongest period in [minPeriod, len(y)/3] that
// FFT finds (none when y is too short); the back-test scores the last
// half of y (every model warm by then, or left out). ok is false when y
// is too short for any model.
func Fit(y []float64, h, minPeriod int) (Model, bool) {
	if len(y) < 2*h+4 {
		return Model{}, false
	}
	period, _ := DetectPeriod(y, minPeriod, len(y)/3)
	from := len(y) / 2
	c, ok := Select(y, h, from, Candidates(period))
	if !ok {
		return Model{}, false
	}
	return Model{Choice: c, Period: period, Value: c.Method.Forecast(y, h)}, true
}

// Row is one line of a back-test report.
type Row struct {
	Name   string
	Method Method
	Errors Errors
}

// Backtest evaluates forecasting h steps ahead out of sample: each
// model family's parameters (and the automatic choice among all) are
// chosen on y[:split] and scored on the forecasts made from split on,
// beside the naive and seasonal-naive baselines.
func Backtest(y []float64, h, period, split int) []Row {
	score := func(m Method) Errors { return Score(y, m.Run(y, h), h, split, len(y)) }
	rows := []Row{{Name: "naive", Method: Method{Kind: Naive}}}
	if period >= 2 {
		rows = append(rows, Row{Name: "seasonal-naive", Method: Method{Kind: SeasonalNaive, Period: period}})
	}
	cands := Candidates(period)
	train := y[:split]
	from := split / 2
	for _, k := range []Kind{EWMA, Holt, HoltWinters, Periodic} {
		var fam []Method
		for _, m := range cands {
			if m.Kind == k {
				fam = append(fam, m)
			}
		}
		if c, ok := Select(train, h, from, fam); ok {
			rows = append(rows, Row{Name: string(k), Method: c.Method})
		}
	}
	if c, ok := Select(train, h, from, cands); ok {
		rows = append(rows, Row{Name: "auto (chosen by back-test)", Method: c.Method})
	}
	for i := range rows {
		rows[i].Errors = score(rows[i].Method)
	}
	return slices.Clip(rows)
}

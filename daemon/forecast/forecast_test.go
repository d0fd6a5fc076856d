package forecast

import (
	"math"
	"math/rand/v2"
	"testing"
)

func series(n int, f func(t int) float64) []float64 {
	y := make([]float64, n)
	for t := range y {
		y[t] = f(t)
	}
	return y
}

func TestScoreByHand(t *testing.T) {
	y := []float64{10, 20, 0, 40}
	p := []float64{12, 0, 50, math.NaN()} // forecasts of y[1..3] with h = 1
	e := Score(y, p, 1, 0, len(y))
	// |12−20| = 8 (40% of 20, sMAPE 2·8/32 = 50%), |0−0| = 0 (no MAPE,
	// sMAPE 0), |50−40| = 10 (25%, sMAPE 2·10/90).
	if e.N != 3 || math.Abs(e.MAE-6) > 1e-12 || math.Abs(e.MAPE-32.5) > 1e-12 ||
		math.Abs(e.SMAPE-(50+0+2000.0/90)/3) > 1e-9 {
		t.Fatalf("errors %+v", e)
	}
	if e := Score(y, []float64{math.NaN(), math.NaN(), math.NaN(), math.NaN()}, 1, 0, 4); e.N != 0 || !math.IsNaN(e.SMAPE) {
		t.Fatalf("nothing forecast, yet scored: %+v", e)
	}
}

func TestNaiveAndSeasonalNaive(t *testing.T) {
	y := series(50, func(t int) float64 { return float64(t % 7) })
	p := Method{Kind: Naive}.Run(y, 3)
	if p[10] != y[10] {
		t.Errorf("naive forecast %v, want the last value %v", p[10], y[10])
	}
	// Seasonal naive at h = 3, m = 7 forecasts y[t+3] with y[t+3−7].
	p = Method{Kind: SeasonalNaive, Period: 7}.Run(y, 3)
	if !math.IsNaN(p[3]) || p[4] != y[0] || p[20] != y[16] {
		t.Errorf("seasonal naive: p[3]=%v p[4]=%v p[20]=%v", p[3], p[4], p[20])
	}
	if e := Score(y, p, 3, 0, len(y)); e.MAE != 0 {
		t.Errorf("a series of period 7 has seasonal-naive error %+v, want 0", e)
	}
	// h longer than the period looks back whole cycles.
	p = Method{Kind: SeasonalNaive, Period: 7}.Run(y, 9)
	if p[20] != y[20+9-14] {
		t.Errorf("h = 9: p[20] = %v, want y[15] = %v", p[20], y[15])
	}
}

// A straight line is forecast exactly by Holt and missed by EWMA and the
// naive forecast (they lag by the trend × h); Fit picks Holt.
func TestTrendKnownAnswer(t *testing.T) {
	y := series(200, func(t int) float64 { return 3 + 2*float64(t) })
	const h = 15
	want := 3 + 2*float64(len(y)-1+h)
	if got := (Method{Kind: Holt, Alpha: 0.5, Beta: 0.1, Phi: 1}).Forecast(y, h); math.Abs(got-want) > 1e-9 {
		t.Errorf("holt forecast %v, want %v", got, want)
	}
	if got := (Method{Kind: EWMA, Alpha: 1}).Forecast(y, h); math.Abs(got-(want-2*h)) > 1e-9 {
		t.Errorf("ewma(1) forecast %v, want the last value %v", got, want-2*h)
	}
	m, ok := Fit(y, h, 4)
	if !ok || m.Method.Kind != Holt || m.Errors.SMAPE > 1e-9 || math.Abs(m.Value-want) > 1e-6 {
		t.Fatalf("fit %+v (%s), want holt with no error forecasting %v", m, m.Method, want)
	}
	if m.Period != 0 {
		t.Errorf("a line has no season, yet period %d", m.Period)
	}
}

// A daily-like sine of period 24 is found by FFT and forecast exactly by
// the seasonal models; Fit picks one of them.
func TestSeasonKnownAnswer(t *testing.T) {
	f := func(t int) float64 { return 10 + 5*math.Sin(2*math.Pi*float64(t)/24) }
	y := series(24*12, f)
	if p, s := DetectPeriod(y, 4, len(y)/3); p != 24 || s < 0.9 {
		t.Fatalf("period %d strength %v, want 24", p, s)
	}
	const h = 5
	m, ok := Fit(y, h, 4)
	if !ok || m.Period != 24 || (m.Method.Kind != Periodic && m.Method.Kind != HoltWinters) {
		t.Fatalf("fit %+v (%s), want a seasonal model at period 24", m, m.Method)
	}
	if want := f(len(y) - 1 + h); math.Abs(m.Value-want) > 1e-6 {
		t.Errorf("forecast %v, want %v", m.Value, want)
	}
	// Non-seasonal models miss the turns.
	if e := Score(y, Method{Kind: Naive}.Run(y, h), h, len(y)/2, len(y)); e.SMAPE < 10 {
		t.Errorf("naive error on a sine %v%%: the test series is too easy", e.SMAPE)
	}
}

// A season on a trend: Holt-Winters follows both; seasonal naive is off
// by one season's growth, naive by the season's swing over h.
func TestSeasonAndTrendBacktest(t *testing.T) {
	y := series(24*20, func(t int) float64 { return 50 + 0.5*float64(t) + 10*math.Sin(2*math.Pi*float64(t)/24) })
	rows := Backtest(y, 6, 24, len(y)*2/3)
	errs := map[string]float64{}
	for _, r := range rows {
		errs[r.Name] = r.Errors.SMAPE
	}
	base := min(errs["seasonal-naive"], errs["naive"])
	if errs["holt-winters"] > base/10 || errs["auto (chosen by back-test)"] > base/10 {
		t.Errorf("sMAPE %v: want holt-winters and the automatic choice a tenth of the baselines' error or less", errs)
	}
}

// Around a constant level, smoothing beats the naive forecast, which
// repeats each sample's noise.
func TestNoiseSmoothing(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	y := series(2000, func(int) float64 { return 100 + r.NormFloat64()*5 })
	naive := Score(y, Method{Kind: Naive}.Run(y, 1), 1, 1000, len(y))
	m, ok := Fit(y, 1, 4)
	if !ok || m.Errors.SMAPE >= naive.SMAPE*0.8 {
		t.Fatalf("fit %s error %v%%, naive %v%%: want smoothing well below naive", m.Method, m.Errors.SMAPE, naive.SMAPE)
	}
	if p, _ := DetectPeriod(y, 4, len(y)/3); p != 0 {
		t.Errorf("white noise has period %d", p)
	}
}

func TestTooShort(t *testing.T) {
	if _, ok := Fit([]float64{1, 2, 3}, 15, 4); ok {
		t.Error("3 points fit a 15-step forecast")
	}
	if !math.IsNaN((Method{Kind: HoltWinters, Period: 10, Alpha: 0.5, Beta: 0.1, Gamma: 0.1}).Forecast(make([]float64, 15), 1)) {
		t.Error("holt-winters forecast before two seasons")
	}
	if DetectPeriodOfConstant := func() int { p, _ := DetectPeriod(make([]float64, 100), 2, 30); return p }(); DetectPeriodOfConstant != 0 {
		t.Error("a constant has a period")
	}
}

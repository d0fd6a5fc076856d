package sim

import (
	"cmp"
	"container/heap"
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/fusiond/fusiond/daemon/sched"
)

// UtilPoint is the GPU allocation at one time.
type UtilPoint struct {
	Time    int64   `json:"t"`
	UtilPct float64 `json:"util_pct"`
	Queued  int     `json:"queued"`
	// PowerKW is the GPUs' draw and IdleGPUs the GPUs with nothing
	// allocated (see Energy).
	PowerKW  float64 `json:"power_kw"`
	IdleGPUs int     `json:"idle_gpus"`
	// A100Eq is the compute the allocated shares hold, in A100s (see
	// Energy.A100EqHours).
	A100Eq float64 `json:"a100_eq"`
}

// TimedResult is one run of the time-ordered mode. Every utilisation
// figure is taken over the same window for every policy: from the first
// to the last arrival of the (scaled) trace.
type TimedResult struct {
	Policy      string `json:"policy"`
	Pods        int    `json:"pods"`
	Placed      int    `json:"placed"`
	NeverPlaced int    `json:"never_placed"`
	// OfferedPct is the achieved in-window offered GPU load: the GPU time
	// the pods ask for inside the window, over capacity × window (the
	// same for every policy).
	OfferedPct float64 `json:"offered_pct"`
	// Scale is the factor every pod's lifetime was multiplied by to reach
	// the asked-for load (1: as traced).
	Scale float64 `json:"scale"`
	// Copies is how many copies of the trace arrive (1: the trace).
	Copies      int     `json:"copies"`
	WindowS     int64   `json:"window_s"`
	MeanUtilPct float64 `json:"mean_util_pct"`
	PeakUtilPct float64 `json:"peak_util_pct"`
	// GPUHours is the GPU time served inside the window.
	GPUHours float64 `json:"gpu_hours"`
	WaitP50  float64 `json:"wait_p50_s"`
	WaitP95  float64 `json:"wait_p95_s"`
	WaitP99  float64 `json:"wait_p99_s"`
	// Waits are over all pods: a pod never placed counts the time from
	// its arrival to the end of the replay (censored).
	WaitMean float64     `json:"wait_mean_s"`
	Util     []UtilPoint `json:"util,omitempty"`
	// WindowEnd is the end of the window (the last arrival).
	WindowEnd int64 `json:"window_end_t"`
	// WaitCDF is the distribution of the placed pods' queueing delays:
	// the wait below which each share of them (0, 1 … 100 %) was placed.
	WaitCDF []CDFPoint `json:"wait_cdf,omitempty"`
	// Energy is the GPUs' energy and idle time inside the window.
	Energy Energy `json:"energy"`
	// Estimates is the backfill's run-time estimates and their error
	// (TimedOptions.Estimates); nil without.
	Estimates *EstimateStats `json:"estimates,omitempty"`
}

// CDFPoint says that Frac (0..1) of the placed pods waited at most WaitS
// seconds.
type CDFPoint struct {
	WaitS float64 `json:"wait_s"`
	Frac  float64 `json:"frac"`
}

// cdf is v's distribution at every whole percent.
func cdf(v []float64) []CDFPoint {
	if len(v) == 0 {
		return nil
	}
	s := slices.Clone(v)
	slices.Sort(s)
	out := make([]CDFPoint, 0, 101)
	for p := 0; p <= 100; p++ {
		i := min(len(s)-1, max(0, int(math.Ceil(float64(p)/100*float64(len(s))))-1))
		out = append(out, CDFPoint{WaitS: s[i], Frac: float64(p) / 100})
	}
	return out
}

// TimedOptions tune RunTimed.
type TimedOptions struct {
	// Aging is the priority a waiting pod gains per second.
	Aging float64
	// MaxTries bounds the queued pods tried per event (see sched.Queue).
	MaxTries int
	// MaxPoints bounds the utilisation samples kept.
	MaxPoints int
	// LoadPct, when > 0, scales every pod's lifetime by one factor so that
	// the offered GPU load inside the arrival window is LoadPct % of the
	// cluster's GPU capacity (see scaleLoad). The openb trace spans 149
	// days at a few % load, which no policy can tell apart.
	LoadPct float64
	// Power overrides the power model's idle and TDP watts per GPU model
	// (see PowerModel).
	Power map[string][2]float64
	// TFLOPS overrides the dense FP16 TFLOPS per GPU model (see
	// PowerModel).
	TFLOPS map[string]float64
	// Estimates is the run-time estimates the queue's backfill is given
	// (EstimatesProfile, EstimatesLongest, EstimatesExact; "" or
	// EstimatesNone: none, the head's reserved node left to it).
	Estimates string
}

// offeredPct is the in-window offered GPU load of pods whose lifetimes are
// multiplied by k: Σ GPU × (the part of [creation, creation + k·life]
// inside [lo, hi]) over capacity × (hi − lo), pods created before the
// window included for the part they would run inside it.
func offeredPct(pods []Pod, capMilli, lo, hi int64, k float64) float64 {
	w := float64(hi - lo)
	if w <= 0 || capMilli <= 0 {
		return 0
	}
	var sum float64
	for i := range pods {
		p := &pods[i]
		end := float64(hi)
		if p.Deletion > 0 && p.Deletion >= p.Creation {
			end = min(end, float64(p.Creation)+k*float64(p.Deletion-p.Creation))
		}
		sum += float64(p.GPUMilliTotal()) * max(0, end-float64(max(p.Creation, lo)))
	}
	return 100 * sum / (float64(capMilli) * w)
}

// scaleLoad keeps the arrival process as traced (every creation time, so
// every gap and burst) and multiplies every lifetime by the factor k for
// which offeredPct is loadPct; it returns the pods, k and the number of
// copies of the trace superposed. Stretching service times, not squeezing
// arrivals, keeps where the load falls: a stretch of the trace that was
// busy stays busy in proportion. When even endless pods cannot offer
// loadPct (the trace holds too little GPU request), copies of every pod
// arrive one second apart per copy (the rate of the arrival process
// multiplied, its shape kept) until they can with a margin (k ≤ 80 % of
// the endless case).
func scaleLoad(pods []Pod, capMilli int64, loadPct float64) ([]Pod, float64, int) {
	if loadPct <= 0 || len(pods) < 2 || capMilli <= 0 {
		return pods, 1, 1
	}
	lo, hi := window(pods)
	if hi <= lo {
		return pods, 1, 1
	}
	const endless = 1e9
	copies := 1
	most := offeredPct(pods, capMilli, lo, hi, endless)
	if most > 0 && most*0.8 < loadPct {
		copies = int(math.Ceil(loadPct / (most * 0.8)))
	}
	all := pods
	if copies > 1 {
		all = make([]Pod, 0, copies*len(pods))
		for c := range copies {
			for _, p := range pods {
				if c > 0 {
					p.Name = fmt.Sprintf("%s-c%d", p.Name, c)
					p.Creation += int64(c)
					if p.Deletion > 0 {
						p.Deletion += int64(c)
					}
				}
				all = append(all, p)
			}
		}
	}
	klo, khi := 1e-6, endless
	if offeredPct(all, capMilli, lo, hi, khi) < loadPct {
		klo = khi
	} else {
		for range 100 {
			mid := math.Sqrt(klo * khi)
			if offeredPct(all, capMilli, lo, hi, mid) < loadPct {
				klo = mid
			} else {
				khi = mid
			}
		}
	}
	k := klo
	out := slices.Clone(all)
	for i := range out {
		if out[i].Deletion > 0 && out[i].Deletion >= out[i].Creation {
			out[i].Deletion = out[i].Creation + int64(k*float64(out[i].Deletion-out[i].Creation))
		}
	}
	return out, k, copies
}

// window is the measurement window: from the creation of the median pod
// (by creation time) to the last creation. The openb trace's arrivals are
// far from even (about half of them in its last tenth), so the first half
// of the pods is the warm-up that fills the cluster, and the second half
// arrives inside the window.
func window(pods []Pod) (int64, int64) {
	if len(pods) == 0 {
		return 0, 0
	}
	ts := make([]int64, len(pods))
	for i := range pods {
		ts[i] = pods[i].Creation
	}
	slices.Sort(ts)
	return ts[len(ts)/2], ts[len(ts)-1]
}

type finish struct {
	t   int64
	req sched.Request
	a   sched.Assignment
}

type finishHeap []finish

func (h finishHeap) Len() int           { return len(h) }
func (h finishHeap) Less(i, j int) bool { return h[i].t < h[j].t }
func (h finishHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *finishHeap) Push(x any)        { *h = append(*h, x.(finish)) }
func (h *finishHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// RunTimed replays pods in creation order; each runs for its (scaled)
// lifetime from the moment it is placed, then leaves. Pods that do not fit
// wait in a sched.Queue (priority with aging and backfill). Utilisation is
// averaged over the window from the first to the last arrival, the same
// for every policy; waits are those of the pods placed.
func RunTimed(ctx context.Context, specs []NodeSpec, pods []Pod, policy string, seed uint64, coverage float64, o TimedOptions) (TimedResult, error) {
	if o.MaxPoints == 0 {
		o.MaxPoints = 500
	}
	if o.MaxTries == 0 {
		o.MaxTries = 64
	}
	if o.Aging == 0 {
		o.Aging = 1.0 / 3600
	}
	frag := ShapeModel(pods, coverage)
	p, ok := sched.PolicyByName(policy, frag, nil)
	if !ok {
		return TimedResult{}, fmt.Errorf("%w: unknown policy %q", ErrBadOption, policy)
	}
	nodes := BuildNodes(specs)
	var capMilli int64
	for _, n := range nodes {
		capMilli += int64(len(n.GPUs)) * sched.MilliPerGPU
	}
	if capMilli == 0 {
		return TimedResult{}, fmt.Errorf("%w: no GPUs in the node list", ErrBadOption)
	}
	scaled, k, copies := scaleLoad(pods, capMilli, o.LoadPct)
	order := slices.Clone(scaled)
	slices.SortStableFunc(order, func(a, b Pod) int { return cmp.Or(cmp.Compare(a.Creation, b.Creation), cmp.Compare(a.Name, b.Name)) })
	lo, hi := window(order)
	power, err := PowerModel(specs, o.Power, o.TFLOPS)
	if err != nil {
		return TimedResult{}, err
	}
	meter, err := newEnergyMeter(nodes, power, lo, hi)
	if err != nil {
		return TimedResult{}, err
	}
	life := map[string]int64{}
	created := map[string]int64{}
	for _, pd := range order {
		d := pd.Deletion - pd.Creation
		if pd.Deletion == 0 || d < 0 {
			d = math.MaxInt64 / 4
		}
		life[pd.Name] = d
		created[pd.Name] = pd.Creation
	}
	eng := sched.NewEngine(sched.Options{Policy: p, Seed: seed})
	q := &sched.Queue{Aging: o.Aging, MaxTries: o.MaxTries}
	var est *estimator
	runningOn := map[int][]sched.Running{} // with estimates: each node's pods and their expected ends
	if o.Estimates != "" && o.Estimates != EstimatesNone {
		if _, err := ParseEstimates(o.Estimates); err != nil {
			return TimedResult{}, err
		}
		if est, err = newEstimator(o.Estimates, order, life); err != nil {
			return TimedResult{}, err
		}
		q.Estimate = est.queueEstimate
	}
	var running finishHeap
	res := TimedResult{Policy: policy, Pods: len(order), Scale: k, Copies: copies, WindowS: hi - lo, WindowEnd: hi, OfferedPct: offeredPct(order, capMilli, lo, hi, 1)}
	var waits []float64
	placedIDs := map[string]bool{}
	var alloc int64
	var area float64 // GPU milli × seconds inside [lo, hi]
	inWin, last := lo, lo
	var samples []UtilPoint
	next := 0
	for next < len(order) || (running.Len() > 0 && inWin < hi) {
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		t := int64(math.MaxInt64)
		if next < len(order) {
			t = order[next].Creation
		}
		if running.Len() > 0 && running[0].t < t {
			t = running[0].t
		}
		if t >= math.MaxInt64/8 {
			break // only never-ending pods remain
		}
		if e := min(t, hi); e > inWin {
			area += float64(alloc) * float64(e-inWin)
			inWin = e
		}
		last = t
		meter.advance(t)
		for running.Len() > 0 && running[0].t <= t {
			f := heap.Pop(&running).(finish)
			eng.Release(&f.req, &f.a, nodes)
			meter.change(&f.a, -1)
			alloc -= f.req.GPUMilliTotal()
			if est != nil {
				est.clock = t
				runningOn[f.a.NodeIdx] = slices.DeleteFunc(runningOn[f.a.NodeIdx], func(r sched.Running) bool { return r.Request.ID == f.req.ID })
				if err := est.ended(&f.req); err != nil {
					return res, err
				}
			}
		}
		for next < len(order) && order[next].Creation == t {
			q.Push(order[next].Request(), t)
			next++
		}
		var placed []sched.Placement
		if est != nil {
			est.clock = t
			placed, _ = q.ScheduleRunning(t, eng, nodes, func(i int) []sched.Running { return runningOn[i] })
		} else {
			placed, _ = q.Schedule(t, eng, nodes)
		}
		for _, pl := range placed {
			if est != nil {
				r := est.started(&pl.Request, t)
				r.Request, r.Assignment = pl.Request, pl.Decision.Assignment
				runningOn[r.Assignment.NodeIdx] = append(runningOn[r.Assignment.NodeIdx], r)
			}
			alloc += pl.Request.GPUMilliTotal()
			meter.change(&pl.Decision.Assignment, +1)
			waits = append(waits, float64(t-created[pl.Request.ID]))
			placedIDs[pl.Request.ID] = true
			heap.Push(&running, finish{t: t + life[pl.Request.ID], req: pl.Request, a: pl.Decision.Assignment})
		}
		u := 100 * float64(alloc) / float64(capMilli)
		if t <= hi {
			res.PeakUtilPct = max(res.PeakUtilPct, u)
			samples = append(samples, UtilPoint{Time: t, UtilPct: u, Queued: q.Len(), PowerKW: meter.watts / 1000, IdleGPUs: meter.idle, A100Eq: meter.a100Eq()})
		}
	}
	res.Placed = len(waits)
	res.NeverPlaced = q.Len()
	// A pod never placed waited at least until the replay ended: counted
	// so (censored), a policy that leaves big pods waiting forever does
	// not look fast.
	for _, pd := range order {
		if !placedIDs[pd.Name] {
			waits = append(waits, float64(max(0, last-pd.Creation)))
		}
	}
	if hi > lo {
		res.MeanUtilPct = 100 * area / float64(hi-lo) / float64(capMilli)
	}
	res.GPUHours = area / sched.MilliPerGPU / 3600
	res.Energy = meter.result(res.GPUHours, power)
	res.WaitP50, res.WaitP95, res.WaitP99, res.WaitMean = percentile(waits, 0.5), percentile(waits, 0.95), percentile(waits, 0.99), mean(waits)
	res.Util = downsample(samples, o.MaxPoints)
	res.WaitCDF = cdf(waits)
	switch {
	case est != nil:
		s := est.result()
		res.Estimates = &s
	case o.Estimates != "":
		res.Estimates = &EstimateStats{Mode: EstimatesNone}
	}
	return res, nil
}

// percentile is the nearest-rank p-quantile of v (0 ≤ p ≤ 1): the
// smallest value with at least p of v at or below it, so the median of
// an even count is the lower middle value.
func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[max(0, min(len(s)-1, int(math.Ceil(p*float64(len(s))))-1))]
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	var t float64
	for _, x := range v {
		t += x
	}
	return t / float64(len(v))
}

func downsample(s []UtilPoint, n int) []UtilPoint {
	if len(s) <= n {
		return s
	}
	out := make([]UtilPoint, 0, n)
	for i := range n {
		out = append(out, s[i*len(s)/n])
	}
	return out
}

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
}

// TimedResult is one run of the time-ordered mode.
type TimedResult struct {
	Policy      string      `json:"policy"`
	Pods        int         `json:"pods"`
	Placed      int         `json:"placed"`
	NeverPlaced int         `json:"never_placed"`
	MeanUtilPct float64     `json:"mean_util_pct"`
	PeakUtilPct float64     `json:"peak_util_pct"`
	WaitP50     float64     `json:"wait_p50_s"`
	WaitP95     float64     `json:"wait_p95_s"`
	WaitMean    float64     `json:"wait_mean_s"`
	Util        []UtilPoint `json:"util,omitempty"`
	// LastPlaced is the time the last pod was placed: the mean
	// utilisation covers the trace up to it (the long-lived pods that
	// run on after it are left out).
	LastPlaced int64 `json:"last_placed_t"`
	// WaitCDF is the distribution of the placed pods' queueing delays:
	// the wait below which each share of them (0, 1 … 100 %) was placed.
	WaitCDF []CDFPoint `json:"wait_cdf,omitempty"`
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
	// LoadPct, when > 0, compresses arrival times (lifetimes unchanged) so
	// that the offered GPU load inside the arrival window is LoadPct % of
	// the cluster's GPU capacity (see compress). The openb trace spans
	// 149 days at a few % load, which no policy can tell apart.
	LoadPct float64
}

// compress scales arrival times (lifetimes unchanged) by the factor k
// for which the offered GPU load inside the compressed arrival window —
// Σ GPU × min(lifetime, window) / (capacity × window) — is loadPct. That
// load cannot exceed the trace's total request over capacity.
func compress(pods []Pod, capMilli int64, loadPct float64) []Pod {
	if loadPct <= 0 || len(pods) < 2 || capMilli <= 0 {
		return pods
	}
	lo, hi := pods[0].Creation, pods[0].Creation
	for _, p := range pods {
		lo, hi = min(lo, p.Creation), max(hi, p.Creation)
	}
	span := float64(hi - lo)
	if span <= 0 {
		return pods
	}
	offered := func(k float64) float64 {
		w := span / k
		var sum float64
		for _, p := range pods {
			life := float64(p.Deletion - p.Creation)
			if p.Deletion == 0 || life < 0 {
				life = w
			}
			sum += float64(p.GPUMilliTotal()) * min(life, w)
		}
		return 100 * sum / (float64(capMilli) * w)
	}
	klo, khi := 1.0, 1e9
	if offered(klo) >= loadPct {
		return pods
	}
	for range 100 {
		mid := math.Sqrt(klo * khi)
		if offered(mid) < loadPct {
			klo = mid
		} else {
			khi = mid
		}
	}
	k := khi
	out := slices.Clone(pods)
	for i := range out {
		life := out[i].Deletion - out[i].Creation
		out[i].Creation = lo + int64(float64(out[i].Creation-lo)/k)
		if out[i].Deletion > 0 {
			out[i].Deletion = out[i].Creation + life
		}
	}
	return out
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

// RunTimed replays pods in creation order (mean utilisation is taken from
// the first arrival until the last placement); each runs for its traced
// lifetime (deletion − creation) from the moment it is placed, then leaves.
// Pods that do not fit wait in a sched.Queue (priority with aging and
// backfill). It reports GPU utilisation over time and queueing delay.
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
	order := slices.Clone(compress(pods, capMilli, o.LoadPct))
	slices.SortStableFunc(order, func(a, b Pod) int { return cmp.Or(cmp.Compare(a.Creation, b.Creation), cmp.Compare(a.Name, b.Name)) })
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
	var running finishHeap
	res := TimedResult{Policy: policy, Pods: len(order)}
	var waits []float64
	var alloc int64
	var utilArea float64
	var last, first int64 = 0, 0
	if len(order) > 0 {
		first, last = order[0].Creation, order[0].Creation
	}
	var samples []UtilPoint
	next := 0
	for next < len(order) || running.Len() > 0 {
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
		if next < len(order) || q.Len() > 0 { // averaged until the last pod is placed
			utilArea += float64(alloc) * float64(t-last)
			last = t
		}
		for running.Len() > 0 && running[0].t <= t {
			f := heap.Pop(&running).(finish)
			eng.Release(&f.req, &f.a, nodes)
			alloc -= f.req.GPUMilliTotal()
		}
		for next < len(order) && order[next].Creation == t {
			q.Push(order[next].Request(), t)
			next++
		}
		placed, _ := q.Schedule(t, eng, nodes)
		for _, pl := range placed {
			alloc += pl.Request.GPUMilliTotal()
			waits = append(waits, float64(t-created[pl.Request.ID]))
			heap.Push(&running, finish{t: t + life[pl.Request.ID], req: pl.Request, a: pl.Decision.Assignment})
		}
		u := 100 * float64(alloc) / float64(capMilli)
		res.PeakUtilPct = max(res.PeakUtilPct, u)
		samples = append(samples, UtilPoint{Time: t, UtilPct: u, Queued: q.Len()})
	}
	res.Placed = len(waits)
	res.LastPlaced = last
	res.NeverPlaced = q.Len()
	if span := last - first; span > 0 {
		res.MeanUtilPct = 100 * utilArea / float64(span) / float64(capMilli)
	}
	res.WaitP50, res.WaitP95, res.WaitMean = percentile(waits, 0.5), percentile(waits, 0.95), mean(waits)
	res.Util = downsample(samples, o.MaxPoints)
	res.WaitCDF = cdf(waits)
	return res, nil
}

func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[min(len(s)-1, int(math.Ceil(p*float64(len(s))))-1)]
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

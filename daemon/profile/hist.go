package profile

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
)

// The histogram's buckets are logarithmic: bucketsPerOctave to each
// doubling (each about 4.4% wide), covering [2^minExp, 2^maxExp); values
// below 2^minExp (zero included) fall in one zero bucket, values from
// 2^maxExp up in the last bucket. A histogram holds at most maxStored
// buckets: past that, two neighbours become one bucket over both index
// ranges (mergeClosest).
const (
	bucketsPerOctave = 16
	minExp           = -20 // about 1e-6
	maxExp           = 44  // about 1.8e13
	zeroIndex        = minExp*bucketsPerOctave - 1
	lastIndex        = maxExp*bucketsPerOctave - 1
	maxStored        = 64
	// pruneBelow drops a bucket whose decayed weight fell below it: an
	// observation weighs 1 when it is folded in, so this is one about 30
	// half-lives old.
	pruneBelow = 1e-9
)

// bucket is one bucket's decayed weight and the smallest and largest
// value folded into it (interpolation runs between them, so a bucket of
// one distinct value answers that value exactly). It covers the indexes
// from I (bucketIndex(Lo)) to bucketIndex(Hi): one, or several once
// merged. It is saved as the JSON array [I, W, Lo, Hi].
type bucket struct {
	I  int
	W  float64
	Lo float64
	Hi float64
}

func (b bucket) MarshalJSON() ([]byte, error) {
	return json.Marshal([4]float64{float64(b.I), b.W, b.Lo, b.Hi})
}

func (b *bucket) UnmarshalJSON(data []byte) error {
	var a []float64
	if err := json.Unmarshal(data, &a); err != nil {
		return err
	}
	if len(a) != 4 {
		return fmt.Errorf("bucket of %d numbers, want 4", len(a))
	}
	if a[0] != math.Trunc(a[0]) || a[0] < zeroIndex || a[0] > lastIndex {
		return fmt.Errorf("bucket index %v out of range", a[0])
	}
	*b = bucket{I: int(a[0]), W: a[1], Lo: a[2], Hi: a[3]}
	return nil
}

// hist is a log-bucketed histogram with decayed weights, its buckets
// sorted by index. The zero value is empty.
type hist struct {
	B []bucket `json:"b,omitempty"`
}

func bucketIndex(v float64) int {
	if v < math.Ldexp(1, minExp) {
		return zeroIndex
	}
	i := int(math.Floor(math.Log2(v) * bucketsPerOctave))
	if i > lastIndex {
		i = lastIndex
	}
	if i <= zeroIndex { // rounding at the lower edge
		i = zeroIndex + 1
	}
	return i
}

// add folds value v (finite, ≥ 0) with weight w > 0.
func (h *hist) add(v, w float64) {
	i := bucketIndex(v)
	// k: the first bucket starting after i; the one before may cover i.
	k := sort.Search(len(h.B), func(j int) bool { return h.B[j].I > i })
	if k > 0 && bucketIndex(h.B[k-1].Hi) >= i {
		b := &h.B[k-1]
		b.W += w
		b.Lo = math.Min(b.Lo, v)
		b.Hi = math.Max(b.Hi, v)
		return
	}
	h.B = append(h.B, bucket{})
	copy(h.B[k+1:], h.B[k:])
	h.B[k] = bucket{I: i, W: w, Lo: v, Hi: v}
	if len(h.B) > maxStored {
		h.mergeClosest()
	}
}

// mergeClosest makes one of the two neighbouring buckets that cost least
// to merge: their weight together times the log of the span they would
// cover. Light buckets close together go first, so the resolution stays
// where the weight is (the quantiles) without letting one bucket grow
// across the whole range.
func (h *hist) mergeClosest() {
	best, bestCost := -1, math.Inf(1)
	for k := 0; k+1 < len(h.B); k++ {
		lo, hi := h.B[k].Lo, h.B[k+1].Hi
		cost := math.Inf(1)
		switch {
		case lo > 0:
			cost = (h.B[k].W + h.B[k+1].W) * math.Log(hi/lo)
		case hi == 0:
			cost = 0
		}
		if cost < bestCost || best < 0 {
			best, bestCost = k, cost
		}
	}
	a, b := &h.B[best], h.B[best+1]
	a.W += b.W
	a.Hi = b.Hi
	h.B = append(h.B[:best+1], h.B[best+2:]...)
}

// scale multiplies every weight by f (0 ≤ f ≤ 1) and drops the buckets
// whose weight fell below pruneBelow.
func (h *hist) scale(f float64) {
	n := 0
	for _, b := range h.B {
		b.W *= f
		if b.W >= pruneBelow {
			h.B[n] = b
			n++
		}
	}
	clear(h.B[n:])
	h.B = h.B[:n]
	if n == 0 {
		h.B = nil
	}
}

func (h *hist) total() float64 {
	var t float64
	for _, b := range h.B {
		t += b.W
	}
	return t
}

// quantile is the weighted q-quantile (0 ≤ q ≤ 1): the bucket where the
// cumulative weight reaches q of the total, interpolated between that
// bucket's smallest and largest value by the share of its weight needed.
// On equal weights and values in distinct buckets this is the
// nearest-rank quantile. 0 when empty.
func (h *hist) quantile(q float64) float64 {
	t := h.total()
	if t <= 0 {
		return 0
	}
	rank := q * t
	var cum float64
	for _, b := range h.B {
		if cum+b.W >= rank {
			frac := (rank - cum) / b.W
			frac = math.Min(1, math.Max(0, frac))
			return b.Lo + frac*(b.Hi-b.Lo)
		}
		cum += b.W
	}
	return h.B[len(h.B)-1].Hi
}

func (h *hist) max() float64 {
	if len(h.B) == 0 {
		return 0
	}
	return h.B[len(h.B)-1].Hi
}

func (h *hist) clone() hist {
	if h.B == nil {
		return hist{}
	}
	return hist{B: append([]bucket(nil), h.B...)}
}

// check is what Load asks of a stored histogram: at most maxStored
// buckets, indexes in range, weights finite and positive, values finite,
// ≥ 0, Lo ≤ Hi, Lo in the bucket's first index, and each bucket's
// indexes (I to bucketIndex(Hi)) before the next one's.
func (h *hist) check() error {
	if len(h.B) > maxStored {
		return fmt.Errorf("%d buckets, more than %d", len(h.B), maxStored)
	}
	prev := zeroIndex - 1
	for _, b := range h.B {
		switch {
		case b.I < zeroIndex || b.I > lastIndex:
			return fmt.Errorf("bucket index %d out of range", b.I)
		case b.I <= prev:
			return errors.New("buckets overlap or are out of order")
		case !finite(b.W) || b.W <= 0:
			return fmt.Errorf("bucket %d: weight %v", b.I, b.W)
		case !finite(b.Lo) || !finite(b.Hi) || b.Lo < 0 || b.Lo > b.Hi:
			return fmt.Errorf("bucket %d: values %v..%v", b.I, b.Lo, b.Hi)
		case bucketIndex(b.Lo) != b.I:
			return fmt.Errorf("bucket %d: value %v outside it", b.I, b.Lo)
		}
		prev = bucketIndex(b.Hi)
	}
	return nil
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// Sketch is a bounded summary of one run's readings, for its Typical
// (p50) and Peak (p95) usage: the histogram profiles keep, undecayed
// (every reading weighs 1). While the readings fall in at most 64
// buckets its quantiles are within one bucket (about 4.4%) of their
// nearest-rank ones; past that, neighbouring buckets are merged (see
// maxStored) and a quantile is interpolated over a wider bucket. It
// holds at most 64 buckets however many readings it is fed. The zero value is
// empty; it is not safe for concurrent use.
type Sketch struct {
	h hist
	n int
}

// Add folds one reading in; NaN, infinite and negative readings are
// ignored (false).
func (s *Sketch) Add(v float64) bool {
	if !finite(v) || v < 0 {
		return false
	}
	s.h.add(v, 1)
	s.n++
	return true
}

// Count is the readings folded in.
func (s *Sketch) Count() int { return s.n }

// Quantile is the readings' q-quantile (0 ≤ q ≤ 1); 0 when empty.
func (s *Sketch) Quantile(q float64) float64 { return s.h.quantile(q) }

// Max is the largest reading; 0 when empty.
func (s *Sketch) Max() float64 { return s.h.max() }

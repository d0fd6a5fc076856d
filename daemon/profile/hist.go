package profile

import (
	"errors"
	"fmt"
	"math"
	"sort"
)

// The histogram's buckets are logarithmic: bucketsPerOctave to each
// doubling (each about 4.4% wide), covering [2^minExp, 2^maxExp); values
// below 2^minExp (zero included) fall in one zero bucket, values from
// 2^maxExp up in the last bucket. A histogram therefore holds at most
// maxBuckets buckets whatever it is fed.
const (
	bucketsPerOctave = 16
	minExp           = -20 // about 1e-6
	maxExp           = 44  // about 1.8e13
	zeroIndex        = minExp*bucketsPerOctave - 1
	lastIndex        = maxExp*bucketsPerOctave - 1
	maxBuckets       = lastIndex - zeroIndex + 1
	// pruneBelow drops a bucket whose decayed weight fell below it: an
	// observation weighs 1 when it is folded in, so this is one about 30
	// half-lives old.
	pruneBelow = 1e-9
)

// bucket is one bucket's decayed weight and the smallest and largest
// value folded into it (interpolation runs between them, so a bucket of
// one distinct value answers that value exactly).
type bucket struct {
	I  int     `json:"i"`
	W  float64 `json:"w"`
	Lo float64 `json:"lo"`
	Hi float64 `json:"hi"`
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
	k := sort.Search(len(h.B), func(j int) bool { return h.B[j].I >= i })
	if k < len(h.B) && h.B[k].I == i {
		b := &h.B[k]
		b.W += w
		b.Lo = math.Min(b.Lo, v)
		b.Hi = math.Max(b.Hi, v)
		return
	}
	h.B = append(h.B, bucket{})
	copy(h.B[k+1:], h.B[k:])
	h.B[k] = bucket{I: i, W: w, Lo: v, Hi: v}
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

// check is what Load asks of a stored histogram: indexes in range and
// strictly increasing, weights finite and positive, each value finite,
// ≥ 0, inside its bucket's index, Lo ≤ Hi.
func (h *hist) check() error {
	if len(h.B) > maxBuckets {
		return fmt.Errorf("%d buckets, more than %d", len(h.B), maxBuckets)
	}
	prev := zeroIndex - 1
	for _, b := range h.B {
		switch {
		case b.I < zeroIndex || b.I > lastIndex:
			return fmt.Errorf("bucket index %d out of range", b.I)
		case b.I <= prev:
			return errors.New("bucket indexes not increasing")
		case !finite(b.W) || b.W <= 0:
			return fmt.Errorf("bucket %d: weight %v", b.I, b.W)
		case !finite(b.Lo) || !finite(b.Hi) || b.Lo < 0 || b.Lo > b.Hi:
			return fmt.Errorf("bucket %d: values %v..%v", b.I, b.Lo, b.Hi)
		case bucketIndex(b.Lo) != b.I || bucketIndex(b.Hi) != b.I:
			return fmt.Errorf("bucket %d: values %v..%v outside it", b.I, b.Lo, b.Hi)
		}
		prev = b.I
	}
	return nil
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// Sketch is a bounded summary of one run's readings, for its Typical
// (p50) and Peak (p95) usage: the histogram profiles keep, undecayed
// (every reading weighs 1). Its quantiles are within one bucket (about
// 4.4%) of the readings' nearest-rank ones, and it holds at most a few
// hundred buckets however many readings it is fed. The zero value is
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

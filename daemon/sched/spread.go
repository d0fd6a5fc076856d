package sched

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
)

// SpreadChoice is the order in which a decentralised origin offers a job
// to candidates ranked on a shared, stale view: instead of every origin
// deciding within one gossip interval offering to the same best candidate
// (herding), each pick is a power-of-d choice among the best candidates
// still left. The zero value (or Top 1) is no spread: rank order.
type SpreadChoice struct {
	// Top is how many of the best-ranked candidates still left each pick
	// draws from (0 or 1: always the best left).
	Top int
	// Within keeps out of a draw the candidates scoring more than Within
	// below the best one left, so a clearly better candidate is still
	// offered first (0: no bound).
	Within float64
	// Choices is d: each pick samples Choices of the drawn candidates
	// (distinct, uniformly) and takes the best-ranked of them (0 or 1: a
	// uniform pick among them; Top or more: always the best left).
	Choices int
}

// ErrBadSpread is returned by SpreadChoice.Validate.
var ErrBadSpread = errors.New("invalid spread choice")

// Validate says what is wrong with s's parameters.
func (s SpreadChoice) Validate() error {
	switch {
	case s.Top < 0 || s.Top > 1024:
		return fmt.Errorf("%w: top %d: between 0 and 1024", ErrBadSpread, s.Top)
	case s.Choices < 0 || s.Choices > 1024:
		return fmt.Errorf("%w: choices %d: between 0 and 1024", ErrBadSpread, s.Choices)
	case math.IsNaN(s.Within) || s.Within < 0 || s.Within > 1:
		return fmt.Errorf("%w: within %v: between 0 and 1", ErrBadSpread, s.Within)
	}
	return nil
}

// Order returns the order in which to offer to the candidates whose
// scores are given best first: a permutation of their indices, of which
// only the first limit are chosen (limit <= 0: all; the rest follow in
// rank order). Each position is picked from the best Top candidates not
// yet ordered (those within Within of the best of them): Choices of them
// are sampled with rng and the best-ranked sampled comes next. It is
// deterministic for a given rng state; a nil rng, or parameters that do
// not Validate, give rank order.
func (s SpreadChoice) Order(scores []float64, limit int, rng *rand.Rand) []int {
	order := make([]int, len(scores))
	for i := range order {
		order[i] = i
	}
	if rng == nil || s.Top <= 1 || s.Validate() != nil {
		return order
	}
	if limit <= 0 || limit > len(order) {
		limit = len(order)
	}
	for pos := range limit {
		left := order[pos:]
		pool := min(s.Top, len(left))
		if s.Within > 0 {
			best := scores[left[0]]
			for k := 1; k < pool; k++ {
				if !(best-scores[left[k]] <= s.Within) { // NaN scores stay out
					pool = k
					break
				}
			}
		}
		if pool <= 1 {
			continue
		}
		pick := s.pick(pool, rng)
		// Offer left[pick] next; the others keep their rank order.
		chosen := left[pick]
		copy(left[1:pick+1], left[:pick])
		left[0] = chosen
	}
	return order
}

// pick draws an index below pool: the smallest of Choices distinct
// uniform samples (one sample when Choices is 0 or 1).
func (s SpreadChoice) pick(pool int, rng *rand.Rand) int {
	d := max(s.Choices, 1)
	if d >= pool {
		return 0
	}
	if d == 1 {
		return rng.IntN(pool)
	}
	// The smallest of d distinct samples from [0, pool): Floyd's sampling
	// without a set, as d is small and pool at most Top.
	best := pool
	var seen [64]bool
	taken := seen[:0]
	if pool <= len(seen) {
		taken = seen[:pool]
	} else {
		taken = make([]bool, pool)
	}
	for j := pool - d; j < pool; j++ {
		t := rng.IntN(j + 1)
		if taken[t] {
			t = j
		}
		taken[t] = true
		best = min(best, t)
	}
	return best
}

// DefaultSpread is the daemon's spread choice of offers (peers.Node.Offer)
// and the simulator's default: a uniform pick between the two best-ranked
// candidates left, measured on the decentralised openb replay
// (docs/peers.md, "Decentralised vs centralised on openb").
func DefaultSpread() SpreadChoice { return SpreadChoice{Top: 2} }

package sched

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// constSource draws the same number every time: 0 makes every pick the
// first of its pool, ^0 the last of a pool of two.
type constSource uint64

func (s constSource) Uint64() uint64 { return uint64(s) }

func TestSpreadOrderNoSpreadIsRankOrder(t *testing.T) {
	scores := []float64{0.9, 0.8, 0.7, 0.6}
	want := []int{0, 1, 2, 3}
	rng := rand.New(constSource(^uint64(0)))
	for _, s := range []SpreadChoice{{}, {Top: 1}, {Top: 4, Choices: 4}} {
		if got := s.Order(scores, 0, rng); !slices.Equal(got, want) {
			t.Errorf("%+v: order %v, want rank order %v", s, got, want)
		}
	}
	if got := (SpreadChoice{Top: 2}).Order(scores, 0, nil); !slices.Equal(got, want) {
		t.Errorf("nil rng: order %v, want rank order", got)
	}
	if got := (SpreadChoice{Top: -2}).Order(scores, 0, rng); !slices.Equal(got, want) {
		t.Errorf("invalid choice: order %v, want rank order", got)
	}
	if got := (SpreadChoice{Top: 2}).Order(nil, 0, rng); len(got) != 0 {
		t.Errorf("no candidates: %v", got)
	}
}

func TestSpreadOrderPicksAmongTheBestLeft(t *testing.T) {
	scores := []float64{0.9, 0.8, 0.7, 0.6}
	// Always the second of the two best left.
	if got, want := (SpreadChoice{Top: 2}).Order(scores, 0, rand.New(constSource(^uint64(0)))), []int{1, 2, 3, 0}; !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
	// Only the first position is chosen; the rest stay in rank order.
	if got, want := (SpreadChoice{Top: 2}).Order(scores, 1, rand.New(constSource(^uint64(0)))), []int{1, 0, 2, 3}; !slices.Equal(got, want) {
		t.Errorf("limit 1: order %v, want %v", got, want)
	}
	// Within: a clearly better candidate is offered first, near-ties
	// spread.
	near := []float64{1, 0.5, 0.49, 0.2}
	if got, want := (SpreadChoice{Top: 2, Within: 0.1}).Order(near, 0, rand.New(constSource(^uint64(0)))), []int{0, 2, 1, 3}; !slices.Equal(got, want) {
		t.Errorf("within 0.1: order %v, want %v", got, want)
	}
	// NaN scores: no panic, still a permutation.
	odd := []float64{math.NaN(), 0.5, math.NaN()}
	got := (SpreadChoice{Top: 3, Within: 0.1}).Order(odd, 0, rand.New(rand.NewPCG(1, 2)))
	if s := slices.Sorted(slices.Values(got)); !slices.Equal(s, []int{0, 1, 2}) {
		t.Errorf("NaN scores: %v is not a permutation", got)
	}
}

// TestSpreadOrderDraws checks the draw's law on a seeded rng: a uniform
// pick between the two best offers the best first half the time; the
// power of two choices among three, two thirds; and every order is a
// permutation, the same again for the same seed.
func TestSpreadOrderDraws(t *testing.T) {
	scores := []float64{0.9, 0.8, 0.7, 0.6, 0.5, 0.4}
	for _, c := range []struct {
		s    SpreadChoice
		want float64
	}{{SpreadChoice{Top: 2}, 1.0 / 2}, {SpreadChoice{Top: 3, Choices: 2}, 2.0 / 3}, {SpreadChoice{Top: 3}, 1.0 / 3}} {
		rng := rand.New(rand.NewPCG(7, 8))
		const draws = 20000
		first := 0
		var orders [][]int
		for range draws {
			o := c.s.Order(scores, 0, rng)
			if s := slices.Sorted(slices.Values(o)); !slices.Equal(s, []int{0, 1, 2, 3, 4, 5}) {
				t.Fatalf("%+v: %v is not a permutation", c.s, o)
			}
			if o[0] >= c.s.Top {
				t.Fatalf("%+v: first offer ranked %d, outside the best %d", c.s, o[0]+1, c.s.Top)
			}
			if o[0] == 0 {
				first++
			}
			if len(orders) < 10 {
				orders = append(orders, o)
			}
		}
		if f := float64(first) / draws; math.Abs(f-c.want) > 0.02 {
			t.Errorf("%+v: the best offered first %.3f of the time, want %.3f", c.s, f, c.want)
		}
		again := rand.New(rand.NewPCG(7, 8))
		for _, o := range orders {
			if got := c.s.Order(scores, 0, again); !slices.Equal(got, o) {
				t.Fatalf("%+v: the same seed gave %v, then %v", c.s, o, got)
			}
		}
	}
}

func TestSpreadChoiceValidate(t *testing.T) {
	for _, s := range []SpreadChoice{{Top: -1}, {Top: 5000}, {Choices: -1}, {Within: math.NaN()}, {Within: -0.1}, {Within: 2}} {
		if err := s.Validate(); !errors.Is(err, ErrBadSpread) {
			t.Errorf("%+v: %v, want ErrBadSpread", s, err)
		}
	}
	if err := DefaultSpread().Validate(); err != nil {
		t.Errorf("default: %v", err)
	}
}

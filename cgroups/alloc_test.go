package cgroups

import (
	"errors"
	"slices"
	"testing"
)

// twoNodes is 2 NUMA nodes × 2 cores × 2 SMT threads.
func twoNodes() []Core {
	return []Core{
		{Node: 0, CPUs: []int{0, 4}}, {Node: 0, CPUs: []int{1, 5}},
		{Node: 1, CPUs: []int{2, 6}}, {Node: 1, CPUs: []int{3, 7}},
	}
}

func TestAllocator(t *testing.T) {
	a, err := NewCPUAllocator(twoNodes(), 1)
	if err != nil {
		t.Fatal(err)
	}
	got, err := a.Allocate("g1", 1, 1)
	if err != nil || !slices.Equal(got, []int{2, 6}) {
		t.Fatalf("Allocate = %v, %v", got, err)
	}
	if s := a.Shared(); !slices.Equal(s, []int{0, 1, 3, 4, 5, 7}) {
		t.Errorf("shared after g1 = %v", s)
	}
	if _, err := a.Allocate("g2", 1, 2); !errors.Is(err, ErrInsufficientCPUs) {
		t.Errorf("over-allocating node 1: %v", err)
	}
	if _, err := a.Allocate("g1", 0, 1); !errors.Is(err, ErrInvalidPlacement) {
		t.Errorf("second allocation for g1: %v", err)
	}
	if _, err := a.Allocate("g3", 0, 2); err != nil {
		t.Fatal(err)
	}
	// One core left: min shared 1 must keep it.
	if _, err := a.Allocate("g4", -1, 1); !errors.Is(err, ErrInsufficientCPUs) {
		t.Errorf("taking the last shared core: %v", err)
	}
	if r := a.Release("g1"); !slices.Equal(r, []int{2, 6}) {
		t.Errorf("Release = %v", r)
	}
	if got, err := a.Allocate("g4", -1, 1); err != nil || !slices.Equal(got, []int{2, 6}) {
		t.Errorf("any-node allocation = %v, %v", got, err)
	}
	if ex := a.Exclusive("g3"); !slices.Equal(ex, []int{0, 1, 4, 5}) {
		t.Errorf("Exclusive(g3) = %v", ex)
	}
}

func TestAllocatorClaim(t *testing.T) {
	a, _ := NewCPUAllocator(twoNodes(), 0)
	if err := a.Claim("old", []int{3, 7}); err != nil {
		t.Fatal(err)
	}
	if err := a.Claim("other", []int{3, 7}); !errors.Is(err, ErrInsufficientCPUs) {
		t.Errorf("double claim: %v", err)
	}
	if err := a.Claim("half", []int{0}); !errors.Is(err, ErrInvalidPlacement) {
		t.Errorf("half-core claim: %v", err)
	}
	if err := a.Claim("ghost", []int{99}); !errors.Is(err, ErrInvalidPlacement) {
		t.Errorf("unknown cpu claim: %v", err)
	}
	if s := a.Shared(); slices.Contains(s, 3) || slices.Contains(s, 7) || len(s) != 6 {
		t.Errorf("shared after claim = %v", s)
	}
	if _, err := NewCPUAllocator([]Core{{CPUs: []int{0}}, {CPUs: []int{0}}}, 0); err == nil {
		t.Error("duplicate cpu accepted")
	}
	if CoresFor(1500) != 2 || CoresFor(1000) != 1 || CoresFor(0) != 0 {
		t.Error("CoresFor rounding")
	}
}

package peers

import (
	"fmt"
	"testing"
	"time"
)

// A key's bucket gives its burst at once and then rate a second; other
// keys have their own; past max keys the idle ones are forgotten first.
func TestKeyedBuckets(t *testing.T) {
	kb := keyedBuckets{rate: 10, burst: 3, max: 4}
	t0 := time.Unix(1000, 0)
	took := 0
	for range 10 {
		if kb.take("a", t0) {
			took++
		}
	}
	if took != 3 {
		t.Fatalf("a burst of %d at once, want 3", took)
	}
	if !kb.take("b", t0) {
		t.Fatal("another key shares a's bucket")
	}
	if kb.take("a", t0.Add(50*time.Millisecond)) {
		t.Fatal("a token after 50 ms at 10 a second")
	}
	if !kb.take("a", t0.Add(150*time.Millisecond)) {
		t.Fatal("no token after 150 ms at 10 a second")
	}
	// c and d fill the map (a, b, c, d); a new key e forgets those full
	// again by then (b, c, d: one token used each, refilled), not a.
	kb.take("c", t0.Add(150*time.Millisecond))
	kb.take("d", t0.Add(150*time.Millisecond))
	later := t0.Add(time.Second)
	for range 3 {
		kb.take("a", later) // a empties
	}
	if !kb.take("e", later) || len(kb.m) > 4 {
		t.Fatalf("a fifth key: %d keys kept", len(kb.m))
	}
	if _, ok := kb.m["a"]; !ok {
		t.Error("a busy key was forgotten for a new one")
	}
	for i := range 100 {
		kb.take(fmt.Sprint("k", i), later)
	}
	if len(kb.m) > 4 {
		t.Errorf("%d keys kept, at most 4", len(kb.m))
	}
}

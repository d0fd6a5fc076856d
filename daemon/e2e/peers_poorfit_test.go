package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// TestPeersPoorFit: the poor-fit rule in real daemons (peers.rank_self at
// its defaults, below 0.5 and margin 0.1). b runs a job holding all but
// 400m of its CPU; a is idle. A batch job of 300m fits a, but there the
// engine scores it poorly (it packs: a small job on an empty host), while
// on b's gossiped load it fills most of what is free: a offers it to b,
// which runs it; a never placed it.
func TestPeersPoorFit(t *testing.T) {
	root := publicTempDir(t)
	ds, cs := peerDaemons(t, root, []string{"a", "b"}, func(int, string) (string, string) { return "", "" })
	da, db, ca, cb := ds[0], ds[1], cs[0], cs[1]
	free := loadOf(t, ca, "b").CPU
	if free < 1000 {
		t.Fatalf("b gossips %v free CPU; the test wants at least 1 core", free)
	}
	hog := fmt.Sprintf(`{"name":"hog","class":"batch","command":["sleep","600"],"resources":{"cpu":"%dm","memory":"16Mi"}}`, free-400)
	sub := db.ctl(asNobody, hog, "submit", "-q", "-")
	if sub.code != 0 {
		t.Fatalf("submit the hog to b: %s%s", sub.stdout, sub.stderr)
	}
	h := waitFor(t, cb, strings.TrimSpace(sub.stdout), api.StateRunning)
	if h.Handover != nil {
		t.Fatalf("b's hog went to a peer: %+v", h.Handover)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if l := loadOf(t, ca, "b"); l != nil && l.CPU <= 400 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a does not see b's hog: b's load %+v", loadOf(t, ca, "b"))
		}
	}
	sub = da.ctl(asNobody, `{"name":"small","class":"batch","command":["true"],"resources":{"cpu":"300m","memory":"16Mi"}}`, "submit", "-q", "-")
	if sub.code != 0 {
		t.Fatalf("submit to a: %s%s", sub.stdout, sub.stderr)
	}
	j := waitFor(t, ca, strings.TrimSpace(sub.stdout), api.StateSucceeded)
	var events []string
	for _, e := range j.Events {
		events = append(events, string(e.To)+": "+e.Reason)
	}
	r := strings.Join(events, "\n")
	if j.Handover == nil || j.Handover.Peer != "b" || !strings.Contains(j.Handover.Why, "fits here poorly (engine score ") ||
		strings.Contains(r, "placed: placed: ") {
		t.Fatalf("the small job on a: handover %+v, events:\n%s", j.Handover, r)
	}
	t.Logf("why: %s", j.Handover.Why)
}

// loadOf is what c's daemon last heard of name's load (nil: nothing).
func loadOf(t *testing.T, c *api.Client, name string) *api.PeerLoad {
	t.Helper()
	for _, p := range peersOf(t, c).Peers {
		if p.Name == name {
			return p.Load
		}
	}
	return nil
}

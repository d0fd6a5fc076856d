package handover

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// GangOverflow is an Overflow that can place a gang bigger than this host
// across peers, all or nothing, in three steps that the origin drives
// (offerGang):
//
//  1. reserve: every member is held on a peer (placed there, not started)
//     or none is;
//  2. commit: each holder records its member committed, still not
//     started, and keeps it for a start barrier; if any commit fails the
//     origin releases every member, committed ones included, and nothing
//     has run;
//  3. start: only when every commit succeeded, every holder is told to
//     start its member.
//
// A held member not committed within its hold, and a committed one that
// hears no start within its barrier, is released by its holder without
// running (held.go). This daemon keeps no member of such a gang itself:
// every member is on a peer (ReserveGang never ranks this host).
type GangOverflow interface {
	Overflow
	// ReserveGang holds every member on peers ranked by gossiped load
	// (locals are the members' keys on this daemon, as for Offer) and
	// returns their hand-overs, or releases what it held and fails.
	ReserveGang(ctx context.Context, locals []string, members []api.Job) ([]api.Handover, error)
	// CommitMember commits one held member: its holder keeps it placed,
	// not started, until StartMember or the end of its start barrier.
	// started is true when the holder predates the start barrier and
	// started the member at its commit.
	CommitMember(ctx context.Context, h api.Handover) (started bool, err error)
	// StartMember starts a committed member.
	StartMember(ctx context.Context, h api.Handover) error
	// ReleaseMember releases a held or committed member that has not
	// started (why is recorded there); one that started is cancelled.
	ReleaseMember(ctx context.Context, h api.Handover, why string) error
}

// overflowGang offers a whole gang that does not fit here to peers, when
// the Overflow can place gangs; it reports whether it took the gang.
func (a *Agent) overflowGang(group []*api.Job, why string) bool {
	g, ok := a.o.(GangOverflow)
	if !ok || len(group) < 2 {
		return false
	}
	j := group[0]
	budget, ok := a.cfg.Budget[j.Spec.Class]
	if !ok {
		return false
	}
	if a.jobs.CanRun(j.Spec) != nil {
		budget = 0 // its members can never run here
	}
	members := ids(group)
	if taken, offer := a.offerDue(members, budget); !offer {
		return taken
	}
	a.jobs.SetWaiting(members, "waiting: "+why+"; reserving the gang across peers")
	a.jobs.Go(func() { a.offerGang(g, members, why, budget) })
	return true
}

func (a *Agent) offerGang(g GangOverflow, group []string, why string, budget time.Duration) {
	lead := group[0]
	defer a.offered(lead)
	snaps := make([]api.Job, len(group))
	locals := make([]string, len(group))
	// Each reservation attempt has keys of its own: the members an
	// aborted attempt left on peers (released, cancelled there) are never
	// mistaken for held ones by the next.
	attempt := strconv.FormatInt(time.Now().UnixNano(), 36)
	for i, id := range group {
		j, ok := a.jobs.Job(id)
		if !ok || j.State != api.StatePending {
			return
		}
		snaps[i] = j
		locals[i] = id + "#" + strconv.Itoa(len(j.Events)) + "g" + attempt
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fail := func(reason string) {
		reason = fmt.Sprintf("waiting: %s; %s", why, reason)
		a.mu.Lock()
		a.retryAt[lead] = time.Now().Add(a.cfg.Retry)
		a.refused[lead] = reason
		a.mu.Unlock()
		a.jobs.SetWaiting(group, reason)
	}
	hs, err := g.ReserveGang(ctx, locals, snaps)
	if err != nil {
		fail(fmt.Sprintf("the gang could not be reserved across peers: %v", err))
		return
	}
	if err := a.commitGang(ctx, g, group, hs); err != nil {
		fail(err.Error())
		return
	}
	var peers []string
	for _, h := range hs {
		peers = append(peers, h.Peer)
	}
	left := fmt.Sprintf("gang of %d did not fit here within its %s wait budget (%s); reserved on %s, committed by every holder, then started", len(group), budget, why, strings.Join(peers, ", "))
	a.forget(lead)
	for i, id := range group {
		h := hs[i]
		if err := a.handedOver(id, h, left, " with its gang"); err != nil {
			a.log.Info("gang member left the queue while its gang was started; cancelling it on the peer", "job", id, "peer", h.Peer, "err", err)
			_ = a.o.Cancel(ctx, h)
			continue
		}
		a.jobs.Go(func() { a.follow(id) })
	}
}

// commitGang commits every reserved member, one after the other, and
// then starts them all at once. A failed commit releases every member
// (none has started); so does a member that left the queue here before
// the start. Only a start refused after every commit succeeded (the
// holder lost the member: its barrier ended, it restarted) can leave
// members that started: they are cancelled.
func (a *Agent) commitGang(ctx context.Context, g GangOverflow, group []string, hs []api.Handover) error {
	n := len(hs)
	releaseAll := func(why string) {
		for _, h := range hs {
			if err := g.ReleaseMember(ctx, h, why); err != nil {
				a.log.Warn("releasing a gang member failed; its hold or barrier ends it there", "peer", h.Peer, "key", h.Key, "err", err)
			}
		}
	}
	started := make([]bool, n)
	for i, h := range hs {
		s, err := g.CommitMember(ctx, h)
		if err != nil {
			why := fmt.Sprintf("the commit of member %d of %d on peer %s failed: %v", i+1, n, h.Peer, err)
			releaseAll("its gang was aborted by the origin: " + why)
			return fmt.Errorf("the gang could not be committed across peers: %s; no member started, every member was released", why)
		}
		if s {
			a.log.Warn("a gang member's holder predates the start barrier and started it at its commit", "peer", h.Peer, "key", h.Key)
		}
		started[i] = s
	}
	var gone string
	for _, id := range group {
		if st, _ := a.jobs.State(id); st != api.StatePending {
			gone = fmt.Sprintf("member %s is %s here", id, st)
			break
		}
	}
	if gone != "" {
		releaseAll("its gang was aborted by the origin before the start: " + gone)
		return fmt.Errorf("the gang was committed but %s: no member started, every member was released", gone)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, h := range hs {
		if started[i] {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = g.StartMember(ctx, h)
		}()
	}
	wg.Wait()
	var failed []string
	for i, err := range errs {
		if err != nil {
			failed = append(failed, fmt.Sprintf("member %d of %d on peer %s: %v", i+1, n, hs[i].Peer, err))
		}
	}
	if len(failed) == 0 {
		return nil
	}
	why := "the start of " + strings.Join(failed, "; ") + " failed after every member had committed"
	releaseAll("its gang was aborted by the origin: " + why)
	return fmt.Errorf("the gang could not be started across peers: %s; the members that started were cancelled", why)
}

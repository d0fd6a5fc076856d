package jobs

import (
	"context"
	"errors"
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
// running. This daemon keeps no member of such a gang itself: every
// member is on a peer (ReserveGang never ranks this host).
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
func (m *Manager) overflowGang(group []*api.Job, why string) bool {
	g, ok := m.ovf.o.(GangOverflow)
	if !ok || len(group) < 2 {
		return false
	}
	j := group[0]
	budget, ok := m.ovf.cfg.Budget[j.Spec.Class]
	if !ok {
		return false
	}
	if m.placer.Admit(j.Spec) != nil {
		budget = 0 // its members can never run here
	}
	if taken, offer := m.offerDue(group, budget); !offer {
		return taken
	}
	m.setWaiting(group, "waiting: "+why+"; reserving the gang across peers")
	m.wg.Add(1)
	go m.offerGang(g, group, why, budget)
	return true
}

func (m *Manager) offerGang(g GangOverflow, group []*api.Job, why string, budget time.Duration) {
	defer m.wg.Done()
	lead := group[0]
	defer func() {
		m.ovf.mu.Lock()
		delete(m.ovf.offering, lead.ID)
		m.ovf.mu.Unlock()
		m.poke()
	}()
	snaps := make([]api.Job, len(group))
	locals := make([]string, len(group))
	// Each reservation attempt has keys of its own: the members an
	// aborted attempt left on peers (released, cancelled there) are never
	// mistaken for held ones by the next.
	attempt := strconv.FormatInt(time.Now().UnixNano(), 36)
	m.mu.Lock()
	for i, j := range group {
		snaps[i] = cloneJob(j)
		locals[i] = j.ID + "#" + strconv.Itoa(len(j.Events)) + "g" + attempt
	}
	m.mu.Unlock()
	for _, s := range snaps {
		if s.State != api.StatePending {
			return
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fail := func(reason string) {
		reason = fmt.Sprintf("waiting: %s; %s", why, reason)
		m.ovf.mu.Lock()
		m.ovf.retryAt[lead.ID] = time.Now().Add(m.ovf.cfg.Retry)
		m.ovf.refused[lead.ID] = reason
		m.ovf.mu.Unlock()
		m.setWaiting(group, reason)
	}
	hs, err := g.ReserveGang(ctx, locals, snaps)
	if err != nil {
		fail(fmt.Sprintf("the gang could not be reserved across peers: %v", err))
		return
	}
	if err := m.commitGang(ctx, g, group, hs); err != nil {
		fail(err.Error())
		return
	}
	var peers []string
	for _, h := range hs {
		peers = append(peers, h.Peer)
	}
	left := fmt.Sprintf("gang of %d did not fit here within its %s wait budget (%s); reserved on %s, committed by every holder, then started", len(group), budget, why, strings.Join(peers, ", "))
	m.ovf.forget(lead.ID)
	for i, j := range group {
		h := hs[i]
		h.At = m.now()
		h.Why = left + "; " + h.Why
		if err := m.transitionFrom(j, api.StatePending, api.StatePlaced, "handed over to peer "+h.Peer+" with its gang: "+h.Why, func(j *api.Job) {
			hc := h
			j.Handover = &hc
		}); err != nil {
			m.log.Info("gang member left the queue while its gang was started; cancelling it on the peer", "job", j.ID, "peer", h.Peer, "err", err)
			_ = m.ovf.o.Cancel(ctx, h)
			continue
		}
		m.wg.Add(1)
		go m.follow(j)
	}
}

// commitGang commits every reserved member, one after the other, and
// then starts them all at once. A failed commit releases every member
// (none has started); so does a member that left the queue here before
// the start. Only a start refused after every commit succeeded (the
// holder lost the member: its barrier ended, it restarted) can leave
// members that started: they are cancelled.
func (m *Manager) commitGang(ctx context.Context, g GangOverflow, group []*api.Job, hs []api.Handover) error {
	n := len(hs)
	releaseAll := func(why string) {
		for _, h := range hs {
			if err := g.ReleaseMember(ctx, h, why); err != nil {
				m.log.Warn("releasing a gang member failed; its hold or barrier ends it there", "peer", h.Peer, "key", h.Key, "err", err)
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
			m.log.Warn("a gang member's holder predates the start barrier and started it at its commit", "peer", h.Peer, "key", h.Key)
		}
		started[i] = s
	}
	m.mu.Lock()
	var gone string
	for _, j := range group {
		if j.State != api.StatePending && gone == "" {
			gone = fmt.Sprintf("member %s is %s here", j.ID, j.State)
		}
	}
	m.mu.Unlock()
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

// ErrNotHeld is the holder's answer to a commit or start for a key that
// holds no reservation (never reserved, released at the end of its hold
// or barrier, or aborted); the error names why when the job says.
var ErrNotHeld = errors.New("no held gang member under that key")

// ErrNotCommitted is the answer to a start of a member held but not
// committed.
var ErrNotCommitted = errors.New("the gang member is held but not committed")

// heldMember is an accepted gang member that has not started: held until
// its commit, then committed until its start. timer releases it at
// deadline (the end of the hold, then of the start barrier).
type heldMember struct {
	timer     *time.Timer
	deadline  time.Time
	committed bool
}

// hold keeps an accepted gang member placed but not started until
// CommitHeld, releasing it after d.
func (m *Manager) hold(j *api.Job, d time.Duration) {
	m.ovf.mu.Lock()
	defer m.ovf.mu.Unlock()
	if m.ovf.held == nil {
		m.ovf.held = map[string]*heldMember{}
	}
	h := &heldMember{deadline: time.Now().Add(d)}
	h.timer = time.AfterFunc(d, func() {
		m.expireHeld(j.ID, h, fmt.Sprintf("its gang was not committed within %s: reservation released, never started", d))
	})
	m.ovf.held[j.ID] = h
}

// takeHeld removes and returns the held member of id when its timer is
// stopped in time (before its deadline); else nil. m.ovf.mu held.
func (m *Manager) takeHeld(id string) *heldMember {
	h := m.ovf.held[id]
	if h == nil || !time.Now().Before(h.deadline) || !h.timer.Stop() {
		return nil
	}
	delete(m.ovf.held, id)
	return h
}

// heldJob finds the accepted job of key and its held entry (nil when it
// holds none).
func (m *Manager) heldJob(key string) (api.Job, *heldMember, bool) {
	j, ok := m.AcceptedByKey(key)
	if !ok || m.ovf == nil {
		return api.Job{}, nil, false
	}
	m.ovf.mu.Lock()
	defer m.ovf.mu.Unlock()
	return j, m.ovf.held[j.ID], true
}

// notHeld is ErrNotHeld with the member's own reason.
func notHeld(j api.Job) error {
	if j.State.Terminal() && j.Reason != "" {
		return fmt.Errorf("%w: job %s %s: %s", ErrNotHeld, j.ID, j.State, j.Reason)
	}
	return ErrNotHeld
}

// started is true of an accepted member whose start was asked for (the
// record shows it: its first attempt began), so a repeated commit or
// start answers as the first did, without a set of committed keys to
// keep.
func started(j api.Job) bool { return j.Attempt > 0 }

// CommitHeld commits the held gang member of key. With a barrier above
// zero it stays placed, not started, until StartCommitted, and is
// released if none comes within barrier; the commit is recorded on the
// job (an event) before the answer. A barrier of zero starts it now (an
// origin that predates the start barrier). started reports which.
func (m *Manager) CommitHeld(key string, barrier time.Duration) (bool, error) {
	j, h, ok := m.heldJob(key)
	if !ok {
		return false, ErrNotHeld
	}
	if h == nil {
		if started(j) {
			return true, nil // started before: idempotent
		}
		return false, notHeld(j)
	}
	if h.committed {
		return false, nil // committed before: idempotent
	}
	m.ovf.mu.Lock()
	if m.takeHeld(j.ID) != h {
		m.ovf.mu.Unlock()
		j, _ = m.AcceptedByKey(key)
		return false, fmt.Errorf("its hold ended before the commit: %w", notHeld(j))
	}
	if barrier <= 0 {
		m.ovf.mu.Unlock()
		m.startHeld(j.ID)
		return true, nil
	}
	c := &heldMember{deadline: time.Now().Add(barrier), committed: true}
	c.timer = time.AfterFunc(barrier, func() {
		m.expireHeld(j.ID, c, fmt.Sprintf("committed with its gang, but the origin's start did not come within its %s start barrier: released, never started", barrier))
	})
	m.ovf.held[j.ID] = c
	m.ovf.mu.Unlock()
	m.mu.Lock()
	live := m.jobs[j.ID]
	m.mu.Unlock()
	if err := m.annotate(live, fmt.Sprintf("committed with its gang by origin %s; waiting up to %s for the gang's start", j.Origin.Node, barrier), func(j *api.Job) {
		j.Reason = "committed with its gang; waiting for the gang's start"
	}); err != nil {
		m.ovf.mu.Lock()
		taken := m.takeHeld(j.ID) == c
		m.ovf.mu.Unlock()
		if taken {
			m.releaseHeld(j.ID, "the commit could not be recorded: released, never started")
		}
		return false, fmt.Errorf("recording the commit: %w", err)
	}
	return false, nil
}

// StartCommitted starts the committed gang member of key.
func (m *Manager) StartCommitted(key string) error {
	j, h, ok := m.heldJob(key)
	switch {
	case !ok:
		return ErrNotHeld
	case h == nil && started(j):
		return nil // started before: idempotent
	case h == nil:
		return notHeld(j)
	case !h.committed:
		return ErrNotCommitted
	}
	m.ovf.mu.Lock()
	taken := m.takeHeld(j.ID) == h
	m.ovf.mu.Unlock()
	if !taken {
		j, _ = m.AcceptedByKey(key)
		return fmt.Errorf("its start barrier ended before the start: %w", notHeld(j))
	}
	m.startHeld(j.ID)
	return nil
}

func (m *Manager) startHeld(id string) {
	m.mu.Lock()
	live := m.jobs[id]
	m.mu.Unlock()
	m.wg.Add(1)
	go m.launch(live)
}

// ReleaseHeld releases the held or committed (not started) gang member of
// key (its gang aborted: why) and reports whether there was one.
func (m *Manager) ReleaseHeld(key, why string) bool {
	j, ok := m.AcceptedByKey(key)
	if !ok {
		return false
	}
	return m.releaseIfHeld(j.ID, why+": released, never started")
}

// releaseIfHeld releases the member id if it is held or committed, with
// reason, and reports whether it was.
func (m *Manager) releaseIfHeld(id, reason string) bool {
	if m.ovf == nil {
		return false
	}
	m.ovf.mu.Lock()
	h := m.ovf.held[id]
	stopped := h != nil && h.timer.Stop()
	if stopped {
		delete(m.ovf.held, id)
	}
	m.ovf.mu.Unlock()
	if !stopped {
		return false
	}
	m.releaseHeld(id, reason)
	return true
}

// expireHeld releases member id at the end of its hold or barrier, if h
// is still its entry.
func (m *Manager) expireHeld(id string, h *heldMember, reason string) {
	m.ovf.mu.Lock()
	mine := m.ovf.held[id] == h
	if mine {
		delete(m.ovf.held, id)
	}
	m.ovf.mu.Unlock()
	if mine {
		m.releaseHeld(id, reason)
	}
}

func (m *Manager) releaseHeld(id, reason string) {
	m.forgetCancel(id)
	m.mu.Lock()
	j := m.jobs[id]
	m.mu.Unlock()
	if j == nil {
		return
	}
	if err := m.transitionFrom(j, api.StatePlaced, api.StateCancelled, reason, func(j *api.Job) {
		t := m.now()
		j.FinishedAt = &t
	}); err != nil {
		m.log.Warn("releasing a held gang member", "job", id, "err", err)
		return
	}
	m.release(j)
	m.poke()
}

package jobs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// GangOverflow is an Overflow that can place a gang bigger than this host
// across peers, all or nothing, in two phases: every member is reserved
// on a peer (placed there and held, not started) or none is; then the
// held members are committed (started). A held member not committed
// within the hold is released by its peer.
type GangOverflow interface {
	Overflow
	// ReserveGang holds every member on peers ranked by gossiped load
	// (locals are the members' keys on this daemon, as for Offer) and
	// returns their hand-overs, or releases what it held and fails.
	ReserveGang(ctx context.Context, locals []string, members []api.Job) ([]api.Handover, error)
	// CommitGang starts the held members; on an error it has cancelled
	// them all.
	CommitGang(ctx context.Context, hs []api.Handover) error
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
	fail := func(err error) {
		reason := fmt.Sprintf("waiting: %s; the gang could not be reserved across peers: %v", why, err)
		m.ovf.mu.Lock()
		m.ovf.retryAt[lead.ID] = time.Now().Add(m.ovf.cfg.Retry)
		m.ovf.refused[lead.ID] = reason
		m.ovf.mu.Unlock()
		m.setWaiting(group, reason)
	}
	hs, err := g.ReserveGang(ctx, locals, snaps)
	if err != nil {
		fail(err)
		return
	}
	if err := g.CommitGang(ctx, hs); err != nil {
		fail(fmt.Errorf("committing: %w", err))
		return
	}
	var peers []string
	for _, h := range hs {
		peers = append(peers, h.Peer)
	}
	left := fmt.Sprintf("gang of %d did not fit here within its %s wait budget (%s); reserved on %s and committed", len(group), budget, why, strings.Join(peers, ", "))
	m.ovf.forget(lead.ID)
	for i, j := range group {
		h := hs[i]
		h.At = m.now()
		h.Why = left + "; " + h.Why
		if err := m.transitionFrom(j, api.StatePending, api.StatePlaced, "handed over to peer "+h.Peer+" with its gang: "+h.Why, func(j *api.Job) {
			hc := h
			j.Handover = &hc
		}); err != nil {
			m.log.Info("gang member left the queue while its gang was reserved; cancelling it on the peer", "job", j.ID, "peer", h.Peer, "err", err)
			_ = m.ovf.o.Cancel(ctx, h)
			continue
		}
		m.wg.Add(1)
		go m.follow(j)
	}
}

// ErrNotHeld is CommitHeld's answer for a key that holds no reservation
// (never reserved, committed already, or released at the end of its hold).
var ErrNotHeld = errors.New("no held gang member under that key")

// hold keeps an accepted gang member placed but not started until
// CommitHeld, releasing it after d.
func (m *Manager) hold(j *api.Job, d time.Duration) {
	m.ovf.mu.Lock()
	if m.ovf.held == nil {
		m.ovf.held, m.ovf.committed = map[string]*time.Timer{}, map[string]bool{}
	}
	id := j.ID
	m.ovf.held[id] = time.AfterFunc(d, func() {
		m.releaseHeld(id, fmt.Sprintf("its gang was not committed within %s: reservation released", d))
	})
	m.ovf.mu.Unlock()
}

// CommitHeld starts the held gang member of key.
func (m *Manager) CommitHeld(key string) error {
	j, ok := m.AcceptedByKey(key)
	if !ok || m.ovf == nil {
		return ErrNotHeld
	}
	m.ovf.mu.Lock()
	t, held := m.ovf.held[j.ID]
	if held && t.Stop() {
		delete(m.ovf.held, j.ID)
		m.ovf.committed[j.ID] = true
	} else {
		held = false
	}
	committed := m.ovf.committed[j.ID]
	m.ovf.mu.Unlock()
	if !held {
		if committed {
			return nil // committed before: idempotent
		}
		return ErrNotHeld // released at the end of its hold, or aborted
	}
	m.mu.Lock()
	live := m.jobs[j.ID]
	m.mu.Unlock()
	m.wg.Add(1)
	go m.launch(live)
	return nil
}

// ReleaseHeld releases the held gang member of key (its gang aborted) and
// reports whether there was one.
func (m *Manager) ReleaseHeld(key string) bool {
	j, ok := m.AcceptedByKey(key)
	if !ok || m.ovf == nil {
		return false
	}
	m.ovf.mu.Lock()
	t, held := m.ovf.held[j.ID]
	m.ovf.mu.Unlock()
	if !held || !t.Stop() {
		return false
	}
	m.releaseHeld(j.ID, "its gang was aborted by the origin: reservation released")
	return true
}

func (m *Manager) releaseHeld(id, reason string) {
	m.ovf.mu.Lock()
	delete(m.ovf.held, id)
	m.ovf.mu.Unlock()
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

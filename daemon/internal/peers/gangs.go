package peers

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/handover"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
	"github.com/fusiond/fusiond/daemon/sched"
)

// Cross-host gangs (handover.GangOverflow; the origin drives the steps, see
// handover.Agent.commitGang): every member is offered with a hold (the
// peer places it and keeps it without starting it) to the best-ranked
// peer with room left by the gang's members placed before it. When all
// are held, each is committed (POST handover/commit with barrier=D: the
// peer records it committed and keeps it, still not started, for the
// start barrier D) and, only when every commit succeeded, started (POST
// handover/start). A member no peer takes, or a failed commit, releases
// every member (handover/cancel with why=...). A peer releases a member
// not committed within its hold, or not started within its barrier.
//
// Older peers tolerate this: one that predates the barrier ignores the
// barrier parameter and starts the member at its commit, answering 204
// rather than 202 (CommitMember reports it started); it ignores why. An
// older origin's commit carries no barrier, and the member starts at
// once, as it did.

// gangHold is how long a peer holds a reserved gang member, gangBarrier
// how long a committed one waits for its start; maxHold the most a peer
// grants of either (Config.MaxGangHold may grant less).
const (
	gangHold    = 10 * time.Second
	gangBarrier = 10 * time.Second
	maxHold     = time.Minute
)

var _ handover.GangOverflow = (*Node)(nil)

// ReserveGang holds every member of a gang on peers, or none.
func (n *Node) ReserveGang(ctx context.Context, locals []string, members []api.Job) ([]api.Handover, error) {
	cands := n.candidates()
	var hs []api.Handover
	release := func(why string) {
		for _, h := range hs {
			if err := n.ReleaseMember(ctx, h, why); err != nil {
				n.log.Warn("releasing a held gang member failed; its hold ends it", "peer", h.Peer, "key", h.Key, "err", err)
			}
		}
	}
	for i, job := range members {
		key := n.cfg.NodeName + "/" + locals[i]
		body, err := json.Marshal(offerRequest{Key: key, JobID: job.ID, User: job.Owner.User, Spec: job.Spec, Hold: api.Duration(gangHold)})
		if err != nil {
			release("its gang could not be reserved: " + err.Error())
			return nil, err
		}
		ranked, skipped := n.ranker().rank(job.Spec, cands)
		var refused []string
		held := false
		for r, c := range ranked {
			a, lost, err := n.offerTo(ctx, c, body)
			if lost {
				// It may hold the member: release it there.
				_ = n.ReleaseMember(ctx, api.Handover{Key: key, Peer: c.name, Address: c.api}, "its gang's offer got no answer from this peer")
			}
			switch {
			case err != nil:
				refused = append(refused, err.Error())
				continue
			case !a.Accepted:
				refused = append(refused, c.name+" refused ("+a.Why+")")
				continue
			}
			hs = append(hs, api.Handover{Key: key, Peer: c.name, Address: c.api, RemoteID: a.RemoteID,
				Why: fmt.Sprintf("member %d of %d held on peer %s, ranked %d of %d by gossiped load (%s)", i+1, len(members), c.name, r+1, len(ranked), c.explain())})
			for k := range cands {
				if cands[k].name == c.name {
					cands[k].load = without(cands[k].load, job.Spec)
				}
			}
			held = true
			break
		}
		if !held {
			why := strings.Join(append(refused, skipped...), "; ")
			if why == "" {
				why = "no live peer with a recent load"
			}
			err := fmt.Errorf("no peer holds member %d of %d (job %s): %s", i+1, len(members), job.ID, why)
			release("its gang could not be reserved: " + err.Error())
			return nil, err
		}
	}
	return hs, nil
}

// CommitMember commits a held member for the start barrier; started is
// true when the peer predates the barrier and started it (204).
func (n *Node) CommitMember(ctx context.Context, h api.Handover) (bool, error) {
	q := url.Values{"key": {h.Key}, "barrier": {gangBarrier.String()}}
	resp, _, err := n.call(ctx, h.Peer, h.Address, "POST", "/peer/v1/handover/commit?"+q.Encode(), nil)
	if err != nil {
		return false, err
	}
	code := resp.StatusCode
	if _, err := readAnswer(resp); err != nil {
		return false, err
	}
	return code != http.StatusAccepted, nil
}

// StartMember starts a committed member. A request that fails on the way
// is sent again (a start is idempotent there) until ctx ends or the peer
// answers.
func (n *Node) StartMember(ctx context.Context, h api.Handover) error {
	q := url.Values{"key": {h.Key}}
	for try := 1; ; try++ {
		resp, _, err := n.call(ctx, h.Peer, h.Address, "POST", "/peer/v1/handover/start?"+q.Encode(), nil)
		if err == nil {
			_, err = readAnswer(resp)
			return err
		}
		if try == 5 || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(try) * 100 * time.Millisecond):
		}
	}
}

// ReleaseMember releases a held or committed member on its peer (a
// started one is cancelled), recording why there.
func (n *Node) ReleaseMember(ctx context.Context, h api.Handover, why string) error {
	return n.cancel(ctx, h, why)
}

// serveStart starts the committed gang member of the key (POST
// /peer/v1/handover/start).
func (n *Node) serveStart(w http.ResponseWriter, r *http.Request) {
	j, ok := n.handedOver(w, r)
	if !ok {
		return
	}
	if err := n.jobs.StartCommitted(j.Origin.Key); err != nil {
		n.refuse(w, r, j.Origin.Node, "peer.start", j.ID, http.StatusConflict, err.Error())
		return
	}
	n.renew(j.Origin.Key)
	n.audit(r, j.Origin.Node, "peer.start", j.ID, http.StatusNoContent, "key "+j.Origin.Key)
	w.WriteHeader(http.StatusNoContent)
}

// without is l less what spec takes (the ranking's view of a peer after
// a gang member was held there).
func without(l api.PeerLoad, spec api.JobSpec) api.PeerLoad {
	r := spec.Resources
	l.CPU -= r.CPU
	l.Memory -= r.Memory
	if g := r.GPU; g != nil {
		switch {
		case g.MIG != "":
			l.MIG = cloneCounts(l.MIG)
			l.MIG[g.MIG]--
		case g.Share > 0:
			l.GPUShareMilli -= g.Share
		default:
			l.GPUs, l.NVLink = cloneCounts(l.GPUs), cloneCounts(l.NVLink)
			// A job's GPUs are of one model: the first (by name) that
			// matches and has them all.
			for _, m := range slices.Sorted(maps.Keys(l.GPUs)) {
				if c := l.GPUs[m]; c >= g.Count && (g.Model == "" || hostplacer.ModelMatches(m, g.Model)) {
					l.GPUs[m] -= g.Count
					l.NVLink[m] = min(l.NVLink[m], l.GPUs[m])
					l.GPUShareMilli -= g.Count * sched.MilliPerGPU
					break
				}
			}
		}
	}
	if r.FPGA != nil {
		l.FPGAFree--
	}
	return l
}

func cloneCounts(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

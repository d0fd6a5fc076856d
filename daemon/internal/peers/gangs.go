package peers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/sched"
)

// Cross-host gangs, two-phase: every member is offered with a hold (the
// peer places it and keeps it without starting it) to the best-ranked
// peer with room left by the gang's members placed before it; when all
// are held, each is committed (started). A member no peer takes releases
// those held; a peer releases a member not committed within the hold.

// gangHold is how long a peer holds a reserved gang member; maxHold the
// most a peer grants.
const (
	gangHold = 10 * time.Second
	maxHold  = time.Minute
)

var _ jobs.GangOverflow = (*Node)(nil)

// ReserveGang holds every member of a gang on peers, or none.
func (n *Node) ReserveGang(ctx context.Context, locals []string, members []api.Job) ([]api.Handover, error) {
	cands := n.candidates()
	var hs []api.Handover
	release := func() {
		for _, h := range hs {
			if err := n.Cancel(ctx, h); err != nil {
				n.log.Warn("releasing a held gang member failed; its hold ends it", "peer", h.Peer, "key", h.Key, "err", err)
			}
		}
	}
	for i, job := range members {
		key := n.cfg.NodeName + "/" + locals[i]
		body, err := json.Marshal(offerRequest{Key: key, JobID: job.ID, User: job.Owner.User, Spec: job.Spec, Hold: api.Duration(gangHold)})
		if err != nil {
			release()
			return nil, err
		}
		ranked, skipped := n.ranker().rank(job.Spec, cands)
		var refused []string
		held := false
		for r, c := range ranked {
			a, lost, err := n.offerTo(ctx, c, body)
			if lost {
				// It may hold the member: release it there.
				_ = n.Cancel(ctx, api.Handover{Key: key, Peer: c.name, Address: c.api})
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
			release()
			why := strings.Join(append(refused, skipped...), "; ")
			if why == "" {
				why = "no live peer with a recent load"
			}
			return nil, fmt.Errorf("no peer holds member %d of %d (job %s): %s", i+1, len(members), job.ID, why)
		}
	}
	return hs, nil
}

// CommitGang starts every held member; if one cannot be started (its
// hold ended) all are cancelled.
func (n *Node) CommitGang(ctx context.Context, hs []api.Handover) error {
	var errs []error
	for _, h := range hs {
		resp, _, err := n.call(ctx, h.Peer, h.Address, "POST", "/peer/v1/handover/commit?"+url.Values{"key": {h.Key}}.Encode(), nil)
		if err == nil {
			_, err = readAnswer(resp)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", h.Peer, err))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	for _, h := range hs {
		_ = n.Cancel(ctx, h)
	}
	return errors.Join(errs...)
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
			need := g.Count
			for m, c := range l.GPUs {
				if need > 0 && (g.Model == "" || strings.Contains(strings.ToLower(m), strings.ToLower(g.Model))) {
					take := min(c, need)
					l.GPUs[m] -= take
					l.NVLink[m] = min(l.NVLink[m], l.GPUs[m])
					l.GPUShareMilli -= take * sched.MilliPerGPU
					need -= take
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

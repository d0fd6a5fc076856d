package peers

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/admission"
	"github.com/fusiond/fusiond/daemon/internal/handover"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
)

// The peer API (HTTPS, mutual TLS, under /peer/v1):
//
//	POST /peer/v1/offers                     offer a job (offerRequest) → offerAnswer
//	GET  /peer/v1/handover?key=K&offset=N    the job's state and output from N; renews its lease
//	POST /peer/v1/handover/cancel?key=K[&why=W]   cancel it (a held or committed gang member: release it, recording W)
//	POST /peer/v1/handover/commit?key=K[&barrier=D]  commit a held gang member: 202, kept placed (not started) for
//	                                          the start barrier D (at most the peer's hold cap); without D: started, 204
//	POST /peer/v1/handover/start?key=K       start a committed gang member (204; 409 once its barrier ended)
//
// Gang members: see gangs.go (hold, commit, start barrier; what older
// peers do with the parameters they do not know: ignore them).
//
// The calling peer is the node its certificate names: an offer's key must
// start with that name, and only the origin may poll or cancel its jobs.

func (n *Node) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /peer/v1/offers", n.serveOffer)
	mux.HandleFunc("GET /peer/v1/handover", n.servePoll)
	mux.HandleFunc("POST /peer/v1/handover/cancel", n.serveCancel)
	mux.HandleFunc("POST /peer/v1/handover/commit", n.serveCommit)
	mux.HandleFunc("POST /peer/v1/handover/start", n.serveStart)
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func fail(w http.ResponseWriter, code int, format string, args ...any) {
	http.Error(w, fmt.Sprintf(format, args...), code)
}

func (n *Node) serveOffer(w http.ResponseWriter, r *http.Request) {
	from, err := peerName(r.TLS)
	if err != nil {
		n.refuse(w, r, from, "peer.offer", "", http.StatusForbidden, err.Error())
		return
	}
	if !n.member(from) {
		n.refuse(w, r, from, "peer.offer", "", http.StatusForbidden, fmt.Sprintf("%s is not a current member of this daemon's peers: offers are taken only from members", from))
		return
	}
	if !n.allowOffer(from) {
		n.refuse(w, r, from, "peer.offer", "", http.StatusTooManyRequests, fmt.Sprintf("peer %s sends more than %g offers a second (burst %d; peers.limits.offers_per_second)", from, n.cfg.OfferRate, n.cfg.OfferBurst))
		return
	}
	limit := cmp.Or(n.cfg.MaxOfferBytes, maxBody)
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		n.refuse(w, r, from, "peer.offer", "", http.StatusBadRequest, "reading the offer: "+err.Error())
		return
	}
	if int64(len(body)) > limit {
		n.refuse(w, r, from, "peer.offer", "", http.StatusRequestEntityTooLarge, fmt.Sprintf("the offer is larger than %d bytes (limits.max_spec_bytes)", limit))
		return
	}
	o, err := decodeOffer(body)
	if err != nil {
		n.refuse(w, r, from, "peer.offer", "", http.StatusBadRequest, err.Error())
		return
	}
	if !strings.HasPrefix(o.Key, from+"/") {
		n.refuse(w, r, from, "peer.offer", o.Key, http.StatusForbidden, fmt.Sprintf("peer %s may offer only keys of its own jobs (%s/...), not %q", from, from, o.Key))
		return
	}
	if o.Hold < 0 || time.Duration(o.Hold) > maxHold {
		n.refuse(w, r, from, "peer.offer", o.Key, http.StatusBadRequest, fmt.Sprintf("hold: between 0 and %s", maxHold))
		return
	}
	// The job manager's admission audits the offer from here on.
	offer := jobs.Offer{From: api.Provenance{Node: from, JobID: o.JobID, Key: o.Key}, User: o.User, Hold: min(time.Duration(o.Hold), n.holdCap())}
	j, err := n.jobs.AcceptHandover(r.Context(), offer, o.Spec)
	var ref *admission.Refusal
	var ae *api.Error
	switch {
	case errors.As(err, &ref):
		writeJSON(w, http.StatusOK, offerAnswer{Why: ref.Error(), Load: n.answerLoad()})
		return
	case errors.As(err, &ae) && ae.HTTPStatus() < 500:
		writeJSON(w, http.StatusOK, offerAnswer{Why: ae.Error(), Load: n.answerLoad()})
		return
	case err != nil:
		fail(w, http.StatusInternalServerError, "%v", err)
		return
	}
	n.renew(o.Key)
	writeJSON(w, http.StatusOK, offerAnswer{Accepted: true, RemoteID: j.ID, Load: n.answerLoad()})
}

// answerLoad is this host's load now, for an offer's answer: the load
// message's envelope (without its kind byte) as the gossip carries it,
// or nil when it cannot be made (the answer goes without it).
func (n *Node) answerLoad() json.RawMessage {
	b, err := n.seal(localLoad(n.host, n.jobs))
	if err != nil {
		n.log.Warn("encoding this host's load for an offer's answer", "err", err)
		return nil
	}
	return b[1:]
}

// takeAnswerLoad keeps the load peer's answer a carried as it keeps a
// gossiped one (merge: a current member's, newer than its view, signed
// by it), so the view of peer is fresh (age 0) for the next ranking. A
// load that is invalid, or of another node than the one answering, is
// dropped and counted like such gossip; an answer without one (an older
// peer) changes nothing.
func (n *Node) takeAnswerLoad(peer string, a offerAnswer) {
	switch {
	case a.loadErr != nil:
		n.dropped.invalid.Add(1)
		n.log.Debug("dropping the load of an offer's answer", "peer", peer, "err", a.loadErr)
	case a.load == nil:
	case a.load.Node != peer:
		n.dropped.unsigned.Add(1)
		n.log.Debug("dropping the load of another node in an offer's answer", "peer", peer, "node", a.load.Node)
	default:
		n.merge(*a.load)
	}
}

// refuse answers a peer API request with status and why, and audits it.
func (n *Node) refuse(w http.ResponseWriter, r *http.Request, peer, action, target string, status int, why string) {
	n.log.Info("refused a peer request", "peer", peer, "action", action, "status", status, "why", why)
	n.audit(r, peer, action, target, status, why)
	fail(w, status, "%s", why)
}

// handedOver finds the job of the request's key, if the caller is its
// origin.
func (n *Node) handedOver(w http.ResponseWriter, r *http.Request) (api.Job, bool) {
	action := "peer." + strings.TrimPrefix(r.URL.Path, "/peer/v1/")
	from, err := peerName(r.TLS)
	if err != nil {
		n.refuse(w, r, from, action, "", http.StatusForbidden, err.Error())
		return api.Job{}, false
	}
	key := r.URL.Query().Get("key")
	j, ok := n.jobs.AcceptedByKey(key)
	if !ok || j.Origin.Node != from {
		n.refuse(w, r, from, action, key, http.StatusNotFound, fmt.Sprintf("no job handed over by %s under key %q", from, key))
		return api.Job{}, false
	}
	return j, true
}

func (n *Node) servePoll(w http.ResponseWriter, r *http.Request) {
	j, ok := n.handedOver(w, r)
	if !ok {
		return
	}
	offset, err := strconv.ParseInt(r.URL.Query().Get("offset"), 10, 64)
	if err != nil || offset < 0 {
		n.refuse(w, r, j.Origin.Node, "peer.handover", j.ID, http.StatusBadRequest, fmt.Sprintf("offset: want a byte offset, got %q", r.URL.Query().Get("offset")))
		return
	}
	n.renew(j.Origin.Key)
	n.mu.Lock()
	_, ended := n.expired[j.Origin.Key]
	n.mu.Unlock()
	st := handover.RemoteStatus{ID: j.ID, State: j.State, Reason: j.Reason, Attempt: j.Attempt, PID: j.PID, Exit: j.Exit, LeaseEnded: ended}
	if path, _, err := n.jobs.LogPath(api.Caller{Admin: true}, j.ID); err == nil {
		if st.Log, err = readChunk(path, offset); err != nil {
			n.log.Warn("reading a handed-over job's output", "job", j.ID, "err", err)
		}
	}
	writeJSON(w, http.StatusOK, st)
}

func (n *Node) serveCommit(w http.ResponseWriter, r *http.Request) {
	j, ok := n.handedOver(w, r)
	if !ok {
		return
	}
	var barrier time.Duration
	if b := r.URL.Query().Get("barrier"); b != "" {
		d, err := time.ParseDuration(b)
		if err != nil || d <= 0 || d > maxHold {
			n.refuse(w, r, j.Origin.Node, "peer.commit", j.ID, http.StatusBadRequest, fmt.Sprintf("barrier: a duration above 0 and at most %s, got %q", maxHold, b))
			return
		}
		barrier = min(d, n.holdCap())
	}
	started, err := n.jobs.CommitHeld(j.Origin.Key, barrier)
	if err != nil {
		n.refuse(w, r, j.Origin.Node, "peer.commit", j.ID, http.StatusConflict, err.Error())
		return
	}
	n.renew(j.Origin.Key)
	if !started {
		n.audit(r, j.Origin.Node, "peer.commit", j.ID, http.StatusAccepted, "key "+j.Origin.Key+": committed, waiting for its start")
		w.WriteHeader(http.StatusAccepted) // committed, waiting for its start
		return
	}
	n.audit(r, j.Origin.Node, "peer.commit", j.ID, http.StatusNoContent, "key "+j.Origin.Key)
	w.WriteHeader(http.StatusNoContent)
}

// holdCap is the most this host holds another host's gang member, before
// its commit and again until its start.
func (n *Node) holdCap() time.Duration {
	if c := n.cfg.MaxGangHold; c > 0 {
		return min(c, maxHold)
	}
	return maxHold
}

func (n *Node) serveCancel(w http.ResponseWriter, r *http.Request) {
	j, ok := n.handedOver(w, r)
	if !ok {
		return
	}
	why := "its gang was aborted by origin " + j.Origin.Node
	if w := r.URL.Query().Get("why"); w != "" {
		if len(w) > 1024 {
			w = strings.ToValidUTF8(w[:1024], "") + "…"
		}
		why = w + " (origin " + j.Origin.Node + ")"
	}
	if n.jobs.ReleaseHeld(j.Origin.Key, why) {
		n.audit(r, j.Origin.Node, "peer.cancel", j.ID, http.StatusNoContent, "key "+j.Origin.Key+": held gang member released")
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if !j.State.Terminal() {
		caller := api.Caller{Admin: true, User: "origin " + j.Origin.Node}
		if _, err := n.jobs.Cancel(r.Context(), caller, j.ID); err != nil {
			var ae *api.Error
			if !errors.As(err, &ae) || ae.Code != api.CodeConflict {
				n.audit(r, j.Origin.Node, "peer.cancel", j.ID, http.StatusInternalServerError, err.Error())
				fail(w, http.StatusInternalServerError, "%v", err)
				return
			}
		}
	}
	n.audit(r, j.Origin.Node, "peer.cancel", j.ID, http.StatusNoContent, "key "+j.Origin.Key)
	w.WriteHeader(http.StatusNoContent)
}

// call sends one peer API request to peer at addr and reports whether the
// request was written (so a failure after that may have taken effect).
func (n *Node) call(ctx context.Context, peer, addr, method, path string, body []byte) (*http.Response, bool, error) {
	var wrote atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { wrote.Store(true) }})
	req, err := http.NewRequestWithContext(ctx, method, "https://"+addr+path, bytes.NewReader(body))
	if err != nil {
		return nil, false, err
	}
	// The server's certificate must name the peer: its node name.
	req.Host = peer
	resp, err := n.clientFor(peer).Do(req)
	return resp, wrote.Load(), err
}

// clientFor is the HTTP client that verifies peer's certificate by its
// node name (dialled by address).
func (n *Node) clientFor(peer string) *http.Client {
	n.mu.Lock()
	defer n.mu.Unlock()
	if c, ok := n.clients[peer]; ok {
		return c
	}
	if len(n.clients) >= maxClients {
		// Full: start again (each is one transport of idle connections).
		for _, c := range n.clients {
			c.CloseIdleConnections()
		}
		clear(n.clients)
	}
	t := n.transport.Clone()
	t.TLSClientConfig = n.transport.TLSClientConfig.Clone()
	t.TLSClientConfig.ServerName = peer
	c := &http.Client{Transport: t}
	n.clients[peer] = c
	return c
}

func readAnswer(resp *http.Response) ([]byte, error) {
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return b, nil
}

// Offer offers job to the peers that fit it by their gossiped load, in
// the spread choice's order over their ranking (offerSpread), until one
// accepts.
func (n *Node) Offer(ctx context.Context, local string, job api.Job) (api.Handover, error) {
	return n.OfferAbove(ctx, local, job, math.Inf(-1))
}

// Best is the best-ranked peer for spec by gossiped load and its ranking
// score (handover.Ranker: the poor-fit rule compares it with this host's
// engine score).
func (n *Node) Best(spec api.JobSpec) (string, float64, bool) {
	ranked, _ := n.ranker().rank(spec, n.candidates())
	if len(ranked) == 0 {
		return "", 0, false
	}
	return ranked[0].name, ranked[0].score, true
}

// OfferAbove is Offer to the peers whose ranking score is at least min
// (handover.Ranker: the poor-fit rule's offers).
func (n *Node) OfferAbove(ctx context.Context, local string, job api.Job, min float64) (api.Handover, error) {
	key := n.cfg.NodeName + "/" + local
	rk := n.ranker()
	ranked, skipped := rk.rank(job.Spec, n.candidates())
	var below []string // ranked under min: not offered
	for _, c := range ranked {
		if c.score < min {
			below = append(below, fmt.Sprintf("%s: ranks %.2f, below the %.2f a poor fit here needs", c.name, c.score, min))
		}
	}
	ranked = slices.DeleteFunc(ranked, func(c candidate) bool { return c.score < min })
	skipped = append(skipped, below...)
	if len(ranked) == 0 {
		if len(skipped) == 0 {
			return api.Handover{}, errors.New("no live peer with a recent load")
		}
		return api.Handover{}, fmt.Errorf("no peer has room by its gossiped load (%s)", strings.Join(skipped, "; "))
	}
	body, err := json.Marshal(offerRequest{Key: key, JobID: job.ID, User: job.Owner.User, Spec: job.Spec})
	if err != nil {
		return api.Handover{}, err
	}
	var refused []string
	offered := make([]bool, len(ranked))
	for _, i := range rk.offerOrder(ranked) {
		c := ranked[i]
		h := api.Handover{Key: key, Peer: c.name, Address: c.api}
		why := fmt.Sprintf("peer %s ranked %d of %d by gossiped load (%s)", c.name, i+1, len(ranked), c.explain())
		if slices.Contains(offered[:i], false) {
			why += fmt.Sprintf(", picked by the spread choice (at random among the best %d not yet offered)", rk.spread.Top)
		}
		offered[i] = true
		if len(refused) > 0 {
			why += " after " + strings.Join(refused, "; ")
		}
		a, lost, err := n.offerTo(ctx, c, body)
		switch {
		case lost:
			// It may have accepted: follow it there; the poll finds
			// out, and its lease stops it if this daemon never does.
			h.Why = why + "; its answer was lost (" + err.Error() + ")"
			return h, nil
		case err != nil:
			refused = append(refused, err.Error())
			continue
		case !a.Accepted:
			refused = append(refused, c.name+" refused ("+a.Why+")")
			continue
		}
		h.RemoteID, h.Why = a.RemoteID, why
		n.log.Info("handed a job over", "job", job.ID, "peer", c.name, "remote", a.RemoteID, "key", key)
		return h, nil
	}
	return api.Handover{}, errors.New(strings.Join(append(refused, below...), "; "))
}

// offerTo sends one offer to c. lost is true when the request was sent
// but its answer did not come back (the peer may have accepted).
func (n *Node) offerTo(ctx context.Context, c candidate, body []byte) (offerAnswer, bool, error) {
	resp, wrote, err := n.call(ctx, c.name, c.api, "POST", "/peer/v1/offers", body)
	if err != nil {
		if wrote {
			return offerAnswer{}, true, err
		}
		return offerAnswer{}, false, fmt.Errorf("%s unreachable (%v)", c.name, err)
	}
	b, err := readAnswer(resp)
	if err != nil {
		return offerAnswer{}, false, fmt.Errorf("%s failed (%v)", c.name, err)
	}
	a, err := decodeAnswer(b)
	if err != nil {
		return offerAnswer{}, false, fmt.Errorf("%s answered badly (%v)", c.name, err)
	}
	n.takeAnswerLoad(c.name, a)
	return a, false, nil
}

// Poll reads the job's state and output on its peer (renewing its lease).
func (n *Node) Poll(ctx context.Context, h api.Handover, offset int64) (handover.RemoteStatus, error) {
	q := url.Values{"key": {h.Key}, "offset": {strconv.FormatInt(offset, 10)}}
	resp, _, err := n.call(ctx, h.Peer, h.Address, "GET", "/peer/v1/handover?"+q.Encode(), nil)
	if err != nil {
		return handover.RemoteStatus{}, err
	}
	if resp.StatusCode == http.StatusNotFound {
		resp.Body.Close()
		return handover.RemoteStatus{}, handover.ErrRemoteGone
	}
	b, err := readAnswer(resp)
	if err != nil {
		return handover.RemoteStatus{}, err
	}
	return decodeStatus(b)
}

// Cancel asks the job's peer to cancel it.
func (n *Node) Cancel(ctx context.Context, h api.Handover) error { return n.cancel(ctx, h, "") }

// cancel is Cancel recording why (a held gang member's release).
func (n *Node) cancel(ctx context.Context, h api.Handover, why string) error {
	q := url.Values{"key": {h.Key}}
	if why != "" {
		q.Set("why", why)
	}
	resp, _, err := n.call(ctx, h.Peer, h.Address, "POST", "/peer/v1/handover/cancel?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	if resp.StatusCode == http.StatusNotFound {
		resp.Body.Close()
		return nil // nothing there to stop
	}
	_, err = readAnswer(resp)
	return err
}

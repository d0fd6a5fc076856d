package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/admission"
	"github.com/fusiond/fusiond/daemon/internal/audit"
)

// Entry is one request to admit jobs, from any source (admission.Sources):
// every one runs the same steps, in the order of admission.Steps, in
// Admit.
type Entry struct {
	Source admission.Source
	// Caller is who the jobs run as: the socket's caller (its kernel
	// credentials), or, for a replica, the owner of the service it
	// scales. A peer's jobs name their user in Offer instead.
	Caller api.Caller
	// Offer is a peer's hand-over (sources Peer and Gang).
	Offer *Offer
	// Pod is kubelet's allocation (source Kubelet): its hold is placed
	// on kubelet's devices at once, and Admit leaves the devices' grant
	// there (pods.go).
	Pod   *PodEntry
	Specs []api.JobSpec
}

// Offer is what a peer asserts with a hand-over: where the job comes from
// (the node its certificate names, its job there, the hand-over key), the
// user it asks the job to run as, and for a gang member how long it is
// held before its gang commits.
type Offer struct {
	From api.Provenance
	User string
	Hold time.Duration
}

// PeerLimits bound what one peer may hold here (zero: no limit).
type PeerLimits struct {
	// Jobs caps the unfinished jobs a peer has handed over here.
	Jobs int
	// SpecBytes caps their specs' JSON size.
	SpecBytes int64
}

// Peer limit names, as the configuration spells them.
const (
	LimitPeerJobs      = "peers.limits.jobs"
	LimitPeerSpecBytes = "peers.limits.spec_bytes"
)

// Auditor records admissions (audit.Log is one).
type Auditor interface {
	Record(audit.Record)
}

// Submit admits one job from the API socket.
func (m *Manager) Submit(ctx context.Context, c api.Caller, spec api.JobSpec) (api.Job, error) {
	jobs, err := m.Admit(ctx, Entry{Source: admission.Socket, Caller: c, Specs: []api.JobSpec{spec}})
	if err != nil {
		return api.Job{}, err
	}
	return jobs[0], nil
}

// SubmitAll admits several jobs from the API socket together: all are
// queued or none is. Errors about one spec of several name it
// ("jobs[2].gang.size").
func (m *Manager) SubmitAll(ctx context.Context, c api.Caller, specs []api.JobSpec) ([]api.Job, error) {
	return m.Admit(ctx, Entry{Source: admission.Batch, Caller: c, Specs: specs})
}

// AcceptHandover admits the job a peer hands over: the same steps as a
// local submission, its identity resolved under the peer policy, then the
// queue, which places it at once or refuses it (a peer's job never waits
// here). A key already accepted returns the job it made, so a retried
// offer never runs twice. With a hold above zero the job is a gang member:
// placed and stored but held, not started, until its gang commits and its
// origin starts it (daemon/internal/handover, held.go), released when the
// hold or the start barrier passes first. A refusal is an *admission.Refusal or an *api.Error.
func (m *Manager) AcceptHandover(ctx context.Context, o Offer, spec api.JobSpec) (api.Job, error) {
	src := admission.Peer
	if o.Hold > 0 {
		src = admission.Gang
	}
	jobs, err := m.Admit(ctx, Entry{Source: src, Offer: &o, Specs: []api.JobSpec{spec}})
	if err != nil {
		return api.Job{}, err
	}
	return jobs[0], nil
}

// Admit runs the admission steps over e and returns the jobs it queued
// (for a peer's job: placed, or already starting when its start came
// before the answer), with their records on disk. Whatever the
// outcome, the audit step records it.
func (m *Manager) Admit(ctx context.Context, e Entry) (out []api.Job, err error) {
	repeat := false
	defer func() { m.auditAdmission(ctx, e, out, err, repeat) }()
	if m.isStopping() {
		return nil, ErrShuttingDown
	}
	if e.Offer != nil {
		if m.ho == nil {
			return nil, &admission.Refusal{Rule: "peers.enabled", Why: "this host runs without peers"}
		}
		// Idempotent: a retried offer finds the job it made.
		if j, ok := m.AcceptedByKey(e.Offer.From.Key); ok {
			repeat = true
			return []api.Job{j}, nil
		}
	}
	// Step 1: validate.
	sizes, tiers, err := m.validate(e)
	if err != nil {
		return nil, err
	}
	// Step 2: identity.
	owner, err := m.identify(e)
	if err != nil {
		return nil, err
	}
	// Step 3: limits (reserved until the records are stored).
	res, err := m.admit(owner, e, sizes)
	var again errAccepted
	if errors.As(err, &again) {
		if j, ok := m.AcceptedByKey(e.Offer.From.Key); ok {
			repeat = true
			return []api.Job{j}, nil
		}
		return nil, &admission.Refusal{Rule: "queue", Why: "the job of this key ended before the answer"}
	}
	if err != nil {
		return nil, err
	}
	defer m.unreserve(res)
	// Step 5 (step 4, the audit, is the deferred record): the queue.
	jobs, err := m.enqueue(e, owner, tiers, sizes)
	switch {
	case err != nil:
		return jobs, err
	case e.Pod != nil:
		// A pod's hold is never queued: held on kubelet's devices now, or
		// refused.
		return m.holdPod(jobs[0], e.Pod)
	case e.Offer == nil:
		return jobs, nil
	}
	return m.settleOffer(ctx, jobs[0], e.Offer)
}

// validate is the first step: each spec's defaults and rules, its size
// against limits.max_spec_bytes, and the host's check that it can ever run
// it. It returns each spec's size and tier.
func (m *Manager) validate(e Entry) ([]int64, []api.Tier, error) {
	specs := e.Specs
	if len(specs) == 0 {
		return nil, nil, api.FieldError("jobs", "no job specs")
	}
	if e.Offer != nil && len(specs) != 1 {
		return nil, nil, api.FieldError("jobs", "an offer carries one job, not %d", len(specs))
	}
	name := func(i int, err error) error {
		var ae *api.Error
		if len(specs) == 1 || !errors.As(err, &ae) {
			return err
		}
		out := *ae
		out.Field = "jobs[" + strconv.Itoa(i) + "]"
		if ae.Field != "" {
			out.Field += "." + ae.Field
		}
		return &out
	}
	sizes := make([]int64, len(specs))
	tiers := make([]api.Tier, len(specs))
	for i := range specs {
		spec := &specs[i]
		spec.ApplyDefaults()
		if err := spec.Validate(); err != nil {
			return nil, nil, name(i, err)
		}
		sizes[i] = specSize(*spec)
		if n := m.cfg.Limits.MaxSpecBytes; n > 0 && sizes[i] > n {
			return nil, nil, name(i, &api.Error{Code: api.CodeTooLarge, Limit: LimitMaxSpecBytes,
				Message: fmt.Sprintf("the job spec takes %s, more than the limit of %s (limit %s)", api.Bytes(sizes[i]).Human(), api.Bytes(n).Human(), LimitMaxSpecBytes)})
		}
		switch {
		case spec.Pod != nil && e.Source != admission.Kubelet:
			return nil, nil, name(i, api.FieldError("pod", "a pod's device hold is made only by kubelet, through fusiond's device plugin"))
		case (spec.Pod == nil || e.Pod == nil) && e.Source == admission.Kubelet:
			return nil, nil, name(i, api.FieldError("pod", "required from kubelet: the devices it allocated"))
		case spec.Pod != nil:
			// Held on kubelet's devices or refused (pods.go): no
			// queue to wait in.
		default:
			// A peer's job must be able to run here: it is never handed on.
			admit := m.admit1
			if e.Offer != nil {
				admit = m.placer.Admit
			}
			if err := admit(*spec); err != nil {
				return nil, nil, name(i, err)
			}
		}
		tiers[i] = cmp.Or(spec.Tier, m.cfg.DefaultTiers[spec.Class], api.TierBurstable)
	}
	return sizes, tiers, nil
}

// identify is the second step: who the jobs run as. A local caller is who
// the kernel says; a peer only asserts a user name, resolved under the
// peer policy (peers.users).
func (m *Manager) identify(e Entry) (api.Caller, error) {
	c := e.Caller
	if e.Offer != nil {
		if m.Cordoned() {
			return api.Caller{}, &admission.Refusal{Rule: "node.cordon", Why: "this host is cordoned"}
		}
		o, err := m.peerPolicy.Users.Resolve(e.Offer.User)
		if err != nil {
			return api.Caller{}, err
		}
		c = api.Caller{UID: o.UID, GID: o.GID, Groups: o.Groups, User: o.User}
	}
	if m.cfg.DaemonUID != 0 && c.UID != m.cfg.DaemonUID {
		return api.Caller{}, api.Errorf(api.CodeForbidden,
			"fusiond is not running as root, so it can run jobs only for uid %d (this job's user is uid %d)", m.cfg.DaemonUID, c.UID)
	}
	return c, nil
}

// enqueue is the last step: the records are stored in one transaction
// and queued.
func (m *Manager) enqueue(e Entry, c api.Caller, tiers []api.Tier, sizes []int64) ([]api.Job, error) {
	now := m.now()
	reason := fmt.Sprintf("submitted by %s (uid %d)", cmp.Or(c.User, "?"), c.UID)
	switch {
	case e.Offer != nil:
		reason = fmt.Sprintf("handed over by peer %s (its job %s), to run as %s (uid %d)", e.Offer.From.Node, e.Offer.From.JobID, c.User, c.UID)
	case e.Source == admission.Replica:
		reason = fmt.Sprintf("added by the elastic scaler for %s (uid %d)", cmp.Or(c.User, "?"), c.UID)
	case e.Source == admission.Kubelet:
		reason = "allocated by kubelet to a pod's container: " + strings.Join(e.Specs[0].Pod.Devices, ", ")
	}
	var origin *api.Provenance
	if e.Offer != nil {
		o := e.Offer.From
		origin = &o
	}
	jobs, err := m.store.CreateJobs(len(e.Specs), func(i int, id string) api.Job {
		return api.Job{
			ID:        id,
			Spec:      e.Specs[i],
			Owner:     api.Owner{UID: c.UID, GID: c.GID, Groups: c.Groups, User: c.User},
			Origin:    origin,
			Tier:      tiers[i],
			State:     api.StatePending,
			Events:    []api.Event{{Time: now, To: api.StatePending, Reason: reason}},
			CreatedAt: now,
			Version:   1,
		}
	})
	if err != nil {
		m.noteStoreError(err)
		return nil, api.Errorf(api.CodeInternal, "could not store the job: %v", err)
	}
	m.noteStoreOK()
	m.mu.Lock()
	for i, job := range jobs {
		stored := job
		m.jobs[job.ID] = &stored
		m.specBytes[job.ID] = sizes[i]
		if origin != nil {
			m.byOrigin[origin.Key] = job.ID
			if e.Offer.Hold > 0 {
				// Set with the record, before any pass can place it.
				m.holds[job.ID] = e.Offer.Hold
			}
		}
	}
	m.mu.Unlock()
	for _, job := range jobs {
		ev := job.Events[0]
		ev.JobID = job.ID
		m.publish(&job, ev)
		m.cfg.Observer.Submitted(job.Spec.Class, job.Tier)
		m.log.Info("job submitted", "job", job.ID, "source", e.Source, "name", job.Spec.Name, "class", job.Spec.Class, "tier", job.Tier, "uid", c.UID)
	}
	m.poke()
	return jobs, nil
}

// settle is a peer's job waiting for the queue's verdict: the loop's next
// pass places it (behind the head, under the restart freeze) or it is
// refused and forgotten.
type settle struct {
	id   string
	done chan error
}

// settleOffer hands j to the loop and waits for its verdict. When ctx ends
// first the verdict still comes (the peer follows a lost answer by polling).
func (m *Manager) settleOffer(ctx context.Context, j api.Job, o *Offer) ([]api.Job, error) {
	s := settle{id: j.ID, done: make(chan error, 1)}
	select {
	case m.settles <- s:
	case <-m.stopping:
		m.refuseOffer(j.ID, "fusiond is shutting down")
		return nil, ErrShuttingDown
	}
	select {
	case err := <-s.done:
		if err != nil {
			return nil, err
		}
	case <-m.stopping:
		// The loop may be gone: nothing places it now (a pass under way
		// may have; then it goes back to the queue when its start sees
		// the shutdown, and the next daemon forgets it, see Recover).
		m.refuseOffer(j.ID, "fusiond is shutting down")
		return nil, ErrShuttingDown
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for the queue: %w", ctx.Err())
	}
	out, ok := m.AcceptedByKey(o.From.Key)
	if !ok {
		return nil, &admission.Refusal{Rule: "queue", Why: "the job ended before the answer"}
	}
	m.log.Info("accepted a job from a peer", "job", out.ID, "peer", o.From.Node, "key", o.From.Key, "user", out.Owner.User, "hold", o.Hold)
	return []api.Job{out}, nil
}

// settleAll gives the peers' jobs waiting for a verdict theirs, after a
// scheduling pass: placed (a held gang member is then held instead of
// started), or refused with the reason it waits for. The loop calls it.
func (m *Manager) settleAll(batch []settle) {
	for _, s := range batch {
		m.mu.Lock()
		j := m.jobs[s.id]
		var state api.State
		var reason string
		if j != nil {
			state, reason = j.State, j.Reason
		}
		m.mu.Unlock()
		switch {
		case j == nil:
			s.done <- &admission.Refusal{Rule: "queue", Why: "the job was forgotten before it was placed"}
		case state == api.StatePending:
			// Forgotten here before the answer (a retried offer of its
			// key is admitted anew), its record removed after it: the
			// refusal waits for no second write. A crash before the
			// removal leaves a peer's pending job, forgotten at restart.
			forgotten, ok := m.unlist(s.id, api.StatePending)
			s.done <- &admission.Refusal{Rule: "queue", Why: cmp.Or(strings.TrimPrefix(reason, "waiting: "), "no room on this host now")}
			if ok {
				m.dropRecord(forgotten, reason)
			}
		default:
			s.done <- nil
		}
	}
}

// refuseOffer forgets a peer's job the queue did not place.
func (m *Manager) refuseOffer(id, why string) { m.forgetUnstarted(id, api.StatePending, why) }

// forgetUnstarted forgets a peer's job that never started here (in state
// from): its record is removed, so its origin, which polls it, hears that
// this host does not have it and places it again.
func (m *Manager) forgetUnstarted(id string, from api.State, why string) {
	if j, ok := m.unlist(id, from); ok {
		m.dropRecord(j, why)
	}
}

// unlist removes a peer's job still in state from from memory (the first
// half of forgetUnstarted) and returns it.
func (m *Manager) unlist(id string, from api.State) (*api.Job, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	j := m.jobs[id]
	if j == nil || j.Origin == nil || j.State != from {
		return nil, false
	}
	delete(m.jobs, id)
	delete(m.specBytes, id)
	delete(m.byOrigin, j.Origin.Key)
	delete(m.holds, id)
	return j, true
}

// dropRecord removes the record of a job unlist took out (the second
// half of forgetUnstarted).
func (m *Manager) dropRecord(j *api.Job, why string) {
	if err := m.store.DeleteJobs(j.ID); err != nil {
		m.log.Warn("removing a peer's job that did not start here", "job", j.ID, "err", err)
	}
	m.log.Info("forgot a peer's job that did not start here", "job", j.ID, "peer", j.Origin.Node, "why", why)
}

// auditAdmission is the audit step: one record per admission, accepted
// or refused, naming its source and who asked (the caller, or the peer's
// certificate identity and the user it asserted).
func (m *Manager) auditAdmission(ctx context.Context, e Entry, jobs []api.Job, err error, repeat bool) {
	if m.cfg.Audit == nil {
		return
	}
	rec := audit.Record{Time: m.now(), Action: "job.submit", Source: string(e.Source), Outcome: audit.OK, Status: 201,
		UID: int64(e.Caller.UID), GID: int64(e.Caller.GID), PID: e.Caller.PID, User: e.Caller.User, Admin: e.Caller.Admin}
	switch e.Source {
	case admission.Socket:
		rec.Method, rec.Path = "POST", "/v1/jobs"
	case admission.Batch:
		rec.Method, rec.Path = "POST", "/v1/batches"
	case admission.Replica:
		rec.PID = 0
	case admission.Kubelet:
		rec.Action, rec.Method, rec.Path, rec.Status = "kubelet.allocate", "gRPC", "/v1beta1.DevicePlugin/Allocate", 200
		rec.PID = 0
		if len(e.Specs) == 1 && e.Specs[0].Pod != nil {
			rec.Message = e.Specs[0].Pod.Resource + " " + strings.Join(e.Specs[0].Pod.Devices, ",")
		}
	}
	if o := e.Offer; o != nil {
		rec.Action, rec.Method, rec.Path, rec.Status = "peer.offer", "POST", "/peer/v1/offers", 200
		rec.Peer, rec.User, rec.UID, rec.GID, rec.Admin = o.From.Node, o.User, -1, -1, false
		rec.Message = "key " + o.From.Key
		if repeat {
			rec.Message += " (a retried offer: the job it made)"
		}
	}
	if len(jobs) > 0 {
		ids := make([]string, len(jobs))
		for i, j := range jobs {
			ids[i] = j.ID
		}
		rec.Target = strings.Join(ids, ",")
		if o := e.Offer; o != nil {
			rec.UID, rec.GID = int64(jobs[0].Owner.UID), int64(jobs[0].Owner.GID)
		}
	}
	if err != nil {
		rec.Outcome, rec.Status, rec.Message = audit.Refused, 400, err.Error()
		var ae *api.Error
		var ref *admission.Refusal
		switch {
		case errors.As(err, &ref):
			rec.Status, rec.Code = 403, ref.Rule
		case errors.As(err, &ae):
			rec.Status, rec.Code, rec.Field = ae.HTTPStatus(), ae.Code, cmp.Or(ae.Limit, ae.Field)
			if rec.Status >= 500 {
				rec.Outcome = audit.Failed
			}
		default:
			rec.Outcome, rec.Status = audit.Failed, 500
		}
	}
	m.cfg.Audit.Record(rec)
	audit.Mark(ctx)
}

// refuseSettles answers the peers' jobs still waiting for a verdict when
// the loop stops: refused and forgotten, since no pass will place them.
func (m *Manager) refuseSettles() {
	for {
		select {
		case s := <-m.settles:
			m.refuseOffer(s.id, "fusiond is shutting down")
			s.done <- ErrShuttingDown
		default:
			return
		}
	}
}

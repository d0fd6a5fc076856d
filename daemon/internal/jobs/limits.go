package jobs

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/admission"
)

// Limits bound what one user (and all jobs together) may hold. Zero
// disables a limit. The names in errors are the configuration keys
// (limits.…) so a refused caller knows which setting refused them.
type Limits struct {
	// MaxSpecBytes caps one spec's JSON size (env included): 413.
	MaxSpecBytes int64
	// PendingJobs caps a user's queued jobs: submissions past it are
	// refused with 429.
	PendingJobs int
	// RunningJobs caps a user's placed, starting and running jobs: jobs
	// past it stay queued, their reason naming the limit.
	RunningJobs int
	// SpecBytes caps the JSON size of the specs of a user's live jobs
	// (queued, placed, starting, running): 429. Finished and cancelled
	// jobs do not count: a user who cancels everything can submit again.
	SpecBytes int64
	// SpecBudget caps the specs the daemon holds for every user together,
	// finished jobs included. Past it the finished jobs of the user whose
	// finished jobs take the most are forgotten first, oldest first (so
	// one user's churn does not erase everyone's history); while live jobs
	// alone would pass it every submission is refused with 429.
	SpecBudget int64
	// LogBytes caps the output the logs of a user's jobs hold on disk.
	// Past it the logs of the user's finished jobs are removed, oldest
	// first; while the user's running jobs alone exceed it, their new
	// submissions are refused with 429.
	LogBytes int64
	// LogBudget caps the logs of all jobs together; past it the logs of
	// finished jobs are removed oldest first, and while running jobs
	// alone exceed it every submission is refused with 429.
	LogBudget int64
	// ExemptRoot exempts uid 0 from the per-user limits (not from the
	// log budget).
	ExemptRoot bool
	// PodHolds caps the pods' device holds (kubelet's allocations through
	// the device plugin) held at once: kubelet's Allocate past it is
	// refused with 429. Kubelet is held to this limit and the node's spec
	// budget, not to root's per-user limits: a hold runs nothing and
	// writes no log.
	PodHolds int
}

// Limit names, as the configuration file spells them.
const (
	LimitMaxSpecBytes = "limits.max_spec_bytes"
	LimitPendingJobs  = "limits.per_user.pending_jobs"
	LimitRunningJobs  = "limits.per_user.running_jobs"
	LimitSpecBytes    = "limits.per_user.spec_bytes"
	LimitLogBytes     = "limits.per_user.log_bytes"
	LimitLogBudget    = "limits.log_budget"
	LimitSpecBudget   = "limits.spec_budget"
)

func (m *Manager) exempt(uid uint32) bool { return m.cfg.Limits.ExemptRoot && uid == 0 }

func specSize(s api.JobSpec) int64 {
	data, err := json.Marshal(s)
	if err != nil {
		return 0
	}
	return int64(len(data))
}

// reservation is a batch being admitted: counted against the limits until
// it is stored (or fails), so concurrent submissions cannot overshoot.
type reservation struct {
	uid     uint32
	pending int
	bytes   int64
	gangs   map[string]int
	// peer and key are a peer's offer's: counted against the peer's
	// limits, and its key claimed, until it is stored.
	peer, key string
	// pod is set for kubelet's pod holds (counted against
	// Limits.PodHolds).
	pod bool
}

// errAccepted is the limits step's answer for an offer whose key is
// already a job here (a retried offer): Admit answers with that job.
type errAccepted struct{ id string }

func (e errAccepted) Error() string { return "the key is job " + e.id + " here already" }

// admit is the limits step: a batch of one user's specs (of sizes, from
// the validate step) checked against the per-user limits, the node's
// budgets, the per-peer limits for a peer's job, and the gangs already
// queued; it reserves the batch. The caller must call m.unreserve.
func (m *Manager) admit(c api.Caller, e Entry, sizes []int64) (*reservation, error) {
	specs := e.Specs
	r := &reservation{uid: c.UID, pending: len(specs), gangs: map[string]int{}, pod: e.Source == admission.Kubelet}
	if e.Offer != nil {
		r.peer, r.key = e.Offer.From.Node, e.Offer.From.Key
	}
	prefix := func(i int) string {
		if len(specs) == 1 {
			return ""
		}
		return "jobs[" + strconv.Itoa(i) + "]."
	}
	for i := range specs {
		r.bytes += sizes[i]
	}
	// Gangs within the batch must agree with each other.
	for i, s := range specs {
		if s.Gang == nil || e.Offer != nil {
			continue // a peer's gang member is not a gang here
		}
		key := strconv.FormatUint(uint64(c.UID), 10) + "/" + s.Gang.Name
		if n, ok := r.gangs[key]; ok && n != s.Gang.Size {
			return nil, api.FieldError(prefix(i)+"gang.size", "gang %q has size %d in an earlier spec of this request, not %d", s.Gang.Name, n, s.Gang.Size)
		}
		r.gangs[key] = s.Gang.Size
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	if r.key != "" {
		// One job a key: a retried offer gets the job its first made,
		// and two at once do not both pass (the key is claimed here,
		// under the lock, until the job is stored under it).
		if id, ok := m.byOrigin[r.key]; ok {
			return nil, errAccepted{id}
		}
		for o := range m.reserved {
			if o.key == r.key {
				return nil, &admission.Refusal{Rule: "queue", Why: "an offer of key " + r.key + " is being admitted now"}
			}
		}
	}
	pending, bytes := 0, int64(0)
	// The jobs and spec bytes the offering peer holds here.
	peerJobs, peerBytes := 0, int64(0)
	// Every user's live specs, and every remembered job's, for the
	// node's budget.
	live, held := int64(0), int64(0)
	// The pods' device holds.
	pods := 0
	for _, j := range m.jobs {
		held += m.specBytesOf(j)
		if j.Spec.Pod != nil && !j.State.Terminal() {
			pods++
		}
		if !j.State.Terminal() {
			live += m.specBytesOf(j)
		}
		if e.Offer != nil && j.Origin != nil && j.Origin.Node == e.Offer.From.Node && !j.State.Terminal() {
			peerJobs++
			peerBytes += m.specBytesOf(j)
		}
		if j.Owner.UID == c.UID && !j.State.Terminal() {
			if j.State == api.StatePending {
				pending++
			}
			bytes += m.specBytesOf(j)
		}
		if g := j.Spec.Gang; g != nil && j.Origin == nil && !j.State.Terminal() {
			if n, ok := r.gangs[gangKey(j)]; ok && n != g.Size {
				i := slices.IndexFunc(specs, func(s api.JobSpec) bool { return s.Gang != nil && s.Gang.Name == g.Name })
				return nil, api.FieldError(prefix(i)+"gang.size", "gang %q already has members of size %d (job %s); got %d", g.Name, g.Size, j.ID, n)
			}
		}
	}
	for o := range m.reserved {
		live += o.bytes
		held += o.bytes
		if o.uid == c.UID {
			pending += o.pending
			bytes += o.bytes
		}
		if o.pod {
			pods += o.pending
		}
		if r.peer != "" && o.peer == r.peer {
			peerJobs += o.pending
			peerBytes += o.bytes
		}
		for k, n := range o.gangs {
			if want, ok := r.gangs[k]; ok && want != n {
				_, name, _ := cutGangKey(k)
				return nil, api.FieldError("gang.size", "gang %q is being submitted with size %d; got %d", name, n, want)
			}
		}
	}
	l := m.cfg.Limits
	if b := l.SpecBudget; b > 0 && live+r.bytes > b {
		return nil, api.QuotaError(LimitSpecBudget, "the daemon holds %s of live job specs; %s more would pass the node's budget of %s: try again when jobs finish",
			api.Bytes(live).Human(), api.Bytes(r.bytes).Human(), api.Bytes(b).Human())
	}
	if b := l.SpecBudget; b > 0 && held+r.bytes > b {
		m.kickGC() // finished jobs make room
	}
	if r.pod {
		if n := l.PodHolds; n > 0 && pods+len(specs) > n {
			return nil, api.QuotaError(LimitPodHolds, "kubelet holds %d pods' devices here, the most allowed (%d)", pods, n)
		}
		m.reserved[r] = struct{}{}
		return r, nil
	}
	if b := l.LogBudget; b > 0 && m.logTotal > b {
		return nil, api.QuotaError(LimitLogBudget, "the jobs' logs hold %s, over the node's log budget of %s; finished jobs' logs are being removed to make room, try again when running jobs finish",
			api.Bytes(m.logTotal).Human(), api.Bytes(b).Human())
	}
	if e.Offer != nil {
		pl, peer := m.peerPolicy.Limits, e.Offer.From.Node
		if n := pl.Jobs; n > 0 && peerJobs+len(specs) > n {
			return nil, api.QuotaError(LimitPeerJobs, "peer %s holds %d unfinished jobs here, the most allowed (%d)", peer, peerJobs, n)
		}
		if n := pl.SpecBytes; n > 0 && peerBytes+r.bytes > n {
			return nil, api.QuotaError(LimitPeerSpecBytes, "the specs of peer %s's jobs here take %s; %s more would pass the limit of %s",
				peer, api.Bytes(peerBytes).Human(), api.Bytes(r.bytes).Human(), api.Bytes(n).Human())
		}
	}
	if !m.exempt(c.UID) {
		who := api.UserName(c.UID, c.User)
		if n := l.PendingJobs; n > 0 && pending+len(specs) > n {
			return nil, api.QuotaError(LimitPendingJobs, "%s has %d queued jobs; %d more would pass the limit of %d", who, pending, len(specs), n)
		}
		if n := l.SpecBytes; n > 0 && bytes+r.bytes > n {
			return nil, api.QuotaError(LimitSpecBytes, "%s's live jobs' specs (queued or running) take %s; %s more would pass the limit of %s",
				who, api.Bytes(bytes).Human(), api.Bytes(r.bytes).Human(), api.Bytes(n).Human())
		}
		if n := l.LogBytes; n > 0 && m.logByUser[c.UID] > n {
			return nil, api.QuotaError(LimitLogBytes, "the logs of %s's jobs hold %s, over the limit of %s; finished jobs' logs are being removed to make room, try again when running jobs finish",
				who, api.Bytes(m.logByUser[c.UID]).Human(), api.Bytes(n).Human())
		}
	}
	m.reserved[r] = struct{}{}
	return r, nil
}

func cutGangKey(k string) (uid, name string, ok bool) {
	for i := range len(k) {
		if k[i] == '/' {
			return k[:i], k[i+1:], true
		}
	}
	return "", k, false
}

func (m *Manager) unreserve(r *reservation) {
	m.mu.Lock()
	delete(m.reserved, r)
	m.mu.Unlock()
}

// specBytesOf is the JSON size of j's spec, computed once. m.mu held.
func (m *Manager) specBytesOf(j *api.Job) int64 {
	n, ok := m.specBytes[j.ID]
	if !ok {
		n = specSize(j.Spec)
		m.specBytes[j.ID] = n
	}
	return n
}

// overSpecBudget picks finished jobs to forget so that the specs of every
// remembered job fit SpecBudget: the finished jobs of the user whose
// finished jobs take the most bytes go first, oldest first, until the
// total fits or no finished job is left. skip are jobs already chosen;
// finished is sorted oldest first. m.mu held.
func (m *Manager) overSpecBudget(finished []*api.Job, skip map[string]bool) []string {
	b := m.cfg.Limits.SpecBudget
	if b <= 0 {
		return nil
	}
	total := int64(0)
	for _, j := range m.jobs {
		if !skip[j.ID] {
			total += m.specBytesOf(j)
		}
	}
	if total <= b {
		return nil
	}
	byUser := map[uint32][]*api.Job{}
	held := map[uint32]int64{}
	for _, j := range finished {
		if !skip[j.ID] {
			byUser[j.Owner.UID] = append(byUser[j.Owner.UID], j)
			held[j.Owner.UID] += m.specBytesOf(j)
		}
	}
	var drop []string
	for total > b && len(byUser) > 0 {
		var top uint32
		first := true
		for uid, n := range held {
			if first || n > held[top] || (n == held[top] && uid < top) {
				top, first = uid, false
			}
		}
		j := byUser[top][0]
		if byUser[top] = byUser[top][1:]; len(byUser[top]) == 0 {
			delete(byUser, top)
			delete(held, top)
		} else {
			held[top] -= m.specBytesOf(j)
		}
		drop = append(drop, j.ID)
		total -= m.specBytesOf(j)
	}
	return drop
}

// overRunningLimit reports, for the scheduler, whether placing n more of
// uid's jobs passes the running-jobs limit, given active (placed, starting
// or running) jobs per user.
func (m *Manager) overRunningLimit(active map[uint32]int, uid uint32, n int) bool {
	l := m.cfg.Limits.RunningJobs
	return l > 0 && !m.exempt(uid) && active[uid]+n > l
}

func jobLogBytes(dir string) int64 {
	var n int64
	for _, name := range []string{"output.log", "output.log.1"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// accountLogs measures every job's log, records the totals per user and
// for the node, and removes the logs of finished jobs, oldest first, while
// a user is over limits.per_user.log_bytes or the node over
// limits.log_budget.
func (m *Manager) accountLogs() {
	type entry struct {
		id       string
		uid      uint32
		finished bool
	}
	m.mu.Lock()
	list := make([]entry, 0, len(m.jobs))
	for _, j := range m.jobs {
		list = append(list, entry{j.ID, j.Owner.UID, j.State.Terminal()})
	}
	m.mu.Unlock()
	slices.SortFunc(list, func(a, b entry) int { return cmp.Compare(idNum(a.id), idNum(b.id)) })
	size := make(map[string]int64, len(list))
	byUser := map[uint32]int64{}
	var total int64
	for _, e := range list {
		n := jobLogBytes(filepath.Join(m.cfg.LogDir, e.id))
		size[e.id] = n
		byUser[e.uid] += n
		total += n
	}
	l := m.cfg.Limits
	for _, e := range list {
		n := size[e.id]
		if !e.finished || n == 0 {
			continue
		}
		userOver := l.LogBytes > 0 && !m.exempt(e.uid) && byUser[e.uid] > l.LogBytes
		nodeOver := l.LogBudget > 0 && total > l.LogBudget
		if !userOver && !nodeOver {
			continue
		}
		if err := removeLogs(filepath.Join(m.cfg.LogDir, e.id)); err != nil {
			m.log.Warn("removing a finished job's log over the log limits", "job", e.id, "err", err)
			continue
		}
		why := LimitLogBudget
		if userOver {
			why = LimitLogBytes
		}
		m.log.Info("removed a finished job's log", "job", e.id, "bytes", n, "limit", why)
		byUser[e.uid] -= n
		total -= n
	}
	m.mu.Lock()
	m.logByUser, m.logTotal = byUser, total
	m.mu.Unlock()
}

func removeLogs(dir string) error {
	var errs []error
	for _, name := range []string{"output.log", "output.log.1"} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("remove logs: %w", errors.Join(errs...))
	}
	return nil
}

// LogUsage is the bytes the jobs' logs held at the last measurement, per
// user and in all.
func (m *Manager) LogUsage() (map[uint32]int64, int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[uint32]int64, len(m.logByUser))
	for k, v := range m.logByUser {
		out[k] = v
	}
	return out, m.logTotal
}

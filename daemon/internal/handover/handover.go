// Package handover hands jobs that do not fit here over to peers, and
// holds the gang members peers reserve here, both sides of a hand-over:
//
//   - the origin's (origin.go, gangs.go): when a job that waited its
//     class's budget is offered, or one that fits here poorly while a peer
//     ranks better (the poor-fit rule, Agent.PoorFit), following a handed-over job on its peer
//     (its state mirrored into the local record, its output appended to
//     the local log), taking it back when the peer is lost, forwarding a
//     cancel; reserving, committing and starting a gang across peers;
//   - the holder's (held.go): a peer's gang member placed here is held,
//     not started, until its gang commits, then kept behind a start
//     barrier until the origin starts it; timers release it otherwise.
//
// The package keeps its own state under its own lock (offers in flight,
// refusals, held members) and reaches the job records only through Jobs,
// which the job manager implements (jobs.Manager.Records); the job
// manager calls back through its own interface (jobs.Handover), which
// Agent implements. Neither package imports the other: the daemon wires
// them (daemon/peersconfig.go). The peers (daemon/internal/peers) are the
// Overflow.
package handover

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// Overflow reaches the peers a job that does not fit here is handed over
// to (daemon/internal/peers implements it over mutual TLS).
type Overflow interface {
	// Offer offers job to the peers, best ranked first, until one accepts.
	// local is the job's key on this daemon ("<id>#<n>"); the Overflow
	// makes it global by prefixing this node's name. An error means no
	// peer took the job. When an offer's answer is lost the returned
	// handover has no RemoteID: the job is followed like an accepted one
	// until the peer answers or is lost (the peer stops what it never
	// hears from the origin about, see Poll).
	Offer(ctx context.Context, local string, job api.Job) (api.Handover, error)
	// Poll reads the job's state on the peer and its output from offset
	// on. Every Poll renews the peer's lease on the job: a peer that has
	// not been polled for its lease stops the job, so an origin that lost
	// its peer may place the job again without two copies running. It
	// fails with ErrRemoteGone when the peer does not have the job.
	Poll(ctx context.Context, h api.Handover, offset int64) (RemoteStatus, error)
	// Cancel asks the peer to cancel the job.
	Cancel(ctx context.Context, h api.Handover) error
}

// Ranker is an Overflow that ranks its peers for a job without offering
// it, and offers only to those that rank well enough: the poor-fit rule
// (Agent.PoorFit, Config.RankSelf).
type Ranker interface {
	// Best is the best-ranked peer for spec and its ranking score (the
	// engine's on its gossiped load, less the penalties for its queue,
	// wait and the view's age); false when no peer fits.
	Best(spec api.JobSpec) (peer string, score float64, ok bool)
	// OfferAbove is Offer to the peers whose ranking score is at least
	// min, in the offering order (the best first, or a spread over the
	// best: the implementation's choice).
	OfferAbove(ctx context.Context, local string, job api.Job, min float64) (api.Handover, error)
}

// ErrRemoteGone is Poll's answer when the peer has no job of the key.
var ErrRemoteGone = errors.New("the peer does not have the job")

// RemoteStatus is a handed-over job as its peer reports it.
type RemoteStatus struct {
	ID      string          `json:"id"`
	State   api.State       `json:"state"`
	Reason  string          `json:"reason,omitempty"`
	Attempt int             `json:"attempt,omitempty"`
	PID     int             `json:"pid,omitempty"`
	Exit    *api.ExitStatus `json:"exit,omitempty"`
	// LeaseEnded is set when the peer stopped the job because this
	// daemon did not poll it for its lease (a partition): the origin
	// takes the job back instead of recording it cancelled.
	LeaseEnded bool `json:"lease_ended,omitempty"`
	// Log is the job's output from the offset asked for (bounded; the
	// next Poll reads on).
	Log []byte `json:"log,omitempty"`
}

// Config says when a job is offered to peers and how a handed-over job is
// followed. (Who a peer's jobs may run as, and what a peer may hold here,
// are admission's: jobs.PeerPolicy.)
type Config struct {
	// Budget is, per class, how long a job may wait unplaced here before
	// it is offered to peers; a class without one is never offered.
	Budget map[api.Class]time.Duration
	// Poll is how often the origin polls a handed-over job (and renews
	// the peer's lease on it).
	Poll time.Duration
	// Lost is how long a peer may stay unreachable before its job is
	// taken back: queued again if it had not started there, else per its
	// restart policy. It must exceed the peer's lease plus the cancel
	// grace, so the peer has stopped the job by then.
	Lost time.Duration
	// Retry is how long a job waits after every peer refused it before it
	// is offered again.
	Retry time.Duration
	// RankSelf is the poor-fit rule: a job that fits here but scores
	// poorly is offered to a peer that ranks better (Agent.PoorFit).
	RankSelf RankSelf
}

// RankSelf is the poor-fit rule's thresholds (peers.rank_self). A single
// job from no peer, of a class with a wait budget, that fits here with an
// engine score s below Below is offered to the peers whose ranking score
// is at least s + Margin, when the best one's is; otherwise, and when
// every such peer refuses, it is placed here. Below 0 is off.
type RankSelf struct {
	Below, Margin float64
}

// Jobs is what the hand-over needs of the job records (jobs.Manager's
// Records implements it). Jobs are named by ID; every method takes the
// manager's lock itself, and a mutate function runs under it.
type Jobs interface {
	// Job is a copy of the job's record.
	Job(id string) (api.Job, bool)
	// State is the job's state.
	State(id string) (api.State, bool)
	// AcceptedByKey finds the job a peer handed over under key.
	AcceptedByKey(key string) (api.Job, bool)
	// Move records the job's move from state from (any state when from is
	// "") to state to, with reason and mutate, stored and published.
	Move(id string, from, to api.State, reason string, mutate func(*api.Job)) error
	// Annotate records an event on an active job without changing its
	// state.
	Annotate(id, reason string, mutate func(*api.Job)) error
	// Patch changes the in-memory record (stored with its next move).
	Patch(id string, mutate func(*api.Job))
	// SetWaiting sets the (unpersisted) reason of those of ids still
	// pending.
	SetWaiting(ids []string, reason string)
	// CanRun is the placer's Admit: an error when this host can never run
	// spec.
	CanRun(spec api.JobSpec) error
	// Launch starts a placed job (a committed gang member).
	Launch(id string)
	// Release gives back a job's placement (after its end is recorded).
	Release(id string)
	// CancelAsked reports whether a cancel of the job was asked for and
	// not yet delivered; ForgetCancel drops it; TakeCancel is a copy of
	// the record and the flag, dropped, in one step.
	CancelAsked(id string) bool
	ForgetCancel(id string)
	TakeCancel(id string) (api.Job, bool)
	// LogFile is where the job's output goes.
	LogFile(id string) string
	// Poke asks the queue for a pass.
	Poke()
	// Now is the manager's clock (UTC).
	Now() time.Time
	// Go runs f as one of the manager's goroutines (its shutdown waits
	// for them); Stopping is closed when the manager stops.
	Go(f func())
	Stopping() <-chan struct{}
}

// Agent is both sides of the hand-over on this host. Its methods are
// what the job manager calls (jobs.Handover) and what the peer API serves
// (CommitHeld, StartCommitted, ReleaseHeld).
type Agent struct {
	jobs Jobs
	o    Overflow
	cfg  Config
	log  *slog.Logger

	mu sync.Mutex
	// since is when (monotonic) each pending job first failed to place;
	// offering marks jobs with an offer in flight; retryAt when a refused
	// job may be offered again.
	since    map[string]time.Time
	offering map[string]bool
	retryAt  map[string]time.Time
	refused  map[string]string
	// held are accepted gang members that have not started (held for
	// their gang's commit, then committed and waiting for its start),
	// each with the timer that releases it. Every entry holds a placement
	// here, so the map is bounded by what the host can place; an entry
	// goes when its member starts or is released. Whether a member
	// started is read from its record (held.go), so no set of committed
	// keys is kept.
	held map[string]*heldMember
}

// New builds the hand-over over the job records. Connect it to the peers
// before the job manager uses it.
func New(jobs Jobs, cfg Config, log *slog.Logger) *Agent {
	if cfg.Poll <= 0 {
		cfg.Poll = 500 * time.Millisecond
	}
	if cfg.Lost <= 0 {
		cfg.Lost = 30 * time.Second
	}
	if cfg.Retry <= 0 {
		cfg.Retry = 5 * time.Second
	}
	return &Agent{jobs: jobs, cfg: cfg, log: log, since: map[string]time.Time{}, offering: map[string]bool{},
		retryAt: map[string]time.Time{}, refused: map[string]string{}, held: map[string]*heldMember{}}
}

// Connect sets the peers jobs are handed over to (they are built after
// the Agent, which serves their held gang members).
func (a *Agent) Connect(o Overflow) { a.o = o }

// Offerable reports whether a job this host can never run may be let in
// because it can be handed over: its class has a wait budget, and for a
// gang member the peers can place gangs.
func (a *Agent) Offerable(spec api.JobSpec) bool {
	if _, ok := a.o.(GangOverflow); spec.Gang != nil && !ok {
		return false
	}
	_, ok := a.cfg.Budget[spec.Class]
	return ok
}

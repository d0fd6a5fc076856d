// Package admission owns what every job passes before it is queued: the
// ways a job enters the daemon (Source), the order of the steps each one
// goes through (Steps), and the peer policy that says which local users a
// peer may run jobs as (PeerUsers). The job manager (daemon/internal/jobs)
// runs the steps over its records; this package holds the rules that need
// no records, so they can be read, configured and tested on their own.
package admission

import "fmt"

// Source is a way a job enters the daemon.
type Source string

// The sources. Every one passes the same Steps.
const (
	// Socket is one job submitted on the API socket (POST /v1/jobs).
	Socket Source = "socket"
	// Batch is several jobs submitted together (POST /v1/batches, a
	// multi-document fusionctl submit): all are admitted or none.
	Batch Source = "batch"
	// Peer is a job a peer hands over (POST /peer/v1/offers, no hold).
	Peer Source = "peer"
	// Gang is a member of a cross-host gang a peer reserves here (an
	// offer with a hold: placed, started only when the gang commits).
	Gang Source = "gang"
	// Replica is a replica the elastic scaler adds to a service.
	Replica Source = "replica"
	// Kubelet is a pod's device hold: devices kubelet allocated to a
	// pod's container through fusiond's device plugin (its Allocate).
	// The caller is kubelet, root on this host; the hold runs no
	// process and is placed at once on the devices kubelet chose, or
	// refused.
	Kubelet Source = "kubelet"
)

// Sources lists every source, in the order docs/architecture.md gives.
var Sources = []Source{Socket, Batch, Peer, Gang, Replica, Kubelet}

// FromPeer reports whether jobs of s come from another daemon: their
// identity is a peer's assertion, resolved under the peer policy.
func (s Source) FromPeer() bool { return s == Peer || s == Gang }

// Step is one admission step.
type Step string

// Steps are the admission steps in the order every source runs them; the
// first that refuses ends the admission, and the audit step records the
// outcome whichever step refused.
var Steps = []Step{
	// Decode and validate: the spec's own rules (api.JobSpec.Validate),
	// limits.max_spec_bytes, and the host's check that it can ever run
	// the job (the placer's Admit).
	"validate",
	// Identity: the caller's kernel credentials, or a peer's assertion
	// under peers.users; a key already accepted from the peer returns the
	// job it made.
	"identity",
	// Limits: per user (pending jobs, spec bytes, log bytes), the node's
	// budgets, and per peer (jobs held, spec bytes held).
	"limits",
	// Audit: one record per admission, accepted or refused, naming the
	// source, the caller or peer, and the rule that refused.
	"audit",
	// Queue: stored durably, then the one queue, which places in order
	// behind the head's backfill reservation and not at all while a
	// re-attached job could not be reserved again (the restart freeze).
	// A peer's job is placed by the next pass or refused: it never waits
	// here, holds the head's reservation or preempts.
	"queue",
}

// Refusal is an admission refused by a named rule: a configuration key
// ("peers.users.deny_groups") or a limit's name.
type Refusal struct {
	Rule string
	Why  string
}

func (r *Refusal) Error() string { return fmt.Sprintf("%s (%s)", r.Why, r.Rule) }

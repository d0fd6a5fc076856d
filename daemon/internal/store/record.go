package store

import (
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// Record is a job as the database holds it. It is the store's own type, not
// the API's: the wire type api.Job may change (fields, tags) without
// changing what existing databases hold, and the other way round. Its bytes
// are, field for field, what schema 1 has always written (the encoding of
// the api.Job of the time), so databases written before Record existed load
// unchanged; a change to these tags or fields is a schema change and needs a
// Migration.
//
// The submitted spec and the recorded allocation, exit status, events and
// usage keep the API's types: they are stored as the documents the API
// accepted and reported, and their quantities (api.MilliCPU, api.Bytes)
// have one encoding.
type Record struct {
	ID         string          `json:"id"`
	Spec       api.JobSpec     `json:"spec"`
	Owner      api.Owner       `json:"owner"`
	Tier       api.Tier        `json:"tier"`
	State      api.State       `json:"state"`
	Reason     string          `json:"reason,omitempty"`
	Attempt    int             `json:"attempt,omitempty"`
	Allocation *api.Allocation `json:"allocation,omitempty"`
	Exit       *api.ExitStatus `json:"exit,omitempty"`
	PID        int             `json:"pid,omitempty"`
	Events     []api.Event     `json:"events"`
	CreatedAt  time.Time       `json:"created_at"`
	StartedAt  *time.Time      `json:"started_at,omitempty"`
	FinishedAt *time.Time      `json:"finished_at,omitempty"`
	Version    uint64          `json:"version"`
	Usage      *api.Usage      `json:"usage,omitempty"`
	Degraded   []string        `json:"degraded,omitempty"`

	// PreemptedBy and Preemptions came with preemption; records written
	// before lack them (zero: never preempted).
	PreemptedBy string `json:"preempted_by,omitempty"`
	Preemptions int    `json:"preemptions,omitempty"`
	// Moves and MovingFor came with defragmentation; optional
	// (omitempty), so records without them needed no migration.
	Moves     int    `json:"moves,omitempty"`
	MovingFor string `json:"moving_for,omitempty"`
	// StoppedOvertime came with max_runtime; optional like MovingFor.
	StoppedOvertime string `json:"stopped_overtime,omitempty"`
	// Handover and Origin are optional (omitempty): records without them
	// are the schema-1 bytes above, so adding them needed no migration.
	Handover *api.Handover   `json:"handover,omitempty"`
	Origin   *api.Provenance `json:"origin,omitempty"`
	// Pod, on a pod's device hold, is the pod it was bound to; optional
	// like Handover, so it needed no migration either.
	Pod *api.PodRef `json:"pod,omitempty"`
}

// recordOf is the record of j, converted at the store's boundary.
func recordOf(j api.Job) Record {
	return Record{
		ID: j.ID, Spec: j.Spec, Owner: j.Owner, Tier: j.Tier, State: j.State, Reason: j.Reason,
		Attempt: j.Attempt, Allocation: j.Allocation, Exit: j.Exit, PID: j.PID, Events: j.Events,
		CreatedAt: j.CreatedAt, StartedAt: j.StartedAt, FinishedAt: j.FinishedAt, Version: j.Version,
		Usage: j.Usage, Degraded: j.Degraded, Handover: j.Handover, Origin: j.Origin,
		PreemptedBy: j.PreemptedBy, Preemptions: j.Preemptions, Pod: j.Pod,
		Moves: j.Moves, MovingFor: j.MovingFor, StoppedOvertime: j.StoppedOvertime,
	}
}

// Job is the API's view of the record.
func (r Record) Job() api.Job {
	return api.Job{
		ID: r.ID, Spec: r.Spec, Owner: r.Owner, Tier: r.Tier, State: r.State, Reason: r.Reason,
		Attempt: r.Attempt, Allocation: r.Allocation, Exit: r.Exit, PID: r.PID, Events: r.Events,
		CreatedAt: r.CreatedAt, StartedAt: r.StartedAt, FinishedAt: r.FinishedAt, Version: r.Version,
		Usage: r.Usage, Degraded: r.Degraded, Handover: r.Handover, Origin: r.Origin,
		PreemptedBy: r.PreemptedBy, Preemptions: r.Preemptions, Pod: r.Pod,
		Moves: r.Moves, MovingFor: r.MovingFor, StoppedOvertime: r.StoppedOvertime,
	}
}

package api

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fusiond/fusiond/daemon/sched"
)

// Class is the kind of work a job is; it selects the default QoS tier and
// the placement weight profile. It is defined once, in the placement
// engine's vocabulary (sched.Class); the wire form is its string.
type Class = sched.Class

// Job classes.
const (
	ClassTraining  = sched.ClassTraining
	ClassInference = sched.ClassInference
	ClassBatch     = sched.ClassBatch
	ClassService   = sched.ClassService
)

// Classes lists every valid class.
var Classes = sched.Classes

// Tier is a job's QoS tier (sched.Tier; the wire form is its string).
type Tier = sched.Tier

// QoS tiers, from most to least protected.
const (
	TierGuaranteed = sched.TierGuaranteed
	TierBurstable  = sched.TierBurstable
	TierBestEffort = sched.TierBestEffort
)

// Tiers lists every valid tier.
var Tiers = sched.Tiers

// TopologyPolicy is how strictly a job's CPUs, memory and devices must share
// a NUMA node (sched.TopologyPolicy; the wire form is its string).
type TopologyPolicy = sched.TopologyPolicy

// Topology policies.
const (
	TopologyNone           = sched.TopologyNone
	TopologyBestEffort     = sched.TopologyBestEffort
	TopologyRestricted     = sched.TopologyRestricted
	TopologySingleNUMANode = sched.TopologySingleNUMANode
)

// TopologyPolicies lists every valid topology policy.
var TopologyPolicies = sched.TopologyPolicies

// RestartPolicy says when a finished job is started again.
type RestartPolicy string

// Restart policies.
const (
	RestartNever     RestartPolicy = "never"
	RestartOnFailure RestartPolicy = "on-failure"
)

// RestartPolicies lists every valid restart policy.
var RestartPolicies = []RestartPolicy{RestartNever, RestartOnFailure}

// JobSpec is what a user submits: `fusionctl submit job.yaml` sends it as
// JSON. Unknown fields are rejected.
type JobSpec struct {
	// Name is a human label; it need not be unique.
	Name string `json:"name"`
	// Class is training, inference, batch or service.
	Class Class `json:"class"`
	// Tier overrides the class's default QoS tier.
	Tier Tier `json:"tier,omitempty"`
	// Priority orders the queue: higher first (0..1000, default 0).
	Priority int `json:"priority,omitempty"`
	// Command is the program and its arguments.
	Command []string `json:"command"`
	// Env holds extra environment variables (KEY: value).
	Env map[string]string `json:"env,omitempty"`
	// Workdir is the job's working directory (absolute); default the
	// user's home directory.
	Workdir string `json:"workdir,omitempty"`
	// Resources is what the job needs reserved for it.
	Resources Resources `json:"resources"`
	// Topology is the NUMA alignment policy (default best-effort).
	Topology TopologyPolicy `json:"topology,omitempty"`
	// Gang makes this job one member of a group placed all-or-nothing.
	Gang *Gang `json:"gang,omitempty"`
	// Restart says whether a failed job is started again.
	Restart *Restart `json:"restart,omitempty"`
	// Labels are free-form key/value pairs, returned as given.
	Labels map[string]string `json:"labels,omitempty"`
	// MaxRuntime bounds how long one attempt may run, counted from its
	// start (a Go duration string: "90s", "2h"; at most MaxJobRuntime).
	// An attempt still running at its limit is stopped as a cancel stops
	// it (SIGTERM, SIGKILL after cancel_grace) and the job ends failed,
	// "exceeded max_runtime …", with no on-failure retry. A start after a
	// preemption or a move is a new attempt with the whole limit again.
	// The queue's backfill takes it as the job's run time (it wins over
	// the task profile's estimate). Zero (or absent) is no limit. Not for
	// a pod's device hold; a gang member's limit is its own.
	MaxRuntime Duration `json:"max_runtime,omitempty"`
	// Movable lets the daemon stop this job and start it again elsewhere
	// on this host to make room for the job first in the queue
	// (defragmentation, docs/scheduling.md): the job must tolerate a
	// restart. A best-effort job is movable whether it says so or not. A
	// gang member and a pod's device hold cannot be movable.
	Movable bool `json:"movable,omitempty"`

	// Rootfs runs the job in a container over this root filesystem
	// (absolute path); the command is looked up inside it and Workdir
	// (default /) is inside it too.
	Rootfs string `json:"rootfs,omitempty"`

	// QoS is the job's latency SLO; unset, the class default of the
	// daemon's config applies (service and inference are protected).
	QoS *QoS `json:"qos,omitempty"`

	// Replicas makes a service or inference job elastic (see Replicas).
	Replicas *Replicas `json:"replicas,omitempty"`

	// Pod makes the job a device hold for a Kubernetes pod: the devices
	// kubelet allocated through fusiond's device plugin (docs/kubernetes.md).
	// Such a job runs no process; it holds its devices until kubelet frees
	// them. Only the kubelet source may set it.
	Pod *PodHold `json:"pod,omitempty"`
}

// PodHold is what kubelet allocated to one container of a pod: the
// plugin's resource and the device IDs of it kubelet chose.
type PodHold struct {
	// Resource is the extended resource ("fusiond.io/gpu-h200").
	Resource string `json:"resource"`
	// Devices are the device plugin's device IDs of Resource.
	Devices []string `json:"devices"`
}

// PodRef names the pod container a device hold belongs to, as kubelet's
// pod-resources API reports it.
type PodRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid,omitempty"`
	Container string `json:"container,omitempty"`
}

// Resources is a job's resource request.
type Resources struct {
	// CPU in cores or millicores ("2", "500m"). Required, > 0.
	CPU MilliCPU `json:"cpu"`
	// Memory with units ("4Gi"). Required, > 0.
	Memory Bytes `json:"memory"`
	// GPU asks for GPUs: whole, MIG slices or shares.
	GPU *GPURequest `json:"gpu,omitempty"`
	// FPGA asks for an FPGA region holding a bitstream.
	FPGA *FPGARequest `json:"fpga,omitempty"`
}

// GPURequest asks for GPUs. With neither MIG nor Share set it asks for Count
// whole GPUs; with MIG it asks for Count instances of that MIG profile; with
// Share it asks for a fraction of one GPU.
type GPURequest struct {
	// Count of whole GPUs or MIG instances (default 1).
	Count int `json:"count,omitempty"`
	// Model restricts the GPU model, e.g. "H200" (substring match,
	// case-insensitive).
	Model string `json:"model,omitempty"`
	// MIG is a MIG profile name such as "1g.18gb".
	MIG string `json:"mig,omitempty"`
	// Share is a compute share of one GPU in milli-GPU (1..999).
	Share int `json:"share,omitempty"`
	// Memory is the GPU memory cap for a shared GPU.
	Memory Bytes `json:"memory,omitempty"`
}

// FPGARequest asks for an FPGA region holding a bitstream.
type FPGARequest struct {
	// Bitstream is a bitstream name or ID from the bitstream library.
	Bitstream string `json:"bitstream"`
}

// Gang groups jobs that must all be placed together or not at all.
type Gang struct {
	Name string `json:"name"`
	// Size is the number of members (1..1024).
	Size int `json:"size"`
}

// Restart is a job's restart policy.
type Restart struct {
	Policy RestartPolicy `json:"policy"`
	// MaxRetries bounds on-failure restarts (0..100).
	MaxRetries int `json:"max_retries,omitempty"`
}

// State is a job's lifecycle state.
type State string

// Job states. Terminal states are succeeded, failed, cancelled, lost and
// preempted (evicted for a job of a higher tier, with restart policy
// never; with on-failure a preempted job is queued again instead).
const (
	StatePending   State = "pending"
	StatePlaced    State = "placed"
	StateStarting  State = "starting"
	StateRunning   State = "running"
	StateSucceeded State = "succeeded"
	StateFailed    State = "failed"
	StateCancelled State = "cancelled"
	StateLost      State = "lost"
	StatePreempted State = "preempted"
)

// States lists every state in lifecycle order.
var States = []State{StatePending, StatePlaced, StateStarting, StateRunning, StateSucceeded, StateFailed, StateCancelled, StateLost, StatePreempted}

// Terminal reports whether no transition leaves s.
func (s State) Terminal() bool {
	switch s {
	case StateSucceeded, StateFailed, StateCancelled, StateLost, StatePreempted:
		return true
	}
	return false
}

// Owner is who submitted a job, as the socket's peer credentials said.
type Owner struct {
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"`
	// User is the user name, when the uid has one.
	User string `json:"user,omitempty"`
}

// UserName is how a user is named to people and in task profiles: the
// user name, or "uid N" when the uid has none.
func UserName(uid uint32, user string) string {
	if user != "" {
		return user
	}
	return "uid " + strconv.FormatUint(uint64(uid), 10)
}

// Job is a job record as the API returns it.
type Job struct {
	ID    string  `json:"id"`
	Spec  JobSpec `json:"spec"`
	Owner Owner   `json:"owner"`
	// Tier is the effective tier (the spec's, or the class default).
	Tier   Tier   `json:"tier"`
	State  State  `json:"state"`
	Reason string `json:"reason,omitempty"`
	// Attempt counts starts (1 for the first run).
	Attempt    int         `json:"attempt,omitempty"`
	Allocation *Allocation `json:"allocation,omitempty"`
	Exit       *ExitStatus `json:"exit,omitempty"`
	PID        int         `json:"pid,omitempty"`
	Events     []Event     `json:"events"`
	CreatedAt  time.Time   `json:"created_at"`
	StartedAt  *time.Time  `json:"started_at,omitempty"`
	FinishedAt *time.Time  `json:"finished_at,omitempty"`
	// Version increases with every change to the record.
	Version uint64 `json:"version"`

	// Usage is the job's resource accounting: live while it runs, final
	// once it has finished (when the executor measured it).
	Usage *Usage `json:"usage,omitempty"`

	// Degraded names the devices of the job's allocation that went out of
	// service (a GPU fallen off the bus, a critical Xid) while the job held
	// them: the job keeps them, and keeps running, until it ends; each
	// leaves the list when it is back in service. Kept on a finished job
	// as a record of what it ran on; cleared when the job is queued again.
	Degraded []string `json:"degraded,omitempty"`
	// Latency is the running job's run-queue latency and SLO state, where
	// the daemon has probes.
	Latency *Latency `json:"latency,omitempty"`

	// PreemptedBy is the job that last preempted this one (evicted it to
	// make room for a job of a higher tier); Preemptions counts how often
	// it was preempted. Starts after a preemption are not on-failure
	// retries.
	PreemptedBy string `json:"preempted_by,omitempty"`
	Preemptions int    `json:"preemptions,omitempty"`
	// Moves counts how often the daemon stopped this movable job and
	// started it again elsewhere on this host to make room for another
	// (defragmentation); MovingFor, while it is being stopped for a move,
	// names the job the move makes room for. Starts after a move are not
	// on-failure retries.
	Moves     int    `json:"moves,omitempty"`
	MovingFor string `json:"moving_for,omitempty"`
	// StoppedOvertime, while the daemon is stopping the running attempt
	// at its max_runtime, says so ("exceeded max_runtime …"); stored
	// before the signal, so a daemon restarted meanwhile still records
	// the attempt's end as failed at its limit, not retried.
	StoppedOvertime string `json:"stopped_overtime,omitempty"`
	// Handover, on the origin, says which peer runs the job and why;
	// Origin, on that peer, which daemon the job came from.
	Handover *Handover   `json:"handover,omitempty"`
	Origin   *Provenance `json:"origin,omitempty"`
	// Pod, on a pod's device hold (Spec.Pod), is the pod container it
	// belongs to, once kubelet's pod resources name it.
	Pod *PodRef `json:"pod,omitempty"`
}

// CanMove reports whether the daemon may move j to make room for another
// job (defragmentation): it said so (Spec.Movable) or its tier is
// best-effort, and it is neither a gang member nor a pod's device hold,
// which are never moved.
func (j *Job) CanMove() bool {
	return (j.Spec.Movable || j.Tier == TierBestEffort) && j.Spec.Gang == nil && j.Spec.Pod == nil
}

// Allocation is what the placement engine reserved for a job.
type Allocation struct {
	CPU    MilliCPU `json:"cpu"`
	Memory Bytes    `json:"memory"`
	// ReclaimedCPU and ReclaimedMemory are the part of CPU and Memory a
	// best-effort job was placed on reclaimed capacity: reserved by
	// guaranteed and burstable jobs but not predicted to be used by them
	// (docs/load.md, "Reclaimed capacity").
	ReclaimedCPU    MilliCPU `json:"reclaimed_cpu,omitempty"`
	ReclaimedMemory Bytes    `json:"reclaimed_memory,omitempty"`
	// CPUSet is the cores the job is pinned to, when it is ("0-3").
	CPUSet string `json:"cpuset,omitempty"`
	// NUMANode is the node the job is aligned to, or -1.
	NUMANode int `json:"numa_node"`
	// Devices names every device held, for display (GPU and MIG UUIDs,
	// shares, FPGA regions).
	Devices []string `json:"devices,omitempty"`
	// GPUs are whole GPUs (UUIDs).
	GPUs []string `json:"gpus,omitempty"`
	// GPUPCI maps each GPU UUID the allocation names (whole GPUs, the
	// share's, the MIG instance's parent) to its PCI address, the identity
	// a re-attach falls back to when a GPU no longer answers to its UUID.
	GPUPCI map[string]string `json:"gpu_pci,omitempty"`
	// GPUShare is a share of one GPU.
	GPUShare *GPUShare `json:"gpu_share,omitempty"`
	// MIG is one MIG instance: an existing one, or one to create.
	MIG *MIGAllocation `json:"mig,omitempty"`
	// FPGA is one FPGA region and the bitstream it must hold.
	FPGA *FPGAAllocation `json:"fpga,omitempty"`
	// Explain is the engine's account of the decision: the chosen node's
	// score per dimension and what was filtered out.
	Explain string `json:"explain,omitempty"`
}

// GPUShare is a compute share and memory cap on one GPU.
type GPUShare struct {
	GPU      string `json:"gpu"`
	Milli    int    `json:"milli"`
	MemoryMB int64  `json:"memory_mb,omitempty"`
}

// MIGAllocation is a MIG instance of Profile on GPU; Instance is its UUID,
// empty until the executor has created it.
type MIGAllocation struct {
	GPU     string `json:"gpu"`
	Profile string `json:"profile"`
	// Start is the first memory slot of the instance on its GPU.
	Start    int    `json:"start"`
	Instance string `json:"instance,omitempty"`
}

// FPGAAllocation is an FPGA region that must hold Bitstream (a library ID).
type FPGAAllocation struct {
	Region    string `json:"region"`
	Bitstream string `json:"bitstream"`
	// Program is true when the region must be reprogrammed first.
	Program bool `json:"program,omitempty"`
}

// ExitStatus is how a job's process ended.
type ExitStatus struct {
	Code int `json:"code"`
	// Signal is the signal name when the process was killed by one.
	Signal string `json:"signal,omitempty"`
	// OOMKilled is true when the kernel's OOM killer ended the job.
	OOMKilled bool `json:"oom_killed,omitempty"`
}

// Usage is a job's resource accounting, read from its cgroup.
type Usage struct {
	// CPUSeconds is the CPU time the job used (user and system).
	CPUSeconds float64 `json:"cpu_seconds"`
	// ThrottledSeconds is the time the job's CPU quota held it back, in
	// ThrottledPeriods quota periods.
	ThrottledSeconds float64 `json:"throttled_seconds,omitempty"`
	ThrottledPeriods uint64  `json:"throttled_periods,omitempty"`
	// MemoryPeak is the most memory the job held at once; MemoryCurrent
	// what it holds now (0 once finished).
	MemoryPeak    Bytes `json:"memory_peak"`
	MemoryCurrent Bytes `json:"memory_current,omitempty"`
	// OOMKills counts processes of the job the OOM killer ended.
	OOMKills uint64 `json:"oom_kills,omitempty"`
	// Pressure is the share of wall time (percent, 60 s average) some of
	// the job's tasks stalled waiting for CPU, memory or I/O. Only cgroup
	// v2 kernels report it per job.
	Pressure *Pressure `json:"pressure,omitempty"`
}

// Pressure is per-job PSI, "some" stall percentages over 60 s.
type Pressure struct {
	CPU    float64 `json:"cpu"`
	Memory float64 `json:"memory"`
	IO     float64 `json:"io"`
}

// Event records one state transition of a job (Kind "job"; the events kept
// in a job record leave Kind empty) or one health transition of a device
// (Kind "device": Device and Healthy are set, the job fields are empty).
type Event struct {
	Time   time.Time `json:"time"`
	Kind   string    `json:"kind,omitempty"`
	JobID  string    `json:"job_id,omitempty"`
	From   State     `json:"from,omitempty"`
	To     State     `json:"to,omitempty"`
	Reason string    `json:"reason"`
	// Device is the GPU or MIG UUID of a device event.
	Device string `json:"device,omitempty"`
	// Healthy is the device's new health (device events only).
	Healthy *bool `json:"healthy,omitempty"`
	// Xid is the NVIDIA Xid behind a device event, when there is one.
	Xid uint64 `json:"xid,omitempty"`
}

// Event kinds.
const (
	EventJob    = "job"
	EventDevice = "device"
)

// NodeStatus is the daemon's view of its host.
type NodeStatus struct {
	Hostname  string    `json:"hostname"`
	Version   string    `json:"version"`
	StartedAt time.Time `json:"started_at"`
	// Simulated is true when devices come from a simulated host.
	Simulated bool `json:"simulated,omitempty"`
	// Cordoned is true while no new jobs are placed.
	Cordoned  bool           `json:"cordoned"`
	Capacity  NodeResources  `json:"capacity"`
	Allocated NodeResources  `json:"allocated"`
	Jobs      map[State]int  `json:"jobs"`
	Devices   []DeviceStatus `json:"devices,omitempty"`
	// Isolation says whether jobs get cgroups (limits, device isolation,
	// accounting) on this node.
	Isolation Isolation `json:"isolation"`
	// QoS is the latency probes' and the QoS loop's state.
	QoS *QoSStatus `json:"qos,omitempty"`
	// Telemetry is the telemetry bus's summary: live load, its sources,
	// and the host forecasts.
	Telemetry *TelemetryStatus `json:"telemetry,omitempty"`
	// Reclaim is the reclaimed-capacity loop's state.
	Reclaim *ReclaimStatus `json:"reclaim,omitempty"`
	// Kubernetes is the kubelet device plugin's state, when it runs
	// (kubernetes.device_plugin).
	Kubernetes *KubernetesStatus `json:"kubernetes,omitempty"`
	// Notes are facts an operator should know (e.g. "no NVIDIA driver").
	Notes []string `json:"notes,omitempty"`
}

// KubernetesStatus is the kubelet device plugin's state.
type KubernetesStatus struct {
	// Resources is how many extended resources the plugin serves;
	// Registered how many of them kubelet has accepted since it last
	// started; Registrations counts every registration (each resource,
	// each kubelet start).
	Resources     int    `json:"resources"`
	Registered    int    `json:"registered"`
	Registrations uint64 `json:"registrations"`
	// PodResources says whether kubelet's pod-resources API answered the
	// last reconcile (without it no hold is released).
	PodResources bool `json:"pod_resources"`
	// Holds is how many pods' device holds hold devices now; Binds and
	// Releases count the holds the reconcile loop named a pod for and
	// released.
	Holds    int    `json:"holds"`
	Binds    uint64 `json:"binds"`
	Releases uint64 `json:"releases"`
	// Allocate and Preferred are kubelet's Allocate and
	// GetPreferredAllocation calls.
	Allocate  CallLatency `json:"allocate"`
	Preferred CallLatency `json:"preferred"`
}

// CallLatency counts calls of one kind and their latency over the recent
// ones.
type CallLatency struct {
	Count  uint64   `json:"count"`
	Errors uint64   `json:"errors"`
	P50    Duration `json:"p50"`
	P99    Duration `json:"p99"`
	Max    Duration `json:"max"`
}

// Isolation is how a node confines its jobs.
type Isolation struct {
	// Isolated is true when every job runs in a cgroup of its own with
	// its limits and device filter; Mode is then the cgroup hierarchy
	// (v1, v2).
	Isolated bool   `json:"isolated"`
	Mode     string `json:"mode,omitempty"`
	// Reason says why jobs cannot be isolated (not root, a controller
	// missing) when they cannot.
	Reason string `json:"reason,omitempty"`
	// JobsRefused is true when jobs cannot be isolated and the node's
	// config does not allow them to run unisolated (allow_unisolated_jobs):
	// every job fails to start, saying so.
	JobsRefused bool `json:"jobs_refused,omitempty"`
}

// NodeResources counts CPU, memory and devices: the daemon's one resource
// vector (a host's capacity, what is allocated on it). Its CPU and memory
// are the API's quantities, api.MilliCPU and api.Bytes; the placement engine
// (sched.Node, sched.Request) and cgroups (Placement) hold the same amounts
// as plain int64 millicores, MiB and bytes, converted at their boundary
// (Bytes.MiB, BytesOfMiB), because neither may import this package and the
// engine's fields are its hot path.
type NodeResources struct {
	CPU    MilliCPU `json:"cpu"`
	Memory Bytes    `json:"memory"`
	GPUs   int      `json:"gpus"`
	FPGAs  int      `json:"fpgas"`
}

// DeviceStatus is one device as node status shows it.
type DeviceStatus struct {
	ID      string `json:"id"`
	Kind    string `json:"kind"`
	Model   string `json:"model,omitempty"`
	Healthy bool   `json:"healthy"`
	Detail  string `json:"detail,omitempty"`
}

// Health is the body of /v1/healthz and /v1/readyz.
type Health struct {
	Status string `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// Version is the body of /v1/version.
type Version struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	BuildDate string `json:"build_date"`
	API       string `json:"api"`
}

// ListOptions filters a job listing.
type ListOptions struct {
	State []State
	User  string
	Class Class
	// Limit caps the number returned (newest first). The server answers
	// one page at a time: at most Limit jobs, and at most MaxPageSize
	// (DefaultPageSize when Limit is 0); Client.List follows the pages.
	Limit int
	// Continue is the token a previous page returned (ContinueHeader):
	// the listing resumes after that page.
	Continue string
}

// Paging of GET /v1/jobs.
const (
	// DefaultPageSize is a page's size when the query sets no limit.
	DefaultPageSize = 500
	// MaxPageSize is the largest page the server returns.
	MaxPageSize = 1000
	// ContinueHeader carries the token for the next page; absent on the
	// last page.
	ContinueHeader = "Fusiond-Continue"
)

// Caller is who is asking, from the socket's peer credentials.
type Caller struct {
	UID    uint32
	GID    uint32
	PID    int32
	Groups []uint32
	// User is the caller's user name, if the uid has one.
	User string
	// Admin callers (root, or members of the admin group) see and manage
	// every job.
	Admin bool
}

// BatchRequest is the body of POST /v1/batches: several job specs
// queued all together or not at all.
type BatchRequest struct {
	Jobs []json.RawMessage `json:"jobs"`
}

// BatchResponse answers POST /v1/batches with the jobs created, in the
// order of the request.
type BatchResponse struct {
	Jobs []Job `json:"jobs"`
}

// QoS is a job's latency SLO. A job with an SLO is protected: when its
// run-queue latency (or memory pressure) breaks the SLO, the daemon's QoS
// loop takes CPU (or memory) from the best-effort tier.
type QoS struct {
	// RunqueueP99 is the most the 99th percentile of the time the job's
	// runnable tasks wait for a CPU may be, per window (10us..10s).
	RunqueueP99 Duration `json:"runqueue_p99,omitempty"`
	// PSISomeAvg10 is the most memory pressure ("some" stall share over
	// 10 s, percent, 0..100] the job may see; cgroup v2 only.
	PSISomeAvg10 float64 `json:"psi_some_avg10,omitempty"`
}

// Latency is a running job's measured run-queue latency and SLO state, as
// `fusionctl show` prints it.
type Latency struct {
	// SLO is the job's effective SLO (spec or class default); nil when
	// the job is not protected.
	SLO *QoS `json:"slo,omitempty"`
	// State is ok, breach, no-data or unprotected.
	State string `json:"state"`
	// P50 and P99 of the last window, Count its events.
	P50   Duration `json:"p50"`
	P99   Duration `json:"p99"`
	Count uint64   `json:"count"`
	// Histogram counts every event since the job was registered: bucket i
	// holds waits in [2^i, 2^(i+1)) ns (bucket 0: [0, 2) ns).
	Histogram []uint64 `json:"histogram"`
	// Preemptions counts involuntary switches in favour of another tier.
	Preemptions uint64 `json:"preemptions,omitempty"`
	// MemoryPressure is the job's memory PSI some avg10, where measured.
	MemoryPressure *float64 `json:"memory_pressure,omitempty"`
	// DelayedBy is the job's run-queue wait since it was registered,
	// charged to whoever held the CPU meanwhile; WindowDelayedBy the last
	// window's.
	DelayedBy       *DelayedBy `json:"delayed_by,omitempty"`
	WindowDelayedBy *DelayedBy `json:"window_delayed_by,omitempty"`
}

// DelayedBy is run-queue wait charged to whoever held the CPU the task
// waited on (the latency probe's attribution, docs/qos.md "Who delayed
// whom"): the CPU idle (waking it took that long), a task of each fusiond
// tier (the job's own threads count in its tier), a fusiond job of no
// tier, a task outside fusiond's cgroups, or a kernel thread.
type DelayedBy struct {
	Idle       Duration `json:"idle"`
	Guaranteed Duration `json:"guaranteed"`
	Burstable  Duration `json:"burstable"`
	BestEffort Duration `json:"besteffort"`
	Job        Duration `json:"job"`
	Outside    Duration `json:"outside"`
	Kernel     Duration `json:"kernel"`
}

// DelayPart is one runner's part of a DelayedBy.
type DelayPart struct {
	// By is the runner as the JSON field names it.
	By   string
	Wait Duration
}

// Parts lists the parts in a fixed order.
func (d DelayedBy) Parts() []DelayPart {
	return []DelayPart{{"idle", d.Idle}, {"guaranteed", d.Guaranteed}, {"burstable", d.Burstable}, {"besteffort", d.BestEffort},
		{"job", d.Job}, {"outside", d.Outside}, {"kernel", d.Kernel}}
}

// Describe is the wait as shares, largest first, leaving out those under
// 1%: "outside 85%, besteffort 10%, idle 5%" ("not attributed" when
// nothing was charged).
func (d DelayedBy) Describe() string {
	total := d.Total()
	if total <= 0 {
		return "not attributed"
	}
	parts := d.Parts()
	slices.SortStableFunc(parts, func(a, b DelayPart) int { return cmp.Compare(b.Wait, a.Wait) })
	var out []string
	for _, p := range parts {
		if pct := 100 * float64(p.Wait) / float64(total); pct >= 1 {
			out = append(out, fmt.Sprintf("%s %.0f%%", p.By, pct))
		}
	}
	return strings.Join(out, ", ")
}

// Total is the whole wait.
func (d DelayedBy) Total() Duration {
	var t Duration
	for _, p := range d.Parts() {
		t += p.Wait
	}
	return t
}

// OutsideDelay is a cgroup outside fusiond's that held CPUs while timed
// jobs waited, and how much of their wait it is charged.
type OutsideDelay struct {
	// Cgroup is its path in the cpu hierarchy ("" when not found, with
	// ID set).
	Cgroup string   `json:"cgroup,omitempty"`
	ID     uint64   `json:"id"`
	Wait   Duration `json:"wait"`
}

// QoSStatus is the QoS loop's state in node status.
type QoSStatus struct {
	// Probes is "attached" or why there are none.
	Probes string `json:"probes"`
	// Enabled is false when the loop does not run (no probes, no cgroups,
	// or switched off in the config).
	Enabled bool     `json:"enabled"`
	Window  Duration `json:"window"`
	// SharedPool is the CPU of the shared pool best-effort runs on (the
	// cores no guaranteed job holds) at the last window: what the loop
	// cuts the best-effort quota from.
	SharedPool MilliCPU `json:"shared_pool,omitempty"`
	// BestEffortQuota is the best-effort tier's CPU cap now (0: none).
	BestEffortQuota MilliCPU `json:"besteffort_quota"`
	// BestEffortMemoryHigh is its memory.high now (0: none).
	BestEffortMemoryHigh Bytes `json:"besteffort_memory_high,omitempty"`
	// Protected counts the running jobs with an SLO, Breaching those
	// over it in the last window.
	Protected int `json:"protected"`
	Breaching int `json:"breaching"`
	// ProbeEvents and ProbeNsPerEvent are the kernel's accounting of the
	// probe's programs (runs, and mean run time in ns), present only while
	// the kernel counts (sysctl kernel.bpf_stats_enabled=1).
	ProbeEvents     uint64  `json:"probe_events,omitempty"`
	ProbeNsPerEvent float64 `json:"probe_ns_per_event,omitempty"`
	// ProbeLostWaits counts the waits the probe dropped since it was
	// loaded: two timed threads whose ids share a slot of its
	// pending-wait array waited at once.
	ProbeLostWaits uint64 `json:"probe_lost_waits,omitempty"`
	// ProbeSlots is how many job cgroups the probe can time at once
	// (qos.max_jobs), ProbeSlotsUsed how many it times now; UntimedJobs
	// counts the running jobs it has no slot for now (not timed, their
	// SLO not watched), UntimedJobsTotal every job it had none for, each
	// once.
	ProbeSlots       int    `json:"probe_slots,omitempty"`
	ProbeSlotsUsed   int    `json:"probe_slots_used,omitempty"`
	UntimedJobs      int    `json:"untimed_jobs,omitempty"`
	UntimedJobsTotal uint64 `json:"untimed_jobs_total,omitempty"`
	// DelayedBy is the protected jobs' run-queue wait in the last window,
	// by who held the CPU; TopOutside the cgroups outside fusiond's
	// charged the most of the timed jobs' waits in that window (at most
	// five).
	DelayedBy  *DelayedBy     `json:"delayed_by,omitempty"`
	TopOutside []OutsideDelay `json:"top_outside,omitempty"`
	// Resctrl is the loop's second actuator: the cache and memory
	// bandwidth resctrl allocates and best-effort's share of them, or
	// "off: " and why (no RDT/PQoS, not mounted, switched off).
	Resctrl string `json:"resctrl,omitempty"`
	// LastAction says what the loop did last, and when.
	LastAction   string     `json:"last_action,omitempty"`
	LastActionAt *time.Time `json:"last_action_at,omitempty"`
}

// EventQoS is the kind of a QoS loop action event.
const EventQoS = "qos"

// TelemetryStatus is the telemetry bus's summary (daemon/internal/telemetry).
type TelemetryStatus struct {
	// Interval is the host sampling interval, JobInterval the jobs'.
	Interval    Duration `json:"interval"`
	JobInterval Duration `json:"job_interval"`
	// Samples is how many host samples the ring holds now, of Ring.
	Samples int `json:"samples"`
	Ring    int `json:"ring"`
	// HistoryMinutes is how many per-minute points are kept for the
	// forecasters.
	HistoryMinutes int `json:"history_minutes"`
	// MemoryBound is the most memory the rings can hold, in bytes.
	MemoryBound Bytes `json:"memory_bound"`
	// SampleCost is the mean wall time one host sample took.
	SampleCost Duration `json:"sample_cost"`
	// CPUBusy is the host's busy fraction (0..1) over the last second;
	// NodeBusy per NUMA node.
	CPUBusy  float64   `json:"cpu_busy"`
	NodeBusy []float64 `json:"node_busy,omitempty"`
	// MemoryUsed is MemTotal − MemAvailable.
	MemoryUsed Bytes `json:"memory_used"`
	// PSI is the host's pressure (some avg10, percent); nil without
	// /proc/pressure.
	PSI *PressureStatus `json:"psi,omitempty"`
	// PackagePowerW is the CPU packages' power (RAPL), nil when absent;
	// Power says where it comes from or why there is none.
	PackagePowerW *float64 `json:"package_power_w,omitempty"`
	Power         string   `json:"power"`
	// GPUs counts the GPUs in the latest sample; GPUPowerW is their power
	// together (NVML); IdleGPUs those with SM utilisation under 1% over
	// the last 10 s, drawing IdleGPUPowerW together.
	GPUs          int     `json:"gpus"`
	GPUPowerW     float64 `json:"gpu_power_w,omitempty"`
	IdleGPUs      int     `json:"idle_gpus,omitempty"`
	IdleGPUPowerW float64 `json:"idle_gpu_power_w,omitempty"`
	// Jobs counts the jobs whose cgroups are read; JobPSI says whether
	// per-job PSI is read or why not (cgroup v1 has none).
	Jobs   int    `json:"jobs"`
	JobPSI string `json:"job_psi"`
	// MaxJobs is the most jobs the bus follows at once (telemetry.max_jobs);
	// UnfollowedJobs counts the running jobs it does not follow now
	// because MaxJobs were followed when they started (they have no usage
	// readings), UnfollowedJobsTotal every job it ever refused, each once.
	MaxJobs             int    `json:"max_jobs"`
	UnfollowedJobs      int    `json:"unfollowed_jobs,omitempty"`
	UnfollowedJobsTotal uint64 `json:"unfollowed_jobs_total,omitempty"`
	// LastError is the last sampling error, if any.
	LastError string `json:"last_error,omitempty"`
	// Forecasts are the host series' forecasts.
	Forecasts []SeriesForecast `json:"forecasts,omitempty"`
	// GPUEnergy is the GPUs' energy per unit of delivered work since
	// the bus started, GPUEnergyRecent over its last minute; nil
	// without GPU samples.
	GPUEnergy       *GPUEnergy `json:"gpu_energy,omitempty"`
	GPUEnergyRecent *GPUEnergy `json:"gpu_energy_recent,omitempty"`
}

// GPUEnergy is this host's GPU energy per unit of delivered work over a
// window of the telemetry bus's samples, each sample's readings counted
// from the previous sample to it.
type GPUEnergy struct {
	// Since is the window's start, Window its length (time integrated).
	Since  time.Time `json:"since"`
	Window Duration  `json:"window"`
	// EnergyWh is the GPUs' energy: the driver's measured power where
	// read (MeasuredWh of it), else the GPU model table's idle + (TDP −
	// idle) × SM utilisation.
	EnergyWh   float64 `json:"energy_wh"`
	MeasuredWh float64 `json:"measured_wh"`
	// IdleFloorWh is what the GPUs' idle draws (the model table's
	// estimates) alone come to over the window, busy or not; the rest of
	// EnergyWh is above idle.
	IdleFloorWh float64 `json:"idle_floor_wh"`
	// GPUHours is GPUs × time; BusyGPUHours Σ SM utilisation × time.
	GPUHours     float64 `json:"gpu_hours"`
	BusyGPUHours float64 `json:"busy_gpu_hours"`
	// A100EqHours is the delivered compute: Σ SM utilisation × the
	// model's dense FP16 TFLOPS (the model table) × time, in hours of an
	// A100 (sched.ReferenceFP16, 312 TFLOPS). SM utilisation is the share
	// of time a kernel ran, not the share of peak throughput reached, so
	// this is an upper bound on the work done.
	A100EqHours float64 `json:"a100_eq_hours"`
	// WhPerBusyGPUHour and WhPerA100EqHour are EnergyWh over
	// BusyGPUHours and A100EqHours (0 when nothing was delivered);
	// FloorWhPerA100EqHour is IdleFloorWh's part of the latter.
	WhPerBusyGPUHour     float64 `json:"wh_per_busy_gpu_hour,omitempty"`
	WhPerA100EqHour      float64 `json:"wh_per_a100_eq_hour,omitempty"`
	FloorWhPerA100EqHour float64 `json:"floor_wh_per_a100_eq_hour,omitempty"`
	// UnknownGPUs counts the GPUs whose model the table does not know:
	// their measured power counts, their compute and idle floor do not.
	UnknownGPUs int `json:"unknown_gpus,omitempty"`
}

// PressureStatus is the "some" avg10 of each resource, in percent.
type PressureStatus struct {
	CPU    float64 `json:"cpu"`
	Memory float64 `json:"memory"`
	IO     float64 `json:"io"`
}

// SeriesForecast is one series' forecast: the model the back-test chose
// and its predicted value Horizon ahead.
type SeriesForecast struct {
	Series  string   `json:"series"`
	Model   string   `json:"model"`
	Horizon Duration `json:"horizon"`
	Now     float64  `json:"now"`
	Value   float64  `json:"value"`
	// SMAPE is the chosen model's back-test error (percent).
	SMAPE float64 `json:"smape"`
	// Points is how many per-minute points it was fitted on.
	Points int `json:"points"`
}

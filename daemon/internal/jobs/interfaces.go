package jobs

import (
	"context"
	"errors"
	"syscall"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/sched"
	"github.com/fusiond/fusiond/devices"
)

// RunRequest is everything a Runner needs to start one attempt of a job.
type RunRequest struct {
	JobID   string
	Attempt int
	Command []string
	// Env is the complete environment, KEY=value.
	Env     []string
	Workdir string
	UID     uint32
	GID     uint32
	Groups  []uint32
	// LogPath receives the job's stdout and stderr.
	LogPath    string
	Tier       api.Tier
	Allocation api.Allocation
	// Devices are the device nodes the job may open (from the device
	// drivers' grants); every other device node is denied.
	Devices []devices.DeviceNode
	// DeviceEnv is added to Env (CUDA_VISIBLE_DEVICES and the like).
	DeviceEnv map[string]string
	// Rootfs, when set, runs the job in a container over it.
	Rootfs string
}

// Process is a started job.
type Process interface {
	PID() int
	// Wait blocks until the job's process ends.
	Wait() (api.ExitStatus, error)
	// Signal sends sig to every process of the job.
	Signal(sig syscall.Signal) error
}

// Runner starts jobs; the daemon's is executor.MonitorRunner.
type Runner interface {
	Start(ctx context.Context, req RunRequest) (Process, error)
	// Attach finds an attempt started by an earlier daemon: its monitor
	// still running, or the result it recorded. It fails with ErrGone when
	// neither is there, and with ErrNeverStarted when no monitor of the
	// attempt ever started its job.
	Attach(jobID string, attempt int) (Process, error)
	// Reap kills whatever is left of a job attempt that was running when
	// the daemon stopped (pid is its recorded leader, or 0 if none was
	// recorded), and says how many processes it killed.
	Reap(jobID string, pid int) (int, error)
}

// ErrGone is Attach's answer for an attempt whose monitor is gone without a
// result: the job is lost.
var ErrGone = errors.New("job attempt's monitor is gone and left no result")

// ErrNeverStarted is Attach's answer for an attempt that provably never ran:
// no monitor holds it and none ever recorded itself or a result (the daemon
// stopped between recording the job as starting and its monitor's first
// record). Such a job is queued again.
var ErrNeverStarted = errors.New("job attempt never started")

// UsageReporter is a Process that can measure the job's resource use.
type UsageReporter interface {
	Usage() (api.Usage, error)
}

// QuotaSetter is a Runner that can change a running job's CPU quota.
type QuotaSetter interface {
	SetCPUQuota(jobID string, milli int64) error
}

// Reclaimer is a Placer that can re-reserve the allocation a job already
// holds (a job re-attached after a daemon restart).
type Reclaimer interface {
	Reclaim(job *api.Job) error
}

// Placer reserves host resources for jobs. The manager calls it from one
// goroutine at a time.
type Placer interface {
	// Admit rejects a spec this host can never satisfy, with an *api.Error
	// (code unsatisfiable) naming the field.
	Admit(spec api.JobSpec) error
	// Place reserves resources for every job in group (a single job, or all
	// members of a gang) or for none. When it cannot, it says why in words
	// a user can read.
	Place(group []*api.Job) ([]api.Allocation, string, bool)
	// Release returns a job's reservation.
	Release(job *api.Job)
	// Capacity and Allocated report the host's totals.
	Capacity() api.NodeResources
	Allocated() api.NodeResources
}

// Preparer readies the devices a placed job was allocated (a GPU share, a
// MIG instance created on demand, an FPGA region programmed) and returns
// what the job must be granted. It may fill in allocation details it
// created. Release undoes it and is safe to call more than once.
type Preparer interface {
	Prepare(ctx context.Context, j *api.Job) (devices.Grant, error)
	Release(j *api.Job)
}

// Scorer is a Placer that tells the placement engine's score of a job's
// placement (the daemon's placer is one): the queue's poor-fit rule
// (Handover.PoorFit) compares it with the peers'.
type Scorer interface {
	// PlacedScore is the engine's score (0..1) of the placement job id
	// holds; false when it has none (not placed, a gang's member).
	PlacedScore(id string) (float64, bool)
}

// Backfiller is a Placer that can keep room for the head of the queue
// (EASY backfill on one host, see queue.go). The daemon's placer is one;
// with a Placer that is not, every job is simply tried in order.
type Backfiller interface {
	// PlaceBehind is Place for a group behind head, the first waiting job
	// (or gang), which holds a reservation: it places group only where
	// that leaves what head needs, and otherwise says why not.
	PlaceBehind(group, head []*api.Job) ([]api.Allocation, string, bool)
	// FitsEmpty reports whether group would fit on the host with nothing
	// else placed: ever (every device in service), and now (the devices
	// out of service left out).
	FitsEmpty(group []*api.Job) (ever, now bool)
}

// Shadower is a Backfiller that knows run times: EASY backfill with
// estimates (queue.go).
type Shadower interface {
	// ShadowTime is when head would first fit if the jobs in ends (by ID)
	// released what they hold at those times and the others held on;
	// false when it would not, or head is a gang.
	ShadowTime(head []*api.Job, ends map[string]time.Time, now time.Time) (time.Time, bool)
}

// RuntimeEstimator says how long a job is expected to run (the daemon:
// its spec's max_runtime when given, else its task profile's estimate,
// profile.Book.EstimateRuntime); false when nothing is known.
type RuntimeEstimator interface {
	EstimateJob(j *api.Job) (time.Duration, bool)
}

// Preempter is a Placer that can plan preemptions (see preempt.go).
type Preempter interface {
	// PlanPreemption names the jobs to evict, among those in costs (the
	// allowed victims, with what evicting each loses), so that j fits: at
	// most budget, only of tiers below j's, fewest then cheapest. It
	// changes nothing.
	PlanPreemption(j *api.Job, costs map[string]float64, budget int) ([]string, error)
}

// Defragmenter is a Placer that can plan moves of movable jobs to make
// room for a job that does not fit (defrag.go). The daemon's placer is
// one.
type Defragmenter interface {
	// PlanMoves plans the fewest moves, at most budget, of the running
	// jobs named in movable after which j fits (sched.Engine.PlanMoves
	// over what they hold): where each goes and where j goes then. It
	// changes nothing, and fails with ErrNoMoves when no plan within
	// budget exists or j fits already.
	PlanMoves(j *api.Job, movable []string, budget int) (MovePlan, error)
	// Pin keeps plan's places: the next placement of each moved job and
	// of the job the plan makes room for goes where the plan put it, as
	// long as that is still free there (each pin is used once). A later
	// Pin replaces every earlier pin.
	Pin(plan MovePlan)
	// Unpin drops the pins of the jobs named (the queue calls it once the
	// job a plan made room for is placed or gone).
	Unpin(ids []string)
}

// ErrNoMoves is PlanMoves' answer when no moves within the budget make
// the job fit (or it fits already).
var ErrNoMoves = errors.New("no moves of movable jobs make the job fit")

// MovePlan is a defragmentation plan as the manager carries it out.
type MovePlan struct {
	// For is the job the moves make room for; Head is where it goes
	// then, in words.
	For, Head string
	// Moves are the jobs to stop and start again, in order.
	Moves []JobMove
	// Why is the planner's one line for people: what blocked the job and
	// what the moves free.
	Why string
	// Pins are the planned assignments by job ID (each moved job's new
	// one and For's), for Defragmenter.Pin.
	Pins map[string]sched.Assignment
}

// JobMove is one job of a MovePlan: where it holds its resources now and
// where it goes, in words.
type JobMove struct {
	ID, From, To string
}

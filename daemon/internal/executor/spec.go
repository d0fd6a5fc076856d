package executor

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/atomicfile"
	"github.com/fusiond/fusiond/devices"
)

// The files of one attempt directory, <jobs dir>/<job>/attempt-<n>/.
const (
	// specFile is written by the daemon before it starts the monitor.
	specFile = "spec.json"
	// stateFile is written by the monitor once the job runs.
	stateFile = "state.json"
	// resultFile is written by the monitor, durably, when the job ended.
	resultFile = "result.json"
	// lockFile is flock'ed by the monitor for as long as it lives: a
	// daemon that can take the lock knows the monitor is gone, whatever
	// became of its pid.
	lockFile = "monitor.lock"
	// reserveFile holds room for resultFile while the job runs.
	reserveFile = "result.reserve"
	// monitorLogFile receives the monitor's own log.
	monitorLogFile = "monitor.log"
)

// Hidden first arguments of the fusiond binary (see Dispatch).
const (
	// MonitorArg starts a job monitor: fusiond __monitor <attempt dir>.
	MonitorArg = "__monitor"
	// execArg is the job's first process: it waits until the monitor has
	// put it into the job's cgroup, takes the job's identity and execs the
	// job's command.
	execArg = "__exec"
	// usernsArg holds a user namespace open for stageRoot: it waits for its
	// standard input to close.
	usernsArg = "__userns"
)

// Spec is what the daemon hands a monitor in spec.json, and the monitor
// hands the job's first process over a pipe.
type Spec struct {
	JobID   string `json:"job_id"`
	Attempt int    `json:"attempt"`
	// Path is the program as the spec names it: the job's first process
	// looks it up in Env's PATH once it runs as the job's user (a
	// container's init, inside the container); Args includes argv[0].
	Path string   `json:"path"`
	Args []string `json:"args"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
	// Rootfs, when set, runs the job in a container over this root
	// filesystem (Path is then looked up inside it).
	Rootfs string `json:"rootfs,omitempty"`
	// Devices are the granted device nodes (a container gets them in its
	// /dev; the cgroup rules come from Cgroup.Limits).
	Devices []devices.DeviceNode `json:"devices,omitempty"`
	// SetIdentity makes the job switch to UID, GID and Groups (only a root
	// daemon can).
	SetIdentity bool     `json:"set_identity"`
	UID         uint32   `json:"uid"`
	GID         uint32   `json:"gid"`
	Groups      []uint32 `json:"groups,omitempty"`
	Rlimits     []Rlimit `json:"rlimits,omitempty"`
	// LogPath receives stdout and stderr; it is rotated to LogPath.1 when
	// it would grow beyond LogMaxBytes.
	LogPath     string `json:"log_path"`
	LogMaxBytes int64  `json:"log_max_bytes"`
	// Grace is the time between SIGTERM and killing the whole job.
	Grace time.Duration `json:"grace"`
	// Cgroup, when set, is the job's control group.
	Cgroup *CgroupSpec `json:"cgroup,omitempty"`
}

// CgroupSpec names the job's cgroup and its limits (computed by
// cgroups.Plan in the daemon).
type CgroupSpec struct {
	Root   string         `json:"root"`
	Parent string         `json:"parent"`
	Tier   cgroups.Tier   `json:"tier"`
	Limits cgroups.Limits `json:"limits"`
}

// Rlimit is one resource limit (unix.RLIMIT_*) of the job.
type Rlimit struct {
	Resource int    `json:"resource"`
	Soft     uint64 `json:"soft"`
	Hard     uint64 `json:"hard"`
}

// State is what a monitor records once its job runs.
type State struct {
	MonitorPID int `json:"monitor_pid"`
	// MonitorStart is the monitor's start time in clock ticks since boot
	// (field 22 of /proc/PID/stat): with the pid it names the process
	// unambiguously.
	MonitorStart uint64    `json:"monitor_start"`
	JobPID       int       `json:"job_pid"`
	Cgroup       string    `json:"cgroup,omitempty"`
	StartedAt    time.Time `json:"started_at"`
}

// Result is how a job attempt ended, as its monitor recorded it.
type Result struct {
	Exit api.ExitStatus `json:"exit"`
	// Reason is cgroups.ExitExited, ExitSignaled or ExitOOMKilled.
	Reason     string     `json:"reason"`
	Usage      *api.Usage `json:"usage,omitempty"`
	FinishedAt time.Time  `json:"finished_at"`
}

// writeJSONDurably writes v to path so that after a crash path holds either
// the old content or all of the new: write a temporary file, fsync it,
// rename it over path and fsync the directory.
func writeJSONDurably(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, 0o600, func(f *os.File) error {
		_, err := f.Write(data)
		return err
	})
}

// readJSON reads path into v; a missing file is reported with
// os.ErrNotExist.
func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// errBadStat is returned for a /proc/PID/stat that cannot be parsed.
var errBadStat = errors.New("unparsable /proc stat")

// processStart reads a process's start time (clock ticks since boot) from
// procRoot/PID/stat.
func processStart(procRoot string, pid int) (uint64, error) {
	data, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	return parseStartTime(string(data))
}

// parseStartTime extracts field 22 (starttime) of a /proc/PID/stat line.
// The command name (field 2) may contain spaces and parentheses, so fields
// are counted from its closing parenthesis.
func parseStartTime(stat string) (uint64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errBadStat
	}
	fields := strings.Fields(stat[i+1:])
	// fields[0] is field 3 (state); starttime is field 22.
	if len(fields) < 20 {
		return 0, errBadStat
	}
	n, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errBadStat, err)
	}
	return n, nil
}

// usageFrom converts cgroup accounting to the job record's form.
func usageFrom(st cgroups.Stats) api.Usage {
	u := api.Usage{
		CPUSeconds:       st.CPUUsage.Seconds(),
		ThrottledSeconds: st.ThrottledTime.Seconds(),
		ThrottledPeriods: st.NrThrottled,
		MemoryPeak:       api.Bytes(st.MemoryPeak),
		MemoryCurrent:    api.Bytes(st.MemoryCurrent),
		OOMKills:         st.OOMKills,
	}
	if p := st.PSI; p != nil {
		u.Pressure = &api.Pressure{CPU: p.CPU.Some.Avg60, Memory: p.Memory.Some.Avg60, IO: p.IO.Some.Avg60}
	}
	return u
}

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/executor/container"
)

// TestExecutorOOMAndUsage: a job over its memory limit is OOM-killed and
// reported so; the daemon and a job beside it carry on; fusionctl show
// prints the jobs' accounting.
func TestExecutorOOMAndUsage(t *testing.T) {
	dir := publicTempDir(t)
	d := newDaemon(t, dir, "")
	d.start()
	c := d.client()
	ctx := context.Background()

	bystander, err := c.Submit(ctx, api.JobSpec{Name: "bystander", Command: []string{"sleep", "600"},
		Resources: api.Resources{CPU: 100, Memory: 32 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	hog, err := c.Submit(ctx, api.JobSpec{Name: "hog", Command: []string{"tail", "/dev/zero"},
		Resources: api.Resources{CPU: 500, Memory: 32 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	j := waitFor(t, c, hog.ID, api.StateFailed)
	if j.Exit == nil || !j.Exit.OOMKilled || !strings.Contains(j.Reason, "oom-killed") {
		t.Fatalf("memory hog ended %+v (%s), want oom-killed", j.Exit, j.Reason)
	}
	if j.Usage == nil || j.Usage.OOMKills == 0 || j.Usage.MemoryPeak < 24<<20 {
		t.Errorf("hog's recorded usage %+v: want an OOM kill and a peak near 32Mi", j.Usage)
	}
	if err := c.Ready(ctx); err != nil {
		t.Errorf("daemon not ready after the OOM kill: %v", err)
	}
	b := waitFor(t, c, bystander.ID, api.StateRunning)
	if !processAlive(b.PID) {
		t.Errorf("bystander pid %d died", b.PID)
	}
	if r := d.ctl(nil, "", "show", hog.ID); !strings.Contains(r.stdout, "oom-killed") || !strings.Contains(r.stdout, "OOM kills") {
		t.Errorf("show of the hog lacks the OOM kill:\n%s", r.stdout)
	}
	if r := d.ctl(nil, "", "show", bystander.ID); !strings.Contains(r.stdout, "Usage:") || !strings.Contains(r.stdout, "peak memory") {
		t.Errorf("show of a running job lacks its usage:\n%s", r.stdout)
	}
	if _, err := c.Cancel(ctx, bystander.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, c, bystander.ID, api.StateCancelled)
}

// TestExecutorContainer: a container job submitted by an unprivileged
// user runs as that user over its busybox-static rootfs, in its own pid
// namespace, and sees its CPU and memory limits from inside.
func TestExecutorContainer(t *testing.T) {
	dir := publicTempDir(t)
	bb, err := osexec.LookPath("busybox")
	if err != nil {
		t.Fatal("busybox missing (apt-get install -y busybox-static)")
	}
	rootfs := filepath.Join(dir, "rootfs")
	if err := container.BuildBusyboxRootfs(rootfs, bb); err != nil {
		t.Fatal(err)
	}
	d := newDaemon(t, dir, "")
	d.start()
	spec := filepath.Join(dir, "ctr.yaml")
	os.WriteFile(spec, []byte(`name: ctr
class: service
rootfs: `+rootfs+`
command: ["sh", "-c", "echo uid=$(id -u) cpus=$(nproc) pid=$$; cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes"]
resources: {cpu: 1, memory: 40Mi}
`), 0o644)
	asNobody := &syscall.Credential{Uid: nobody, Gid: nobody}
	r := d.ctl(asNobody, "", "submit", spec, "-o", "json")
	if r.code != 0 {
		t.Fatalf("submit: %d %s", r.code, r.stderr)
	}
	var jobs []api.Job
	if err := json.Unmarshal([]byte(r.stdout), &jobs); err != nil || len(jobs) != 1 {
		t.Fatalf("submit output %q: %v", r.stdout, err)
	}
	j := waitFor(t, d.client(), jobs[0].ID, api.StateSucceeded)
	if j.Allocation == nil || j.Allocation.CPUSet == "" {
		t.Fatalf("guaranteed container job without exclusive cores: %+v", j.Allocation)
	}
	cpus, _ := cgroups.ParseCPUList(j.Allocation.CPUSet)
	want := fmt.Sprintf("uid=%d cpus=%d pid=1\n%d\n", nobody, len(cpus), 40<<20)
	if logs := d.ctl(asNobody, "", "logs", j.ID); logs.stdout != want {
		t.Errorf("container job printed %q, want %q", logs.stdout, want)
	}
}

// TestGracefulRestartLeavesJobs: with leave_jobs_on_shutdown a graceful
// stop leaves jobs to their monitors; the next daemon records the exit of
// one that ended meanwhile and re-attaches to one still running.
func TestGracefulRestartLeavesJobs(t *testing.T) {
	dir := publicTempDir(t)
	d := newDaemon(t, dir, "leave_jobs_on_shutdown: true\n")
	d.start()
	c := d.client()
	ctx := context.Background()
	flag := filepath.Join(dir, "go")
	spec := func(cmd string) api.JobSpec {
		return api.JobSpec{Command: []string{"sh", "-c", cmd}, Env: map[string]string{"E2E_FUSIOND_RUN": dir},
			Resources: api.Resources{CPU: 100, Memory: 32 << 20}}
	}
	ends, err := c.Submit(ctx, spec("while [ ! -e "+flag+" ]; do sleep 0.05; done; exit 4"))
	if err != nil {
		t.Fatal(err)
	}
	runs, err := c.Submit(ctx, spec("sleep 300"))
	if err != nil {
		t.Fatal(err)
	}
	endsPID := waitFor(t, c, ends.ID, api.StateRunning).PID
	runsPID := waitFor(t, c, runs.ID, api.StateRunning).PID
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Fatalf("graceful stop: %v", err)
	}
	if !processAlive(endsPID) || !processAlive(runsPID) {
		t.Fatal("a job did not survive the graceful stop")
	}
	touch(t, flag)
	waitGone(t, endsPID)
	d.start()
	if j := waitFor(t, c, ends.ID, api.StateFailed); j.Exit == nil || j.Exit.Code != 4 {
		t.Errorf("job that ended while fusiond was down: exit %+v, want 4", j.Exit)
	}
	if j, err := c.Get(ctx, runs.ID); err != nil || j.State != api.StateRunning || j.PID != runsPID {
		t.Errorf("running job after restart: %+v, %v", j.State, err)
	}
	if _, err := c.Cancel(ctx, runs.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, c, runs.ID, api.StateCancelled)
	if left := jobProcesses(t, dir, map[string]bool{ends.ID: true, runs.ID: true}); len(left) > 0 {
		t.Errorf("job processes left: %v", left)
	}
}

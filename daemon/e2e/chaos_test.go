//go:build chaos

// The chaos tests are built only with -tags chaos (make chaos, which
// .ci/run calls): without the tag they do not exist, so nothing can pass
// for them by skipping.

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// chaosDuration is $CHAOS_DURATION (a Go duration), 60 s by default.
func chaosDuration(t *testing.T) time.Duration {
	t.Helper()
	v := os.Getenv("CHAOS_DURATION")
	if v == "" {
		return 60 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("CHAOS_DURATION=%q: want a positive Go duration such as 120s", v)
	}
	return d
}

// bookedTwice lists (GPU, job, job) for every GPU two live jobs of the
// list hold.
func bookedTwice(jobs []api.Job) [][3]string {
	holder := map[string]string{}
	var out [][3]string
	for _, j := range jobs {
		if j.Allocation == nil || (j.State != api.StatePlaced && j.State != api.StateStarting && j.State != api.StateRunning) {
			continue
		}
		for _, g := range j.Allocation.GPUs {
			if other, ok := holder[g]; ok {
				out = append(out, [3]string{g, other, j.ID})
			}
			holder[g] = j.ID
		}
	}
	return out
}

// TestChaosKill9 kills fusiond --simulate dgxh200 with SIGKILL every 2 to
// 4 seconds while 8 clients submit jobs (CPU jobs, and every fourth a
// 1-GPU job) as fast as it takes them, for CHAOS_DURATION. Every acknowledged submission must
// survive, no job may be lost, and no GPU may ever be held by two live
// (placed, starting or running) jobs of one listing (checked every second
// and after every restart; a finished job keeps its allocation as a record
// and does not count).
func TestChaosKill9(t *testing.T) {
	duration := chaosDuration(t)
	dir := publicTempDir(t)
	d := newDaemon(t, dir, "")
	d.args = []string{"--simulate", "dgxh200"}
	d.start()
	admin := d.client()

	var (
		mu        sync.Mutex
		acked     = map[string]bool{}
		refused   atomic.Int64
		violation []string
	)
	stop := make(chan struct{})
	var clients sync.WaitGroup
	for w := range 8 {
		clients.Add(1)
		go func() {
			defer clients.Done()
			c := api.NewClient(d.socket)
			defer c.Close()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				spec := api.JobSpec{
					Name:      fmt.Sprintf("chaos-%d-%d", w, i),
					Command:   []string{"sleep", "0.3"},
					Env:       map[string]string{"E2E_FUSIOND_RUN": dir},
					Resources: api.Resources{CPU: 250, Memory: 16 << 20},
				}
				if i%4 == 0 {
					// The simulated host's 8 GPUs with the real CPUs (2 here):
					// up to 8 of these run at once, with the CPU jobs.
					spec.Command = []string{"sleep", "1"}
					spec.Resources = api.Resources{CPU: 100, Memory: 16 << 20, GPU: &api.GPURequest{Count: 1}}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				j, err := c.Submit(ctx, spec)
				cancel()
				if err != nil {
					refused.Add(1) // the daemon is down or going down: not acknowledged
					time.Sleep(20 * time.Millisecond)
					continue
				}
				mu.Lock()
				acked[j.ID] = true
				mu.Unlock()
			}
		}()
	}
	sightings := 0 // listings that showed a GPU under two live jobs
	check := func(when string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// One page is one snapshot of the daemon's jobs (docs/api.md), so a
		// GPU two live jobs of it hold is double-booked: nothing moved
		// between the reads. The live jobs are a few dozen at most here,
		// far below a page.
		live, next, err := admin.ListPage(ctx, api.ListOptions{State: []api.State{api.StatePlaced, api.StateStarting, api.StateRunning}, Limit: api.MaxPageSize})
		if err != nil {
			return // the daemon is down
		}
		var bad []string
		if next != "" {
			bad = append(bad, fmt.Sprintf("more than %d live jobs: the check would span two snapshots", api.MaxPageSize))
		}
		twice := bookedTwice(live)
		for _, p := range twice {
			bad = append(bad, fmt.Sprintf("%s held by jobs %s and %s", p[0], p[1], p[2]))
		}
		if len(bad) > 0 {
			mu.Lock()
			if len(twice) > 0 {
				sightings++
			}
			violation = append(violation, when+": "+strings.Join(bad, "; "))
			mu.Unlock()
		}
	}

	restarts := 0
	end := time.Now().Add(duration)
	for time.Now().Before(end) {
		// Up for 2 to 4 s, checked every second, then killed.
		up := time.Now().Add(time.Duration(2000+restarts*700%2000) * time.Millisecond)
		for time.Now().Before(up) {
			time.Sleep(time.Second)
			check("while up")
		}
		if err := d.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-d.done
		d.start()
		restarts++
		check(fmt.Sprintf("after restart %d", restarts))
	}
	close(stop)
	clients.Wait()

	// One last crash and restart, then everything is accounted for.
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-d.done
	d.start()
	restarts++
	all, err := admin.List(context.Background(), api.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]api.Job{}
	states := map[api.State]int{}
	for _, j := range all {
		byID[j.ID] = j
		states[j.State]++
	}
	missing, lost, gpuRuns := 0, 0, 0
	for id := range acked {
		j, ok := byID[id]
		if !ok {
			missing++
			continue
		}
		if j.StartedAt != nil && j.Allocation != nil && len(j.Allocation.GPUs) > 0 {
			gpuRuns++
		}
		if j.State == api.StateLost {
			lost++
			if lost <= 5 {
				t.Errorf("job %s lost: %s", id, j.Reason)
			}
		}
	}
	check("at the end")
	mu.Lock()
	booked := slices.Clone(violation)
	mu.Unlock()
	t.Logf("chaos figures: duration %s, 8 clients, restarts (kill -9) %d, submissions acknowledged %d (attempts refused while the daemon was down %d), "+
		"acknowledged missing %d, lost %d, listings with a GPU under two live jobs %d, GPU jobs started %d; final states %v",
		duration, restarts, len(acked), refused.Load(), missing, lost, sightings, gpuRuns, states)
	if missing > 0 {
		t.Errorf("%d acknowledged submissions missing", missing)
	}
	if lost > 0 {
		t.Errorf("%d jobs lost", lost)
	}
	for _, v := range booked {
		t.Errorf("double-booked: %s", v)
	}
	if gpuRuns == 0 {
		t.Error("no GPU job ever started: double-booking was not put to the test")
	}
	if restarts < 3 || len(acked) < 100 {
		t.Errorf("%d restarts, %d acknowledged: too little chaos to prove anything", restarts, len(acked))
	}
	// The end is a crash too: the thousands of queued jobs stay queued
	// (the state directory goes with the test); the few running finish
	// under their monitors, which remove their cgroups.
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-d.done
	deadline := time.Now().Add(20 * time.Second)
	for len(d.jobCgroups()) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
}

// monitorState reads a job attempt's state.json.
func monitorState(t *testing.T, stateDir, id string) (pid int, cgroup string) {
	t.Helper()
	var st struct {
		MonitorPID int    `json:"monitor_pid"`
		JobPID     int    `json:"job_pid"`
		Cgroup     string `json:"cgroup"`
	}
	b, err := os.ReadFile(filepath.Join(stateDir, "jobs", id, "attempt-1", "state.json"))
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	if err != nil || st.MonitorPID <= 0 || st.JobPID <= 0 {
		t.Fatalf("monitor state of job %s: %s %v", id, b, err)
	}
	return st.MonitorPID, st.Cgroup
}

// TestChaosMonitorKilled: kill -9 of a job's monitor gets the job recorded
// lost, saying what was killed, with its processes dead and its cgroup
// removed.
func TestChaosMonitorKilled(t *testing.T) {
	dir := publicTempDir(t)
	d := newDaemon(t, dir, "")
	d.start()
	c := d.client()
	j, err := c.Submit(context.Background(), api.JobSpec{
		Command:   []string{"sh", "-c", "sleep 300 & sleep 300; wait"},
		Env:       map[string]string{"E2E_FUSIOND_RUN": dir},
		Resources: api.Resources{CPU: 100, Memory: 16 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	j = waitFor(t, c, j.ID, api.StateRunning)
	mon, _ := monitorState(t, filepath.Join(dir, "state"), j.ID)
	if len(d.jobCgroups()) == 0 {
		t.Fatal("the job has no cgroup")
	}
	if err := syscall.Kill(mon, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	j = waitFor(t, c, j.ID, api.StateLost)
	if !strings.Contains(j.Reason, "processes of the job killed and its cgroup removed") {
		t.Errorf("reason %q", j.Reason)
	}
	if left := jobProcesses(t, dir, map[string]bool{j.ID: true}); len(left) > 0 {
		t.Errorf("job processes outlived its monitor: %v", left)
	}
	if left := d.jobCgroups(); len(left) > 0 {
		t.Errorf("job cgroup outlived its monitor: %v", left)
	}
}

// tmpfsStateDir mounts a tmpfs of size at dir/state (before the daemon
// starts, unmounted after it stopped).
func tmpfsStateDir(t *testing.T, dir, size string) string {
	t.Helper()
	state := filepath.Join(dir, "state")
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", state, "tmpfs", 0, "size="+size+",mode=0700"); err != nil {
		t.Fatalf("mount tmpfs at %s (needs root): %v", state, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(state, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", state, err)
		}
	})
	return state
}

// waitReady waits until readiness is want (nil: ready).
func waitReady(t *testing.T, c *api.Client, ready bool, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := c.Ready(context.Background())
		if (err == nil) == ready {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("readiness after %s: %v, want ready=%t", within, err, ready)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestChaosStateDirFull: the state filesystem fills up while a job runs.
// Submissions fail and readiness says so; the job exits 0 meanwhile and is
// not recorded lost; once space is freed readiness comes back by itself
// and the job is recorded succeeded.
func TestChaosStateDirFull(t *testing.T) {
	dir := publicTempDir(t)
	state := tmpfsStateDir(t, dir, "48m")
	// The first job's record must be larger than a full store's free
	// pages (400 KB of env), past the default per-spec cap.
	d := newDaemon(t, dir, "limits: {max_spec_bytes: 1Mi}\n")
	d.start()
	c := d.client()
	gate := filepath.Join(dir, "gate")
	pad := map[string]string{"E2E_FUSIOND_RUN": dir}
	for i := range 4 {
		pad["PAD"+strconv.Itoa(i)] = strings.Repeat("x", 100_000) // a record larger than a full store's free pages
	}
	a, err := c.Submit(context.Background(), api.JobSpec{
		Command: []string{"sh", "-c", "while [ ! -e " + gate + " ]; do sleep 0.05; done"}, Env: pad,
		Resources: api.Resources{CPU: 100, Memory: 16 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, c, a.ID, api.StateRunning)
	filler := filepath.Join(state, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if _, err := f.Write(buf[:512]); err != nil {
				break
			}
		}
	}
	f.Close()
	var submitErr error
	for i := 0; i < 200 && submitErr == nil; i++ {
		_, submitErr = c.Submit(context.Background(), api.JobSpec{Command: []string{"true"},
			Env: map[string]string{"PAD": strings.Repeat("y", 8<<10)}, Resources: api.Resources{CPU: 100, Memory: 16 << 20}})
	}
	if submitErr == nil {
		t.Fatal("200 submissions stored on a full state filesystem")
	}
	waitReady(t, c, false, 3*time.Second)
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if j, _ := c.Get(context.Background(), a.ID); j.State == api.StateLost {
		t.Fatalf("job that exited 0 on a full state filesystem recorded lost: %s", j.Reason)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitReady(t, c, true, 10*time.Second)
	j := waitFor(t, c, a.ID, api.StateSucceeded)
	if j.Exit == nil || j.Exit.Code != 0 {
		t.Errorf("exit %+v", j.Exit)
	}
	b, err := c.Submit(context.Background(), api.JobSpec{Command: []string{"true"}, Env: map[string]string{"E2E_FUSIOND_RUN": dir},
		Resources: api.Resources{CPU: 100, Memory: 16 << 20}})
	if err != nil {
		t.Fatalf("submission after space was freed: %v", err)
	}
	waitFor(t, c, b.ID, api.StateSucceeded)
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// ext4StateDir makes an ext4 image in dir, mounted (loop,
// errors=remount-ro) at dir/state, and unmounts it when the test ends.
func ext4StateDir(t *testing.T, dir string) (state, image string) {
	t.Helper()
	state, image = filepath.Join(dir, "state"), filepath.Join(dir, "state.img")
	run := func(name string, args ...string) {
		t.Helper()
		if out, err := osexec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
	}
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	run("truncate", "-s", "96M", image)
	run("mkfs.ext4", "-q", "-F", image)
	mount := func() { run("mount", "-o", "loop,errors=remount-ro", image, state) }
	mount()
	t.Cleanup(func() {
		if err := syscall.Unmount(state, 0); err != nil && !errors.Is(err, syscall.EINVAL) {
			t.Errorf("unmount %s: %v", state, err)
		}
	})
	return state, image
}

// TestChaosStateDirReadOnly: the state filesystem turns read-only under a
// running job, as ext4 does on an I/O error (errors=remount-ro, forced
// through /sys/fs/ext4/DEV/trigger_fs_error). Submissions are refused
// saying why (nothing unacknowledged is claimed), readiness fails, the
// daemon keeps serving and the running job keeps running and can be
// cancelled. After an operator's repair (stop, fsck, mount) the restarted
// daemon has every acknowledged job and runs new ones.
func TestChaosStateDirReadOnly(t *testing.T) {
	dir := publicTempDir(t)
	state, image := ext4StateDir(t, dir)
	d := newDaemon(t, dir, "")
	d.start()
	c := d.client()
	spec := func(cmd ...string) api.JobSpec {
		return api.JobSpec{Command: cmd, Env: map[string]string{"E2E_FUSIOND_RUN": dir}, Resources: api.Resources{CPU: 100, Memory: 16 << 20}}
	}
	a, err := c.Submit(context.Background(), spec("sleep", "300"))
	if err != nil {
		t.Fatal(err)
	}
	a = waitFor(t, c, a.ID, api.StateRunning)
	src, err := osexec.Command("findmnt", "-n", "-o", "SOURCE", state).Output()
	if err != nil {
		t.Fatal(err)
	}
	trigger := filepath.Join("/sys/fs/ext4", filepath.Base(strings.TrimSpace(string(src))), "trigger_fs_error")
	if err := os.WriteFile(trigger, []byte("1"), 0o200); err != nil {
		t.Fatalf("force the state filesystem read-only: %v", err)
	}
	if err := os.WriteFile(filepath.Join(state, "probe"), nil, 0o600); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("state filesystem not read-only after the error: %v", err)
	}
	_, err = c.Submit(context.Background(), spec("true"))
	if err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("submission on a read-only state filesystem: %v; want a refusal that says read-only", err)
	}
	waitReady(t, c, false, 3*time.Second)
	if !processAlive(a.PID) {
		t.Fatal("the running job died when the state filesystem turned read-only")
	}
	if _, err := c.Get(context.Background(), a.ID); err != nil {
		t.Fatalf("the daemon stopped serving: %v", err)
	}
	if _, err := c.Cancel(context.Background(), a.ID); err != nil {
		t.Fatal(err)
	}
	waitGone(t, a.PID)
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Errorf("shutdown on a read-only state filesystem: %v", err)
	}

	// The operator's repair: unmount, fsck, mount.
	if err := syscall.Unmount(state, 0); err != nil {
		t.Fatalf("unmount after the monitors are gone: %v", err)
	}
	if out, err := osexec.Command("e2fsck", "-f", "-y", image).CombinedOutput(); err != nil {
		// Exit 1: errors corrected.
		if ee, ok := err.(*osexec.ExitError); !ok || ee.ExitCode() > 1 {
			t.Fatalf("e2fsck: %v\n%s", err, out)
		}
	}
	if out, err := osexec.Command("mount", "-o", "loop,errors=remount-ro", image, state).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v\n%s", err, out)
	}
	d.start()
	if _, err := c.Get(context.Background(), a.ID); err != nil {
		t.Errorf("acknowledged job missing after the repair: %v", err)
	}
	b, err := c.Submit(context.Background(), spec("true"))
	if err != nil {
		t.Fatalf("submission after the repair: %v", err)
	}
	waitFor(t, c, b.ID, api.StateSucceeded)
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// TestChaosGPULost makes the GPU under a running 1-GPU job fall off the
// bus (Xid 79, the simulated GPU stops answering) on `--simulate dgxh200`.
// The policy (docs/reliability.md): the GPU leaves placement at once; the
// job is not stopped but marked degraded, with an event in its history
// that keeps its state, and keeps its reservation — so no other job is
// placed on the GPU, neither while it is out of service nor after it is
// back in service, until the job ends. After a reset and the probation the
// degraded mark is lifted with another event, and once the job ends the GPU
// is placeable again.
func TestChaosGPULost(t *testing.T) {
	dir := publicTempDir(t)
	d := newDaemon(t, dir, "gpu: {health_probation: 1500ms, health_probe: 100ms}\n")
	d.args = []string{"--simulate", "dgxh200"}
	d.start()
	c := d.client()
	ctx := context.Background()
	ok := func(args ...string) string {
		t.Helper()
		r := d.ctl(nil, "", args...)
		if r.code != 0 {
			t.Fatalf("fusionctl %v: exit %d: %s%s", args, r.code, r.stdout, r.stderr)
		}
		return r.stdout
	}
	gpuJob := func() api.JobSpec {
		return api.JobSpec{Command: []string{"sleep", "600"},
			Resources: api.Resources{CPU: 50, Memory: 16 << 20, GPU: &api.GPURequest{Count: 1}}}
	}
	poll := func(what string, within time.Duration, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(within); !cond(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%s: not within %s\n%s", what, within, d.log)
			}
		}
	}

	a, err := c.Submit(ctx, gpuJob())
	if err != nil {
		t.Fatal(err)
	}
	a = waitFor(t, c, a.ID, api.StateRunning)
	if a.Allocation == nil || len(a.Allocation.GPUs) != 1 {
		t.Fatalf("allocation %+v, want 1 GPU", a.Allocation)
	}
	lost := a.Allocation.GPUs[0]
	gpus, err := c.GPUs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	k := slices.IndexFunc(gpus.GPUs, func(g api.GPU) bool { return g.UUID == lost })
	if k < 0 {
		t.Fatalf("job's GPU %s not in gpu list", lost)
	}
	pid := a.PID

	ok("gpu", "fault", strconv.Itoa(k), "--xid", "79", "--lost")
	poll("job marked degraded", 10*time.Second, func() bool {
		a, err = c.Get(ctx, a.ID)
		return err == nil && slices.Contains(a.Degraded, lost)
	})
	if a.State != api.StateRunning || a.PID != pid || syscall.Kill(pid, 0) != nil {
		t.Fatalf("job is %s (pid %d, was %d) after its GPU was lost; want it left running", a.State, a.PID, pid)
	}
	last := a.Events[len(a.Events)-1]
	if last.From != api.StateRunning || last.To != api.StateRunning || !strings.Contains(last.Reason, lost) ||
		!strings.Contains(last.Reason, "out of service") || !strings.Contains(last.Reason, "fallen off the bus") {
		t.Errorf("degraded event %+v", last)
	}
	if show := ok("show", a.ID); !strings.Contains(show, "Degraded:") || !strings.Contains(show, lost) {
		t.Errorf("fusionctl show of a degraded job:\n%s", show)
	}

	// Eight more 1-GPU jobs: the seven healthy GPUs take seven, the lost
	// one takes none.
	var others []string
	for range 8 {
		j, err := c.Submit(ctx, gpuJob())
		if err != nil {
			t.Fatal(err)
		}
		others = append(others, j.ID)
	}
	counts := func() (running, pending int, onLost []string) {
		t.Helper()
		for _, id := range others {
			j, err := c.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			switch j.State {
			case api.StateRunning:
				running++
			case api.StatePending:
				pending++
			}
			if j.Allocation != nil && slices.Contains(j.Allocation.GPUs, lost) {
				onLost = append(onLost, id)
			}
		}
		return
	}
	poll("seven of eight 1-GPU jobs running", 30*time.Second, func() bool { r, _, _ := counts(); return r == 7 })
	if _, p, on := counts(); p != 1 || len(on) > 0 {
		t.Fatalf("%d pending (want 1); jobs placed on the lost GPU %s: %v", p, lost, on)
	}

	// Reset: after the probation the GPU is healthy, but the degraded job
	// still holds it.
	ok("gpu", "fault", strconv.Itoa(k), "--reset")
	poll("GPU back in service", 15*time.Second, func() bool {
		l, err := c.GPUs(ctx)
		return err == nil && l.GPUs[k].Health.Healthy
	})
	poll("degraded mark lifted", 10*time.Second, func() bool {
		a, err = c.Get(ctx, a.ID)
		return err == nil && len(a.Degraded) == 0
	})
	if last := a.Events[len(a.Events)-1]; a.State != api.StateRunning || !strings.Contains(last.Reason, "back in service") {
		t.Errorf("job %s after recovery, last event %+v", a.State, last)
	}
	time.Sleep(1500 * time.Millisecond) // placement passes run meanwhile
	if r, p, on := counts(); r != 7 || p != 1 || len(on) > 0 {
		t.Fatalf("GPU %s held by job %s handed out: %d running, %d pending, on it: %v", lost, a.ID, r, p, on)
	}

	// The job ends: its GPU is placeable again and the waiting job gets it.
	if _, err := c.Cancel(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, c, a.ID, api.StateCancelled)
	poll("the waiting job placed on the recovered GPU", 20*time.Second, func() bool {
		r, _, on := counts()
		return r == 8 && len(on) == 1
	})
	for _, id := range others {
		if _, err := c.Cancel(ctx, id); err != nil {
			t.Fatal(err)
		}
		waitFor(t, c, id, api.StateCancelled)
	}

	// A job that fails when its GPU is lost (as a CUDA program would: here
	// it exits 1 once told to) is restarted by its on-failure policy on a
	// healthy GPU, and its degraded mark goes with the old allocation.
	flag := filepath.Join(dir, "gpu-gone")
	spec := gpuJob()
	spec.Command = []string{"sh", "-c", `if [ "$FUSIOND_JOB_ATTEMPT" = 1 ]; then while [ ! -e ` + flag + ` ]; do sleep 0.1; done; exit 1; fi; exec sleep 600`}
	spec.Restart = &api.Restart{Policy: api.RestartOnFailure, MaxRetries: 1}
	r, err := c.Submit(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	r = waitFor(t, c, r.ID, api.StateRunning)
	gone := r.Allocation.GPUs[0]
	k = slices.IndexFunc(gpus.GPUs, func(g api.GPU) bool { return g.UUID == gone })
	ok("gpu", "fault", strconv.Itoa(k), "--xid", "79", "--lost")
	poll("restartable job marked degraded", 10*time.Second, func() bool {
		r, err = c.Get(ctx, r.ID)
		return err == nil && slices.Contains(r.Degraded, gone)
	})
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	poll("restarted on another GPU", 20*time.Second, func() bool {
		r, err = c.Get(ctx, r.ID)
		return err == nil && r.Attempt == 2 && r.State == api.StateRunning
	})
	if r.Allocation == nil || len(r.Allocation.GPUs) != 1 || r.Allocation.GPUs[0] == gone || len(r.Degraded) != 0 {
		t.Errorf("restarted job: allocation %+v, degraded %v; want one GPU other than the lost %s, not degraded", r.Allocation, r.Degraded, gone)
	}
	if _, err := c.Cancel(ctx, r.ID); err != nil {
		t.Fatal(err)
	}
}

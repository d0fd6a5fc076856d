package e2e

import (
	"bufio"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// TestCrashDurability kills fusiond with SIGKILL while a client submits
// 500 jobs in a loop. After a restart every acknowledged submission is
// there, and no job is lost: the jobs that were running at the crash run on
// under their monitors, and the restarted daemon re-attaches to them.
func TestCrashDurability(t *testing.T) {
	dir := publicTempDir(t)
	d := newDaemon(t, dir, "")
	d.start()
	c := d.client()

	const total = 500
	acked := make(chan string, total)
	errc := make(chan error, 1)
	go func() {
		defer close(acked)
		for i := range total {
			j, err := c.Submit(context.Background(), api.JobSpec{
				Name:      "crash-" + strconv.Itoa(i),
				Command:   []string{"sh", "-c", "sleep 300"},
				Env:       map[string]string{"E2E_FUSIOND_RUN": dir},
				Resources: api.Resources{CPU: 500, Memory: 16 << 20},
			})
			if err != nil {
				errc <- err
				return
			}
			acked <- j.ID
		}
	}()
	var ids []string
	for id := range acked {
		ids = append(ids, id)
		if len(ids) == 150 {
			if err := d.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
		}
	}
	<-d.done
	select {
	case err := <-errc:
		t.Logf("client stopped after %d acknowledged submissions: %v", len(ids), err)
	default:
		t.Fatalf("all %d submissions succeeded: the daemon was not killed mid-stream", total)
	}
	if len(ids) < 150 {
		t.Fatalf("only %d acknowledged before the kill", len(ids))
	}

	d.start()
	all, err := c.List(context.Background(), api.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]api.Job{}
	for _, j := range all {
		byID[j.ID] = j
	}
	running := 0
	for _, id := range ids {
		j, ok := byID[id]
		if !ok {
			t.Errorf("acknowledged job %s is missing after the crash", id)
			continue
		}
		switch j.State {
		case api.StateRunning:
			running++
			if !processAlive(j.PID) {
				t.Errorf("job %s is running per the daemon, but its pid %d is gone", id, j.PID)
			}
		case api.StatePending, api.StatePlaced, api.StateStarting:
		default:
			t.Errorf("job %s is %s after the crash (%s)", id, j.State, j.Reason)
		}
	}
	if running == 0 {
		t.Errorf("no job running after the restart, though jobs were running at the crash")
	}
	t.Logf("%d acknowledged, %d recorded, %d running (re-attached or started since)", len(ids), len(all), running)

	// Clean up: cancel everything; nothing may be left behind.
	for _, j := range all {
		if !j.State.Terminal() {
			c.Cancel(context.Background(), j.ID)
		}
	}
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Errorf("shutdown: %v", err)
	}
	live := map[string]bool{}
	for _, id := range ids {
		live[id] = true
	}
	if left := jobProcesses(t, dir, live); len(left) > 0 {
		t.Errorf("processes of cancelled jobs survived: %v", left)
	}
}

// TestCrashReattach: kill -9 of fusiond with 20 jobs running. All keep
// running; fusiond restarts and re-attaches; jobs that ended while it was
// down and jobs that end after the restart are recorded with their real
// exit codes; cancelling the rest leaves no process and no cgroup.
func TestCrashReattach(t *testing.T) {
	dir := publicTempDir(t)
	d := newDaemon(t, dir, "")
	d.start()
	c := d.client()
	flags := filepath.Join(dir, "flags")
	if err := os.Mkdir(flags, 0o755); err != nil {
		t.Fatal(err)
	}
	const n = 20
	ids := make([]string, n)
	for i := range n {
		flag := filepath.Join(flags, strconv.Itoa(i))
		j, err := c.Submit(context.Background(), api.JobSpec{
			Name:      "reattach-" + strconv.Itoa(i),
			Command:   []string{"sh", "-c", "while [ ! -e " + flag + " ]; do sleep 0.1; done; exit " + strconv.Itoa(10+i)},
			Env:       map[string]string{"E2E_FUSIOND_RUN": dir},
			Resources: api.Resources{CPU: 50, Memory: 64 << 20},
		})
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = j.ID
	}
	pids := make([]int, n)
	for i, id := range ids {
		pids[i] = waitFor(t, c, id, api.StateRunning).PID
	}
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-d.done
	for i, pid := range pids {
		if !processAlive(pid) {
			t.Fatalf("job %s (pid %d) died with the daemon", ids[i], pid)
		}
	}
	// The first half ends while no daemon watches.
	for i := range n / 2 {
		touch(t, filepath.Join(flags, strconv.Itoa(i)))
	}
	for i := range n / 2 {
		waitGone(t, pids[i])
	}
	d.start()
	for i := range n / 2 {
		j := waitFor(t, c, ids[i], api.StateFailed)
		if j.Exit == nil || j.Exit.Code != 10+i {
			t.Errorf("job %s ended while fusiond was down: exit %+v, want code %d", ids[i], j.Exit, 10+i)
		}
	}
	for i := n / 2; i < n; i++ {
		j, err := c.Get(context.Background(), ids[i])
		if err != nil {
			t.Fatal(err)
		}
		if j.State != api.StateRunning || j.PID != pids[i] {
			t.Errorf("job %s after restart: %s pid %d (%s), want running pid %d", ids[i], j.State, j.PID, j.Reason, pids[i])
		}
		if j.Usage == nil || j.Usage.CPUSeconds <= 0 {
			t.Errorf("re-attached job %s shows no usage: %+v", ids[i], j.Usage)
		}
	}
	// A quarter ends under the restarted daemon, the rest is cancelled.
	for i := n / 2; i < 3*n/4; i++ {
		touch(t, filepath.Join(flags, strconv.Itoa(i)))
	}
	for i := n / 2; i < 3*n/4; i++ {
		if j := waitFor(t, c, ids[i], api.StateFailed); j.Exit == nil || j.Exit.Code != 10+i {
			t.Errorf("job %s: exit %+v, want code %d", ids[i], j.Exit, 10+i)
		}
	}
	for i := 3 * n / 4; i < n; i++ {
		if _, err := c.Cancel(context.Background(), ids[i]); err != nil {
			t.Fatal(err)
		}
	}
	for i := 3 * n / 4; i < n; i++ {
		waitFor(t, c, ids[i], api.StateCancelled)
	}
	all := map[string]bool{}
	for _, id := range ids {
		all[id] = true
	}
	if left := jobProcesses(t, dir, all); len(left) > 0 {
		t.Errorf("job processes left: %v", left)
	}
	if left := d.jobCgroups(); len(left) > 0 {
		t.Errorf("job cgroups left: %v", left)
	}
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

func processAlive(pid int) bool { return pid > 0 && !isZombie(pid) }

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for processAlive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still alive", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// jobProcesses lists pids whose environment names one of the jobs and the
// test run (E2E_FUSIOND_RUN=run: job IDs repeat across daemons).
func jobProcesses(t *testing.T, run string, ids map[string]bool) []int {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := os.Open(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Split(splitNUL)
		ours, named := false, false
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "FUSIOND_JOB_ID="); ok && ids[v] {
				named = true
			}
			ours = ours || sc.Text() == "E2E_FUSIOND_RUN="+run
		}
		f.Close()
		if ours && named && !isZombie(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func isZombie(pid int) bool {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	i := strings.LastIndexByte(string(data), ')')
	return i > 0 && len(data) > i+2 && data[i+2] == 'Z'
}

func splitNUL(data []byte, atEOF bool) (int, []byte, error) {
	for i, b := range data {
		if b == 0 {
			return i + 1, data[:i], nil
		}
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}

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

	"github.com/fusiond/fusiond/daemon/api"
)

// TestCrashDurability kills fusiond with SIGKILL while a client submits
// 500 jobs in a loop. After a restart every acknowledged submission is
// there, and the jobs that were running at the crash are reported lost with
// a reason, with no process of theirs left behind.
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
				Resources: api.Resources{CPU: 10, Memory: 1 << 20},
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
	lost := 0
	for _, id := range ids {
		j, ok := byID[id]
		if !ok {
			t.Errorf("acknowledged job %s is missing after the crash", id)
			continue
		}
		switch j.State {
		case api.StateLost:
			lost++
			if !strings.Contains(j.Reason, "fusiond restarted while the job was") {
				t.Errorf("job %s lost without a reason: %q", id, j.Reason)
			}
		case api.StatePending, api.StatePlaced, api.StateStarting, api.StateRunning:
		default:
			t.Errorf("job %s is %s after the crash (%s)", id, j.State, j.Reason)
		}
	}
	if lost == 0 {
		t.Errorf("no job was reported lost, though jobs were running at the crash")
	}
	t.Logf("%d acknowledged, %d recorded, %d reported lost", len(ids), len(all), lost)

	// Nothing of the lost jobs survives: no process carries their job IDs.
	lostIDs := map[string]bool{}
	for _, id := range ids {
		if byID[id].State == api.StateLost {
			lostIDs[id] = true
		}
	}
	if left := jobProcesses(t, lostIDs); len(left) > 0 {
		for _, pid := range left {
			stat, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
			t.Errorf("a process of a lost job survived the crash: %s", stat)
		}
	}
	// Clean up: cancel what the restarted daemon started again.
	for _, j := range all {
		if !j.State.Terminal() {
			c.Cancel(context.Background(), j.ID)
		}
	}
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// jobProcesses lists pids whose environment names one of the jobs.
func jobProcesses(t *testing.T, ids map[string]bool) []int {
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
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "FUSIOND_JOB_ID="); ok && ids[v] {
				if !isZombie(pid) {
					pids = append(pids, pid)
				}
			}
		}
		f.Close()
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

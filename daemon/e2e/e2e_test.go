package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
)

const nobody = 65534

// TestLifecycle drives the built binaries: submit from a file, wait, read
// logs and exit codes, cancel a long job, list with filters.
func TestLifecycle(t *testing.T) {
	dir := publicTempDir(t)
	d := newDaemon(t, dir, "")
	d.start()
	c := d.client()

	spec := filepath.Join(dir, "job.yaml")
	os.WriteFile(spec, []byte(`# two documents: two jobs
name: greeter
class: batch
command: ["sh", "-c", "echo hello from $FUSIOND_JOB_NAME; echo to-stderr >&2; exit 7"]
resources: {cpu: 250m, memory: 32Mi}
---
name: long
class: service
command: ["sleep", "600"]
resources: {cpu: 250m, memory: 32Mi}
`), 0o644)
	r := d.ctl(nil, "", "submit", spec, "-o", "json")
	if r.code != 0 {
		t.Fatalf("submit: %d %s", r.code, r.stderr)
	}
	var submitted []api.Job
	if err := json.Unmarshal([]byte(r.stdout), &submitted); err != nil || len(submitted) != 2 {
		t.Fatalf("submit output %q: %v", r.stdout, err)
	}
	greeter, long := submitted[0].ID, submitted[1].ID
	if submitted[1].Tier != api.TierGuaranteed || submitted[0].Tier != api.TierBestEffort {
		t.Errorf("class default tiers not applied: %s %s", submitted[0].Tier, submitted[1].Tier)
	}

	j := waitFor(t, c, greeter, api.StateFailed)
	if j.Exit == nil || j.Exit.Code != 7 {
		t.Errorf("exit %+v, want code 7", j.Exit)
	}
	if r := d.ctl(nil, "", "logs", greeter); r.code != 0 || r.stdout != "hello from greeter\nto-stderr\n" {
		t.Errorf("logs: %d %q %s", r.code, r.stdout, r.stderr)
	}

	// run -f streams the output and exits with the job's code.
	r = d.ctl(nil, "", "run", "-f", "--cpu", "100m", "--memory", "16Mi", "--", "sh", "-c", "echo streamed; exit 3")
	if r.code != 3 || r.stdout != "streamed\n" {
		t.Errorf("run -f: code %d stdout %q stderr %q, want 3 and the output", r.code, r.stdout, r.stderr)
	}

	waitFor(t, c, long, api.StateRunning)
	r = d.ctl(nil, "", "list", "--state", "running", "-o", "json")
	var running []api.Job
	if err := json.Unmarshal([]byte(r.stdout), &running); err != nil || len(running) != 1 || running[0].ID != long {
		t.Fatalf("list --state running: %q %v", r.stdout, err)
	}
	r = d.ctl(nil, "", "ps", "--class", "batch", "-o", "json")
	var batch []api.Job
	if err := json.Unmarshal([]byte(r.stdout), &batch); err != nil || len(batch) != 2 {
		t.Fatalf("ps --class batch: %q %v", r.stdout, err)
	}
	for _, j := range batch {
		if j.Spec.Class != api.ClassBatch {
			t.Errorf("class filter let through %s", j.Spec.Class)
		}
	}
	if r := d.ctl(nil, "", "list", "--state", "sleeping"); r.code == 0 || !strings.Contains(r.stderr, "unknown state") {
		t.Errorf("bad state filter accepted: %d %q", r.code, r.stderr)
	}

	pid := waitFor(t, c, long, api.StateRunning).PID
	r = d.ctl(nil, "", "cancel", long)
	if r.code != 0 || !strings.Contains(r.stdout, "cancelled") {
		t.Fatalf("cancel: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("process %d of the cancelled job still exists (kill 0: %v)", pid, err)
	}
	if r := d.ctl(nil, "", "cancel", long); r.code != 1 || !strings.Contains(r.stderr, "already cancelled") {
		t.Errorf("second cancel: %d %q", r.code, r.stderr)
	}

	// Bad input: one clear line on stderr, non-zero exit.
	os.WriteFile(spec, []byte("command: [x]\nresources: {cpu: 1, memory: 1Gi, gpus: 2}\n"), 0o644)
	r = d.ctl(nil, "", "submit", spec)
	if r.code != 1 || !strings.Contains(r.stderr, "resources.gpus: unknown field") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("bad spec: code %d stderr %q", r.code, r.stderr)
	}
	if r := d.ctl(nil, "", "show", "12345"); r.code != 1 || !strings.Contains(r.stderr, "no job") {
		t.Errorf("show missing: %d %q", r.code, r.stderr)
	}
	// Graceful shutdown: SIGTERM exits cleanly and removes the socket.
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Errorf("fusiond exit after SIGTERM: %v\n%s", err, d.log)
	}
	if _, err := os.Stat(d.socket); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}
}

// TestIdentity: a job runs as the uid of whoever submitted it, and users
// see and cancel only their own jobs; root manages everyone's.
func TestIdentity(t *testing.T) {
	dir := publicTempDir(t)
	d := newDaemon(t, dir, "")
	d.start()
	c := d.client()
	asNobody := &syscall.Credential{Uid: nobody, Gid: nobody}

	r := d.ctl(asNobody, "", "run", "-w", "-o", "json", "--cpu", "100m", "--memory", "16Mi", "--", "sh", "-c", "id -u; id -g")
	if r.code != 0 {
		t.Fatalf("run as nobody: %d %s", r.code, r.stderr)
	}
	var mine api.Job
	json.Unmarshal([]byte(r.stdout), &mine)
	if mine.Owner.UID != nobody {
		t.Errorf("owner uid %d, want %d", mine.Owner.UID, nobody)
	}
	if logs := d.ctl(asNobody, "", "logs", mine.ID); logs.stdout != "65534\n65534\n" {
		t.Errorf("job ran as %q, want uid and gid 65534", logs.stdout)
	}

	rootJob, err := c.Submit(context.Background(), api.JobSpec{Command: []string{"sleep", "600"}, Resources: api.Resources{CPU: 100, Memory: 16 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	if r := d.ctl(asNobody, "", "show", rootJob.ID); r.code == 0 || !strings.Contains(r.stderr, "no job") {
		t.Errorf("nobody can see root's job: %d %q", r.code, r.stdout)
	}
	if r := d.ctl(asNobody, "", "cancel", rootJob.ID); r.code == 0 {
		t.Errorf("nobody cancelled root's job: %q", r.stdout)
	}
	r = d.ctl(asNobody, "", "list", "-o", "json")
	var seen []api.Job
	json.Unmarshal([]byte(r.stdout), &seen)
	for _, j := range seen {
		if j.Owner.UID != nobody {
			t.Errorf("nobody's list shows job %s of uid %d", j.ID, j.Owner.UID)
		}
	}
	if r := d.ctl(asNobody, "", "node", "cordon"); r.code == 0 || !strings.Contains(r.stderr, "only root") {
		t.Errorf("nobody cordoned the node: %d %q", r.code, r.stderr)
	}
	waitFor(t, c, rootJob.ID, api.StateRunning)
	if j := waitFor(t, c, rootJob.ID, api.StateRunning); j.State != api.StateRunning {
		t.Fatalf("root job not running after nobody's cancel attempt: %s", j.State)
	}

	// nobody's long job: root sees it and cancels it.
	r = d.ctl(asNobody, "", "run", "-o", "json", "--cpu", "100m", "--memory", "16Mi", "--", "sleep", "600")
	var theirs api.Job
	json.Unmarshal([]byte(r.stdout), &theirs)
	waitFor(t, c, theirs.ID, api.StateRunning)
	if r := d.ctl(nil, "", "cancel", theirs.ID); r.code != 0 {
		t.Errorf("root could not cancel nobody's job: %q", r.stderr)
	}
	if j := waitFor(t, c, theirs.ID, api.StateCancelled); !strings.Contains(j.Reason, "cancelled") {
		t.Errorf("reason %q", j.Reason)
	}
	if r := d.ctl(nil, "", "cancel", rootJob.ID); r.code != 0 {
		t.Errorf("root cancel of its own job: %q", r.stderr)
	}

	// The audit file holds who did, and who was refused, what.
	// The admins', other users' actions and their refusals: three files.
	var data []byte
	for _, f := range []string{"audit.log", "audit-users.log", "audit-refused.log"} {
		b, err := os.ReadFile(filepath.Join(dir, "state", f))
		if err != nil {
			t.Fatal(err)
		}
		data = append(data, b...)
	}
	type rec struct {
		UID     int64  `json:"uid"`
		User    string `json:"user"`
		PID     int32  `json:"pid"`
		Action  string `json:"action"`
		Target  string `json:"target"`
		Outcome string `json:"outcome"`
		Status  int    `json:"status"`
	}
	var recs []rec
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var r rec
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		recs = append(recs, r)
	}
	for _, w := range []rec{
		{UID: nobody, Action: "job.submit", Target: mine.ID, Outcome: "ok", Status: 201},
		{UID: nobody, Action: "request", Outcome: "refused", Status: 404},
		{UID: nobody, Action: "job.cancel", Target: rootJob.ID, Outcome: "refused", Status: 404},
		{UID: nobody, Action: "node.cordon", Outcome: "refused", Status: 403},
		{UID: 0, Action: "job.cancel", Target: theirs.ID, Outcome: "ok", Status: 200},
	} {
		found := false
		for _, r := range recs {
			found = found || (r.UID == w.UID && r.Action == w.Action && r.Target == w.Target && r.Outcome == w.Outcome && r.Status == w.Status && r.PID > 0 && r.User != "")
		}
		if !found {
			t.Errorf("no audit record %+v in\n%s", w, data)
		}
	}
}

// TestStartupErrors: bad configuration and unusable state databases stop
// start-up with a clear error.
func TestStartupErrors(t *testing.T) {
	dir := publicTempDir(t)
	run := func(args ...string) (int, string) {
		cmd := osexec.Command(filepath.Join(binDir, "fusiond"), args...)
		out, _ := cmd.CombinedOutput()
		return cmd.ProcessState.ExitCode(), string(out)
	}
	cfg := filepath.Join(dir, "bad.yaml")
	os.WriteFile(cfg, []byte("socket: /tmp/x.sock\nsokcet_group: x\n"), 0o644)
	if code, out := run("--config", cfg); code != 1 || !strings.Contains(out, cfg) || !strings.Contains(out, "sokcet_group: unknown field") {
		t.Errorf("unknown key: %d %q", code, out)
	}
	os.WriteFile(cfg, []byte("cancel_grace: soon\n"), 0o644)
	if code, out := run("--config", cfg); code != 1 || !strings.Contains(out, "cancel_grace") {
		t.Errorf("bad value: %d %q", code, out)
	}
	if code, out := run("--config", filepath.Join(dir, "missing.yaml")); code != 1 || !strings.Contains(out, "no such file") {
		t.Errorf("missing explicit config: %d %q", code, out)
	}

	d := newDaemon(t, dir, "")
	state := filepath.Join(dir, "state")
	os.MkdirAll(state, 0o700)
	os.WriteFile(filepath.Join(state, "fusiond.db"), []byte(strings.Repeat("not a database ", 1000)), 0o600)
	if code, out := run("--config", d.config); code != 1 || !strings.Contains(out, "corrupt") {
		t.Errorf("corrupt database: %d %q", code, out)
	}
	os.Remove(filepath.Join(state, "fusiond.db"))

	d.start()
	second := newDaemon(t, dir, "")
	second.socket = filepath.Join(dir, "other.sock")
	os.WriteFile(second.config, []byte("state_dir: "+state+"\nsocket: "+second.socket+"\nsocket_group: \"\"\n"), 0o644)
	if code, out := run("--config", second.config); code != 1 || !strings.Contains(out, "locked") {
		t.Errorf("second daemon on the same state: %d %q", code, out)
	}
	os.WriteFile(second.config, []byte("state_dir: "+filepath.Join(dir, "state2")+"\nsocket: "+d.socket+"\nsocket_group: \"\"\n"), 0o644)
	if code, out := run("--config", second.config); code != 1 || !strings.Contains(out, "already serving") {
		t.Errorf("second daemon on the same socket: %d %q", code, out)
	}
}

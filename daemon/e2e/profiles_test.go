package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
)

// TestProfilesRecommend runs a job that over-asks (2 CPUs and 4 GiB for a
// dd holding a 30 MB buffer while its reader sleeps) three times under one name on fusiond --simulate dgxh200:
// fusionctl recommend then suggests lowering both requests, fusionctl
// profile lists the profile with its three runs (to its owner, not to
// another user), and after a restart of fusiond the profile is still
// there, read from <state_dir>/profiles.json.
func TestProfilesRecommend(t *testing.T) {
	dir := publicTempDir(t)
	d := newDaemon(t, dir, "profiles: {min_runs: 3}\ntelemetry: {job_interval: 200ms}\n")
	d.args = []string{"--simulate", "dgxh200"}
	d.start()
	c := d.client()

	spec := api.JobSpec{Name: "overask", Class: api.ClassBatch, Command: []string{"sh", "-c", "dd if=/dev/zero bs=30M count=1 2>/dev/null | { sleep 2; cat >/dev/null; }"},
		Resources: api.Resources{CPU: 2000, Memory: 4 << 30}}
	var last api.Job
	for range 3 {
		j, err := c.Submit(context.Background(), spec)
		if err != nil {
			t.Fatal(err)
		}
		last = waitFor(t, c, j.ID, api.StateSucceeded)
	}

	// The recommendation for the last job, as JSON: both requests
	// over-asked, suggestions far below them.
	var r api.Recommendation
	out := d.mustCtl("recommend", last.ID, "-o", "json")
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("recommend output %q: %v", out, err)
	}
	if !r.Ready || !r.OverAsked || r.Runs != 3 || r.Key.Name != "overask" || r.Key.Owner != "root" || r.Key.Class != "batch" {
		t.Fatalf("recommendation %+v", r)
	}
	// dd's 30 MB buffer was seen.
	if r.Profile == nil || r.Profile.Mem.P95 < 25 {
		t.Fatalf("profile %+v", r.Profile)
	}
	if r.Requested.CPUMilli != 2000 || r.Requested.MemMiB != 4096 ||
		r.Suggested.CPUMilli <= 0 || r.Suggested.CPUMilli >= 1600 || r.Suggested.MemMiB < r.Profile.Mem.P95 || r.Suggested.MemMiB > 1024 {
		t.Fatalf("suggested %+v for requested %+v", r.Suggested, r.Requested)
	}
	// As a table, by job and by name.
	for _, args := range [][]string{{"recommend", last.ID}, {"recommend", "--name", "overask"}} {
		out := d.mustCtl(args...)
		t.Logf("fusionctl %s:\n%s", strings.Join(args, " "), out)
		for _, want := range []string{"over-asked", "asks 2000m CPU", "asks 4096 MiB memory", "over 3 runs"} {
			if !strings.Contains(out, want) {
				t.Errorf("fusionctl %v lacks %q:\n%s", args, want, out)
			}
		}
	}

	profileRow := func(out string) []string {
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) > 4 && f[1] == "overask" {
				return f
			}
		}
		return nil
	}
	out = d.mustCtl("profile")
	t.Logf("fusionctl profile:\n%s", out)
	if f := profileRow(out); f == nil || f[0] != "root" || f[2] != "batch" || f[3] != "3" || !strings.Contains(out, "(2000m)") {
		t.Fatalf("fusionctl profile:\n%s", out)
	}
	// Another user sees none of root's profiles.
	if r := d.ctl(&syscall.Credential{Uid: nobody, Gid: nobody}, "", "profile"); r.code != 0 || profileRow(r.stdout) != nil {
		t.Fatalf("fusionctl profile as nobody: %d %s%s", r.code, r.stdout, r.stderr)
	}
	if r := d.ctl(&syscall.Credential{Uid: nobody, Gid: nobody}, "", "recommend", "--name", "overask", "--owner", "root"); r.code == 0 {
		t.Fatalf("nobody got root's recommendation:\n%s", r.stdout)
	}

	// Saved at shutdown, loaded at start.
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Fatalf("fusiond exited: %v\n%s", err, d.log)
	}
	if _, err := os.Stat(filepath.Join(dir, "state", "profiles.json")); err != nil {
		t.Fatal(err)
	}
	d.start()
	out = d.mustCtl("profile", "--name", "overask")
	if f := profileRow(out); f == nil || f[3] != "3" {
		t.Fatalf("after a restart, fusionctl profile:\n%s", out)
	}
	if !strings.Contains(d.log.String(), "task profiles loaded") {
		t.Errorf("no load logged:\n%s", d.log)
	}
}

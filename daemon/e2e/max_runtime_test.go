package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// TestMaxRuntime: a real fusiond runs `sleep 60` submitted with
// `fusionctl run --max-runtime 2s`; it stops the job at its limit and the
// job ends failed, not retried though it may restart on failure, with the
// reason in `fusionctl show` (and the limit).
func TestMaxRuntime(t *testing.T) {
	d := newDaemon(t, publicTempDir(t), "")
	d.start()
	c := d.client()
	id := strings.TrimSpace(d.mustCtl("-q", "run", "--max-runtime", "2s", "--retries", "2", "--cpu", "100m", "--memory", "16Mi", "--", "sleep", "60"))
	j := waitFor(t, c, id, api.StateFailed)
	const want = "exceeded max_runtime 2s: stopped (killed by signal"
	if !strings.HasPrefix(j.Reason, want) || j.Attempt != 1 {
		t.Fatalf("job %s: %q, attempt %d; want %q…, attempt 1", id, j.Reason, j.Attempt, want)
	}
	if ran := j.FinishedAt.Sub(*j.StartedAt); ran < 2*time.Second {
		t.Errorf("stopped after %s, before its 2s limit", ran)
	}
	show := d.mustCtl("show", id)
	t.Logf("fusionctl show %s:\n%s", id, show)
	for _, s := range []string{want, "2s per attempt", "exceeded max_runtime 2s; stopping: SIGTERM, SIGKILL after 2s"} {
		if !strings.Contains(show, s) {
			t.Errorf("fusionctl show lacks %q:\n%s", s, show)
		}
	}
}

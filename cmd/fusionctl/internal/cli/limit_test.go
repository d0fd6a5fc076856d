package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// show gives a job's max_runtime and, while it runs, what is left of it
// from its recorded start; a job without one shows no line.
func TestShowMaxRuntime(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 6, 0, 0, 0, time.UTC)
	limit := api.JobSpec{MaxRuntime: api.Duration(2 * time.Hour)}
	for _, c := range []struct {
		name string
		job  api.Job
		now  time.Time
		want string
	}{
		{"pending", api.Job{State: api.StatePending, Spec: limit}, t0, "2h0m0s per attempt"},
		{"running", api.Job{State: api.StateRunning, Spec: limit, StartedAt: &t0}, t0.Add(47*time.Minute + 30500*time.Millisecond), "2h0m0s per attempt; 1h12m29s left"},
		{"under a second", api.Job{State: api.StateRunning, Spec: limit, StartedAt: &t0}, t0.Add(2*time.Hour - time.Millisecond), "2h0m0s per attempt; 1s left"},
		{"reached", api.Job{State: api.StateRunning, Spec: limit, StartedAt: &t0}, t0.Add(2*time.Hour + time.Second), "2h0m0s per attempt; reached, being stopped"},
		{"started in the future", api.Job{State: api.StateRunning, Spec: limit, StartedAt: &t0}, t0.Add(-time.Minute), "2h0m0s per attempt; 2h0m0s left"},
		{"failed", api.Job{State: api.StateFailed, Spec: limit, StartedAt: &t0}, t0.Add(3 * time.Hour), "2h0m0s per attempt"},
	} {
		if got := describeLimit(c.job, c.now); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	var b bytes.Buffer
	if err := showJob(&b, api.Job{ID: "4", State: api.StateFailed, Spec: limit}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "Max runtime:") || !strings.Contains(b.String(), " 2h0m0s per attempt\n") {
		t.Errorf("show lacks the limit:\n%s", b.String())
	}
	b.Reset()
	if err := showJob(&b, api.Job{ID: "4", State: api.StateFailed}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "Max runtime") {
		t.Errorf("show of a job without a limit has a limit line:\n%s", b.String())
	}
}

// submitCatcher answers POST /v1/jobs with a pending job and keeps the spec.
type submitCatcher struct {
	mu   sync.Mutex
	spec []byte
}

func (s *submitCatcher) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != "POST" || r.URL.Path != "/v1/jobs" {
		w.WriteHeader(404)
		return
	}
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.spec = body
	s.mu.Unlock()
	w.WriteHeader(201)
	json.NewEncoder(w).Encode(api.Job{ID: "1", State: api.StatePending})
}

// fusionctl run --max-runtime sends the limit as max_runtime; a value
// that is not a duration is refused before anything is sent. A spec
// file's max_runtime: decodes to the same field.
func TestRunMaxRuntime(t *testing.T) {
	f := &submitCatcher{}
	sock := serveFake(t, f)
	var out, errb bytes.Buffer
	if code := Execute(context.Background(), []string{"--socket", sock, "-q", "run", "--max-runtime", "90m", "--", "sleep", "60"}, nil, &out, &errb); code != 0 {
		t.Fatalf("run: %d %s", code, errb.String())
	}
	var sent map[string]any
	if err := json.Unmarshal(f.spec, &sent); err != nil {
		t.Fatal(err)
	}
	if sent["max_runtime"] != "1h30m0s" {
		t.Errorf("sent %s, want max_runtime 1h30m0s", f.spec)
	}
	f.spec = nil
	if code := Execute(context.Background(), []string{"--socket", sock, "-q", "run", "--", "true"}, nil, &out, &errb); code != 0 {
		t.Fatalf("run: %d %s", code, errb.String())
	}
	if bytes.Contains(f.spec, []byte("max_runtime")) {
		t.Errorf("run without --max-runtime sent %s", f.spec)
	}
	f.spec = nil
	errb.Reset()
	if code := Execute(context.Background(), []string{"--socket", sock, "run", "--max-runtime", "2 hours", "--", "true"}, nil, &out, &errb); code == 0 || f.spec != nil {
		t.Errorf("--max-runtime '2 hours' exited %d and sent %s", code, f.spec)
	}
	if !strings.Contains(errb.String(), "max-runtime") {
		t.Errorf("stderr %q does not name the flag", errb.String())
	}

	doc, err := SpecJSON([]byte("command: [sleep, \"60\"]\nresources: {cpu: 1, memory: 64Mi}\nmax_runtime: 2h\n"))
	if err != nil {
		t.Fatal(err)
	}
	spec, err := api.DecodeSpec(doc)
	if err != nil {
		t.Fatal(err)
	}
	if spec.MaxRuntime != api.Duration(2*time.Hour) {
		t.Errorf("max_runtime: 2h decoded to %s", spec.MaxRuntime)
	}
}

package apiserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/apiserver"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/jobs/jobstest"
	"github.com/fusiond/fusiond/daemon/internal/store"
)

// backend is the real job manager plus a fixed node status.
type backend struct{ *jobs.Manager }

func (backend) Node(context.Context, api.Caller) (api.NodeStatus, error) {
	return api.NodeStatus{Hostname: "test"}, nil
}

// startServer runs the daemon's job manager, store, placer (a host of 4
// CPUs and 8 GiB) and executor (job monitors and cgroups) behind the API on
// a Unix socket and returns an HTTP client for it.
func startServer(t *testing.T) (*http.Client, *jobs.Manager) {
	t.Helper()
	hc, mgr, _ := startServerWith(t, nil, nil)
	return hc, mgr
}

// startServerWith is startServer with the manager's and the server's
// configuration adjusted (nil: as startServer).
func startServerWith(t *testing.T, jc func(*jobs.Config), sc func(*apiserver.Config)) (*http.Client, *jobs.Manager, *apiserver.Server) {
	t.Helper()
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	runner := jobstest.Runner(t, filepath.Join(dir, "jobs"), time.Second)
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	jcfg := jobs.Config{LogDir: filepath.Join(dir, "jobs"), CancelGrace: time.Second}
	if jc != nil {
		jc(&jcfg)
	}
	mgr := jobs.New(jcfg, st, runner, jobstest.Placer(4000, 8<<30), log)
	if err := mgr.Recover(); err != nil {
		t.Fatal(err)
	}
	mgr.Start()
	scfg := apiserver.Config{MaxBodyBytes: 4096, LogPoll: 10 * time.Millisecond}
	if sc != nil {
		sc(&scfg)
	}
	srv := apiserver.New(backend{mgr}, scfg)
	sock := filepath.Join(dir, "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv, ConnContext: srv.ConnContext}
	go hs.Serve(ln)
	t.Cleanup(func() {
		srv.CloseStreams()
		hs.Shutdown(context.Background())
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		mgr.Stop(ctx)
	})
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	return hc, mgr, srv
}

func do(t *testing.T, hc *http.Client, method, path, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, "http://x"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data
}

const sleepJob = `{"name":"sleeper","class":"service","command":["sleep","30"],"resources":{"cpu":"100m","memory":"16Mi"}}`
const echoJob = `{"name":"echo","command":["sh","-c","echo out; echo err >&2"],"resources":{"cpu":"100m","memory":"16Mi"}}`

func TestRoutes(t *testing.T) {
	hc, _ := startServer(t)
	// Fixtures: one finished job (1) and one long-running job (2).
	if code, body := do(t, hc, "POST", "/v1/jobs", echoJob); code != 201 {
		t.Fatalf("submit echo: %d %s", code, body)
	}
	if code, body := do(t, hc, "POST", "/v1/jobs", sleepJob); code != 201 {
		t.Fatalf("submit sleeper: %d %s", code, body)
	}
	waitState(t, hc, "1", api.StateSucceeded)
	waitState(t, hc, "2", api.StateRunning)

	big := `{"name":"` + strings.Repeat("x", 5000) + `"}`
	tests := []struct {
		name, method, path, body string
		wantStatus               int
		wantCode, wantField      string
		wantBody                 string // regexp the body must match
	}{
		{"submit", "POST", "/v1/jobs", echoJob, 201, "", "", `"state": "pending"`},
		{"submit malformed JSON", "POST", "/v1/jobs", `{"command":`, 400, api.CodeBadRequest, "", ""},
		{"submit unknown field", "POST", "/v1/jobs", `{"command":["x"],"resources":{"cpu":1,"memory":"1Gi"},"colour":"red"}`, 422, api.CodeInvalid, "colour", ""},
		{"submit negative cpu", "POST", "/v1/jobs", `{"command":["x"],"resources":{"cpu":-2,"memory":"1Gi"}}`, 422, api.CodeInvalid, "resources.cpu", ""},
		{"submit negative memory", "POST", "/v1/jobs", `{"command":["x"],"resources":{"cpu":1,"memory":-5}}`, 422, api.CodeInvalid, "resources.memory", ""},
		{"submit oversized body", "POST", "/v1/jobs", big, 413, api.CodeTooLarge, "", ""},
		{"submit more CPU than the host", "POST", "/v1/jobs", `{"command":["x"],"resources":{"cpu":64,"memory":"1Gi"}}`, 422, api.CodeUnsatisfiable, "resources.cpu", ""},
		{"submit GPU on a host without", "POST", "/v1/jobs", `{"command":["x"],"resources":{"cpu":1,"memory":"1Gi","gpu":{"count":1}}}`, 422, api.CodeUnsatisfiable, "resources.gpu", ""},
		{"list", "GET", "/v1/jobs", "", 200, "", "", `"id": "2"`},
		{"list by state", "GET", "/v1/jobs?state=running", "", 200, "", "", `^\[\s*\{[^\[]*"id": "2"`},
		{"list by class", "GET", "/v1/jobs?class=service", "", 200, "", "", `"name": "sleeper"`},
		{"list by user", "GET", "/v1/jobs?user=nobody-at-all", "", 200, "", "", `^\[\]\s*$`},
		{"list limit", "GET", "/v1/jobs?limit=1", "", 200, "", "", `"id": "3"`},
		{"list bad state", "GET", "/v1/jobs?state=sleeping", "", 400, api.CodeBadRequest, "state", ""},
		{"list bad limit", "GET", "/v1/jobs?limit=-1", "", 400, api.CodeBadRequest, "limit", ""},
		{"list unknown parameter", "GET", "/v1/jobs?colour=red", "", 400, api.CodeBadRequest, "colour", ""},
		{"get", "GET", "/v1/jobs/1", "", 200, "", "", `"state": "succeeded"`},
		{"get missing", "GET", "/v1/jobs/999", "", 404, api.CodeNotFound, "", ""},
		{"get bad id", "GET", "/v1/jobs/abc", "", 404, api.CodeNotFound, "", ""},
		{"logs", "GET", "/v1/jobs/1/logs", "", 200, "", "", `out\n`},
		{"logs bad follow", "GET", "/v1/jobs/1/logs?follow=maybe", "", 400, api.CodeBadRequest, "follow", ""},
		{"logs missing job", "GET", "/v1/jobs/999/logs", "", 404, api.CodeNotFound, "", ""},
		{"cancel finished", "POST", "/v1/jobs/1/cancel", "", 409, api.CodeConflict, "", ""},
		{"cancel missing", "POST", "/v1/jobs/999/cancel", "", 404, api.CodeNotFound, "", ""},
		{"cancel running", "POST", "/v1/jobs/2/cancel", "", 200, "", "", `"id": "2"`},
		{"events unknown job", "GET", "/v1/events?job=999", "", 404, api.CodeNotFound, "", ""},
		{"events bad parameter", "GET", "/v1/events?x=1", "", 400, api.CodeBadRequest, "x", ""},
		{"node", "GET", "/v1/node", "", 200, "", "", `"hostname": "test"`},
		{"cordon", "POST", "/v1/node/cordon", "", 200, "", "", ""},
		{"uncordon", "POST", "/v1/node/uncordon", "", 200, "", "", ""},
		{"healthz", "GET", "/v1/healthz", "", 200, "", "", `"ok"`},
		{"readyz", "GET", "/v1/readyz", "", 200, "", "", `"ready"`},
		{"version", "GET", "/v1/version", "", 200, "", "", `"api"`},
		{"wrong method", "DELETE", "/v1/jobs", "", 405, api.CodeMethodNotAllowed, "", ""},
		{"wrong method on job", "PUT", "/v1/jobs/1", "", 405, api.CodeMethodNotAllowed, "", ""},
		{"unknown route", "GET", "/v2/jobs", "", 404, api.CodeNotFound, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := do(t, hc, tt.method, tt.path, tt.body)
			if status != tt.wantStatus {
				t.Fatalf("status %d, want %d; body %s", status, tt.wantStatus, body)
			}
			if tt.wantCode != "" {
				var e api.Error
				if err := json.Unmarshal(body, &e); err != nil {
					t.Fatalf("error body is not JSON: %s", body)
				}
				if e.Code != tt.wantCode || e.Field != tt.wantField || e.Message == "" {
					t.Errorf("error %+v, want code %q field %q and a message", e, tt.wantCode, tt.wantField)
				}
			}
			if tt.wantBody != "" && !regexp.MustCompile(tt.wantBody).Match(body) {
				t.Errorf("body does not match %q:\n%s", tt.wantBody, body)
			}
		})
	}
	waitState(t, hc, "2", api.StateCancelled)
}

func waitState(t *testing.T, hc *http.Client, id string, want api.State) api.Job {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, body := do(t, hc, "GET", "/v1/jobs/"+id, "")
		var j api.Job
		if err := json.Unmarshal(body, &j); err != nil {
			t.Fatalf("job %s: %s", id, body)
		}
		if j.State == want {
			return j
		}
		if time.Now().After(deadline) || (j.State.Terminal() && j.State != want) {
			t.Fatalf("job %s is %s (%s), want %s", id, j.State, j.Reason, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestLogsFollowAndEvents(t *testing.T) {
	hc, _ := startServer(t)
	resp, err := hc.Get("http://x/v1/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	job := `{"command":["sh","-c","echo one; sleep 0.3; echo two"],"resources":{"cpu":"100m","memory":"16Mi"}}`
	if code, body := do(t, hc, "POST", "/v1/jobs", job); code != 201 {
		t.Fatalf("submit: %d %s", code, body)
	}
	code, logs := do(t, hc, "GET", "/v1/jobs/1/logs?follow=true", "")
	if code != 200 || string(logs) != "one\ntwo\n" {
		t.Fatalf("follow returned %d %q, want the whole output once the job ended", code, logs)
	}
	dec := json.NewDecoder(resp.Body)
	var seen []api.State
	for len(seen) < 5 {
		var ev api.Event
		if err := dec.Decode(&ev); err != nil {
			t.Fatalf("event stream: %v (seen %v)", err, seen)
		}
		if ev.JobID != "1" || ev.Reason == "" {
			t.Errorf("event %+v lacks job id or reason", ev)
		}
		seen = append(seen, ev.To)
	}
	want := []api.State{api.StatePending, api.StatePlaced, api.StateStarting, api.StateRunning, api.StateSucceeded}
	if !slices.Equal(seen, want) {
		t.Errorf("events %v, want %v", seen, want)
	}
}

// TestAPIDocsMatchRoutes keeps docs/api.md in step with the routes the
// server registers: every route documented, nothing documented that is not
// a route.
func TestAPIDocsMatchRoutes(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?m)^### `(GET|POST|PUT|DELETE|PATCH) (/v1/[^`]*)`")
	var documented []string
	for _, m := range re.FindAllSubmatch(doc, -1) {
		documented = append(documented, string(m[1])+" "+string(m[2]))
	}
	var routes []string
	for _, r := range apiserver.Routes {
		routes = append(routes, r.Method+" "+r.Path)
	}
	slices.Sort(documented)
	slices.Sort(routes)
	if !slices.Equal(documented, routes) {
		t.Errorf("docs/api.md documents\n  %v\nbut the server has\n  %v", documented, routes)
	}
	if !bytes.Contains(doc, []byte("payload_too_large")) {
		t.Error("docs/api.md does not list the error codes")
	}
}

package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
)

// TestSpecJSON: YAML 1.2 scalars (y, on, no stay strings), duplicate keys
// refused with their path, numbers and booleans kept.
func TestSpecJSON(t *testing.T) {
	got, err := SpecJSON([]byte("name: y\nclass: on\nworkdir: no\npriority: 5\nenv: {A: \"1\", B: true}\nresources: {cpu: 0.5}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(got, &m); err != nil {
		t.Fatal(err)
	}
	if m["name"] != "y" || m["class"] != "on" || m["workdir"] != "no" || m["priority"] != 5.0 ||
		m["env"].(map[string]any)["B"] != true || m["resources"].(map[string]any)["cpu"] != 0.5 {
		t.Errorf("SpecJSON = %s", got)
	}
	_, err = SpecJSON([]byte("name: a\nresources:\n  cpu: 1\n  cpu: 2\n"))
	if err == nil || !strings.Contains(err.Error(), "resources.cpu: key given more than once") || !strings.Contains(err.Error(), "line 4") {
		t.Errorf("duplicate key: %v", err)
	}
	_, err = SpecJSON([]byte("a: &x [1, 2]\nb: *x\n"))
	if err != nil {
		t.Errorf("aliases: %v", err)
	}
}

type fakeDaemon struct {
	mu       sync.Mutex
	requests []string
	bodies   [][]byte
	jobs     int // jobs the listing holds
}

func (f *fakeDaemon) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.requests = append(f.requests, r.Method+" "+r.URL.RequestURI())
	f.bodies = append(f.bodies, body)
	f.mu.Unlock()
	switch {
	case r.Method == "POST" && r.URL.Path == "/v1/batches":
		var req api.BatchRequest
		json.Unmarshal(body, &req)
		if strings.Contains(string(req.Jobs[1]), "bad") {
			w.WriteHeader(422)
			json.NewEncoder(w).Encode(api.Error{Code: api.CodeInvalid, Field: "jobs[1].gang.size", Message: "conflicting size"})
			return
		}
		var out api.BatchResponse
		for i := range req.Jobs {
			out.Jobs = append(out.Jobs, api.Job{ID: strconv.Itoa(i + 1), State: api.StatePending})
		}
		w.WriteHeader(201)
		json.NewEncoder(w).Encode(out)
	case r.Method == "GET" && r.URL.Path == "/v1/jobs":
		// Pages of 2, newest first, from f.jobs down.
		top := f.jobs
		if c := r.URL.Query().Get("continue"); c != "" {
			top, _ = strconv.Atoi(c)
			top--
		}
		var page []api.Job
		for id := top; id > 0 && len(page) < 2; id-- {
			page = append(page, api.Job{ID: strconv.Itoa(id), State: api.StateSucceeded})
		}
		if last := top - len(page); last > 0 {
			w.Header().Set(api.ContinueHeader, page[len(page)-1].ID)
		}
		json.NewEncoder(w).Encode(page)
	default:
		w.WriteHeader(404)
	}
}

func serveFake(t *testing.T, f http.Handler) string {
	sock := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: f}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// TestSubmitIsOneRequest: a multi-document file goes in one batch request;
// a refused document is named by file and document and nothing is
// claimed as submitted.
func TestSubmitIsOneRequest(t *testing.T) {
	f := &fakeDaemon{}
	sock := serveFake(t, f)
	dir := t.TempDir()
	good := filepath.Join(dir, "gang.yaml")
	os.WriteFile(good, []byte("name: a\n---\nname: b\n"), 0o644)
	var out, errb bytes.Buffer
	if code := Execute(context.Background(), []string{"--socket", sock, "-q", "submit", good}, nil, &out, &errb); code != 0 {
		t.Fatalf("submit: %d %s", code, errb.String())
	}
	if len(f.requests) != 1 || f.requests[0] != "POST /v1/batches" || out.String() != "1\n2\n" {
		t.Fatalf("requests %v, output %q", f.requests, out.String())
	}
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("name: a\n---\nname: bad\n"), 0o644)
	out.Reset()
	errb.Reset()
	if code := Execute(context.Background(), []string{"--socket", sock, "submit", bad}, nil, &out, &errb); code != 1 {
		t.Fatalf("bad submit exited %d", code)
	}
	if want := "bad.yaml (document 2): gang.size: conflicting size; nothing was submitted"; !strings.Contains(errb.String(), want) {
		t.Errorf("stderr %q lacks %q", errb.String(), want)
	}
}

// TestListFollowsPages: fusionctl ps reads every page.
func TestListFollowsPages(t *testing.T) {
	f := &fakeDaemon{jobs: 5}
	sock := serveFake(t, f)
	var out, errb bytes.Buffer
	if code := Execute(context.Background(), []string{"--socket", sock, "-q", "ps"}, nil, &out, &errb); code != 0 {
		t.Fatalf("ps: %d %s", code, errb.String())
	}
	if out.String() != "5\n4\n3\n2\n1\n" || len(f.requests) != 3 {
		t.Errorf("ps printed %q in %d requests (%v)", out.String(), len(f.requests), f.requests)
	}
	f.requests = nil
	out.Reset()
	if code := Execute(context.Background(), []string{"--socket", sock, "-q", "ps", "--limit", "3"}, nil, &out, &errb); code != 0 {
		t.Fatalf("ps: %d %s", code, errb.String())
	}
	if out.String() != "5\n4\n3\n" {
		t.Errorf("ps --limit 3 printed %q (%v)", out.String(), f.requests)
	}
}

// FuzzSpecJSON: a spec file's YAML document converts to JSON or fails,
// never panics, and what it produces is JSON.
func FuzzSpecJSON(f *testing.F) {
	for _, s := range []string{"name: y\ncommand: [a, b]\n", "a: &x [1]\nb: *x\n", "a: 1\na: 2\n", "<<: {a: 1}\n", "? [a]\n: b\n", "x: .inf\n", ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		js, err := SpecJSON(data)
		if err != nil {
			return
		}
		if !json.Valid(js) {
			t.Fatalf("SpecJSON(%q) = %q, not JSON", data, js)
		}
	})
}

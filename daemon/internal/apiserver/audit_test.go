package apiserver_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/apiserver"
	"github.com/fusiond/fusiond/daemon/internal/audit"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/jobs/jobstest"
	"github.com/fusiond/fusiond/daemon/internal/store"
)

// syncBuffer is a log sink the server's goroutines may share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

const gangJob = `{"name":"g","command":["true"],"resources":{"cpu":"100m","memory":"16Mi"},"gang":{"name":"g","size":2}}`

// TestAudit: privileged requests are recorded whatever their outcome,
// refusals on any route are recorded, with who (uid, user, pid), what and
// the outcome; ordinary successful reads are not.
func TestAudit(t *testing.T) {
	dir := t.TempDir()
	var logBuf syncBuffer
	log := slog.New(slog.NewJSONHandler(&logBuf, nil))
	auditPath := filepath.Join(dir, "audit.log")
	al, err := audit.Open(auditPath, audit.Options{}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { al.Close() })
	runner := jobstest.Runner(t, filepath.Join(dir, "jobs"), time.Second)
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	// As in the daemon, the job manager audits every admission and the
	// server every other privileged or refused request.
	mgr := jobs.New(jobs.Config{LogDir: filepath.Join(dir, "jobs"), CancelGrace: time.Second, Audit: al}, st,
		runner, jobstest.Placer(4000, 8<<30), slog.New(slog.DiscardHandler))
	if err := mgr.Recover(); err != nil {
		t.Fatal(err)
	}
	mgr.Start()
	srv := apiserver.New(backend{mgr}, apiserver.Config{MaxBodyBytes: 4096, Audit: al, Logger: log})
	serve := func(name string, as *api.Caller) *http.Client {
		sock := filepath.Join(dir, name)
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		hs := &http.Server{Handler: srv, ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if as != nil {
				return apiserver.WithCaller(ctx, *as, nil)
			}
			return srv.ConnContext(ctx, c)
		}}
		go hs.Serve(ln)
		t.Cleanup(func() { hs.Shutdown(context.Background()) })
		return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		mgr.Stop(ctx)
	})
	root := serve("root.sock", nil)
	user := serve("user.sock", &api.Caller{UID: 4242, GID: 4243, PID: 99, User: "mallory"})

	steps := []struct {
		hc                 *http.Client
		method, path, body string
		status             int
	}{
		{root, "POST", "/v1/jobs", echoJob, 201},
		{root, "GET", "/v1/jobs", "", 200},   // not audited
		{root, "GET", "/v1/node", "", 200},   // not audited
		{user, "GET", "/v1/jobs/1", "", 404}, // another's job
		{user, "POST", "/v1/jobs/1/cancel", "", 404},
		{user, "POST", "/v1/node/cordon", "", 403},
		{user, "POST", "/v1/jobs", `{"command":["x"],"resources":{"cpu":1,"memory":"1Gi"},"env":{"FUSIOND_JOB_ID":"1"}}`, 422},
		{user, "POST", "/v1/jobs", `{"name":"` + strings.Repeat("x", 5000) + `"}`, 413},
		{root, "POST", "/v1/node/cordon", "", 200},
		{root, "POST", "/v1/node/uncordon", "", 200},
		{root, "POST", "/v1/mig/apply", `{}`, 503}, // this server has no devices
		// A batch (a gang): one record naming both jobs.
		{root, "POST", "/v1/batches", `{"jobs":[` + gangJob + `,` + gangJob + `]}`, 201},
		{root, "POST", "/v1/peers/keyring", `{"install":"x"}`, 409}, // this server has no peers
	}
	for _, s := range steps {
		if code, body := do(t, s.hc, s.method, s.path, s.body); code != s.status {
			t.Fatalf("%s %s: %d %s, want %d", s.method, s.path, code, body, s.status)
		}
	}
	want := []audit.Record{
		{UID: 0, User: "root", PID: int32(os.Getpid()), Action: "job.submit", Target: "1", Outcome: audit.OK, Status: 201},
		{UID: 4242, GID: 4243, User: "mallory", PID: 99, Action: "request", Path: "/v1/jobs/1", Outcome: audit.Refused, Status: 404, Code: api.CodeNotFound},
		{UID: 4242, User: "mallory", PID: 99, Action: "job.cancel", Target: "1", Outcome: audit.Refused, Status: 404, Code: api.CodeNotFound},
		{UID: 4242, User: "mallory", PID: 99, Action: "node.cordon", Outcome: audit.Refused, Status: 403, Code: api.CodeForbidden},
		{UID: 4242, User: "mallory", PID: 99, Action: "job.submit", Outcome: audit.Refused, Status: 422, Code: api.CodeInvalid, Field: "env.FUSIOND_JOB_ID"},
		{UID: 4242, User: "mallory", PID: 99, Action: "job.submit", Outcome: audit.Refused, Status: 413, Code: api.CodeTooLarge},
		{UID: 0, Action: "node.cordon", Outcome: audit.OK, Status: 200},
		{UID: 0, Action: "node.uncordon", Outcome: audit.OK, Status: 200},
		{UID: 0, Action: "mig.apply", Outcome: audit.Failed, Status: 503, Code: api.CodeUnavailable},
		{UID: 0, Action: "job.submit", Target: "2,3", Outcome: audit.OK, Status: 201},
		{UID: 0, Action: "peers.keyring", Outcome: audit.Refused, Status: 409, Code: api.CodeConflict},
	}
	// root's records are in the admins' file, mallory's refusals in the
	// refusals' file; in time order they are the steps'.
	var got []audit.Record
	for stream, path := range audit.StreamPaths(auditPath) {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var r audit.Record
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatal(err)
			}
			if want := map[bool]string{true: audit.Admins, false: audit.Refusals}[r.UID == 0]; stream != want {
				t.Errorf("uid %d's %s in the %s file, want %s", r.UID, r.Action, stream, want)
			}
			got = append(got, r)
		}
		f.Close()
	}
	slices.SortStableFunc(got, func(a, b audit.Record) int { return a.Time.Compare(b.Time) })
	if len(got) != len(want) {
		t.Fatalf("%d records, want %d:\n%+v", len(got), len(want), got)
	}
	for i, src := range map[int]string{0: "socket", 4: "socket", 9: "batch"} {
		if got[i].Source != src {
			t.Errorf("record %d's source %q, want %s", i, got[i].Source, src)
		}
	}
	for i, w := range want {
		g := got[i]
		if g.UID != w.UID || g.Action != w.Action || g.Target != w.Target || g.Outcome != w.Outcome ||
			g.Status != w.Status || g.Code != w.Code || g.Field != w.Field || g.Time.IsZero() ||
			(w.User != "" && g.User != w.User) || (w.PID != 0 && g.PID != w.PID) || (w.Path != "" && g.Path != w.Path) ||
			(w.GID != 0 && g.GID != w.GID) {
			t.Errorf("record %d:\n got %+v\nwant %+v", i, g, w)
		}
	}
	if g := got[3]; g.Message == "" || g.Method != "POST" || g.Path != "/v1/node/cordon" {
		t.Errorf("refusal without its reason or route: %+v", g)
	}
	// The same records reach the daemon's log under the "audit" key.
	if n := strings.Count(logBuf.String(), `"msg":"audit","audit":{`); n != len(want) {
		t.Errorf("%d audit lines on the log, want %d:\n%s", n, len(want), logBuf.String())
	}
}

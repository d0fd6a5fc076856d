package lifecycle

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
)

// recorder is a group whose parts note their starts and stops in calls.
type recorder struct {
	g     *Group
	calls []string
}

func newRecorder(t *testing.T) *recorder {
	return &recorder{g: New(slog.New(slog.NewTextHandler(testWriter{t}, nil)))}
}

// add registers a part that records "start NAME" and "stop NAME"; a
// non-nil fail is what its Start returns.
func (r *recorder) add(t *testing.T, name string, fail error, needs ...string) {
	t.Helper()
	err := r.g.Add(Part{Name: name, Needs: needs,
		Start: func(context.Context) error { r.calls = append(r.calls, "start "+name); return fail },
		Stop:  func(context.Context) error { r.calls = append(r.calls, "stop "+name); return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func TestOrderFromNeeds(t *testing.T) {
	r := newRecorder(t)
	// Registered in the reverse of any valid order, with ties.
	r.add(t, "api", nil, "jobs", "qos")
	r.add(t, "qos", nil, "jobs", "telemetry")
	r.add(t, "jobs", nil, "store")
	r.add(t, "telemetry", nil)
	r.add(t, "store", nil)
	if err := r.g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := r.g.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	// telemetry and store are both free first: telemetry was registered
	// before store.
	wantCalls := []string{"start telemetry", "start store", "start jobs", "start qos", "start api",
		"stop api", "stop qos", "stop jobs", "stop store", "stop telemetry"}
	if !slices.Equal(r.calls, wantCalls) {
		t.Fatalf("calls %v, want %v", r.calls, wantCalls)
	}
}

func TestCycleRefused(t *testing.T) {
	r := newRecorder(t)
	r.add(t, "store", nil)
	r.add(t, "bus", nil, "store", "jobs")
	r.add(t, "placer", nil, "bus")
	r.add(t, "jobs", nil, "placer")
	err := r.g.Start(context.Background())
	if err == nil {
		t.Fatal("a cycle started")
	}
	for _, name := range []string{"bus", "placer", "jobs"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error %q does not name %s", err, name)
		}
	}
	if strings.Contains(err.Error(), "store") {
		t.Errorf("error %q names store, which is not on the cycle", err)
	}
	if len(r.calls) != 0 {
		t.Errorf("parts ran before the cycle was found: %v", r.calls)
	}
}

func TestUnknownNeedRefused(t *testing.T) {
	r := newRecorder(t)
	r.add(t, "store", nil)
	r.add(t, "jobs", nil, "store", "stroe")
	err := r.g.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), `"jobs" needs "stroe"`) {
		t.Fatalf("error %v, want one naming jobs and stroe", err)
	}
	if len(r.calls) != 0 {
		t.Errorf("parts ran before the unknown need was found: %v", r.calls)
	}
}

func TestDuplicateNameRefused(t *testing.T) {
	g := New(nil)
	if err := g.Add(Part{Name: "store"}); err != nil {
		t.Fatal(err)
	}
	if err := g.Add(Part{Name: "store"}); err == nil || !strings.Contains(err.Error(), "store") {
		t.Fatalf("second store: %v, want an error naming it", err)
	}
	if err := g.Add(Part{}); err == nil {
		t.Fatal("a part without a name was added")
	}
}

var errBoom = errors.New("boom")

func TestFailedStartStopsStartedInReverse(t *testing.T) {
	r := newRecorder(t)
	r.add(t, "store", nil)
	r.add(t, "jobs", nil, "store")
	r.add(t, "qos", errBoom, "jobs")
	r.add(t, "api", nil, "qos")
	err := r.g.Start(context.Background())
	if !errors.Is(err, errBoom) || !strings.Contains(err.Error(), "starting qos") {
		t.Fatalf("error %v, want boom wrapped with qos", err)
	}
	// qos did not start: it is not stopped; api never started.
	want := []string{"start store", "start jobs", "start qos", "stop jobs", "stop store"}
	if !slices.Equal(r.calls, want) {
		t.Fatalf("calls %v, want %v", r.calls, want)
	}
	if err := r.g.Stop(context.Background()); err != nil || len(r.calls) != len(want) {
		t.Fatalf("Stop after a failed start: %v, calls %v", err, r.calls)
	}
}

func TestStopIdempotent(t *testing.T) {
	r := newRecorder(t)
	r.add(t, "store", nil)
	r.add(t, "jobs", nil, "store")
	if err := r.g.Stop(context.Background()); err != nil || len(r.calls) != 0 {
		t.Fatalf("Stop before Start: %v, calls %v", err, r.calls)
	}
	r = newRecorder(t)
	r.add(t, "store", nil)
	r.add(t, "jobs", nil, "store")
	if err := r.g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := r.g.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"start store", "start jobs", "stop jobs", "stop store"}
	if !slices.Equal(r.calls, want) {
		t.Fatalf("calls %v, want %v", r.calls, want)
	}
	if err := r.g.Start(context.Background()); err == nil {
		t.Fatal("a stopped group started again")
	}
}

func TestStopErrorsJoinedAndEveryPartStopped(t *testing.T) {
	g := New(nil)
	var stopped []string
	for _, name := range []string{"a", "b", "c"} {
		if err := g.Add(Part{Name: name, Stop: func(context.Context) error {
			stopped = append(stopped, name)
			if name == "b" {
				return errBoom
			}
			return nil
		}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	err := g.Stop(context.Background())
	if !errors.Is(err, errBoom) || !strings.Contains(err.Error(), "stopping b") {
		t.Fatalf("error %v, want boom wrapped with b", err)
	}
	if !slices.Equal(stopped, []string{"c", "b", "a"}) {
		t.Fatalf("stopped %v, want c b a", stopped)
	}
}

func TestLogsEachStartAndStopWithDuration(t *testing.T) {
	var buf bytes.Buffer
	g := New(slog.New(slog.NewTextHandler(&buf, nil)))
	noop := func(context.Context) error { return nil }
	if err := g.Add(Part{Name: "store", Start: noop, Stop: noop}); err != nil {
		t.Fatal(err)
	}
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := g.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("log %q, want two lines", buf.String())
	}
	for i, want := range []string{"part started", "part stopped"} {
		if !strings.Contains(lines[i], want) || !strings.Contains(lines[i], "part=store") || !strings.Contains(lines[i], "duration=") {
			t.Errorf("log line %q, want %q with part=store and a duration", lines[i], want)
		}
	}
}

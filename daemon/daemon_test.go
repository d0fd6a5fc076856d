package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/executor/exectest"
)

// TestNewThenServe builds a real daemon with New — store, hardware,
// placer, monitor runner and job manager, no socket — checks that it holds
// its state directory, then serves it on a listener the test made and runs
// a job through the API client.
func TestNewThenServe(t *testing.T) {
	dir := t.TempDir()
	cfg := DefaultConfig()
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.Socket = filepath.Join(dir, "api.sock")
	cfg.SocketGroup = ""
	cfg.CgroupParent = fmt.Sprintf("fusiond-test-new-%d", os.Getpid())
	t.Cleanup(func() {
		if err := exectest.Cleanup(cgroups.DefaultRoot, cfg.CgroupParent, cfg.StateDir, 10*time.Second); err != nil {
			t.Error(err)
		}
	})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	d, err := New(ctx, Options{Config: cfg, Logger: log})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	// A second daemon on the same state directory must refuse to start
	// while the first holds its store.
	if d2, err := New(ctx, Options{Config: cfg, Logger: log}); err == nil {
		d2.Close()
		t.Fatal("a second daemon opened a state directory the first holds")
	}
	if _, err := os.Stat(cfg.Socket); err == nil {
		t.Fatal("New created the API socket; only Run does")
	}

	ln, err := net.Listen("unix", cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- d.Serve(ctx, ln) }()

	c := api.NewClient(cfg.Socket)
	defer c.Close()
	job, err := c.Submit(ctx, api.JobSpec{Name: "hello", Command: []string{"/bin/sh", "-c", "echo served"},
		Resources: api.Resources{CPU: 100, Memory: 16 << 20}})
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for job.State != api.StateSucceeded {
		if job.State.Terminal() || time.Now().After(deadline) {
			t.Fatalf("job %s ended %s (%s), want succeeded", job.ID, job.State, job.Reason)
		}
		time.Sleep(50 * time.Millisecond)
		if job, err = c.Get(ctx, job.ID); err != nil {
			t.Fatal(err)
		}
	}
	out, err := os.ReadFile(filepath.Join(cfg.StateDir, "jobs", job.ID, "output.log"))
	if err != nil || !strings.Contains(string(out), "served") {
		t.Fatalf("job output %q, %v", out, err)
	}

	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return after its context ended")
	}
	// Serve closed the daemon: the state directory is free again.
	d3, err := New(context.Background(), Options{Config: cfg, Logger: log})
	if err != nil {
		t.Fatalf("New after Serve returned: %v", err)
	}
	d3.Close()
}

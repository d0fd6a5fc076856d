package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/executor/exectest"
)

// serveDaemon builds a real daemon with New over the default config in a
// temporary state directory (cgroups under fusiond-test-<name>-<pid>),
// changed by edit, and serves it on a Unix socket there. It returns the
// context the daemon serves under, a client of its socket, and stop, which
// ends the daemon and fails the test if serving ended with an error. The
// job cgroups and monitors left are removed when the test ends.
func serveDaemon(t *testing.T, name string, edit func(*Config)) (context.Context, *api.Client, func()) {
	t.Helper()
	ctx, c, stop, _ := serveDaemonD(t, name, edit)
	return ctx, c, stop
}

// serveDaemonD is serveDaemon that also returns the daemon, for tests
// that drive its simulated hardware.
func serveDaemonD(t *testing.T, name string, edit func(*Config)) (context.Context, *api.Client, func(), *Daemon) {
	t.Helper()
	dir := t.TempDir()
	cfg := DefaultConfig()
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.Socket = filepath.Join(dir, "api.sock")
	cfg.SocketGroup = ""
	cfg.CgroupParent = fmt.Sprintf("fusiond-test-%s-%d", name, os.Getpid())
	if edit != nil {
		edit(&cfg)
	}
	t.Cleanup(func() {
		if err := exectest.Cleanup(cgroups.DefaultRoot, cfg.CgroupParent, cfg.StateDir, 10*time.Second); err != nil {
			t.Error(err)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	d, err := New(ctx, Options{Config: cfg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", cfg.Socket)
	if err != nil {
		d.Close()
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- d.Serve(ctx, ln) }()
	c := api.NewClient(cfg.Socket)
	t.Cleanup(func() { c.Close() })
	stopped := false
	return ctx, c, func() {
		t.Helper()
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-served; err != nil {
			t.Error(err)
		}
	}, d
}

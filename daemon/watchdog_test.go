package daemon

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// runWithWatchdog runs the daemon on a listener it did not open (as under
// socket activation) and counts watchdog pings for a while. checkSocket is
// where the daemon's health check dials.
func runWithWatchdog(t *testing.T, checkSocket func(listening string) string) (pings int64, stopping bool) {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "api.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false) // as a listener made from systemd's descriptor
	cfg := DefaultConfig()
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.Socket = checkSocket(sock)
	var n atomic.Int64
	var stopped atomic.Bool
	ready := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{
			Config: cfg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Listener: ln, OnReady: func() { close(ready) },
			Watchdog: func() { n.Add(1) }, WatchdogInterval: 20 * time.Millisecond,
			OnStopping: func() { stopped.Store(true) },
		})
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	time.Sleep(300 * time.Millisecond)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	// The socket belongs to whoever passed the listener (systemd).
	if _, err := os.Lstat(sock); err != nil {
		t.Errorf("Run removed a socket it did not create: %v", err)
	}
	return n.Load(), stopped.Load()
}

func TestWatchdogPingsWhileHealthy(t *testing.T) {
	pings, stopping := runWithWatchdog(t, func(s string) string { return s })
	if pings < 3 {
		t.Errorf("%d watchdog pings in 300ms at a 20ms interval", pings)
	}
	if !stopping {
		t.Error("OnStopping not called on shutdown")
	}
}

// A daemon whose API does not answer its own health check must not ping:
// systemd then restarts it.
func TestWatchdogWithheldWhenUnhealthy(t *testing.T) {
	pings, _ := runWithWatchdog(t, func(s string) string { return s + ".nobody-listens" })
	if pings != 0 {
		t.Errorf("%d watchdog pings although the health check cannot succeed", pings)
	}
}

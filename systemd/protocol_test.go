package systemd_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// TestDaemonSpeaksSystemdProtocol runs the real fusiond binary the way
// systemd starts it from fusiond.service with fusiond.socket: an inherited
// listening socket on fd 3 (LISTEN_FDS/LISTEN_PID), NOTIFY_SOCKET and
// WATCHDOG_USEC. It must serve the inherited socket, send READY=1, keep
// pinging the watchdog while healthy, send STOPPING=1 on SIGTERM, and
// leave the socket file (systemd's) in place when it exits.
func TestDaemonSpeaksSystemdProtocol(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "fusiond")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/fusiond/fusiond/cmd/fusiond").CombinedOutput(); err != nil {
		t.Fatalf("building fusiond: %v\n%s", err, out)
	}
	sock := filepath.Join(dir, "api.sock")
	cfg := filepath.Join(dir, "config.yaml")
	yaml := fmt.Sprintf("state_dir: %s\nsocket: %s\nsocket_group: \"\"\n", filepath.Join(dir, "state"), sock)
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}

	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	lnFile, err := ln.File()
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	notifyPath := filepath.Join(dir, "notify")
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notifyPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notify.Close()

	// LISTEN_PID must be the daemon's pid: the shell sets it to its own
	// and execs fusiond in its place, as systemd does after fork.
	cmd := exec.Command("/bin/sh", "-c", `LISTEN_PID=$$ exec "$0" --config "$1"`, bin, cfg)
	cmd.Env = append(os.Environ(), "LISTEN_FDS=1", "LISTEN_FDNAMES=fusiond.socket",
		"NOTIFY_SOCKET="+notifyPath, "WATCHDOG_USEC=400000")
	cmd.ExtraFiles = []*os.File{lnFile}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lnFile.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		if t.Failed() {
			t.Logf("fusiond stderr:\n%s", stderr.String())
		}
	}()

	next := func(want string) string {
		t.Helper()
		buf := make([]byte, 4096)
		notify.SetReadDeadline(time.Now().Add(20 * time.Second))
		for {
			k, err := notify.Read(buf)
			if err != nil {
				t.Fatalf("waiting for %q from fusiond: %v", want, err)
			}
			if msg := string(buf[:k]); strings.HasPrefix(msg, want) {
				return msg
			}
		}
	}
	if msg := next("READY=1"); !strings.Contains(msg, "STATUS=serving on "+sock) {
		t.Errorf("ready message %q", msg)
	}
	c := api.NewClient(sock)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Node(ctx); err != nil {
		t.Fatalf("API on the inherited socket: %v", err)
	}
	for range 3 {
		next("WATCHDOG=1")
	}
	cmd.Process.Signal(syscall.SIGTERM)
	next("STOPPING=1")
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("fusiond exit: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("fusiond did not exit after SIGTERM")
	}
	if _, err := os.Lstat(sock); err != nil {
		t.Errorf("fusiond removed the socket systemd owns: %v", err)
	}
}

package daemon

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestListenMetrics(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SocketGroup, cfg.SocketMode = "", "0640"

	ln, err := listenMetrics(cfg, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if a := ln.Addr().(*net.TCPAddr); !a.IP.IsLoopback() || a.Port == 0 {
		t.Errorf("tcp listener on %v", a)
	}
	ln.Close()

	sock := filepath.Join(t.TempDir(), "sub", "metrics.sock")
	ln, err = listenMetrics(cfg, "unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(sock)
	if err != nil || st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o640 {
		t.Errorf("metrics socket %v %v, want a socket with mode 0640", st, err)
	}
	// A live socket is not taken over.
	if _, err := listenMetrics(cfg, "unix", sock); err == nil || !strings.Contains(err.Error(), "already serving") {
		t.Errorf("second listener on a live socket: %v", err)
	}
	ln.Close()
	// A stale one (nobody listening) is replaced. Closing a Go unix
	// listener removes its file, so leave a stale file behind by hand.
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err = listenMetrics(cfg, "unix", sock)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	ln.Close()

	cfg.SocketGroup = "no-such-group-fusiond"
	if _, err := listenMetrics(cfg, "unix", sock+"2"); err == nil || !strings.Contains(err.Error(), "socket_group") {
		t.Errorf("unknown group: %v", err)
	}
}

package peers

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSecretFilesMustBePrivate: a node does not start on a gossip keyring
// or a private key that other users may read or write, or that another
// user owns; the error names the file, its mode and the fix. The same
// files at 0600 start it.
func TestSecretFilesMustBePrivate(t *testing.T) {
	ca := newTestCA(t, t.TempDir())
	cert, keyFile := ca.issue(t, "a")
	keyring := filepath.Join(ca.dir, "a.keyring")
	if err := os.WriteFile(keyring, []byte(key('k')+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{NodeName: "a", Gossip: "127.0.0.1:0", API: "127.0.0.1:0", Profile: "local", KeyringFile: keyring,
		CertFile: cert, KeyFile: keyFile, CAFile: filepath.Join(ca.dir, "ca.pem"), Broadcast: 50 * time.Millisecond}
	start := func() error {
		n, err := New(cfg, newFakeJobs(), &fakeHost{cpu: 1000}, nil)
		if err == nil {
			n.Close()
		}
		return err
	}
	for _, c := range []struct {
		file string
		mode os.FileMode
		uid  int
		want string
	}{
		{keyring, 0o644, -1, "gossip keyring " + keyring + " is open to other users (mode 0644): it holds a secret of the cluster; chmod 600"},
		{keyring, 0o640, -1, "(mode 0640)"},
		{keyring, 0o602, -1, "(mode 0602)"},
		{keyFile, 0o644, -1, "peer private key " + keyFile + " is open to other users (mode 0644)"},
		{keyFile, 0o600, 65534, "belongs to uid 65534, neither this daemon's user"},
	} {
		if err := os.Chmod(c.file, c.mode); err != nil {
			t.Fatal(err)
		}
		if c.uid >= 0 {
			if err := os.Chown(c.file, c.uid, -1); err != nil {
				t.Fatalf("chown (the tests run as root): %v", err)
			}
		}
		if err := start(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s at %04o (uid %d): %v; want an error saying %q", filepath.Base(c.file), c.mode, c.uid, err, c.want)
		}
		os.Chmod(c.file, 0o600)
		os.Chown(c.file, os.Geteuid(), -1)
	}
	if err := start(); err != nil {
		t.Errorf("private files refused: %v", err)
	}
}

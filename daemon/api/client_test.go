package api

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPermissionHintNamesSocketGroup: the permission-denied hint names the
// group that really owns the socket, not a hard-coded "fusiond".
func TestPermissionHintNamesSocketGroup(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// daemon (gid 1) exists on every Debian system; chown needs root,
	// which the tests require.
	if err := os.Chown(sock, 0, 1); err != nil {
		t.Fatalf("chown socket (the tests run as root): %v", err)
	}
	c := NewClient(sock)
	err = c.dialError(fmt.Errorf("dial: %w", os.ErrPermission))
	if !strings.Contains(err.Error(), "(daemon, gid 1)") || strings.Contains(err.Error(), "fusiond)") {
		t.Errorf("hint = %q, want the socket's real group daemon (gid 1)", err)
	}
	if got := socketGroup(filepath.Join(t.TempDir(), "absent")); got != "the socket's group" {
		t.Errorf("hint for a socket that cannot be stat'ed = %q", got)
	}
}

// TestParseBytesRange: a unit the parser knows but a value too large is
// "out of range", not "invalid".
func TestParseBytesRange(t *testing.T) {
	for in, want := range map[string]string{"8Ei": "out of range", "16E": "out of range", "1Zi": "invalid", "x": "invalid"} {
		_, err := ParseBytes(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseBytes(%q) = %v, want an error containing %q", in, err, want)
		}
	}
	for in, want := range map[string]Bytes{"1Ei": 1 << 60, "2Pi": 2 << 50, "1P": 1e15} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v, want %d", in, got, err, want)
		}
	}
}

package exectest

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestUserLockExcludesOthers: while one test holds a user's lock, another
// open of the same lock file — another test binary — cannot take it, and
// it can once the holder released it.
func TestUserLockExcludesOthers(t *testing.T) {
	name := "fusiond-tlock"
	unlock := lockUser(t, name)
	f, err := os.Open(filepath.Join(os.TempDir(), "fusiond-test-user-"+name+".lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); !errors.Is(err, unix.EWOULDBLOCK) {
		t.Fatalf("second holder while the first holds it: %v, want EWOULDBLOCK", err)
	}
	unlock()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatalf("second holder after the release: %v", err)
	}
}

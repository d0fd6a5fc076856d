package exectest

import (
	"errors"
	"fmt"
	"os"
	osexec "os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// User is an unprivileged account of the host for a test.
type User struct {
	Name     string
	UID, GID uint32
}

// NeedUser returns the local account name, creating it (useradd, no home,
// no login shell) when it does not exist and removing it again when the
// test ends. It fails the test when the account cannot be had.
//
// Test binaries of several packages run at once and share the host's
// accounts: while one holds name, another must neither delete it under
// the first one's processes nor find it half made. NeedUser therefore
// holds an exclusive lock on a file named after the account, from before
// it looks the account up until after it removed it, and a second test
// asking for the same name — in this binary or another — waits for it.
func NeedUser(t testing.TB, name string) User {
	t.Helper()
	unlock := lockUser(t, name)
	t.Cleanup(unlock) // registered first, so it runs after userdel
	u, err := user.Lookup(name)
	if err != nil {
		out, err := osexec.Command("useradd", "--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", name).CombinedOutput()
		if err != nil {
			t.Fatalf("useradd %s: %v: %s", name, err, out)
		}
		t.Cleanup(func() { removeUser(t, name) })
		if u, err = user.Lookup(name); err != nil {
			t.Fatalf("user %s after useradd: %v", name, err)
		}
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		t.Fatal(fmt.Errorf("user %s: uid %q gid %q", name, u.Uid, u.Gid))
	}
	return User{Name: name, UID: uint32(uid), GID: uint32(gid)}
}

// lockUser takes the cross-process lock of the account name and returns
// its release.
func lockUser(t testing.TB, name string) func() {
	t.Helper()
	path := filepath.Join(os.TempDir(), "fusiond-test-user-"+name+".lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatalf("lock of test user %s: %v", name, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); errors.Is(err, unix.EWOULDBLOCK) {
		t.Logf("test user %s is held by another test; waiting for it", name)
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
	}
	if err != nil {
		f.Close()
		t.Fatalf("lock %s: %v", path, err)
	}
	return func() { f.Close() } // closing the only descriptor releases the lock
}

// removeUser deletes the account the test created. userdel refuses (exit
// 8) while a process of the user is still there: a child the test
// started may not have been reaped yet on a loaded host, so it waits for
// that a while; a process still there after it is a leak the test
// reports.
func removeUser(t testing.TB, name string) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := osexec.Command("userdel", name).CombinedOutput()
		var ee *osexec.ExitError
		switch {
		case err == nil:
			return
		case errors.As(err, &ee) && ee.ExitCode() == 8 && time.Now().Before(deadline):
			time.Sleep(100 * time.Millisecond)
			continue
		}
		ps, _ := osexec.Command("ps", "-o", "pid,ppid,stat,args", "-u", name).CombinedOutput()
		t.Errorf("userdel %s: %v: %s\nprocesses of %s:\n%s", name, err, out, name, ps)
		return
	}
}

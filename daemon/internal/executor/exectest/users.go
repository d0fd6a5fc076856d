package exectest

import (
	"errors"
	"fmt"
	osexec "os/exec"
	"os/user"
	"strconv"
	"testing"
	"time"
)

// User is an unprivileged account of the host for a test.
type User struct {
	Name     string
	UID, GID uint32
}

// NeedUser returns the local account name, creating it (useradd, no home,
// no login shell) when it does not exist and removing it again when the
// test ends. It fails the test when the account cannot be had.
func NeedUser(t testing.TB, name string) User {
	t.Helper()
	u, err := user.Lookup(name)
	if err != nil {
		out, err := osexec.Command("useradd", "--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", name).CombinedOutput()
		if err != nil {
			t.Fatalf("useradd %s: %v: %s", name, err, out)
		}
		t.Cleanup(func() {
			// userdel refuses (exit 8) while a process of the user is
			// still there: a child the test started may not have been
			// reaped yet on a loaded host. Wait for it a while.
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
				t.Errorf("userdel %s: %v: %s", name, err, out)
				return
			}
		})
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

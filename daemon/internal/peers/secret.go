package peers

import (
	"fmt"
	"os"
	"syscall"
)

// checkSecret refuses a file holding a secret of the cluster (the gossip
// keyring, the peer API's private key) that anyone but its owner may
// read or write, or whose owner is neither this daemon's user nor root:
// another user could read the cluster's key from it, or put theirs in
// its place. As ssh does with a private key, the daemon does not start
// on such a file; the error says what to change.
func checkSecret(path, what string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("%s %s is open to other users (mode %04o): it holds a secret of the cluster; chmod 600 %s", what, path, perm, path)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() && st.Uid != 0 {
		return fmt.Errorf("%s %s belongs to uid %d, neither this daemon's user (uid %d) nor root: chown it", what, path, st.Uid, os.Geteuid())
	}
	return nil
}

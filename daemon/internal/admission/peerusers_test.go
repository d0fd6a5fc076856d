package admission

import (
	"errors"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// run runs a command that must succeed; undo is run at cleanup.
func run(t *testing.T, undo []string, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%v: %v: %s", args, err, out)
	}
	if undo != nil {
		t.Cleanup(func() {
			if out, err := exec.Command(undo[0], undo[1:]...).CombinedOutput(); err != nil {
				t.Errorf("%v: %v: %s", undo, err, out)
			}
		})
	}
}

// group makes sure a group exists (created for the test if the host has
// none of the name) and returns its gid.
func group(t *testing.T, name string) uint32 {
	t.Helper()
	if _, err := user.LookupGroup(name); err != nil {
		run(t, []string{"groupdel", name}, "groupadd", name)
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.ParseUint(g.Gid, 10, 32)
	return uint32(n)
}

// regular creates a regular (non-system) user in groups.
func regular(t *testing.T, name string, groups ...string) {
	t.Helper()
	args := []string{"useradd", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin"}
	if len(groups) > 0 {
		args = append(args, "--groups", strings.Join(groups, ","))
	}
	run(t, []string{"userdel", name}, append(args, name)...)
}

// The rules of peers.users, on real accounts of this host (it needs root:
// it adds users and groups, and removes them after).
func TestPeerUsersResolve(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: it adds users and groups")
	}
	group(t, "docker")
	socket := group(t, "fusiond-t-sock")
	group(t, "fusiond-t-ml")
	regular(t, "fusiond-t-alice", "fusiond-t-sock")
	regular(t, "fusiond-t-bob", "fusiond-t-sock", "docker")
	regular(t, "fusiond-t-carol")
	regular(t, "fusiond-t-dave", "fusiond-t-sock", "fusiond-t-ml")
	run(t, []string{"userdel", "fusiond-t-sys"}, "useradd", "--system", "--no-create-home", "fusiond-t-sys")
	minUID, maxUID := LoginDefsUIDRange("/etc/login.defs")
	base := PeerUsers{SocketGID: &socket, MinUID: minUID, MaxUID: maxUID}
	for _, c := range []struct {
		name   string
		policy func(PeerUsers) PeerUsers
		user   string
		rule   string // "" : accepted
	}{
		{"a regular user who could use the socket", nil, "fusiond-t-alice", ""},
		{"root", nil, "root", RuleRoot},
		{"root, allowed", func(p PeerUsers) PeerUsers { p.AcceptRoot = true; return p }, "root", ""},
		{"a member of docker", nil, "fusiond-t-bob", RuleDenyGroups},
		{"a user outside the socket's group", nil, "fusiond-t-carol", RuleSocketAccess},
		{"a system account", nil, "fusiond-t-sys", RuleSystem},
		{"the system user daemon", nil, "daemon", RuleSystem},
		{"nobody", nil, "nobody", RuleSystem},
		{"a user on the deny list", func(p PeerUsers) PeerUsers { p.Deny = []string{"fusiond-t-alice"}; return p }, "fusiond-t-alice", RuleDeny},
		{"a denied group", func(p PeerUsers) PeerUsers { p.DenyGroups = []string{"fusiond-t-ml"}; return p }, "fusiond-t-dave", RuleDenyGroups},
		{"outside the allow list", func(p PeerUsers) PeerUsers { p.Allow = []string{"fusiond-t-dave"}; return p }, "fusiond-t-alice", RuleAllow},
		{"in an allowed group", func(p PeerUsers) PeerUsers { p.AllowGroups = []string{"fusiond-t-ml"}; return p }, "fusiond-t-dave", ""},
		{"allow never lifts a root-equivalent group", func(p PeerUsers) PeerUsers { p.Allow = []string{"fusiond-t-bob"}; return p }, "fusiond-t-bob", RuleDenyGroups},
		{"no such user", nil, "fusiond-t-nobody-here", RuleUnknownUser},
		{"no user named", nil, "", RuleUnknownUser},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := base
			if c.policy != nil {
				p = c.policy(p)
			}
			o, err := p.Resolve(c.user)
			var ref *Refusal
			switch {
			case c.rule == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.rule == "" && o.User != c.user:
				t.Fatalf("resolved to %+v", o)
			case c.rule != "" && (!errors.As(err, &ref) || ref.Rule != c.rule):
				t.Fatalf("got %+v, %v; want refused by %s", o, err, c.rule)
			}
		})
	}
}

func TestLoginDefsUIDRange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "login.defs")
	if err := os.WriteFile(path, []byte("# comment\nUID_MIN\t\t 500\nUID_MAX 30000\nGID_MIN 500\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if lo, hi := LoginDefsUIDRange(path); lo != 500 || hi != 30000 {
		t.Errorf("got %d…%d, want 500…30000", lo, hi)
	}
	if lo, hi := LoginDefsUIDRange(filepath.Join(t.TempDir(), "none")); lo != 1000 || hi != 60000 {
		t.Errorf("without the file: %d…%d, want 1000…60000", lo, hi)
	}
}

package admission

import (
	"bufio"
	"fmt"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"

	"github.com/fusiond/fusiond/daemon/api"
)

// RootEquivalentGroups are groups whose members can become root, or read
// or write what only root should (raw disks, the container or VM daemon's
// socket, /etc/shadow, every log). A peer never runs a job as one of their
// members, whatever peers.users allows.
var RootEquivalentGroups = []string{
	"root", "sudo", "wheel", "admin", "adm", "docker", "podman", "disk",
	"kmem", "staff", "lxd", "incus-admin", "libvirt", "kvm", "shadow",
	"systemd-journal",
}

// Rule names, as the configuration spells them.
const (
	RuleUnknownUser  = "peers.users"
	RuleRoot         = "peers.accept_root_jobs"
	RuleDeny         = "peers.users.deny"
	RuleSystem       = "peers.users.min_uid"
	RuleDenyGroups   = "peers.users.deny_groups"
	RuleAllow        = "peers.users.allow"
	RuleSocketAccess = "peers.users.require_socket_access"
)

// PeerUsers is the peer policy on identity (the peers.users section): which
// local users a peer's job may run as. A peer only asserts a user name; the
// rules are checked in this order and the first that refuses is named:
// the user must exist here; root only with AcceptRoot; not in Deny; not a
// system account (a uid outside MinUID…MaxUID); in no group of DenyGroups
// nor RootEquivalentGroups; in Allow or AllowGroups when either is set;
// and, with SocketGID, a member of the API socket's group (a user who
// could not submit here locally cannot through a peer).
type PeerUsers struct {
	Allow       []string
	AllowGroups []string
	Deny        []string
	DenyGroups  []string
	// AcceptRoot lets peers run jobs as root (peers.accept_root_jobs).
	AcceptRoot bool
	// MinUID and MaxUID bound the uids of regular users (UID_MIN and
	// UID_MAX of /etc/login.defs by default: 1000 and 60000).
	MinUID, MaxUID uint32
	// SocketGID, when set, is the API socket's group: only its members
	// could use the socket, so only they may be named by a peer.
	SocketGID *uint32
	// Lookup finds a user by name (os/user.Lookup when nil).
	Lookup func(name string) (*user.User, error)
}

// Resolve maps the user name a peer asserts to the owner its job runs as
// here, or refuses it with a *Refusal naming the rule.
func (p PeerUsers) Resolve(name string) (api.Owner, error) {
	lookup := p.Lookup
	if lookup == nil {
		lookup = user.Lookup
	}
	if name == "" {
		return api.Owner{}, &Refusal{RuleUnknownUser, "the offer names no user"}
	}
	u, err := lookup(name)
	if err != nil {
		return api.Owner{}, &Refusal{RuleUnknownUser, fmt.Sprintf("no user %q on this host", name)}
	}
	o, err := OwnerOf(u)
	if err != nil {
		return api.Owner{}, &Refusal{RuleUnknownUser, err.Error()}
	}
	if o.UID == 0 {
		if !p.AcceptRoot {
			return api.Owner{}, &Refusal{RuleRoot, "jobs of root are not accepted from peers here"}
		}
		return o, nil
	}
	if slices.Contains(p.Deny, o.User) {
		return api.Owner{}, &Refusal{RuleDeny, fmt.Sprintf("user %s is on the deny list", o.User)}
	}
	minUID, maxUID := p.MinUID, p.MaxUID
	if minUID == 0 && maxUID == 0 {
		minUID, maxUID = LoginDefsUIDRange("/etc/login.defs")
	}
	if o.UID < minUID || o.UID > maxUID {
		return api.Owner{}, &Refusal{RuleSystem, fmt.Sprintf("user %s (uid %d) is a system account: regular users have uids %d to %d", o.User, o.UID, minUID, maxUID)}
	}
	names, gids := groupsOf(u)
	for _, g := range names {
		if slices.Contains(RootEquivalentGroups, g) {
			return api.Owner{}, &Refusal{RuleDenyGroups, fmt.Sprintf("user %s is in group %s, which is root-equivalent", o.User, g)}
		}
		if slices.Contains(p.DenyGroups, g) {
			return api.Owner{}, &Refusal{RuleDenyGroups, fmt.Sprintf("user %s is in group %s, which is denied", o.User, g)}
		}
	}
	if len(p.Allow) > 0 || len(p.AllowGroups) > 0 {
		ok := slices.Contains(p.Allow, o.User)
		for _, g := range names {
			ok = ok || slices.Contains(p.AllowGroups, g)
		}
		if !ok {
			return api.Owner{}, &Refusal{RuleAllow, fmt.Sprintf("user %s is not allowed: neither listed nor in a listed group", o.User)}
		}
	}
	if p.SocketGID != nil && !slices.Contains(gids, *p.SocketGID) {
		return api.Owner{}, &Refusal{RuleSocketAccess, fmt.Sprintf("user %s could not use the API socket here (not in its group, gid %d)", o.User, *p.SocketGID)}
	}
	return o, nil
}

// groupsOf lists u's groups, primary included, by name and by gid (a group
// without a name is left out of the names).
func groupsOf(u *user.User) (names []string, gids []uint32) {
	ids, _ := u.GroupIds()
	if !slices.Contains(ids, u.Gid) {
		ids = append(ids, u.Gid)
	}
	for _, id := range ids {
		if n, err := strconv.ParseUint(id, 10, 32); err == nil {
			gids = append(gids, uint32(n))
		}
		if g, err := user.LookupGroupId(id); err == nil {
			names = append(names, g.Name)
		}
	}
	return names, gids
}

// OwnerOf maps a user of this host to the job owner it runs as.
func OwnerOf(u *user.User) (api.Owner, error) {
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return api.Owner{}, fmt.Errorf("user %q has no numeric uid/gid here", u.Username)
	}
	o := api.Owner{UID: uint32(uid), GID: uint32(gid), User: u.Username}
	ids, _ := u.GroupIds()
	for _, g := range ids {
		if n, err := strconv.ParseUint(g, 10, 32); err == nil && uint32(n) != o.GID {
			o.Groups = append(o.Groups, uint32(n))
		}
	}
	return o, nil
}

// LoginDefsUIDRange reads UID_MIN and UID_MAX from a login.defs file; a
// missing file or key gives the usual 1000 and 60000.
func LoginDefsUIDRange(path string) (minUID, maxUID uint32) {
	minUID, maxUID = 1000, 60000
	f, err := os.Open(path)
	if err != nil {
		return minUID, maxUID
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 2 {
			continue
		}
		n, err := strconv.ParseUint(fields[1], 10, 32)
		if err != nil {
			continue
		}
		switch fields[0] {
		case "UID_MIN":
			minUID = uint32(n)
		case "UID_MAX":
			maxUID = uint32(n)
		}
	}
	return minUID, maxUID
}

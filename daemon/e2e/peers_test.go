package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// fusionctl runs the built fusionctl without a daemon (cert, keygen).
func fusionctl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := osexec.Command(filepath.Join(binDir, "fusionctl"), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("fusionctl %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// peerPKI makes a test CA, a certificate per node and a gossip keyring
// with fusionctl, as docs/peers.md tells an operator to.
func peerPKI(t testing.TB, dir string, nodes ...string) (keyring string) {
	t.Helper()
	fusionctl(t, "peers", "cert", "ca", "--dir", dir)
	for _, n := range nodes {
		fusionctl(t, "peers", "cert", "node", n, "--dir", dir)
	}
	keyring = filepath.Join(dir, "gossip.keys")
	if err := os.WriteFile(keyring, []byte(fusionctl(t, "peers", "keygen")), 0o600); err != nil {
		t.Fatal(err)
	}
	return keyring
}

// peerConfig is the peers section of a daemon named name, gossiping on
// addr (host:0 takes a port from the kernel) and joining join. The tests'
// jobs run as nobody (uid 65534), which peers.users.max_uid lets peers
// name here (above UID_MAX it is a system account, refused by default:
// TestPeerAttacks).
// acceptRootJobs, appended to peerConfig's section, lets peers run the
// jobs of root that a test submits as root (refused by default).
const acceptRootJobs = "  accept_root_jobs: true\n"

func peerConfig(pki, keyring, name, addr string, join ...string) string {
	host := strings.Split(addr, ":")[0]
	j := ""
	if len(join) > 0 {
		j = fmt.Sprintf("  join: [%s]\n", strings.Join(join, ", "))
	}
	return fmt.Sprintf(`peers:
  enabled: true
  node_name: %s
  gossip: %s
  api: %s:0
  profile: local
  keyring_file: %s
  cert: %s/%s.pem
  key: %s/%s-key.pem
  ca: %s/ca.pem
  broadcast_interval: 100ms
  poll: 100ms
  lease: 4s
  wait_budget: {training: 0s, batch: 0s, inference: 0s, service: 0s}
  users: {max_uid: 65534}
%s`, name, addr, host, keyring, pki, name, pki, name, pki, j)
}

// copyKeyring gives each daemon its own keyring file (keyring changes
// write it back).
func copyKeyring(t *testing.T, src, dir string) string {
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "gossip.keys")
	if err := os.WriteFile(dst, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return dst
}

func peersOf(t *testing.T, c *api.Client) api.PeerList {
	t.Helper()
	l, err := c.Peers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func selfGossip(t *testing.T, c *api.Client) string {
	for _, p := range peersOf(t, c).Peers {
		if p.Self {
			return p.Address
		}
	}
	t.Fatal("the daemon does not list itself among its peers")
	return ""
}

// converged waits until every daemon sees every name alive with a load.
func converged(t *testing.T, clients []*api.Client, names ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, c := range clients {
		for {
			seen := map[string]bool{}
			for _, p := range peersOf(t, c).Peers {
				if p.State == "alive" && p.Load != nil {
					seen[p.Name] = true
				}
			}
			ok := true
			for _, n := range names {
				ok = ok && seen[n]
			}
			if ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("peers did not converge: one daemon sees %v of %v", seen, names)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

var asNobody = &syscall.Credential{Uid: nobody, Gid: nobody}

// TestPeersShareWork runs three daemons on loopback: a and b without
// GPUs, dgx a simulated DGX H200. A GPU job submitted to a runs on dgx as
// the same user; its logs, state and provenance come back through a, and a
// cancel on a stops a job on dgx.
func TestPeersShareWork(t *testing.T) {
	root := publicTempDir(t)
	pki := filepath.Join(root, "pki")
	keyring := peerPKI(t, pki, "a", "b", "dgx")
	for _, n := range []string{"a", "b", "dgx"} {
		os.MkdirAll(filepath.Join(root, n), 0o755)
	}
	da := newDaemon(t, filepath.Join(root, "a"), peerConfig(pki, copyKeyring(t, keyring, root+"/a"), "a", "127.0.0.1:0"))
	da.start()
	ca := da.client()
	seed := selfGossip(t, ca)
	db := newDaemon(t, filepath.Join(root, "b"), peerConfig(pki, copyKeyring(t, keyring, root+"/b"), "b", "127.0.0.1:0", seed))
	ddgx := newDaemon(t, filepath.Join(root, "dgx"), "simulate: dgxh200\n"+peerConfig(pki, copyKeyring(t, keyring, root+"/dgx"), "dgx", "127.0.0.1:0", seed))
	db.start()
	ddgx.start()
	cb, cdgx := db.client(), ddgx.client()
	converged(t, []*api.Client{ca, cb, cdgx}, "a", "b", "dgx")
	for _, p := range peersOf(t, ca).Peers {
		if p.Name == "dgx" && p.Load.GPUs["NVIDIA H200 141GB HBM3e"] != 8 {
			t.Fatalf("a sees dgx's load %+v, want 8 free H200", p.Load)
		}
	}
	// The DGX's power headroom comes from its GPUs' telemetry (the
	// simulated H200s draw 140 W under a 700 W limit): 8 × 560 W once its
	// telemetry has a reading; a host without GPUs measures none.
	deadline := time.Now().Add(15 * time.Second)
	for {
		var dgx, self *api.PeerLoad
		for _, p := range peersOf(t, ca).Peers {
			switch p.Name {
			case "dgx":
				dgx = p.Load
			case "a":
				self = p.Load
			}
		}
		if dgx != nil && dgx.PowerMeasured && dgx.EnergyHeadroomWatts == 8*560 && self != nil && !self.PowerMeasured {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a sees dgx's power headroom as %+v and its own as %+v, want 4480 W measured on dgx, none on a", dgx, self)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if out := da.ctl(nil, "", "peers"); out.code != 0 || !strings.Contains(out.stdout, "dgx") || !strings.Contains(out.stdout, "8 NVIDIA H200") || !strings.Contains(out.stdout, "4480 W") {
		t.Fatalf("fusionctl peers:\n%s%s", out.stdout, out.stderr)
	}
	if out := da.ctl(nil, "", "status"); !strings.Contains(out.stdout, "Peers: a is one of 3 members (3 alive)") {
		t.Fatalf("fusionctl status has no peer summary:\n%s", out.stdout)
	}

	spec := `{"name":"gpu","class":"training","command":["sh","-c","echo hello from $(id -un) on gpus $CUDA_VISIBLE_DEVICES"],
	  "resources":{"cpu":"1","memory":"64Mi","gpu":{"count":1}}}`
	sub := da.ctl(asNobody, spec, "submit", "-q", "-")
	if sub.code != 0 {
		t.Fatalf("submit to a: %s%s", sub.stdout, sub.stderr)
	}
	id := strings.TrimSpace(sub.stdout)
	j := waitFor(t, ca, id, api.StateSucceeded)
	if j.Handover == nil || j.Handover.Peer != "dgx" || j.Handover.RemoteID == "" || !strings.HasPrefix(j.Handover.Key, "a/"+id+"#") {
		t.Fatalf("a's record of the job: handover %+v", j.Handover)
	}
	remote, err := cdgx.Get(context.Background(), j.Handover.RemoteID)
	if err != nil {
		t.Fatal(err)
	}
	if remote.Origin == nil || remote.Origin.Node != "a" || remote.Origin.JobID != id || remote.Owner.User != "nobody" || remote.Owner.UID != 65534 ||
		remote.State != api.StateSucceeded || remote.Allocation == nil || len(remote.Allocation.GPUs) != 1 {
		t.Fatalf("dgx's record of the job: %+v", remote)
	}
	logs := da.ctl(asNobody, "", "logs", id)
	if !strings.Contains(logs.stdout, "hello from nobody on gpus ") {
		t.Fatalf("logs through a: %q %s", logs.stdout, logs.stderr)
	}
	show := da.ctl(asNobody, "", "show", id)
	if !strings.Contains(show.stdout, "to peer dgx (127.0.0.1:") || !strings.Contains(show.stdout, "cannot run on this host") ||
		!strings.Contains(show.stdout, "ranked 1 of 1 by gossiped load (score ") || !strings.Contains(show.stdout, "compute ") {
		t.Fatalf("fusionctl show on a:\n%s", show.stdout)
	}
	js, _ := json.Marshal(j.Events)
	for _, want := range []string{"handed over to peer dgx", "starting on peer dgx", "running on peer dgx", "exit code 0"} {
		if !strings.Contains(string(js), want) {
			t.Errorf("a's events lack %q: %s", want, js)
		}
	}

	// A cancel on the origin stops the job on the peer.
	sub = da.ctl(asNobody, strings.Replace(spec, `echo hello from $(id -un) on gpus $CUDA_VISIBLE_DEVICES`, `echo started; exec sleep 600`, 1), "submit", "-q", "-")
	id2 := strings.TrimSpace(sub.stdout)
	waitFor(t, ca, id2, api.StateRunning)
	if out := da.ctl(asNobody, "", "cancel", id2); out.code != 0 {
		t.Fatalf("cancel on a: %s%s", out.stdout, out.stderr)
	}
	j2 := waitFor(t, ca, id2, api.StateCancelled)
	r2, err := cdgx.Get(context.Background(), j2.Handover.RemoteID)
	if err != nil || r2.State != api.StateCancelled {
		t.Fatalf("dgx's copy after a cancel on a: %s, %v", r2.State, err)
	}
	// Nothing ran twice: dgx holds exactly the two jobs, b none.
	if n := countJobs(t, cdgx); n != 2 {
		t.Errorf("dgx holds %d jobs, want 2", n)
	}
	if n := countJobs(t, cb); n != 0 {
		t.Errorf("b holds %d jobs, want 0", n)
	}
}

func countJobs(t *testing.T, c *api.Client) int {
	t.Helper()
	js, err := c.List(context.Background(), api.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return len(js)
}

// TestPeersCrossHostGang: a gang bigger than any host (two members of 8
// GPUs) submitted to a daemon without GPUs is reserved on two simulated
// DGX peers, one member each, and committed; a gang of three finds room
// for two, so nothing of it starts: the members held are released.
func TestPeersCrossHostGang(t *testing.T) {
	root := publicTempDir(t)
	names := []string{"o", "dgx1", "dgx2"}
	ds, cs := peerDaemons(t, root, names, func(i int, _ string) (string, string) {
		if i > 0 {
			return "simulate: dgxh200\n", acceptRootJobs
		}
		return "", acceptRootJobs
	})
	member := func(gang string, size int) string {
		return fmt.Sprintf(`{"name":%q,"class":"training","command":["sh","-c","echo member on $CUDA_VISIBLE_DEVICES"],
		  "resources":{"cpu":"1","memory":"64Mi","gpu":{"count":8}},"gang":{"name":%q,"size":%d}}`, gang, gang, size)
	}
	var ids []string
	for range 2 {
		r := ds[0].ctl(nil, member("two", 2), "submit", "-q", "-")
		if r.code != 0 {
			t.Fatalf("submit: %s%s", r.stdout, r.stderr)
		}
		ids = append(ids, strings.TrimSpace(r.stdout))
	}
	peersOfGang := map[string]bool{}
	for _, id := range ids {
		j := waitFor(t, cs[0], id, api.StateSucceeded)
		if j.Handover == nil || !strings.Contains(j.Handover.Why, "gang of 2 did not fit here") {
			t.Fatalf("member %s: %+v", id, j.Handover)
		}
		peersOfGang[j.Handover.Peer] = true
	}
	if !peersOfGang["dgx1"] || !peersOfGang["dgx2"] {
		t.Fatalf("the two members ran on %v, want one on each DGX", peersOfGang)
	}

	var three []string
	for range 3 {
		r := ds[0].ctl(nil, member("three", 3), "submit", "-q", "-")
		three = append(three, strings.TrimSpace(r.stdout))
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		j, err := cs[0].Get(context.Background(), three[0])
		if err != nil {
			t.Fatal(err)
		}
		if j.State != api.StatePending {
			t.Fatalf("a member of a gang too big for the peers is %s (%s)", j.State, j.Reason)
		}
		if strings.Contains(j.Reason, "could not be reserved across peers") && strings.Contains(j.Reason, "no peer holds member 3 of 3") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reason: %s", j.Reason)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// What the peers held of it was released, never started.
	released := 0
	for _, c := range cs[1:] {
		for _, j := range listAll(t, c) {
			if j.Spec.Name != "three" {
				continue
			}
			if j.State != api.StateCancelled || j.StartedAt != nil {
				t.Errorf("a held member of the failed gang is %s (started %v)", j.State, j.StartedAt)
			}
			released++
		}
	}
	if released == 0 {
		t.Error("no peer ever held a member of the failed gang")
	}
	for _, id := range three {
		ds[0].ctl(nil, "", "cancel", id)
	}
}

// TestPeersCrossHostGangLastCommitFails: a gang of two 8-GPU members from
// a host without GPUs, one member pinned to an H200 peer and one to an
// A100 peer. The A100 peer grants gang holds of at most 1ns
// (peers.max_gang_hold), so its hold has always ended by the time the
// commit reaches it: the gang's last commit fails, after the first
// member's commit succeeded, the way it does for a holder on a slow link
// or under a slow origin. Nothing of the gang ever runs: no member's
// command (which leaves a marker file) started on any host, no copy was
// ever starting or running, the committed member was released with the
// failed commit as its reason, and the gang waits on the origin.
func TestPeersCrossHostGangLastCommitFails(t *testing.T) {
	root := publicTempDir(t)
	names := []string{"o", "dgx1", "dgxa"}
	ds, cs := peerDaemons(t, root, names, func(_ int, n string) (string, string) {
		switch n {
		case "dgx1":
			return "simulate: dgxh200\n", acceptRootJobs
		case "dgxa":
			return "simulate: dgxa100\n", acceptRootJobs + "  max_gang_hold: 1ns\n"
		}
		return "", acceptRootJobs
	})
	marks := filepath.Join(root, "marks")
	os.MkdirAll(marks, 0o777)
	var ids []string
	for _, model := range []string{"H200", "A100"} {
		spec := fmt.Sprintf(`{"name":"g-%s","class":"training","command":["sh","-c","touch %s/started-%s-$$"],
		  "resources":{"cpu":"1","memory":"64Mi","gpu":{"count":8,"model":%q}},"gang":{"name":"g","size":2}}`, model, marks, model, model)
		r := ds[0].ctl(nil, spec, "submit", "-q", "-")
		if r.code != 0 {
			t.Fatalf("submit: %s%s", r.stdout, r.stderr)
		}
		ids = append(ids, strings.TrimSpace(r.stdout))
	}
	deadline := time.Now().Add(30 * time.Second)
	var reason string
	for {
		j, err := cs[0].Get(context.Background(), ids[0])
		if err != nil {
			t.Fatal(err)
		}
		if j.State != api.StatePending {
			t.Fatalf("a member of a gang whose commit fails is %s (%s)", j.State, j.Reason)
		}
		if strings.Contains(j.Reason, "could not be committed across peers") {
			reason = j.Reason
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reason: %s", j.Reason)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, want := range []string{"the commit of member 2 of 2 on peer dgxa failed", "not committed within 1ns", "no member started, every member was released"} {
		if !strings.Contains(reason, want) {
			t.Errorf("the origin's reason lacks %q: %s", want, reason)
		}
	}
	for _, id := range ids {
		ds[0].ctl(nil, "", "cancel", id) // no further attempts
	}
	time.Sleep(time.Second) // a member that were to start, would have by now

	if m, _ := filepath.Glob(filepath.Join(marks, "started-*")); len(m) != 0 {
		t.Errorf("member commands ran: %v", m)
	}
	copies := map[string]int{}
	for i, c := range cs[1:] {
		host := names[i+1]
		for _, j := range listAll(t, c) {
			copies[host]++
			evs := reasons(j)
			if j.State != api.StateCancelled || j.StartedAt != nil || j.Attempt != 0 ||
				strings.Contains(evs, "starting:") || strings.Contains(evs, "running:") {
				t.Errorf("%s's copy of %s is %s (attempt %d, started %v):\n%s", host, j.Spec.Name, j.State, j.Attempt, j.StartedAt, evs)
			}
			switch host {
			case "dgx1":
				if !strings.Contains(evs, "placed: committed with its gang by origin o") ||
					!strings.Contains(j.Reason, "its gang was aborted by the origin: the commit of member 2 of 2 on peer dgxa failed") {
					t.Errorf("dgx1's member was not committed, then released for the failed commit:\n%s", evs)
				}
			case "dgxa":
				if !strings.Contains(j.Reason, "not committed within 1ns") && !strings.Contains(j.Reason, "the commit of member 2 of 2 on peer dgxa failed") {
					t.Errorf("dgxa's member: %s", j.Reason)
				}
			}
		}
	}
	if copies["dgx1"] == 0 || copies["dgxa"] == 0 {
		t.Fatalf("copies per peer %v: each should have held its member", copies)
	}
}

// peerDaemons starts a daemon per name under root, each a member joining
// the first, with the config lines extra(i, name) gives before and after
// its peers section, and waits until every one sees all.
func peerDaemons(t *testing.T, root string, names []string, extra func(i int, name string) (head, tail string)) ([]*daemon, []*api.Client) {
	t.Helper()
	pki := filepath.Join(root, "pki")
	keyring := peerPKI(t, pki, names...)
	var ds []*daemon
	var cs []*api.Client
	seed := ""
	for i, n := range names {
		dir := filepath.Join(root, n)
		os.MkdirAll(dir, 0o755)
		head, tail := extra(i, n)
		var join []string
		if seed != "" {
			join = []string{seed}
		}
		d := newDaemon(t, dir, head+peerConfig(pki, copyKeyring(t, keyring, dir), n, "127.0.0.1:0", join...)+tail)
		d.start()
		ds, cs = append(ds, d), append(cs, d.client())
		if i == 0 {
			seed = selfGossip(t, cs[0])
		}
	}
	converged(t, cs, names...)
	return ds, cs
}

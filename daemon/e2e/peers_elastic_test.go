package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// TestPeersElasticReplicas: an elastic GPU service (at least 2 replicas)
// submitted to a daemon without GPUs. The elastic job and the replica the
// controller adds are ordinary jobs to the hand-over: both run on the
// simulated DGX peer. The controller counts the replica on the peer (it
// adds no more while the group has its minimum), and when the elastic job
// is cancelled on the origin it cancels the replica there, which reaches
// the peer.
func TestPeersElasticReplicas(t *testing.T) {
	root := publicTempDir(t)
	pki := filepath.Join(root, "pki")
	keyring := peerPKI(t, pki, "o", "dgx")
	for _, n := range []string{"o", "dgx"} {
		os.MkdirAll(filepath.Join(root, n), 0o755)
	}
	do := newDaemon(t, filepath.Join(root, "o"), "elastic: {step: 200ms}\n"+peerConfig(pki, copyKeyring(t, keyring, root+"/o"), "o", "127.0.0.1:0"))
	do.start()
	co := do.client()
	ddgx := newDaemon(t, filepath.Join(root, "dgx"), "simulate: dgxh200\n"+peerConfig(pki, copyKeyring(t, keyring, root+"/dgx"), "dgx", "127.0.0.1:0", selfGossip(t, co)))
	ddgx.start()
	cdgx := ddgx.client()
	converged(t, []*api.Client{co, cdgx}, "o", "dgx")

	spec := `{"name":"web","class":"service","tier":"burstable","command":["sh","-c","echo serving; exec sleep 600"],
	  "resources":{"cpu":"100m","memory":"16Mi","gpu":{"count":1}},
	  "replicas":{"min":2,"max":3,"target":{"metric":"cpu","value":50}}}`
	sub := do.ctl(asNobody, spec, "submit", "-q", "-")
	if sub.code != 0 {
		t.Fatalf("submit to o: %s%s", sub.stdout, sub.stderr)
	}
	leader := strings.TrimSpace(sub.stdout)
	waitFor(t, co, leader, api.StateRunning)
	replicas := func() []api.Job {
		js, err := co.List(context.Background(), api.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []api.Job
		for _, j := range js {
			if j.Spec.Labels[api.LabelReplicaOf] == leader {
				out = append(out, j)
			}
		}
		return out
	}
	var r api.Job
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if rs := replicas(); len(rs) == 1 && rs[0].State == api.StateRunning {
			r = rs[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no running replica of %s on o after 30 s: %+v", leader, replicas())
		}
	}
	if r.Handover == nil || r.Handover.Peer != "dgx" || r.Owner.User != "nobody" || r.Spec.Labels[api.LabelReplica] != "2" {
		t.Fatalf("the replica: handover %+v, owner %+v, labels %v", r.Handover, r.Owner, r.Spec.Labels)
	}
	// Ten controller steps: the replica on the peer counts, so the group
	// stays at its minimum of two.
	time.Sleep(2 * time.Second)
	if rs := replicas(); len(rs) != 1 {
		t.Fatalf("the controller added replicas beyond the minimum: %d", len(rs))
	}
	if out := do.ctl(asNobody, "", "cancel", leader); out.code != 0 {
		t.Fatalf("cancel on o: %s%s", out.stdout, out.stderr)
	}
	rj := waitFor(t, co, r.ID, api.StateCancelled)
	remote, err := cdgx.Get(context.Background(), rj.Handover.RemoteID)
	if err != nil || remote.State != api.StateCancelled {
		t.Fatalf("dgx's copy of the replica after its elastic job was cancelled: %s, %v", remote.State, err)
	}
	if n := countJobs(t, cdgx); n != 2 {
		t.Errorf("dgx holds %d jobs, want 2 (the elastic job and one replica)", n)
	}
}

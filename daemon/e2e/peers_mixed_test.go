package e2e

import (
	"context"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
)

// TestPeersMixedHost: a host without GPUs hands an L4 job and an H100 job
// to its peer of two GPU models (fusiond --simulate mixed), which gossips
// its free GPUs per model: the peer accepts both and runs each on a GPU
// of the model it asked for — what its gossip offered is what its placer
// then does.
func TestPeersMixedHost(t *testing.T) {
	root := publicTempDir(t)
	ds, cs := peerDaemons(t, root, []string{"a", "mix"}, func(i int, _ string) (string, string) {
		if i == 1 {
			return "simulate: mixed\n", ""
		}
		return "", ""
	})
	da, ca, cmix := ds[0], cs[0], cs[1]
	for _, p := range peersOf(t, ca).Peers {
		if p.Name == "mix" && (p.Load.GPUs["NVIDIA L4"] != 2 || p.Load.GPUs["NVIDIA H100 80GB HBM3"] != 1) {
			t.Fatalf("a sees mix's load %+v, want 2 free L4 and 1 free H100", p.Load)
		}
	}
	gl, err := cmix.GPUs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	model := map[string]string{}
	for _, g := range gl.GPUs {
		model[g.UUID] = g.Model
	}
	for _, tc := range []struct{ ask, want string }{{"L4", "NVIDIA L4"}, {"h100", "NVIDIA H100 80GB HBM3"}} {
		spec := `{"name":"` + tc.ask + `","class":"batch","command":["sleep","600"],
		  "resources":{"cpu":"100m","memory":"16Mi","gpu":{"count":1,"model":"` + tc.ask + `"}}}`
		sub := da.ctl(asNobody, spec, "submit", "-q", "-")
		if sub.code != 0 {
			t.Fatalf("submit %s to a: %s%s", tc.ask, sub.stdout, sub.stderr)
		}
		id := strings.TrimSpace(sub.stdout)
		j := waitFor(t, ca, id, api.StateRunning)
		if j.Handover == nil || j.Handover.Peer != "mix" {
			t.Fatalf("%s job on a: handover %+v", tc.ask, j.Handover)
		}
		remote, err := cmix.Get(context.Background(), j.Handover.RemoteID)
		if err != nil {
			t.Fatal(err)
		}
		if remote.Allocation == nil || len(remote.Allocation.GPUs) != 1 || model[remote.Allocation.GPUs[0]] != tc.want {
			t.Fatalf("%s job on mix: allocation %+v, want one %s", tc.ask, remote.Allocation, tc.want)
		}
	}
}

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// TestPeersKilledDuringHandoverBurst hands a burst of 30 GPU jobs from an
// origin without GPUs to a simulated DGX H200 peer and SIGKILLs the peer's
// fusiond mid-burst (its jobs' monitors live on, as they do), then starts
// it again on the same ports. Every job the origin recorded as accepted by
// the peer before the kill, and every other, ends succeeded on the origin
// after exactly one run: nothing acknowledged is lost (a job the peer had
// accepted but not started is forgotten by the restarted peer and placed
// again by its origin), and no job ever ran twice (each job's script
// marks its start and end in a shared file).
func TestPeersKilledDuringHandoverBurst(t *testing.T) {
	root := publicTempDir(t)
	pki := filepath.Join(root, "pki")
	keyring := peerPKI(t, pki, "origin", "dgx")
	marks := filepath.Join(root, "runs.log")
	os.WriteFile(marks, nil, 0o666)
	for _, n := range []string{"origin", "dgx"} {
		os.MkdirAll(filepath.Join(root, n), 0o755)
	}
	do := newDaemon(t, filepath.Join(root, "origin"), peerConfig(pki, copyKeyring(t, keyring, root+"/origin"), "origin", "127.0.0.1:0"))
	do.start()
	co := do.client()
	// The peer's gossip and API ports are fixed, so that its restart
	// answers the origin's polls where the origin follows its jobs.
	gossip, apiPort := freeTCPPort(t), freeTCPPort(t)
	cfg := peerConfig(pki, copyKeyring(t, keyring, root+"/dgx"), "dgx", fmt.Sprintf("127.0.0.1:%d", gossip), selfGossip(t, co))
	cfg = strings.Replace(cfg, "api: 127.0.0.1:0", fmt.Sprintf("api: 127.0.0.1:%d", apiPort), 1)
	ddgx := newDaemon(t, filepath.Join(root, "dgx"), "simulate: dgxh200\n"+cfg+acceptRootJobs)
	ddgx.start()
	cdgx := ddgx.client()
	converged(t, []*api.Client{co, cdgx}, "origin", "dgx")

	script := fmt.Sprintf(`echo "start $JOB $$ $(date +%%s.%%N)" >> %[1]s
sleep 1.5
echo "end $$ $(date +%%s.%%N)" >> %[1]s`, marks)
	const n = 30
	ids := make([]string, n)
	submitted := make(chan error, 1)
	go func() {
		for i := range n {
			spec := fmt.Sprintf(`{"name":"burst-%d","class":"training","command":["sh","-c",%q],"env":{"JOB":"burst-%d"},
			  "resources":{"cpu":"50m","memory":"16Mi","gpu":{"count":1}}}`, i, script, i)
			j, err := co.SubmitJSON(context.Background(), []byte(spec))
			if err != nil {
				submitted <- err
				return
			}
			ids[i] = j.ID
		}
		submitted <- nil
	}()

	// Mid-burst: once the peer has acknowledged a few, one of which the
	// origin saw start there (a started job must survive the kill) and
	// one it has not yet (it may not have started: then the restarted
	// peer forgets it), while the rest are still submitted or offered.
	accepted := func() (map[string]string, int, int) {
		out, started, placed := map[string]string{}, 0, 0
		for _, j := range listAll(t, co) {
			if j.Handover != nil && j.Handover.RemoteID != "" {
				out[j.ID] = j.Handover.RemoteID
				switch j.State {
				case api.StateStarting, api.StateRunning:
					started++
				case api.StatePlaced:
					placed++
				}
			}
		}
		return out, started, placed
	}
	var acked map[string]string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var started, placed int
		if acked, started, placed = accepted(); len(acked) >= 3 && started > 0 && placed > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the peer acknowledged %d hand-overs in 30 s", len(acked))
		}
	}
	ddgx.cmd.Process.Kill()
	<-ddgx.done
	t.Logf("killed the peer's fusiond after %d acknowledged hand-overs", len(acked))
	time.Sleep(500 * time.Millisecond) // offers meanwhile find it gone
	ddgx.start()
	if err := <-submitted; err != nil {
		t.Fatalf("submit: %v", err)
	}

	deadline := time.Now().Add(60 * time.Second)
	for i, id := range ids {
		for {
			j, err := co.Get(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			if j.State == api.StateSucceeded {
				break
			}
			if j.State.Terminal() || time.Now().After(deadline) {
				_, wasAcked := acked[id]
				t.Fatalf("burst-%d (job %s, acknowledged before the kill: %v) is %s:\n%s", i, id, wasAcked, j.State, reasons(j))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	replaced := 0
	for id := range acked {
		j, err := co.Get(context.Background(), id)
		if err == nil && strings.Contains(reasons(j), "queued again") {
			replaced++
		}
	}
	t.Logf("of the %d acknowledged before the kill, %d were forgotten by the restarted peer and placed again", len(acked), replaced)
	rs := runs(t, marks)
	noOverlap(t, rs, 0)
	perJob := map[string][]run{}
	for _, r := range rs {
		perJob[r.id] = append(perJob[r.id], r)
	}
	for i := range n {
		name := fmt.Sprintf("burst-%d", i)
		if got := perJob[name]; len(got) != 1 || got[0].how != "end" {
			t.Errorf("%s (acknowledged before the kill: %v) ran %d times: %+v, want once to its end", name, acked[ids[i]] != "", len(got), got)
		}
	}
	// The peer holds one finished copy of each job, whatever it forgot.
	var done int
	for _, c := range listAll(t, cdgx) {
		if c.State == api.StateSucceeded {
			done++
		}
	}
	if done != n {
		t.Errorf("the restarted peer holds %d succeeded jobs, want %d", done, n)
	}
}

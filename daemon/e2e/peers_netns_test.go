package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// netHosts are network namespaces joined by veth pairs to a bridge in a
// namespace of its own: hosts on 10.213.0.0/24 whose addresses exist only
// inside them. All is removed when the test ends.
type netHosts struct {
	t      testing.TB
	prefix string
	hosts  []string
}

func ip(t testing.TB, args ...string) {
	t.Helper()
	if out, err := osexec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func newNetHosts(t testing.TB, n int) *netHosts {
	b := make([]byte, 3)
	rand.Read(b)
	h := &netHosts{t: t, prefix: "fz" + hex.EncodeToString(b)}
	br := h.prefix + "br"
	ip(t, "netns", "add", br)
	t.Cleanup(func() { h.kill(br); osexec.Command("ip", "netns", "del", br).Run() })
	ip(t, "-n", br, "link", "add", "br0", "type", "bridge")
	ip(t, "-n", br, "link", "set", "br0", "up")
	for i := range n {
		ns := fmt.Sprintf("%s%d", h.prefix, i)
		ip(t, "netns", "add", ns)
		t.Cleanup(func() { h.kill(ns); osexec.Command("ip", "netns", "del", ns).Run() })
		hv, bv := ns+"h", ns+"b"
		ip(t, "link", "add", hv, "address", h.mac(i), "type", "veth", "peer", "name", bv)
		ip(t, "link", "set", hv, "netns", ns)
		ip(t, "link", "set", bv, "netns", br)
		ip(t, "-n", br, "link", "set", bv, "master", "br0", "up")
		ip(t, "-n", ns, "link", "set", hv, "name", "eth0")
		ip(t, "-n", ns, "addr", "add", h.addr(i)+"/24", "dev", "eth0")
		ip(t, "-n", ns, "link", "set", "eth0", "up")
		ip(t, "-n", ns, "link", "set", "lo", "up")
		h.hosts = append(h.hosts, ns)
	}
	// Every host knows every other's MAC address (permanent neighbours,
	// no ARP): the kernel's neighbour table is one for all namespaces
	// and holds at most gc_thresh3 (1024) learnt entries, which 100
	// hosts knowing each other (9,900) overflow. Permanent entries are
	// not counted. A link set down drops them; ARP takes over then.
	for i, ns := range h.hosts {
		var batch strings.Builder
		for j := range n {
			if j != i {
				fmt.Fprintf(&batch, "neigh replace %s lladdr %s dev eth0 nud permanent\n", h.addr(j), h.mac(j))
			}
		}
		cmd := osexec.Command("ip", "-n", ns, "-batch", "-")
		cmd.Stdin = strings.NewReader(batch.String())
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("neighbours of %s: %v\n%s", ns, err, out)
		}
	}
	return h
}

func (h *netHosts) addr(i int) string { return fmt.Sprintf("10.213.0.%d", i+1) }

// mac is host i's MAC address (locally administered).
func (h *netHosts) mac(i int) string {
	return fmt.Sprintf("02:fd:00:00:%02x:%02x", (i+1)>>8, (i+1)&0xff)
}

// kill SIGKILLs every process in namespace ns: the host dies.
func (h *netHosts) kill(ns string) {
	out, _ := osexec.Command("ip", "netns", "pids", ns).Output()
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// run records the starts and ends a job script appended to a file.
type run struct {
	id         string
	start, end float64 // end 0: never ended
	how        string  // end, stop (SIGTERM) or "" (killed)
}

// runs parses lines "start ID PID TIME", "end PID TIME", "stop PID TIME".
func runs(t *testing.T, path string) []run {
	t.Helper()
	data, _ := os.ReadFile(path)
	byPID := map[string]int{}
	var out []run
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 4 && f[0] == "start":
			ts, _ := strconv.ParseFloat(f[3], 64)
			byPID[f[2]] = len(out)
			out = append(out, run{id: f[1], start: ts})
		case len(f) == 3 && (f[0] == "end" || f[0] == "stop"):
			ts, _ := strconv.ParseFloat(f[2], 64)
			if i, ok := byPID[f[1]]; ok {
				out[i].end, out[i].how = ts, f[0]
			}
		}
	}
	return out
}

// noOverlap fails if two runs of one origin job were ever alive at once:
// a run killed with its host counts as alive until killedAt.
func noOverlap(t *testing.T, rs []run, killedAt float64) {
	t.Helper()
	for i, a := range rs {
		for _, b := range rs[i+1:] {
			if a.id != b.id {
				continue
			}
			aEnd := a.end
			if aEnd == 0 {
				aEnd = killedAt
			}
			if b.start < aEnd {
				t.Errorf("job %s ran twice at once: %+v and %+v", a.id, a, b)
			}
		}
	}
}

// TestPeersNetnsFailures runs an origin and two simulated DGX peers on
// hosts of their own (network namespaces). A peer host killed while it
// runs a handed-over job: the origin re-places the job on the other peer
// (its restart policy allows one retry) after the first is lost. A peer
// cut off by a partition stops its copy when its lease ends; the origin
// takes the job back, and places it again when the partition heals. No
// job is lost and no job ever runs twice at once.
func TestPeersNetnsFailures(t *testing.T) {
	net := newNetHosts(t, 3)
	root := publicTempDir(t)
	pki := filepath.Join(root, "pki")
	names := []string{"origin", "p", "q"}
	keyring := peerPKI(t, pki, names...)
	marks := filepath.Join(root, "runs.log")
	os.WriteFile(marks, nil, 0o666)
	seed := net.addr(0) + ":7946"
	ds := make([]*daemon, 3)
	cs := make([]*api.Client, 3)
	for i, n := range names {
		dir := filepath.Join(root, n)
		os.MkdirAll(dir, 0o755)
		extra := ""
		if i > 0 {
			extra = "simulate: dgxh200\n"
		}
		join := []string{seed}
		if i == 0 {
			join = nil
		}
		// Its jobs run as root (they write the run marks): peers must
		// accept root's jobs, which they refuse by default.
		ds[i] = newDaemon(t, dir, extra+peerConfig(pki, copyKeyring(t, keyring, dir), n, net.addr(i)+":7946", join...)+acceptRootJobs)
		ds[i].netns = net.hosts[i]
		ds[i].start()
		cs[i] = ds[i].client()
	}
	converged(t, cs, names...)

	script := fmt.Sprintf(`echo "start $JOB $$ $(date +%%s.%%N)" >> %[1]s
trap 'echo "stop $$ $(date +%%s.%%N)" >> %[1]s; exit 143' TERM
i=0; while [ $i -lt 80 ]; do sleep 0.1; i=$((i+1)); done
echo "end $$ $(date +%%s.%%N)" >> %[1]s`, marks)
	submit := func(name string) string {
		spec := fmt.Sprintf(`{"name":%q,"class":"training","command":["sh","-c",%q],"env":{"JOB":%q},
		  "resources":{"cpu":"500m","memory":"32Mi","gpu":{"count":1}},"restart":{"policy":"on-failure","max_retries":1}}`,
			name, script, name)
		r := ds[0].ctl(nil, spec, "submit", "-q", "-")
		if r.code != 0 {
			t.Fatalf("submit: %s%s", r.stdout, r.stderr)
		}
		return strings.TrimSpace(r.stdout)
	}
	waitOn := func(id string, want api.State, timeout time.Duration) api.Job {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for {
			j, err := cs[0].Get(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			if j.State == want {
				return j
			}
			if j.State.Terminal() || time.Now().After(deadline) {
				t.Fatalf("job %s is %s (%s), want %s", id, j.State, j.Reason, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	index := map[string]int{"p": 1, "q": 2}

	// 1. A peer host dies while it runs the job.
	j1 := submit("killed")
	j := waitOn(j1, api.StateRunning, 30*time.Second)
	first := j.Handover.Peer
	time.Sleep(300 * time.Millisecond) // the script has written its start
	net.kill(net.hosts[index[first]])
	killedAt := float64(time.Now().UnixNano()) / 1e9
	<-ds[index[first]].done
	j = waitOn(j1, api.StateSucceeded, 60*time.Second)
	other := j.Handover.Peer
	if other == first || !strings.Contains(reasons(j), "restarting (retry 1 of 1)") {
		t.Fatalf("after %s died the job went to %s; events:\n%s", first, other, reasons(j))
	}

	// 2. A partition cuts off the peer running the job, then heals.
	j2 := submit("partitioned")
	j = waitOn(j2, api.StateRunning, 30*time.Second)
	if j.Handover.Peer != other {
		t.Fatalf("job 2 went to %s, the only live GPU peer is %s", j.Handover.Peer, other)
	}
	ns := net.hosts[index[other]]
	time.Sleep(300 * time.Millisecond)
	ip(t, "-n", ns, "link", "set", "eth0", "down")
	j = waitOn(j2, api.StatePending, 30*time.Second)
	if !strings.Contains(reasons(j), "unreachable") {
		t.Fatalf("taken back without the peer being unreachable:\n%s", reasons(j))
	}
	ip(t, "-n", ns, "link", "set", "eth0", "up")
	j = waitOn(j2, api.StateSucceeded, 90*time.Second)
	if j.Handover.Peer != other {
		t.Fatalf("after the heal job 2 ran on %s", j.Handover.Peer)
	}
	// The cut-off peer stopped its copy when its lease ended and did not
	// run it again: it holds the stopped copy and the new one.
	copies, err := cs[index[other]].List(context.Background(), api.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var states []string
	for _, c := range copies {
		if c.Spec.Name == "partitioned" {
			states = append(states, string(c.State))
		}
	}
	if strings.Join(states, ",") != "succeeded,cancelled" {
		t.Errorf("the healed peer's copies of job 2: %v (newest first), want succeeded,cancelled", states)
	}

	rs := runs(t, marks)
	noOverlap(t, rs, killedAt)
	ended := map[string]int{}
	for _, r := range rs {
		if r.how == "end" {
			ended[r.id]++
		}
	}
	if len(rs) != 4 || ended["killed"] != 1 || ended["partitioned"] != 1 {
		t.Errorf("runs %+v: want 4 starts and one full run of each job", rs)
	}
	// The dead host reboots: its fusiond finds the job it ran lost and
	// does not run it again.
	ds[index[first]].start()
	for _, c := range listAll(t, ds[index[first]].client()) {
		if c.State != api.StateLost {
			t.Errorf("rebooted peer's copy of %s is %s", c.Spec.Name, c.State)
		}
	}
}

func listAll(t *testing.T, c *api.Client) []api.Job {
	t.Helper()
	js, err := c.List(context.Background(), api.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func reasons(j api.Job) string {
	var out []string
	for _, e := range j.Events {
		out = append(out, string(e.To)+": "+e.Reason)
	}
	return strings.Join(out, "\n")
}

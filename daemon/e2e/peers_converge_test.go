package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/peers"
)

// gossipMemberEnv, set to a memberSpec in JSON, makes the test binary a
// gossip-only member (gossipMember) instead of running tests.
const gossipMemberEnv = "FUSIOND_E2E_GOSSIP_MEMBER"

// memberSpec is one gossip-only member's configuration.
type memberSpec struct {
	Name, Gossip, API      string
	Join                   []string
	Keyring, Cert, Key, CA string
	Watch                  string // the member whose load changes it reports
	Broadcast, Poll        time.Duration
	Profile                string
	CPU                    int64
	// Log, when set, is a file the member logs to (debug).
	Log string
}

// memberHost is a host whose free CPU its controller sets.
type memberHost struct{ cpu atomic.Int64 }

func (h *memberHost) Capacity() api.NodeResources {
	return api.NodeResources{CPU: api.MilliCPU(h.cpu.Load()), Memory: 1 << 30}
}
func (h *memberHost) Allocated() api.NodeResources            { return api.NodeResources{} }
func (h *memberHost) Hardware() hostplacer.Hardware           { return hostplacer.Hardware{} }
func (h *memberHost) LiveLoad() (float64, map[string]float64) { return 0, nil }
func (h *memberHost) PowerHeadroom() map[string]float64       { return nil }

// noJobs is a member without a job manager: an empty queue, and every
// hand-over refused.
type noJobs struct{}

var errGossipOnly = errors.New("a gossip-only member takes no jobs")

func (noJobs) QueueLoad() (int, time.Duration, map[string]int, bool) { return 0, 0, nil, false }
func (noJobs) HeldDevices() map[string]bool                          { return nil }
func (noJobs) Ready() error                                          { return nil }
func (noJobs) AcceptHandover(context.Context, jobs.Offer, api.JobSpec) (api.Job, error) {
	return api.Job{}, errGossipOnly
}
func (noJobs) CommitHeld(string, time.Duration) (bool, error) { return false, errGossipOnly }
func (noJobs) StartCommitted(string) error                    { return errGossipOnly }
func (noJobs) ReleaseHeld(string, string) bool                { return false }
func (noJobs) AcceptedByKey(string) (api.Job, bool)           { return api.Job{}, false }
func (noJobs) Accepted() []api.Job                            { return nil }
func (noJobs) Cancel(context.Context, api.Caller, string) (api.Job, error) {
	return api.Job{}, errGossipOnly
}
func (noJobs) LogPath(api.Caller, string) (string, bool, error) { return "", false, errGossipOnly }

// gossipMember runs a member with the peers package's gossip, as the
// daemon runs it (peers.New, Start), without a job manager. Its stdin
// takes "cpu N" (its free CPU becomes N millicores; the broadcast loop
// notices and gossips it); on stdout it writes "views K" when it holds
// the loads of K members (itself included) and "saw N UNIXNANO" when the
// watched member's load it holds changes to N. EOF on stdin ends it.
func gossipMember(specJSON string) int {
	var s memberSpec
	if err := json.Unmarshal([]byte(specJSON), &s); err != nil {
		fmt.Fprintln(os.Stderr, "member spec:", err)
		return 2
	}
	h := &memberHost{}
	h.cpu.Store(s.CPU)
	log := slog.New(slog.DiscardHandler)
	if s.Log != "" {
		f, err := os.Create(s.Log)
		if err != nil {
			fmt.Fprintln(os.Stderr, "member log:", err)
			return 1
		}
		defer f.Close()
		log = slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	nd, err := peers.New(peers.Config{NodeName: s.Name, Gossip: s.Gossip, API: s.API, Join: s.Join, Profile: s.Profile,
		KeyringFile: s.Keyring, CertFile: s.Cert, KeyFile: s.Key, CAFile: s.CA, Broadcast: s.Broadcast}, noJobs{}, h, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "member:", err)
		return 1
	}
	nd.Start()
	defer nd.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "cpu "); ok {
				if cpu, err := strconv.ParseInt(v, 10, 64); err == nil {
					h.cpu.Store(cpu)
				}
			}
		}
	}()
	out := bufio.NewWriter(os.Stdout)
	views, seen := -1, int64(-1)
	t := time.NewTicker(s.Poll)
	defer t.Stop()
	for {
		select {
		case <-done:
			return 0
		case <-t.C:
		}
		now := time.Now()
		k := 0
		for _, p := range nd.Peers().Peers {
			if p.Load == nil {
				continue
			}
			k++
			if p.Name == s.Watch && int64(p.Load.CPU) != seen {
				seen = int64(p.Load.CPU)
				fmt.Fprintf(out, "saw %d %d\n", seen, now.UnixNano())
			}
		}
		if k != views {
			views = k
			fmt.Fprintf(out, "views %d\n", k)
		}
		out.Flush()
	}
}

// memberEvent is a line a member wrote.
type memberEvent struct {
	member int
	kind   string // views or saw
	value  int64
	at     time.Time
}

// gossipCluster is n gossip-only members, each a process of its own on a
// host (network namespace) of its own.
type gossipCluster struct {
	t      testing.TB
	net    *netHosts
	stdins []io.WriteCloser
	events chan memberEvent
	views  []int64
	// cpu is member 0's free CPU: each change sets a new value.
	cpu int64
}

// newGossipCluster starts n members (LAN profile, the daemon's default,
// broadcast interval 1 s; poll is how often each member looks at its
// views), member 0 the seed and the watched one, and waits until every
// member has held every member's load.
func newGossipCluster(t testing.TB, n int, poll time.Duration) *gossipCluster {
	net := newNetHosts(t, n)
	root := publicTempDir(t)
	pki := filepath.Join(root, "pki")
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("m%03d", i)
	}
	keyring := peerPKI(t, pki, names...)
	c := &gossipCluster{t: t, net: net, events: make(chan memberEvent, 64*n), views: make([]int64, n), cpu: 1000}
	for i, name := range names {
		s := memberSpec{Name: name, Gossip: net.addr(i) + ":7946", API: net.addr(i) + ":7947", Profile: "lan",
			Keyring: keyring, Cert: filepath.Join(pki, name+".pem"), Key: filepath.Join(pki, name+"-key.pem"),
			CA: filepath.Join(pki, "ca.pem"), Watch: names[0], Broadcast: time.Second, Poll: poll, CPU: c.cpu}
		if i > 0 {
			s.Join = []string{net.addr(0) + ":7946"}
		}
		if dir := os.Getenv("FUSIOND_E2E_MEMBER_LOGS"); dir != "" {
			s.Log = filepath.Join(dir, name+".log")
		}
		spec, _ := json.Marshal(s)
		cmd := osexec.Command("nsenter", "--net=/var/run/netns/"+net.hosts[i], filepath.Join(binDir, "e2e.test"))
		// One P per member: a hundred Go runtimes of two Ps each on
		// two cores spend the CPU spinning for work.
		cmd.Env = append(os.Environ(), gossipMemberEnv+"="+string(spec), "GOMAXPROCS=1")
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
		c.stdins = append(c.stdins, stdin)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				if len(f) < 2 {
					continue
				}
				v, _ := strconv.ParseInt(f[1], 10, 64)
				e := memberEvent{member: i, kind: f[0], value: v, at: time.Now()}
				if len(f) == 3 {
					if ns, err := strconv.ParseInt(f[2], 10, 64); err == nil {
						e.at = time.Unix(0, ns)
					}
				}
				c.events <- e
			}
		}()
	}
	// Every member has held every member's load at least once (under
	// load one may drop a member it suspected and take it back).
	deadline := time.After(time.Duration(60+3*n) * time.Second)
	for full := 0; full < n; {
		select {
		case e := <-c.events:
			if e.kind != "views" || c.views[e.member] == int64(n) {
				continue
			}
			c.views[e.member] = e.value
			if e.value == int64(n) {
				full++
			}
		case <-deadline:
			t.Fatalf("the %d members did not all hold every load; views per member: %v", n, c.views)
		}
	}
	return c
}

// change sets member 0's free CPU to a new value and returns, for every other
// member, how long until it held the change (from the moment the host's
// load changed: the broadcast loop notices it within a tenth of its
// interval).
func (c *gossipCluster) change(timeout time.Duration) ([]time.Duration, error) {
	c.cpu++
	cpu := c.cpu
	t0 := time.Now()
	if _, err := fmt.Fprintf(c.stdins[0], "cpu %d\n", cpu); err != nil {
		return nil, err
	}
	n := len(c.stdins)
	took := make([]time.Duration, n)
	left := n - 1
	deadline := time.After(timeout)
	for left > 0 {
		select {
		case e := <-c.events:
			if e.kind == "saw" && e.value == cpu && e.member != 0 && took[e.member] == 0 {
				took[e.member] = max(e.at.Sub(t0), time.Nanosecond)
				left--
			}
		case <-deadline:
			var missing []int
			for i := 1; i < n; i++ {
				if took[i] == 0 {
					missing = append(missing, i)
				}
			}
			return nil, fmt.Errorf("load change to %d reached %d of %d members in %s; missing %v", cpu, n-1-left, n-1, timeout, missing)
		}
	}
	return took[1:], nil
}

// sentBytes is what each member's host sent (the bridge's end of its
// veth received): gossip, probes, push/pull, key fetches, all of it.
func (c *gossipCluster) sentBytes() int64 {
	out, err := osexec.Command("ip", "-n", c.net.prefix+"br", "-s", "-j", "link", "show").Output()
	if err != nil {
		c.t.Fatalf("link statistics: %v", err)
	}
	var links []struct {
		Ifname string `json:"ifname"`
		Stats  struct {
			RX struct {
				Bytes int64 `json:"bytes"`
			} `json:"rx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal(out, &links); err != nil {
		c.t.Fatalf("link statistics: %v", err)
	}
	var sum int64
	for _, l := range links {
		if strings.HasPrefix(l.Ifname, c.net.prefix) && strings.HasSuffix(l.Ifname, "b") {
			sum += l.Stats.RX.Bytes
		}
	}
	return sum
}

// convergence makes changes load changes of member 0, each a quiet
// broadcast interval after the last reached everyone, and returns the
// time each took to reach every member, every member's arrival times,
// and the bytes each member's host sent per second meanwhile.
func (c *gossipCluster) convergence(changes int, timeout time.Duration) (all, each []time.Duration, perMember float64, err error) {
	b0, t0 := c.sentBytes(), time.Now()
	for range changes {
		time.Sleep(1100 * time.Millisecond)
		took, err := c.change(timeout)
		if err != nil {
			return nil, nil, 0, err
		}
		each = append(each, took...)
		all = append(all, slices.Max(took))
	}
	perMember = float64(c.sentBytes()-b0) / time.Since(t0).Seconds() / float64(len(c.stdins))
	slices.Sort(all)
	slices.Sort(each)
	return all, each, perMember, nil
}

// quantile is the q-quantile (nearest rank) of sorted ds.
func quantile(ds []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(ds))+0.5) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

func loadAverage() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// TestPeersNetnsTen runs ten gossip-only members (the peers package's
// gossip, as the daemon runs it), each a process on a host (network
// namespace) of its own, joined by a bridge: every member comes to hold
// every member's load, and each of three load changes of one member
// reaches all the others. How fast is BenchmarkPeersNetnsConvergence's.
func TestPeersNetnsTen(t *testing.T) {
	c := newGossipCluster(t, 10, 20*time.Millisecond)
	all, each, perMember, err := c.convergence(3, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(each) != 3*9 {
		t.Fatalf("%d arrivals, want 27", len(each))
	}
	t.Logf("FIGURE netns 10 members: change reached all p50 %v max %v; per member p50 %v; %.0f B/s sent per member (load average %s)",
		quantile(all, 0.5), all[len(all)-1], quantile(each, 0.5), perMember, loadAverage())
}

// BenchmarkPeersNetnsConvergence measures, for 10 and 100 gossip-only
// members in processes of their own, each on a network namespace of its
// own (LAN profile, broadcast interval 1 s), how long a load change of
// one member takes to reach every member (from the change of the host's
// load; each op one change, a quiet interval after the last), and the
// bytes each member's host sent per second (everything on its link:
// gossip, probes, push/pull, key fetches). Each member looks at its
// views every 20 ms (10 members) or 50 ms (100: the looking costs CPU),
// so the times are up to that late.
//
//	go test -run '^$' -bench PeersNetnsConvergence -benchtime 20x ./daemon/e2e/
func BenchmarkPeersNetnsConvergence(b *testing.B) {
	outer := b
	clusters := map[int]*gossipCluster{}
	for _, n := range []int{10, 100} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			// One cluster for the benchmark's probe run (b.N 1) and
			// the measured one, removed when the benchmark ends.
			c := clusters[n]
			if c == nil {
				c = newGossipCluster(cleanupBy{b, outer}, n, poll(n))
				clusters[n] = c
			}
			c.t = b
			b.ResetTimer()
			all, each, perMember, err := c.convergence(b.N, 30*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			b.ReportMetric(float64(quantile(all, 0.5).Milliseconds()), "ms-p50")
			b.ReportMetric(float64(quantile(all, 0.99).Milliseconds()), "ms-p99")
			b.ReportMetric(float64(quantile(each, 0.5).Milliseconds()), "ms-member-p50")
			b.ReportMetric(float64(quantile(each, 0.99).Milliseconds()), "ms-member-p99")
			b.ReportMetric(perMember, "B/s/member")
			b.Logf("load average %s", loadAverage())
		})
	}
}

// cleanupBy is tb whose cleanups run when owner ends.
type cleanupBy struct {
	testing.TB
	owner testing.TB
}

func (c cleanupBy) Cleanup(f func()) { c.owner.Cleanup(f) }

func poll(members int) time.Duration {
	if members > 10 {
		return 50 * time.Millisecond
	}
	return 20 * time.Millisecond
}

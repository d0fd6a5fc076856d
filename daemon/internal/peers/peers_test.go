package peers

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/admission"
	"github.com/fusiond/fusiond/daemon/internal/handover"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/devices"
)

// testCA issues peer certificates in a directory.
type testCA struct {
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTestCA(t testing.TB, dir string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "ca.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	return &testCA{dir: dir, cert: cert, key: key}
}

// issue writes NAME.pem and NAME-key.pem and returns their paths.
func (ca *testCA) issue(t testing.TB, name string) (string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	c, k := filepath.Join(ca.dir, name+".pem"), filepath.Join(ca.dir, name+"-key.pem")
	os.WriteFile(c, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	os.WriteFile(k, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600)
	return c, k
}

// fakeHost is a host with fixed capacity and GPUs.
type fakeHost struct {
	cpu  api.MilliCPU
	gpus []devices.Device
	// nvlink joins GPUs; gpuLoad is every GPU's live load.
	nvlink  [][2]int
	gpuLoad float64
	// headroom is each GPU's measured power headroom (watts, by ID).
	headroom map[string]float64
}

func (h *fakeHost) PowerHeadroom() map[string]float64 { return h.headroom }

func (h *fakeHost) Capacity() api.NodeResources {
	return api.NodeResources{CPU: h.cpu, Memory: 64 << 30, GPUs: len(h.gpus)}
}
func (h *fakeHost) Allocated() api.NodeResources { return api.NodeResources{} }
func (h *fakeHost) Hardware() hostplacer.Hardware {
	return hostplacer.Hardware{CPU: h.cpu, Memory: 64 << 30, GPUs: h.gpus, NVLink: h.nvlink}
}
func (h *fakeHost) LiveLoad() (float64, map[string]float64) {
	gpus := map[string]float64{}
	for _, g := range h.gpus {
		gpus[g.ID] = h.gpuLoad
	}
	return 0, gpus
}

// fakeJobs accepts or refuses offers and records what it was asked.
type fakeJobs struct {
	mu          sync.Mutex
	heldDevices map[string]bool
	// shares are the milli-GPU held on shared GPUs, by device ID.
	shares   map[string]int
	refuse   string
	accepted map[string]*api.Job
	offers   int
	cancels  []string
	// held, committed, started, released: gang member keys; barriers the
	// barrier of each commit; whys each release's reason.
	held, committed, started, released []string
	barriers                           []time.Duration
	whys                               []string
	// noBarrier answers commits as a peer that predates the start
	// barrier: started at once.
	noBarrier bool
}

func (f *fakeJobs) CommitHeld(key string, barrier time.Duration) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	j, ok := f.accepted[key]
	if !ok || j.State != api.StatePlaced || slices.Contains(f.committed, key) {
		return false, errors.New("not held")
	}
	f.committed = append(f.committed, key)
	f.barriers = append(f.barriers, barrier)
	if barrier == 0 || f.noBarrier {
		j.State = api.StateRunning
		f.started = append(f.started, key)
		return true, nil
	}
	return false, nil
}

func (f *fakeJobs) StartCommitted(key string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	j, ok := f.accepted[key]
	if !ok || j.State != api.StatePlaced || !slices.Contains(f.committed, key) {
		return errors.New("not committed")
	}
	j.State = api.StateRunning
	f.started = append(f.started, key)
	return nil
}

func (f *fakeJobs) ReleaseHeld(key, why string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	j, ok := f.accepted[key]
	if !ok || j.State != api.StatePlaced {
		return false
	}
	j.State = api.StateCancelled
	f.released = append(f.released, key)
	f.whys = append(f.whys, why)
	return true
}

func newFakeJobs() *fakeJobs { return &fakeJobs{accepted: map[string]*api.Job{}} }

func (f *fakeJobs) QueueLoad() (int, time.Duration, map[string]int, bool) {
	return 0, 0, f.shares, false
}
func (f *fakeJobs) HeldDevices() map[string]bool { return f.heldDevices }
func (f *fakeJobs) Ready() error                 { return nil }
func (f *fakeJobs) AcceptHandover(_ context.Context, offer jobs.Offer, spec api.JobSpec) (api.Job, error) {
	from, user, hold := offer.From, offer.User, offer.Hold
	f.mu.Lock()
	defer f.mu.Unlock()
	f.offers++
	if hold > 0 {
		if f.refuse != "" {
			return api.Job{}, &admission.Refusal{Rule: "test", Why: f.refuse}
		}
		o := from
		j := &api.Job{ID: fmt.Sprint(len(f.accepted) + 1), Spec: spec, State: api.StatePlaced, Origin: &o}
		f.accepted[from.Key] = j
		f.held = append(f.held, from.Key)
		return *j, nil
	}
	if f.refuse != "" {
		return api.Job{}, &admission.Refusal{Rule: "test", Why: f.refuse}
	}
	if j, ok := f.accepted[from.Key]; ok {
		return *j, nil
	}
	o := from
	j := &api.Job{ID: fmt.Sprint(len(f.accepted) + 1), Spec: spec, State: api.StateRunning, Origin: &o, Owner: api.Owner{User: user}}
	f.accepted[from.Key] = j
	return *j, nil
}
func (f *fakeJobs) AcceptedByKey(key string) (api.Job, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	j, ok := f.accepted[key]
	if !ok {
		return api.Job{}, false
	}
	return *j, true
}
func (f *fakeJobs) Accepted() []api.Job {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []api.Job
	for _, j := range f.accepted {
		if !j.State.Terminal() {
			out = append(out, *j)
		}
	}
	return out
}
func (f *fakeJobs) Cancel(_ context.Context, c api.Caller, id string) (api.Job, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, j := range f.accepted {
		if j.ID == id {
			j.State = api.StateCancelled
			f.cancels = append(f.cancels, c.User)
			return *j, nil
		}
	}
	return api.Job{}, api.Errorf(api.CodeNotFound, "no job %q", id)
}
func (f *fakeJobs) LogPath(api.Caller, string) (string, bool, error) {
	return "", false, errors.New("no logs")
}

type cluster struct {
	// lease is the nodes' lease (500ms when 0); maxGangHold the
	// MaxGangHold of the nodes started after it is set.
	lease, maxGangHold time.Duration
	t                  *testing.T
	ca                 *testCA
	nodes              []*Node
	jobs               []*fakeJobs
}

func key(b byte) string {
	return base64.StdEncoding.EncodeToString([]byte(strings.Repeat(string(b), 32)))
}

// start makes a node named name on loopback, with keyring keys (none: no
// encryption) and joining join.
func (c *cluster) start(name string, host *fakeHost, keys []string, join ...string) *Node {
	c.t.Helper()
	n := c.add(name, host, keys, join...)
	n.Start()
	return n
}

// add is start without Start (a test changes the node first).
func (c *cluster) add(name string, host Host, keys []string, join ...string) *Node {
	c.t.Helper()
	cert, k := c.ca.issue(c.t, name)
	cfg := Config{NodeName: name, Gossip: "127.0.0.1:0", API: "127.0.0.1:0", Join: join, Profile: "local",
		CertFile: cert, KeyFile: k, CAFile: filepath.Join(c.ca.dir, "ca.pem"),
		Broadcast: 50 * time.Millisecond, Lease: cmpOr2(c.lease, 500*time.Millisecond), MaxGangHold: c.maxGangHold}
	if keys != nil {
		cfg.KeyringFile = filepath.Join(c.ca.dir, name+".keyring")
		os.WriteFile(cfg.KeyringFile, []byte(strings.Join(keys, "\n")+"\n"), 0o600)
	} else {
		cfg.InsecureGossip = true
	}
	j := newFakeJobs()
	n, err := New(cfg, j, host, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(n.Close)
	c.nodes = append(c.nodes, n)
	c.jobs = append(c.jobs, j)
	return n
}

func cmpOr2(a, b time.Duration) time.Duration {
	if a != 0 {
		return a
	}
	return b
}

func newCluster(t *testing.T) *cluster {
	return &cluster{t: t, ca: newTestCA(t, t.TempDir())}
}

// eventually polls cond for up to 30 s. A passing run takes a second or
// two; the margin is for a loaded CI host, where memberlist's local
// profile (500 ms probe timeouts) may hold a member suspect for seconds
// (not seen here), and a 10 s bound failed a 4-member join once there.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func loads(n *Node) map[string]*api.PeerLoad {
	out := map[string]*api.PeerLoad{}
	for _, p := range n.Peers().Peers {
		if p.State == "alive" && p.Load != nil {
			out[p.Name] = p.Load
		}
	}
	return out
}

func TestMembersConvergeOnLoad(t *testing.T) {
	c := newCluster(t)
	h100 := []devices.Device{{ID: "GPU-a", Kind: devices.GPU, Model: "NVIDIA H100", Health: devices.Health{Healthy: true}},
		{ID: "GPU-b", Kind: devices.GPU, Model: "NVIDIA H100", Health: devices.Health{Healthy: true}}}
	a := c.start("a", &fakeHost{cpu: 4000}, nil)
	c.start("b", &fakeHost{cpu: 8000, gpus: h100}, nil, a.GossipAddr())
	c.start("c", &fakeHost{cpu: 2000}, nil, a.GossipAddr())
	for _, n := range c.nodes {
		eventually(t, n.cfg.NodeName+" to see 3 loads", func() bool { return len(loads(n)) == 3 })
		l := loads(n)
		if l["b"].CPU != 8000 || l["b"].GPUs["NVIDIA H100"] != 2 || l["c"].CPU != 2000 || l["a"].GPUs != nil {
			t.Fatalf("%s sees loads a=%+v b=%+v c=%+v", n.cfg.NodeName, l["a"], l["b"], l["c"])
		}
		for _, p := range n.Peers().Peers {
			if p.APIAddress == "" || time.Duration(p.Age) > 5*time.Second {
				t.Errorf("%s's view of %s: api %q, age %v", n.cfg.NodeName, p.Name, p.APIAddress, time.Duration(p.Age))
			}
		}
	}
}

func TestWrongGossipKeyIsRefused(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", &fakeHost{cpu: 1000}, []string{key('k')})
	c.start("b", &fakeHost{cpu: 1000}, []string{key('k')}, a.GossipAddr())
	eventually(t, "a and b to join", func() bool { return len(loads(a)) == 2 })
	x := c.start("x", &fakeHost{cpu: 1000}, []string{key('w')})
	if _, err := x.ml.Join([]string{a.GossipAddr()}); err == nil {
		t.Fatal("a member with the wrong gossip key joined")
	}
	plain := c.start("p", &fakeHost{cpu: 1000}, nil)
	if _, err := plain.ml.Join([]string{a.GossipAddr()}); err == nil {
		t.Fatal("a member without encryption joined an encrypted cluster")
	}
	time.Sleep(300 * time.Millisecond)
	for name := range loads(a) {
		if name == "x" || name == "p" {
			t.Fatalf("a sees %s's load", name)
		}
	}
}

func TestKeyringRotation(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", &fakeHost{cpu: 1000}, []string{key('1')})
	b := c.start("b", &fakeHost{cpu: 1000}, []string{key('1')}, a.GossipAddr())
	eventually(t, "join", func() bool { return len(loads(b)) == 2 })
	for _, op := range []api.KeyringRequest{{Op: "install", Key: key('2')}, {Op: "use", Key: key('2')}, {Op: "remove", Key: key('1')}} {
		for _, n := range []*Node{a, b} {
			if _, err := n.Keyring(op); err != nil {
				t.Fatalf("%s %s: %v", n.cfg.NodeName, op.Op, err)
			}
		}
	}
	if _, err := a.Keyring(api.KeyringRequest{Op: "remove", Key: key('2')}); err == nil {
		t.Error("removing the primary key worked")
	}
	want := []string{fingerprint([]byte(strings.Repeat("2", 32)))}
	if got := a.Peers().Keys; len(got) != 1 || got[0] != want[0] {
		t.Fatalf("keys after rotation %v, want %v", got, want)
	}
	keys, err := readKeyring(a.cfg.KeyringFile)
	if err != nil || len(keys) != 1 || string(keys[0]) != strings.Repeat("2", 32) {
		t.Fatalf("keyring file after rotation: %q, %v", keys, err)
	}
	// Gossip still flows under the new key, and a member holding only
	// the old one is refused.
	before := loads(b)["a"]
	_ = before
	seq := func() uint64 {
		for _, p := range b.Peers().Peers {
			if p.Name == "a" {
				return p.Seq
			}
		}
		return 0
	}
	s0 := seq()
	eventually(t, "a's load under the new key", func() bool { return seq() > s0+2 })
	old := c.start("old", &fakeHost{cpu: 1000}, []string{key('1')})
	if _, err := old.ml.Join([]string{a.GossipAddr()}); err == nil {
		t.Fatal("a member with the rotated-out key joined")
	}
}

// peerClient is an HTTPS client with the given certificate (none: no
// client certificate) trusting ca.
func peerClient(t *testing.T, caFile, cert, key, server string) *http.Client {
	pemCA, _ := os.ReadFile(caFile)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pemCA)
	cfg := &tls.Config{RootCAs: pool, ServerName: server}
	if cert != "" {
		kp, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{kp}
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 5 * time.Second}
}

func TestPeerAPIRefusesMissingOrWrongCertificates(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", &fakeHost{cpu: 1000}, nil)
	caFile := filepath.Join(c.ca.dir, "ca.pem")
	url := "https://" + a.APIAddr() + "/peer/v1/handover?key=b/1%231&offset=0"

	if _, err := peerClient(t, caFile, "", "", "a").Get(url); err == nil {
		t.Error("a client without a certificate was answered")
	}
	other := newTestCA(t, t.TempDir())
	oc, ok := other.issue(t, "b")
	if _, err := peerClient(t, caFile, oc, ok, "a").Get(url); err == nil {
		t.Error("a client with another CA's certificate was answered")
	}
	gc, gk := c.ca.issue(t, "b")
	resp, err := peerClient(t, caFile, gc, gk, "a").Get(url)
	if err != nil {
		t.Fatalf("a client with a good certificate: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("poll of an unknown key: %s, want 404", resp.Status)
	}
	// An offer of another node's job is refused.
	body := strings.NewReader(`{"key":"c/1#1","job_id":"1","user":"root","spec":{"name":"x","class":"batch","command":["true"],"resources":{"cpu":"1","memory":"1Mi"}}}`)
	resp, err = peerClient(t, caFile, gc, gk, "a").Post("https://"+a.APIAddr()+"/peer/v1/offers", "application/json", body)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || c.jobs[0].offers != 0 {
		t.Errorf("offer of another node's key: %s, %d offers reached the jobs", resp.Status, c.jobs[0].offers)
	}
	// The client checks the server's name: a's certificate does not
	// name "z".
	if _, err := peerClient(t, caFile, gc, gk, "z").Get(url); err == nil {
		t.Error("a server certificate for another name was accepted")
	}
}

func gpuSpec() api.JobSpec {
	return api.JobSpec{Name: "train", Class: api.ClassTraining, Command: []string{"true"},
		Resources: api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 1, Model: "h100"}}}
}

func TestOfferRanksTriesNextAndIsIdempotent(t *testing.T) {
	c := newCluster(t)
	one := []devices.Device{{ID: "GPU-1", Kind: devices.GPU, Model: "NVIDIA H100", Health: devices.Health{Healthy: true}}}
	two := append(one, devices.Device{ID: "GPU-2", Kind: devices.GPU, Model: "NVIDIA H100", Health: devices.Health{Healthy: true}})
	a := c.start("a", &fakeHost{cpu: 4000}, nil)
	c.start("b", &fakeHost{cpu: 8000, gpus: two}, nil, a.GossipAddr())
	c.start("c", &fakeHost{cpu: 8000, gpus: one}, nil, a.GossipAddr()) // ranked first: the engine packs (fragmentation)
	c.start("d", &fakeHost{cpu: 8000}, nil, a.GossipAddr())            // no GPU: never offered
	eventually(t, "loads", func() bool { return len(loads(a)) == 4 })
	c.jobs[2].refuse = "no room after all"
	drawWith(a, constSource(0)) // the spread choice keeps rank order (TestOfferWalksTheSpreadOrder)
	job := api.Job{ID: "7", Spec: gpuSpec(), Owner: api.Owner{User: "root"}}
	h, err := a.Offer(context.Background(), "7#2", job)
	if err != nil {
		t.Fatal(err)
	}
	if h.Peer != "b" || h.RemoteID == "" || h.Key != "a/7#2" || !strings.Contains(h.Why, "c refused (no room after all (test))") ||
		!strings.Contains(h.Why, "fragmentation") {
		t.Fatalf("handover %+v", h)
	}
	if c.jobs[1].offers != 1 || c.jobs[2].offers != 1 || c.jobs[3].offers != 0 {
		t.Fatalf("offers reached b %d, c %d, d %d times", c.jobs[1].offers, c.jobs[2].offers, c.jobs[3].offers)
	}
	again, err := a.Offer(context.Background(), "7#2", job)
	if err != nil || again.RemoteID != h.RemoteID || len(c.jobs[1].accepted) != 1 {
		t.Fatalf("the same key offered again: %+v, %v; b holds %d jobs", again, err, len(c.jobs[1].accepted))
	}
	st, err := a.Poll(context.Background(), h, 0)
	if err != nil || st.ID != h.RemoteID || st.State != api.StateRunning {
		t.Fatalf("poll: %+v, %v", st, err)
	}
	if err := a.Cancel(context.Background(), h); err != nil {
		t.Fatal(err)
	}
	if st, _ := a.Poll(context.Background(), h, 0); st.State != api.StateCancelled {
		t.Fatalf("after cancel the peer reports %s", st.State)
	}
	if _, err := a.Poll(context.Background(), api.Handover{Key: "a/9#1", Peer: "b", Address: h.Address}, 0); !errors.Is(err, handover.ErrRemoteGone) {
		t.Fatalf("poll of a key the peer never had: %v", err)
	}
	c.jobs[1].refuse = "full"
	if _, err := a.Offer(context.Background(), "8#2", api.Job{ID: "8", Spec: gpuSpec()}); err == nil ||
		!strings.Contains(err.Error(), "c refused") || !strings.Contains(err.Error(), "b refused (full (test))") {
		t.Fatalf("every peer refusing: %v", err)
	}
}

func TestLeaseStopsJobsTheOriginStopsPolling(t *testing.T) {
	c := newCluster(t)
	c.lease = 2 * time.Second // polls 200ms apart keep it even on a loaded machine
	a := c.start("a", &fakeHost{cpu: 4000}, nil)
	c.start("b", &fakeHost{cpu: 8000}, nil, a.GossipAddr())
	eventually(t, "loads", func() bool { return len(loads(a)) == 2 })
	spec := api.JobSpec{Name: "x", Class: api.ClassBatch, Command: []string{"true"}, Resources: api.Resources{CPU: 1000, Memory: 1 << 20}}
	h, err := a.Offer(context.Background(), "1#1", api.Job{ID: "1", Spec: spec, Owner: api.Owner{User: "root"}})
	if err != nil {
		t.Fatal(err)
	}
	// Polled: the lease (2s) holds.
	for range 15 {
		if _, err := a.Poll(context.Background(), h, 0); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if j, _ := c.jobs[1].AcceptedByKey(h.Key); j.State != api.StateRunning {
		t.Fatalf("a polled job is %s", j.State)
	}
	eventually(t, "the unpolled job to be stopped", func() bool {
		j, _ := c.jobs[1].AcceptedByKey(h.Key)
		return j.State == api.StateCancelled
	})
	if cs := c.jobs[1].cancels; len(cs) != 1 || !strings.Contains(cs[0], "lease: origin a silent") {
		t.Fatalf("cancels %q", cs)
	}
}

func TestGangReservedAcrossPeersAllOrNothing(t *testing.T) {
	c := newCluster(t)
	gpu := func(id string) devices.Device {
		return devices.Device{ID: id, Kind: devices.GPU, Model: "NVIDIA H100", Health: devices.Health{Healthy: true}}
	}
	a := c.start("a", &fakeHost{cpu: 4000}, nil)
	c.start("b", &fakeHost{cpu: 8000, gpus: []devices.Device{gpu("b1")}}, nil, a.GossipAddr())
	c.start("c", &fakeHost{cpu: 8000, gpus: []devices.Device{gpu("c1")}}, nil, a.GossipAddr())
	eventually(t, "loads", func() bool { return len(loads(a)) == 3 })
	member := func(id string) api.Job { return api.Job{ID: id, Spec: gpuSpec(), Owner: api.Owner{User: "root"}} }
	hs, err := a.ReserveGang(context.Background(), []string{"1#1", "2#1"}, []api.Job{member("1"), member("2")})
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 2 || hs[0].Peer == hs[1].Peer {
		t.Fatalf("gang of two one-GPU members on two one-GPU peers: %+v", hs)
	}
	if len(c.jobs[1].held)+len(c.jobs[2].held) != 2 || len(c.jobs[1].committed)+len(c.jobs[2].committed) != 0 {
		t.Fatal("members not held, or started before the commit")
	}
	// Commit: each peer keeps its member for the start barrier, unstarted.
	for _, h := range hs {
		started, err := a.CommitMember(context.Background(), h)
		if err != nil || started {
			t.Fatalf("commit on %s: started %v, %v", h.Peer, started, err)
		}
	}
	for _, f := range c.jobs[1:] {
		if len(f.committed) != 1 || len(f.started) != 0 || f.barriers[0] != gangBarrier {
			t.Fatalf("after the commits: committed %v, started %v, barriers %v", f.committed, f.started, f.barriers)
		}
	}
	for _, h := range hs {
		if err := a.StartMember(context.Background(), h); err != nil {
			t.Fatalf("start on %s: %v", h.Peer, err)
		}
	}
	if len(c.jobs[1].started) != 1 || len(c.jobs[2].started) != 1 {
		t.Fatalf("started b %v, c %v", c.jobs[1].started, c.jobs[2].started)
	}
	// Three members, room for two (by the gossip, which still shows the
	// fake peers' GPUs free): the third finds no peer, and the two held
	// are released.
	c.jobs[2].refuse = "no GPU left"
	_, err = a.ReserveGang(context.Background(), []string{"3#1", "4#1", "5#1"}, []api.Job{member("3"), member("4"), member("5")})
	if err == nil || !strings.Contains(err.Error(), "no peer holds member") {
		t.Fatalf("a gang too big: %v", err)
	}
	released := len(c.jobs[1].released) + len(c.jobs[2].released)
	held := len(c.jobs[1].held) + len(c.jobs[2].held) - 2
	if held == 0 || released != held {
		t.Fatalf("held %d members of the failed gang, released %d", held, released)
	}
	for _, f := range c.jobs[1:] {
		for _, why := range f.whys {
			if !strings.Contains(why, "its gang could not be reserved: no peer holds member ") || !strings.HasSuffix(why, "(origin a)") {
				t.Errorf("release reason %q", why)
			}
		}
	}
}

// The wire of the start barrier: a commit carries the barrier (capped by
// the peer's MaxGangHold) and is answered 202 (committed, not started); a
// peer that predates the barrier starts the member at its commit (204),
// which CommitMember reports; a release carries the origin's reason.
func TestGangCommitStartWire(t *testing.T) {
	c := newCluster(t)
	gpu := devices.Device{ID: "b1", Kind: devices.GPU, Model: "NVIDIA H100", Health: devices.Health{Healthy: true}}
	a := c.start("a", &fakeHost{cpu: 4000}, nil)
	c.maxGangHold = 3 * time.Second // b's cap: the barrier asked is 10s
	c.start("b", &fakeHost{cpu: 8000, gpus: []devices.Device{gpu}}, nil, a.GossipAddr())
	eventually(t, "loads", func() bool { return len(loads(a)) == 2 })
	fb := c.jobs[1]
	member := func(id string) api.Job { return api.Job{ID: id, Spec: gpuSpec(), Owner: api.Owner{User: "root"}} }
	reserve := func(local string) api.Handover {
		t.Helper()
		hs, err := a.ReserveGang(context.Background(), []string{local}, []api.Job{member(local)})
		if err != nil || len(hs) != 1 {
			t.Fatalf("reserve: %v", err)
		}
		return hs[0]
	}
	h := reserve("1#1")
	started, err := a.CommitMember(context.Background(), h)
	if err != nil || started {
		t.Fatalf("commit: started %v, %v", started, err)
	}
	if fb.barriers[0] != 3*time.Second {
		t.Fatalf("barrier granted %v, want the peer's cap 3s", fb.barriers[0])
	}
	if err := a.ReleaseMember(context.Background(), h, "its gang was aborted by the origin: the commit of member 2 of 2 failed"); err != nil {
		t.Fatal(err)
	}
	if len(fb.whys) != 1 || fb.whys[0] != "its gang was aborted by the origin: the commit of member 2 of 2 failed (origin a)" {
		t.Fatalf("release reasons %q", fb.whys)
	}
	if err := a.StartMember(context.Background(), h); err == nil {
		t.Fatal("a released member started")
	}

	fb.mu.Lock()
	fb.noBarrier = true
	fb.mu.Unlock()
	h = reserve("2#1")
	started, err = a.CommitMember(context.Background(), h)
	if err != nil || !started {
		t.Fatalf("commit on a peer without the barrier: started %v, %v", started, err)
	}
	if fb.started[len(fb.started)-1] != h.Key {
		t.Fatalf("started %v", fb.started)
	}
}

// A member with only a DNS seed (a name that resolves to a member's
// address) joins.
func TestDNSSeedJoins(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", &fakeHost{cpu: 1000}, nil)
	_, port, _ := strings.Cut(a.GossipAddr(), ":")
	cert, k := c.ca.issue(t, "b")
	b, err := New(Config{NodeName: "b", Gossip: "127.0.0.1:0", API: "127.0.0.1:0", Profile: "local", DNSSeed: "localhost:" + port, InsecureGossip: true,
		CertFile: cert, KeyFile: k, CAFile: filepath.Join(c.ca.dir, "ca.pem"), Broadcast: 50 * time.Millisecond}, newFakeJobs(), &fakeHost{cpu: 2000}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.Start()
	t.Cleanup(b.Close)
	eventually(t, "b to join through its DNS seed", func() bool { return len(loads(a)) == 2 && len(loads(b)) == 2 })
}

// TestChangesGossipBeforeRefreshes: a node's first load goes on the
// arrival queue, a load that changed on the change queue, the same load
// again (a heartbeat) on the refresh queue; gossip takes every change
// before any arrival (a join burst's first loads, larger and newer, which
// one queue would send first) and arrivals before refreshes, within its
// limit.
func TestChangesGossipBeforeRefreshes(t *testing.T) {
	ca := newTestCA(t, t.TempDir())
	cert, key := ca.issue(t, "a")
	host := &changingHost{}
	host.cpu.Store(1000)
	jobs := newFakeJobs()
	nd, err := New(Config{NodeName: "a", Gossip: "127.0.0.1:0", API: "127.0.0.1:0", Profile: "lan", InsecureGossip: true,
		CertFile: cert, KeyFile: key, CAFile: filepath.Join(ca.dir, "ca.pem")}, jobs, host, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nd.Close()
	nd.gossip(localLoad(host, jobs))
	nd.gossip(localLoad(host, jobs))
	if c, a, r := nd.queue.NumQueued(), nd.arrivals.NumQueued(), nd.refresh.NumQueued(); c != 0 || a != 1 || r != 1 {
		t.Fatalf("first load and the same again: %d changes, %d arrivals and %d refreshes queued, want 0, 1 and 1", c, a, r)
	}
	// A change, then arrivals and refreshes of other nodes, larger and
	// newer (which one queue would send first), filling more than a
	// packet.
	host.cpu.Store(2000)
	nd.gossip(localLoad(host, jobs))
	pad := strings.Repeat("p", 300)
	for i := range 20 {
		nd.refresh.QueueBroadcast(&broadcast{node: fmt.Sprintf("r%d", i), msg: []byte("r" + pad)})
		nd.arrivals.QueueBroadcast(&broadcast{node: fmt.Sprintf("a%d", i), msg: []byte("a" + pad)})
	}
	const overhead, limit = 3, 1400
	out := nd.GetBroadcasts(overhead, limit)
	size := 0
	for _, b := range out {
		size += len(b) + overhead
	}
	if len(out) < 2 || size > limit {
		t.Fatalf("%d broadcasts of %d bytes, want a change and refreshes within %d", len(out), size, limit)
	}
	first, err := decodeLoad(out[0])
	if err != nil || first.Load.CPU != 2000 {
		t.Fatalf("first broadcast: %v %+v, want the change to 2000m", err, first.loadMsg)
	}
	for _, b := range out[1:] {
		if m, err := decodeLoad(b); err == nil && m.Load.CPU == 2000 {
			t.Fatalf("the change went out twice in one packet")
		}
		if b[0] == 'r' {
			t.Fatalf("a refresh went out while arrivals waited")
		}
	}
}

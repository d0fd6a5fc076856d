package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	osexec "os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// peerClient speaks the peer API to the daemon named server with the
// certificate of node (issued by the cluster's CA in pki).
func peerClient(t *testing.T, pki, node, server string) *http.Client {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(filepath.Join(pki, node+".pem"), filepath.Join(pki, node+"-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(pki, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxConnsPerHost: 256, MaxIdleConnsPerHost: 256,
		TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, ServerName: server, MinVersion: tls.VersionTLS13}}}
}

// offerAnswer is the peer API's answer to an offer.
type offerAnswer struct {
	Accepted bool   `json:"accepted"`
	RemoteID string `json:"remote_id"`
	Why      string `json:"why"`
}

// offer sends one offer and returns the HTTP status, the answer and the
// body of an error.
func offer(c *http.Client, addr, key, user string, spec map[string]any) (int, offerAnswer, string, error) {
	body, _ := json.Marshal(map[string]any{"key": key, "job_id": "1", "user": user, "spec": spec})
	resp, err := c.Post("https://"+addr+"/peer/v1/offers", "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, offerAnswer{}, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var a offerAnswer
	if resp.StatusCode == http.StatusOK {
		_ = json.Unmarshal(b, &a)
	}
	return resp.StatusCode, a, string(b), nil
}

// addUser adds a regular (non-system) user in groups for the test.
func addUser(t *testing.T, name string, groups ...string) {
	t.Helper()
	for _, g := range groups {
		if osexec.Command("getent", "group", g).Run() != nil {
			if out, err := osexec.Command("groupadd", g).CombinedOutput(); err != nil {
				t.Fatalf("groupadd %s: %v: %s", g, err, out)
			}
			t.Cleanup(func() { _ = osexec.Command("groupdel", g).Run() })
		}
	}
	args := []string{"--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin"}
	if len(groups) > 0 {
		args = append(args, "--groups", strings.Join(groups, ","))
	}
	if out, err := osexec.Command("useradd", append(args, name)...).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { _ = osexec.Command("userdel", name).Run() })
}

// auditRecords reads every record of the daemon's audit files.
func auditRecords(t *testing.T, state string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, f := range []string{"audit.log", "audit-users.log", "audit-refused.log"} {
		b, err := os.ReadFile(filepath.Join(state, f))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var r map[string]any
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				out = append(out, r)
			}
		}
	}
	return out
}

// TestPeerAttacks: a holder of a valid cluster certificate attacks a
// daemon over the mutual-TLS peer API. Offers for root, for a member of
// docker, for a system account, for a user outside peers.users, over the
// spec size limit and over the user's limit are each refused by its rule
// and audited with the peer's certificate identity; a certificate of the
// CA whose name is no member is refused outright; 1,000 offers a second
// from one member are cut to its offer rate, and another user's list
// stays fast meanwhile (figures: docs/peers.md).
func TestPeerAttacks(t *testing.T) {
	root := publicTempDir(t)
	pki := filepath.Join(root, "pki")
	keyring := peerPKI(t, pki, "a", "b", "mallory")
	for _, n := range []string{"a", "b"} {
		os.MkdirAll(filepath.Join(root, n), 0o755)
	}
	addUser(t, "fusiond-e2e-dkr", "docker")
	addUser(t, "fusiond-e2e-out")
	addUser(t, "fusiond-e2e-fl")
	cfgA := strings.Replace(peerConfig(pki, copyKeyring(t, keyring, root+"/a"), "a", "127.0.0.1:0"),
		"users: {max_uid: 65534}", "users: {max_uid: 65534, allow: [nobody, fusiond-e2e-dkr, fusiond-e2e-fl]}\n  limits: {offers_per_second: 50, offer_burst: 100, jobs: 256, spec_bytes: 64Mi}", 1) +
		"limits: {max_spec_bytes: 64Ki, per_user: {spec_bytes: 6Ki}}\n"
	da := newDaemon(t, filepath.Join(root, "a"), cfgA)
	da.start()
	ca := da.client()
	db := newDaemon(t, filepath.Join(root, "b"), peerConfig(pki, copyKeyring(t, keyring, root+"/b"), "b", "127.0.0.1:0", selfGossip(t, ca)))
	db.start()
	converged(t, []*api.Client{ca, db.client()}, "a", "b")
	var apiA string
	for _, p := range peersOf(t, ca).Peers {
		if p.Self {
			apiA = p.APIAddress
		}
	}
	asB := peerClient(t, pki, "b", "a")
	small := map[string]any{"name": "x", "class": "batch", "command": []string{"sleep", "600"}, "resources": map[string]any{"cpu": "100m", "memory": "16Mi"}}
	withEnv := func(n int) map[string]any {
		s := map[string]any{}
		for k, v := range small {
			s[k] = v
		}
		s["env"] = map[string]string{"PAD": strings.Repeat("x", n)}
		return s
	}
	n := 0
	key := func() string { n++; return fmt.Sprintf("b/%d#1", n) }
	for _, c := range []struct {
		name, user string
		spec       map[string]any
		want       string // in the refusal
	}{
		{"root", "root", small, "peers.accept_root_jobs"},
		{"a member of docker", "fusiond-e2e-dkr", small, "peers.users.deny_groups"},
		{"the system user daemon", "daemon", small, "peers.users.min_uid"},
		{"a user outside peers.users", "fusiond-e2e-out", small, "peers.users.allow"},
		{"over limits.max_spec_bytes", "nobody", withEnv(70 << 10), "limits.max_spec_bytes"},
	} {
		status, a, body, err := offer(asB, apiA, key(), c.user, c.spec)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if a.Accepted || !strings.Contains(a.Why+body, c.want) {
			t.Errorf("%s: status %d, answer %+v %s; want refused by %s", c.name, status, a, body, c.want)
		}
	}
	// The user's own limit applies to a peer's jobs: two 4 KiB specs pass
	// limits.per_user.spec_bytes (6 KiB).
	if _, a, body, err := offer(asB, apiA, key(), "nobody", withEnv(4<<10)); err != nil || !a.Accepted {
		t.Fatalf("the first 4 KiB job: %+v %s %v", a, body, err)
	}
	if _, a, body, _ := offer(asB, apiA, key(), "nobody", withEnv(4<<10)); a.Accepted || !strings.Contains(a.Why, "limits.per_user.spec_bytes") {
		t.Errorf("a second 4 KiB job of the same user: %+v %s; want refused by limits.per_user.spec_bytes", a, body)
	}
	// A certificate of the cluster's CA for a node that is no member.
	if status, _, body, err := offer(peerClient(t, pki, "mallory", "a"), apiA, "mallory/1#1", "nobody", small); err != nil || status != http.StatusForbidden || !strings.Contains(body, "not a current member") {
		t.Errorf("mallory's offer: %d %s %v; want 403, not a member", status, body, err)
	}
	// A key of another node's.
	if status, _, _, _ := offer(asB, apiA, "a/1#1", "nobody", small); status != http.StatusForbidden {
		t.Errorf("b offering a key of a's: %d, want 403", status)
	}

	// 1,000 offers a second from b for 3 s while nobody lists: offers
	// a refuses (a user outside peers.users), then tiny jobs a runs.
	for i, user := range []string{"fusiond-e2e-out", "fusiond-e2e-fl"} {
		floodOffers(t, da, asB, apiA, user, fmt.Sprintf("b/f%d-", i))
		time.Sleep(2 * time.Second) // the offer allowance refills
	}
	// The same tiny jobs of the same user submitted locally (fusionctl)
	// at about the rate the flood's accepted ones started (50 a second):
	// what starting them costs another user's list, peers aside.
	idle, _ := listP99(da, asNobody, 20)
	fl, err := user.Lookup("fusiond-e2e-fl")
	if err != nil {
		t.Fatal(err)
	}
	flUID, _ := strconv.Atoi(fl.Uid)
	flGID, _ := strconv.Atoi(fl.Gid)
	asFl := &syscall.Credential{Uid: uint32(flUID), Gid: uint32(flGID)}
	stopLocal := make(chan struct{})
	localDone := make(chan int)
	go func() {
		var n atomic.Int64
		var wg sync.WaitGroup
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopLocal:
				wg.Wait()
				localDone <- int(n.Load())
				return
			case <-tick.C:
			}
			wg.Go(func() {
				if out := da.ctl(asFl, `{"name":"l","class":"batch","command":["true"],"resources":{"cpu":"10m","memory":"8Mi"}}`, "submit", "-q", "-"); out.code == 0 {
					n.Add(1)
				}
			})
		}
	}()
	localStart := time.Now()
	time.Sleep(500 * time.Millisecond)
	during, _ := listP99(da, asNobody, 20)
	time.Sleep(time.Second)
	close(stopLocal)
	submitted := <-localDone
	took := time.Since(localStart)
	t.Logf("FIGURE local submissions instead: %d tiny jobs in %s (%.0f/s); another user's list p99 %s idle, %s meanwhile",
		submitted, took.Round(time.Millisecond), float64(submitted)/took.Seconds(), idle.Round(time.Millisecond), during.Round(time.Millisecond))
	// A local user is not locked out by what a peer sent.
	if out := da.ctl(asNobody, `{"name":"local","command":["true"],"resources":{"cpu":"100m","memory":"16Mi"}}`, "submit", "-q", "-"); out.code != 0 {
		t.Errorf("nobody's local submission after the attacks: %s%s", out.stdout, out.stderr)
	}

	// Every refusal is audited with the peer's certificate identity.
	recs := auditRecords(t, filepath.Join(root, "a", "state"))
	found := func(peer, action, in string) bool {
		for _, r := range recs {
			if r["peer"] == peer && r["action"] == action && strings.Contains(fmt.Sprint(r["message"], r["code"], r["field"]), in) {
				return true
			}
		}
		return false
	}
	for _, want := range []string{"peers.accept_root_jobs", "peers.users.deny_groups", "peers.users.min_uid", "peers.users.allow", "limits.max_spec_bytes", "limits.per_user.spec_bytes"} {
		if !found("b", "peer.offer", want) {
			t.Errorf("no audit record of b's offer refused by %s", want)
		}
	}
	if !found("mallory", "peer.offer", "not a current member") {
		t.Error("no audit record of mallory's refused offer")
	}
	if !found("b", "peer.offer", "offers a second") && !found("b", "audit.suppressed", "peer b") {
		t.Error("no audit record of b's offers refused for their rate")
	}
	_ = context.Background
}

// floodOffers sends 1,000 offers a second for 3 s from the peer client c
// to the peer API at addr (tiny jobs of user, keys prefix<n>#1) and checks
// that they are cut to the peer's offer rate (50 a second, burst 100: the
// test's peers.limits) while another user's list stays answered.
func floodOffers(t *testing.T, da *daemon, c *http.Client, addr, user, prefix string) {
	t.Helper()
	asB, apiA := c, addr
	idle, failed := listP99(da, asNobody, 20)
	if len(failed) > 0 {
		t.Fatalf("list before the flood: %v", failed)
	}
	stop := make(chan struct{})
	var sent, limited, answered, accepted, errs atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	tiny := map[string]any{"name": "f", "class": "batch", "command": []string{"true"}, "resources": map[string]any{"cpu": "10m", "memory": "8Mi"}}
	// One offer every millisecond, each on its own goroutine (at most
	// 512 in flight): the rate does not wait for the answers.
	wg.Add(1)
	go func() {
		defer wg.Done()
		inflight := make(chan struct{}, 512)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			select {
			case inflight <- struct{}{}:
			default:
				continue // 512 unanswered: the peer is not keeping up
			}
			sent.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-inflight }()
				status, a, _, err := offer(asB, apiA, fmt.Sprintf("%s%d#1", prefix, i), user, tiny)
				switch {
				case err != nil:
					errs.Add(1)
				case status == http.StatusTooManyRequests:
					limited.Add(1)
				case status == http.StatusOK:
					answered.Add(1)
					if a.Accepted {
						accepted.Add(1)
					}
				}
			}()
		}
	}()
	time.Sleep(500 * time.Millisecond)
	during, failed := listP99(da, asNobody, 20)
	for time.Since(start) < 3*time.Second {
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	took := time.Since(start)
	t.Logf("FIGURE peer offer flood (jobs of %s): %d offers in %s (%.0f/s) from one peer: %d answered (%d accepted), %d refused 429, %d failed; another user's list p99 %s idle, %s during the flood",
		user, sent.Load(), took.Round(time.Millisecond), float64(sent.Load())/took.Seconds(), answered.Load(), accepted.Load(), limited.Load(), errs.Load(), idle.Round(time.Millisecond), during.Round(time.Millisecond))
	if len(failed) > 0 {
		t.Errorf("list during the flood: %v", failed)
	}
	if max := int64(100 + 50*took.Seconds() + 10); answered.Load() > max {
		t.Errorf("%d offers answered in %s, more than the burst of 100 and 50 a second allow (%d)", answered.Load(), took, max)
	}
	if limited.Load() < sent.Load()/2 {
		t.Errorf("only %d of %d offers were refused 429", limited.Load(), sent.Load())
	}
	if during > time.Second {
		t.Errorf("another user's list took %s (p99) during the flood", during)
	}
}

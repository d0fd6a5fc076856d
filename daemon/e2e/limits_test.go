package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
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

func spec(name string, env map[string]string) api.JobSpec {
	return api.JobSpec{Name: name, Command: []string{"sleep", "60"}, Env: env,
		Resources: api.Resources{CPU: 100, Memory: 16 << 20}}
}

// TestDefaultLimitsStopOneUser runs fusiond with the default limits (root
// made subject to them, since the test is root) and tries what one user
// did before there were limits: 2,000 queued jobs, 1 MB env values, 200
// idle event streams. It also measures what a listing of 200 large specs
// costs the daemon: the page is streamed, so its peak memory grows by far
// less than the listing's size.
func TestDefaultLimitsStopOneUser(t *testing.T) {
	d := newDaemon(t, publicTempDir(t), "limits: {exempt_root: false}\n")
	d.start()
	c := d.client()
	ctx := context.Background()
	if _, err := c.SetCordoned(ctx, true); err != nil { // everything stays queued
		t.Fatal(err)
	}

	// One 1 MB env value: 413 naming limits.max_spec_bytes.
	_, err := c.Submit(ctx, spec("big", map[string]string{"X": strings.Repeat("x", 1000000)}))
	var e *api.Error
	if !errors.As(err, &e) || e.HTTPStatus() != http.StatusRequestEntityTooLarge || e.Limit != "limits.max_spec_bytes" {
		t.Fatalf("1 MB env: %v, want 413 naming limits.max_spec_bytes", err)
	}

	// 200 specs of 200 KiB each (40 MB) are accepted; list them all.
	pad := strings.Repeat("y", 200<<10)
	for i := range 200 {
		if _, err := c.Submit(ctx, spec(fmt.Sprint("wide-", i), map[string]string{"PAD": pad})); err != nil {
			t.Fatalf("wide spec %d: %v", i, err)
		}
	}
	before := vmHWM(t, d.cmd.Process.Pid)
	start := time.Now()
	all, err := c.List(ctx, api.ListOptions{})
	if err != nil || len(all) != 200 {
		t.Fatalf("list: %d jobs, %v", len(all), err)
	}
	took := time.Since(start)
	after := vmHWM(t, d.cmd.Process.Pid)
	t.Logf("FIGURE listing 200 jobs of 200 KiB specs (40 MiB): %s, daemon peak RSS %d MiB -> %d MiB", took.Round(time.Millisecond), before>>10, after>>10)
	if grew := after - before; grew > 40<<10 {
		t.Errorf("the listing grew the daemon's peak RSS by %d MiB, as much as the listing itself", grew>>10)
	}

	// 2,000 more queued jobs from 8 clients: the user stops at 1,000 queued.
	var ok, refused, other atomic.Int64
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 250 {
				_, err := c.Submit(ctx, spec(fmt.Sprintf("q-%d-%d", w, i), nil))
				var e *api.Error
				switch {
				case err == nil:
					ok.Add(1)
				case errors.As(err, &e) && e.HTTPStatus() == http.StatusTooManyRequests && e.Limit == "limits.per_user.pending_jobs":
					refused.Add(1)
				default:
					other.Add(1)
					t.Errorf("submit: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("FIGURE 2,000 submissions after 200 queued: %d accepted, %d refused with 429 (limits.per_user.pending_jobs)", ok.Load(), refused.Load())
	if ok.Load() != 800 || refused.Load() != 1200 || other.Load() != 0 {
		t.Errorf("accepted %d, refused %d, other errors %d; want 800 (to 1,000 queued) and 1,200", ok.Load(), refused.Load(), other.Load())
	}

	// 200 idle event streams: 64 open, the rest 429.
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var streamRefused atomic.Int64
	var swg sync.WaitGroup
	for range 200 {
		swg.Add(1)
		go func() {
			defer swg.Done()
			sc := api.NewClient(d.socket)
			defer sc.Close()
			err := sc.Events(sctx, "", func(api.Event) error { return nil })
			var e *api.Error
			if errors.As(err, &e) && e.Limit == "limits.per_user.streams" {
				streamRefused.Add(1)
			}
		}()
	}
	deadline := time.Now().Add(20 * time.Second)
	for streamRefused.Load() < 136 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("FIGURE 200 idle event streams of one user: %d refused with 429 (limits.per_user.streams)", streamRefused.Load())
	if streamRefused.Load() != 136 {
		t.Errorf("%d streams refused, want 136 (64 allowed)", streamRefused.Load())
	}
	cancel()
	swg.Wait()
}

// vmHWM is a process's peak resident set in KiB.
func vmHWM(t *testing.T, pid int) int64 { return procStatusKiB(t, pid, "VmHWM") }

// vmRSS is a process's resident set in KiB.
func vmRSS(t *testing.T, pid int) int64 { return procStatusKiB(t, pid, "VmRSS") }

// procStatusKiB reads a "kB" field of /proc/PID/status.
func procStatusKiB(t *testing.T, pid int, field string) int64 {
	t.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// TestQuotasCountLiveWork: finished and cancelled jobs no longer count
// against a user's spec bytes (a user who cancels everything can submit
// again), and the node-wide spec budget keeps what all users make the
// daemon hold bounded: past it the finished jobs of the user holding the
// most are forgotten (another user's history stays), and live jobs that
// would pass it are refused, naming limits.spec_budget.
func TestQuotasCountLiveWork(t *testing.T) {
	dir := publicTempDir(t)
	d := newDaemon(t, dir, "limits: {exempt_root: false, spec_budget: 3Mi, per_user: {spec_bytes: 2Mi}}\n")
	d.start()
	c := d.client()
	ctx := context.Background()
	if _, err := c.SetCordoned(ctx, true); err != nil { // everything stays queued
		t.Fatal(err)
	}
	pad := strings.Repeat("p", 100<<10)
	// fill submits ~100 KiB specs as root until one is refused.
	fill := func() ([]string, *api.Error) {
		var ids []string
		for i := range 100 {
			j, err := c.Submit(ctx, spec(fmt.Sprint("fill-", i), map[string]string{"PAD": pad}))
			var e *api.Error
			if errors.As(err, &e) {
				return ids, e
			}
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, j.ID)
		}
		t.Fatal("100 specs of 100 KiB accepted under a 2 MiB limit")
		return nil, nil
	}
	first, e := fill()
	if e.Limit != "limits.per_user.spec_bytes" || len(first) < 15 || len(first) > 20 {
		t.Fatalf("after %d specs: %v; want ~19 then limits.per_user.spec_bytes", len(first), e)
	}
	// uid 1000 has one finished job: history that must outlive root's churn.
	file := filepath.Join(dir, "other.json")
	other, _ := json.Marshal(spec("other", nil))
	if err := os.WriteFile(file, other, 0o644); err != nil {
		t.Fatal(err)
	}
	alice := &syscall.Credential{Uid: 1000, Gid: 1000}
	r := d.ctl(alice, "", "-q", "submit", file)
	if r.code != 0 {
		t.Fatalf("uid 1000 submit: %s", r.stderr)
	}
	aliceJob := strings.TrimSpace(r.stdout)
	if r := d.ctl(alice, "", "cancel", aliceJob); r.code != 0 {
		t.Fatalf("uid 1000 cancel: %s", r.stderr)
	}
	// Cancel everything and submit again, twice: each round is accepted in
	// full; root's finished specs then pass the 3 MiB budget and its
	// oldest are forgotten.
	for round := range 2 {
		for _, id := range first {
			if _, err := c.Cancel(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		again, e := fill()
		if e.Limit != "limits.per_user.spec_bytes" || len(again) != len(first) {
			t.Fatalf("round %d after cancelling everything: %d accepted, then %v; want %d as before", round, len(again), e, len(first))
		}
		first = again
	}
	deadline := time.Now().Add(10 * time.Second)
	var all []api.Job
	for {
		var err error
		if all, err = c.List(ctx, api.ListOptions{}); err != nil {
			t.Fatal(err)
		}
		var held int64
		for _, j := range all {
			b, _ := json.Marshal(j.Spec)
			held += int64(len(b))
		}
		if held <= 3<<20 {
			t.Logf("FIGURE specs held after 3 rounds of ~1.9 MiB: %d jobs, %.2f MiB (budget 3 MiB)", len(all), float64(held)/(1<<20))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon still holds %d bytes of specs in %d jobs, over the 3 MiB budget", held, len(all))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := c.Get(ctx, aliceJob); err != nil {
		t.Errorf("uid 1000's finished job was forgotten for root's churn: %v", err)
	}
	if _, err := c.Get(ctx, "1"); err == nil {
		t.Error("root's oldest finished job is still remembered")
	}
	// Live specs: root holds ~1.9 MiB; uid 1000's ~1.2 MiB more would pass
	// the node's 3 MiB though within its own 2 MiB.
	big, _ := json.Marshal(spec("big", map[string]string{"PAD": strings.Repeat("q", 200<<10)}))
	if err := os.WriteFile(file, big, 0o644); err != nil {
		t.Fatal(err)
	}
	refused := ""
	for range 10 {
		if r := d.ctl(alice, "", "-q", "submit", file); r.code != 0 {
			refused = r.stderr
			break
		}
	}
	if !strings.Contains(refused, "limit limits.spec_budget") || !strings.Contains(refused, "live job specs") {
		t.Errorf("live specs past the node's budget: %q, want a refusal naming limits.spec_budget", refused)
	}
}

// TestMemoryAtLimits measures what users can make the daemon hold at the
// default limits: one user, then four, each filling limits.per_user.spec_bytes
// (64 MiB) with the largest specs allowed; four fill limits.spec_budget
// (256 MiB), and a fifth user is refused, naming it. The daemon's RSS at
// each step is the figure (docs/reliability.md).
func TestMemoryAtLimits(t *testing.T) {
	dir := publicTempDir(t)
	d := newDaemon(t, dir, "limits: {exempt_root: false}\nlog: {level: info}\n")
	d.start()
	c := d.client()
	ctx := context.Background()
	if _, err := c.SetCordoned(ctx, true); err != nil {
		t.Fatal(err)
	}
	pid := d.cmd.Process.Pid
	rssMiB := func() int64 { return vmRSS(t, pid) >> 10 }
	idle := rssMiB()
	// Three specs of ~250 KiB a request (max_request_bytes is 1 MiB).
	pad := strings.Repeat("m", 250<<10)
	var docs []string
	for i := range 3 {
		b, _ := json.Marshal(spec(fmt.Sprint("mem-", i), map[string]string{"PAD": pad}))
		docs = append(docs, string(b))
	}
	file := filepath.Join(dir, "three.yaml")
	if err := os.WriteFile(file, []byte(strings.Join(docs, "\n---\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	// fill submits as cred until refused; it returns the refusal.
	fill := func(cred *syscall.Credential) (int, string) {
		for n := 0; n < 200; n++ {
			if r := d.ctl(cred, "", "-q", "submit", file); r.code != 0 {
				return 3 * n, r.stderr
			}
		}
		t.Fatal("200 requests of 750 KiB accepted")
		return 0, ""
	}
	var perUser []int64
	for i, uid := range []uint32{0, 1000, 1001, 1002} {
		var cred *syscall.Credential
		if uid != 0 {
			cred = &syscall.Credential{Uid: uid, Gid: uid}
		}
		n, why := fill(cred)
		if !strings.Contains(why, "limits.per_user.spec_bytes") {
			t.Fatalf("user %d after %d specs: %q, want the per-user limit", uid, n, why)
		}
		perUser = append(perUser, rssMiB())
		t.Logf("FIGURE memory at the default limits: %d user(s) at limits.per_user.spec_bytes (%d specs of 250 KiB this one): daemon RSS %d MiB (idle %d MiB)",
			i+1, n, perUser[i], idle)
	}
	_, why := fill(&syscall.Credential{Uid: 1003, Gid: 1003})
	if !strings.Contains(why, "limits.spec_budget") {
		t.Errorf("a fifth user past the 256 MiB budget: %q, want a refusal naming limits.spec_budget", why)
	}
	rss := rssMiB()
	t.Logf("FIGURE memory at limits.spec_budget (256 MiB): daemon RSS %d MiB, %.0f MiB per user on average", rss, float64(rss-idle)/4)
	if rss > 2048 {
		t.Errorf("the daemon holds %d MiB at the node's spec budget", rss)
	}
}

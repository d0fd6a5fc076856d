package deviceplugin

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// clock is a settable wall clock for the reconcile loop.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time          { return c.now }
func (c *clock) advance(d time.Duration) { c.now = c.now.Add(d) }
func newReconciler() *reconciler         { return &reconciler{lastSeen: map[string]time.Time{}} }
func ref(ns, name, c string) api.PodRef  { return api.PodRef{Namespace: ns, Name: name, Container: c} }
func hold(id, res string, created time.Time, devs ...string) Hold {
	return Hold{ID: id, Resource: res, Devices: devs, Created: created}
}

// released says which of ids were released, each for why.
func checkReleased(t *testing.T, pool *fakePool, when string, want map[string]bool) {
	t.Helper()
	for id, w := range want {
		why, ok := pool.releasedWhy(id)
		if ok != w {
			t.Errorf("%s: %s released = %v, want %v", when, id, ok, w)
		}
		if ok && why != whyGone {
			t.Errorf("%s: %s released for %q", when, id, why)
		}
	}
}

func TestReconcileBindsAndReleasesAfterGrace(t *testing.T) {
	pool := newFakePool(gpus(true, true, true, true))
	e := newEnv(t, pool)
	e.cfg.Grace = time.Minute
	pr := startPodResources(t, e.cfg.PodResources)
	p := e.plugin()
	c := &clock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	p.t.now = c.Now
	t0, old := c.now, c.now.Add(-time.Hour)

	pool.addHold(hold("h1", gpu, old, "GPU-a")) // its pod is listed
	pool.addHold(hold("h2", gpu, old, "GPU-b")) // no pod has it: missing
	h3 := hold("h3", gpu, old, "GPU-c")         // bound to a pod that ended; kubelet gave its device to another
	h3.Pod = &api.PodRef{Namespace: "ns", Name: "gone", Container: "main"}
	pool.addHold(h3)
	pool.addHold(hold("h4", gpu, t0.Add(30*time.Second), "GPU-d")) // allocated just now: the pod is not listed yet
	pool.addHold(hold("h5", fpga, old, "GPU-a"))                   // the same ID under another resource is not a match
	pr.setPods(
		pod("ns", "a", container("main", gpu, "GPU-a")),
		pod("ns", "b", container("main", gpu, "GPU-c"), container("init", gpu, "GPU-c")),
	)
	r := newReconciler()
	ctx := context.Background()

	p.reconcile(ctx, r)
	if got, _ := pool.boundTo("h1"); got != ref("ns", "a", "main") {
		t.Errorf("h1 bound to %+v", got)
	}
	// GPU-c is in two containers of pod b (an init container and the
	// app): the first by name.
	if got, _ := pool.boundTo("h3"); got != ref("ns", "b", "init") {
		t.Errorf("h3 bound to %+v", got)
	}
	// Old, missing holds are kept for Grace after pod-resources first
	// answered: the daemon may just have restarted.
	checkReleased(t, pool, "first reconcile", map[string]bool{"h2": false, "h4": false, "h5": false})

	c.advance(59 * time.Second)
	p.reconcile(ctx, r)
	checkReleased(t, pool, "t0+59s", map[string]bool{"h2": false, "h4": false, "h5": false})
	binds := pool.bindCount

	c.advance(time.Second) // t0+60s: h1's pod ends
	pr.setPods(pod("ns", "b", container("main", gpu, "GPU-c"), container("init", gpu, "GPU-c")))
	p.reconcile(ctx, r)
	checkReleased(t, pool, "t0+60s", map[string]bool{"h1": false, "h2": true, "h3": false, "h4": false, "h5": true})
	if pool.bindCount != binds {
		t.Errorf("%d binds of holds already bound", pool.bindCount-binds)
	}

	c.advance(30 * time.Second) // t0+90s: h4 missing since its creation for 60s
	p.reconcile(ctx, r)
	checkReleased(t, pool, "t0+90s", map[string]bool{"h1": false, "h4": true})

	c.advance(28 * time.Second) // t0+118s: h1 last seen at t0+59s
	p.reconcile(ctx, r)
	checkReleased(t, pool, "t0+118s", map[string]bool{"h1": false, "h3": false})
	c.advance(time.Second)
	p.reconcile(ctx, r)
	checkReleased(t, pool, "t0+119s", map[string]bool{"h1": true, "h3": false})

	s := p.Stats()
	if !s.PodResourcesUp || s.Releases != 4 || s.Binds != 2 {
		t.Errorf("stats %+v", s)
	}
}

func TestReconcileRebindsWhenDevicesMove(t *testing.T) {
	pool := newFakePool(gpus(true, true))
	e := newEnv(t, pool)
	pr := startPodResources(t, e.cfg.PodResources)
	p := e.plugin()
	pool.addHold(hold("h1", gpu, time.Now(), "GPU-a", "GPU-b"))
	r := newReconciler()

	pr.setPods(pod("ns", "a", container("main", gpu, "GPU-a", "GPU-b")))
	p.reconcile(context.Background(), r)
	pr.setPods(pod("ns", "a2", container("main", gpu, "GPU-a", "GPU-b")))
	p.reconcile(context.Background(), r)
	if got, _ := pool.boundTo("h1"); got != ref("ns", "a2", "main") {
		t.Errorf("h1 bound to %+v after its devices moved", got)
	}
	// Split over two pods: the one with more of its devices.
	pr.setPods(pod("ns", "x", container("c", gpu, "GPU-a")), pod("ns", "y", container("c", gpu, "GPU-b", "GPU-a")))
	p.reconcile(context.Background(), r)
	if got, _ := pool.boundTo("h1"); got != ref("ns", "y", "c") {
		t.Errorf("h1 bound to %+v, want the pod with both devices", got)
	}
	if n := pool.bindCount; n != 3 {
		t.Errorf("%d binds, want 3", n)
	}
}

func TestReconcileReleasesNothingWhilePodResourcesDown(t *testing.T) {
	pool := newFakePool(gpus(true))
	e := newEnv(t, pool)
	e.cfg.Grace = time.Minute
	p := e.plugin()
	c := &clock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	p.t.now = c.Now
	pool.addHold(hold("h1", gpu, c.now.Add(-24*time.Hour), "GPU-a"))
	r := newReconciler()

	for range 5 { // no pod-resources socket: kubelet is down
		p.reconcile(context.Background(), r)
		c.advance(time.Hour)
	}
	checkReleased(t, pool, "pod resources down", map[string]bool{"h1": false})
	if p.Stats().PodResourcesUp {
		t.Error("stats say pod resources are up")
	}
	if n := e.logs.count("pod-resources API does not answer"); n != 1 {
		t.Errorf("the outage logged %d times", n)
	}

	startPodResources(t, e.cfg.PodResources) // kubelet is back, without the pod
	p.reconcile(context.Background(), r)
	checkReleased(t, pool, "kubelet back", map[string]bool{"h1": false})
	if n := e.logs.count("answers again"); n != 1 {
		t.Errorf("the recovery logged %d times", n)
	}
	c.advance(time.Minute)
	p.reconcile(context.Background(), r)
	checkReleased(t, pool, "a minute after kubelet came back", map[string]bool{"h1": true})
}

func TestReconcileKubeletRestartRestartsGrace(t *testing.T) {
	pool := newFakePool(gpus(true))
	e := newEnv(t, pool)
	e.cfg.Grace = time.Minute
	pr := startPodResources(t, e.cfg.PodResources)
	p := e.plugin()
	c := &clock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	p.t.now = c.Now
	pool.addHold(hold("h1", gpu, c.now.Add(-time.Hour), "GPU-a"))
	r := newReconciler()

	pr.setPods(pod("ns", "a", container("main", gpu, "GPU-a")))
	p.reconcile(context.Background(), r) // seen at t0
	c.advance(50 * time.Second)
	p.kubeletRestarted() // a new kubelet may list its pods late
	pr.setPods()
	c.advance(time.Second)
	p.reconcile(context.Background(), r) // t0+51s: missing
	c.advance(30 * time.Second)
	p.reconcile(context.Background(), r) // t0+81s: 81s since seen, 30s since kubelet's restart
	checkReleased(t, pool, "30s after kubelet restarted", map[string]bool{"h1": false})
	c.advance(30 * time.Second)
	p.reconcile(context.Background(), r)
	checkReleased(t, pool, "60s after kubelet restarted", map[string]bool{"h1": true})
}

func TestReconcileOnRegistration(t *testing.T) {
	pool := newFakePool(gpus(true))
	e := newEnv(t, pool) // Reconcile is an hour: only registrations reconcile
	pr := startPodResources(t, e.cfg.PodResources)
	k := startKubelet(t, e.cfg.Dir)
	pool.addHold(hold("h1", gpu, time.Now(), "GPU-a"))
	e.run(e.plugin())
	eventually(t, "registration", func() bool { return len(k.registrations()) == 1 })
	eventually(t, "the start's and the registration's reconciles", func() bool { return pr.listCount() >= 2 })

	pr.setPods(pod("ns", "a", container("main", gpu, "GPU-a")))
	time.Sleep(50 * time.Millisecond)
	if _, ok := pool.boundTo("h1"); ok {
		t.Fatal("bound without a reconcile")
	}
	k.restart()
	eventually(t, "the hold bound after kubelet's restart", func() bool {
		got, ok := pool.boundTo("h1")
		return ok && got == ref("ns", "a", "main")
	})
}

// The pod's UID, which the pod-resources API does not tell, comes from
// kubelet's device checkpoint; a pod of the same name made again (a new
// UID) binds the hold again.
func TestReconcileTakesPodUIDFromKubeletCheckpoint(t *testing.T) {
	pool := newFakePool(gpus(true, true))
	e := newEnv(t, pool)
	pr := startPodResources(t, e.cfg.PodResources)
	p := e.plugin()
	pool.addHold(hold("h1", gpu, time.Now(), "GPU-a"))
	pr.setPods(pod("ns", "a", container("main", gpu, "GPU-a")))
	writeCheckpoint := func(uid string) {
		t.Helper()
		// As kubelet writes it: PodDevicesEntry without JSON tags, the
		// devices by NUMA node, beside the registered devices and a
		// checksum.
		data := `{"Data":{"PodDeviceEntries":[{"PodUID":"` + uid + `","ContainerName":"main","ResourceName":"` + gpu +
			`","DeviceIDs":{"0":["GPU-a"]},"AllocResp":"CgA="}],"RegisteredDevices":{"` + gpu + `":["GPU-a","GPU-b"]}},"Checksum":12345}`
		if err := os.WriteFile(filepath.Join(e.cfg.Dir, kubeletCheckpoint), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r := newReconciler()
	p.reconcile(context.Background(), r) // no checkpoint yet: bound without a UID
	if got, _ := pool.boundTo("h1"); got != ref("ns", "a", "main") {
		t.Fatalf("h1 bound to %+v", got)
	}
	writeCheckpoint("uid-1")
	p.reconcile(context.Background(), r)
	want := ref("ns", "a", "main")
	want.UID = "uid-1"
	if got, _ := pool.boundTo("h1"); got != want {
		t.Errorf("h1 bound to %+v, want %+v", got, want)
	}
	n := pool.bindCount
	p.reconcile(context.Background(), r)
	if pool.bindCount != n {
		t.Errorf("a hold bound to its pod's UID bound again")
	}
	writeCheckpoint("uid-2")
	p.reconcile(context.Background(), r)
	if got, _ := pool.boundTo("h1"); got.UID != "uid-2" {
		t.Errorf("h1 bound to %+v after its pod was made again", got)
	}
	// A checkpoint kubelet wrote in another form leaves the UID as it was.
	if err := os.WriteFile(filepath.Join(e.cfg.Dir, kubeletCheckpoint), []byte("not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	p.reconcile(context.Background(), r)
	if got, _ := pool.boundTo("h1"); got.UID != "uid-2" {
		t.Errorf("h1 bound to %+v after an unreadable checkpoint", got)
	}
}

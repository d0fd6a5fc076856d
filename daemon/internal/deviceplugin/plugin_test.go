package deviceplugin

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const (
	gpu  = "fusiond.io/gpu-h200"
	fpga = "fusiond.io/fpga-u55c"
)

func gpus(healthy ...bool) Resource {
	r := Resource{Name: gpu}
	for i, h := range healthy {
		r.Devices = append(r.Devices, Device{ID: "GPU-" + string(rune('a'+i)), Healthy: h, NUMA: i % 2})
	}
	return r
}

func fpgas() Resource {
	return Resource{Name: fpga, Devices: []Device{{ID: "fpga0", Healthy: true, NUMA: -1}}}
}

// registeredResources is the resource names registered, sorted.
func registeredResources(k *fakeKubelet) []string {
	var names []string
	for _, r := range k.registrations() {
		names = append(names, r.ResourceName)
	}
	slices.Sort(names)
	return names
}

func TestRegistersEveryResource(t *testing.T) {
	e := newEnv(t, newFakePool(fpgas(), gpus(true, true)))
	k := startKubelet(t, e.cfg.Dir)
	p := e.plugin()
	e.run(p)

	eventually(t, "two registrations", func() bool { return len(k.registrations()) == 2 })
	want := map[string]string{gpu: "fusiond-gpu-h200.sock", fpga: "fusiond-fpga-u55c.sock"}
	for _, r := range k.registrations() {
		if r.Version != pluginapi.Version {
			t.Errorf("%s: version %q", r.ResourceName, r.Version)
		}
		if r.Endpoint != want[r.ResourceName] {
			t.Errorf("%s: endpoint %q, want %q", r.ResourceName, r.Endpoint, want[r.ResourceName])
		}
		if o := r.Options; o == nil || !o.GetPreferredAllocationAvailable || o.PreStartRequired {
			t.Errorf("%s: options %v", r.ResourceName, o)
		}
		fi, err := os.Stat(filepath.Join(e.cfg.Dir, r.Endpoint))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want a socket with 0600", r.Endpoint, fi.Mode())
		}
	}
	if got := registeredResources(k); !slices.Equal(got, []string{fpga, gpu}) {
		t.Errorf("registered %v", got)
	}
	eventually(t, "stats to count the registrations", func() bool {
		s := p.Stats()
		return s.Resources == 2 && s.Registered == 2 && s.Registrations == 2
	})
	// Nothing registers twice while kubelet stays up.
	time.Sleep(100 * time.Millisecond)
	if n := len(k.registrations()); n != 2 {
		t.Errorf("%d registrations without a kubelet restart", n)
	}
}

func TestKubeletRestartRegistersAgain(t *testing.T) {
	e := newEnv(t, newFakePool(fpgas(), gpus(true)))
	k := startKubelet(t, e.cfg.Dir)
	e.run(e.plugin())
	eventually(t, "first registrations", func() bool { return len(k.registrations()) == 2 })

	k.restart() // removes every socket in Dir, ours too
	eventually(t, "registrations after the restart", func() bool { return len(k.registrations()) == 4 })
	if got := registeredResources(k); !slices.Equal(got, []string{fpga, fpga, gpu, gpu}) {
		t.Errorf("registered %v", got)
	}
	// The sockets are served again: kubelet's call back works.
	resp, err := e.dial("fusiond-gpu-h200.sock").GetDevicePluginOptions(context.Background(), &pluginapi.Empty{})
	if err != nil || !resp.GetPreferredAllocationAvailable {
		t.Fatalf("options after the restart: %v, %v", resp, err)
	}
	if n := e.logs.count("kubelet.sock was made again"); n != 1 {
		t.Errorf("restart logged %d times:\n%s", n, e.logs)
	}

	// kubelet.sock made again while the sockets stay (no removal) is a
	// restart too.
	k.stop()
	k.start()
	eventually(t, "registrations after kubelet.sock was made again", func() bool { return len(k.registrations()) == 6 })
}

func TestKubeletDownRetriesWithBackoff(t *testing.T) {
	e := newEnv(t, newFakePool(gpus(true)))
	e.run(e.plugin())

	// No kubelet.sock: nothing is tried, the wait is logged.
	time.Sleep(100 * time.Millisecond)
	if n := e.logs.count("kubelet is not up"); n != 1 {
		t.Errorf("kubelet's absence logged %d times", n)
	}
	// kubelet.sock, but kubelet does not answer yet: retried with backoff,
	// logged no more (the same outage).
	k := &fakeKubelet{t: t, dir: e.cfg.Dir, refuse: status.Error(codes.Unavailable, "kubelet is starting")}
	k.start()
	t.Cleanup(k.stop)
	time.Sleep(300 * time.Millisecond)
	attempts := k.attemptCount()
	// Poll 10 ms, backoff doubling to 40 ms: about 10 attempts in 300 ms;
	// retrying at every poll would be 30.
	if attempts < 2 || attempts > 14 {
		t.Errorf("%d registration attempts in 300 ms", attempts)
	}
	if n := e.logs.count("kubelet is not up") + e.logs.count("kubelet does not answer"); n != 1 {
		t.Errorf("one outage logged %d times:\n%s", n, e.logs)
	}
	k.setRefuse(nil)
	eventually(t, "registration once kubelet answers", func() bool { return len(k.registrations()) == 1 })
	eventually(t, "recovery logged", func() bool { return e.logs.count("kubelet is up again") == 1 })
}

func TestKubeletNotAnsweringLoggedOnce(t *testing.T) {
	e := newEnv(t, newFakePool(gpus(true), fpgas()))
	// A kubelet.sock nobody listens on: kubelet died.
	l := listenUnix(t, filepath.Join(e.cfg.Dir, kubeletSocket))
	l.Close()
	e.run(e.plugin())
	eventually(t, "the outage logged", func() bool { return e.logs.count("kubelet does not answer") > 0 })
	time.Sleep(200 * time.Millisecond) // retries, for both resources
	if n := e.logs.count("kubelet does not answer"); n != 1 {
		t.Errorf("the outage logged %d times:\n%s", n, e.logs)
	}
}

func TestKubeletRefusalLoggedOnce(t *testing.T) {
	e := newEnv(t, newFakePool(gpus(true)))
	k := startKubelet(t, e.cfg.Dir)
	k.setRefuse(status.Error(codes.InvalidArgument, "bad resource"))
	e.run(e.plugin())
	eventually(t, "several attempts", func() bool { return k.attemptCount() >= 4 })
	if n := e.logs.count("kubelet refused the registration"); n != 1 {
		t.Errorf("refusal logged %d times", n)
	}
}

func TestListAndWatch(t *testing.T) {
	pool := newFakePool(gpus(true, true))
	e := newEnv(t, pool)
	k := startKubelet(t, e.cfg.Dir)
	e.run(e.plugin())
	eventually(t, "registration", func() bool { return len(k.registrations()) == 1 })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := e.dial("fusiond-gpu-h200.sock").ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	stream := readLists(s)
	first, err := stream.next(2 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	checkDevices(t, first, "GPU-a", pluginapi.Healthy, 0, "GPU-b", pluginapi.Healthy, 1)

	// A signal that changes nothing sends nothing.
	pool.fire()
	if r, err := stream.next(100 * time.Millisecond); !errors.Is(err, errTimeout) {
		t.Fatalf("a list was sent without a change: %v, %v", r, err)
	}

	// A health change is sent.
	pool.setResources(gpus(true, false))
	r, err := stream.next(2 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	checkDevices(t, r, "GPU-a", pluginapi.Healthy, 0, "GPU-b", pluginapi.Unhealthy, 1)

	// A burst ends with the last state, in fewer lists than changes.
	for i := range 50 {
		pool.setResources(gpus(true, i%2 == 0, true))
	}
	got := 0
	for {
		r, err = stream.next(2 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		got++
		if len(r.Devices) == 3 && r.Devices[1].Health == pluginapi.Unhealthy {
			break // i = 49: the last state
		}
	}
	if got >= 50 {
		t.Errorf("%d lists for a burst of 50 changes", got)
	}

	// A device without a NUMA node has no topology.
	pool.setResources(Resource{Name: gpu, Devices: []Device{{ID: "GPU-z", Healthy: true, NUMA: -1}}})
	r, err = stream.next(2 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Devices) != 1 || r.Devices[0].Topology != nil {
		t.Errorf("device without a NUMA node: %v", r.Devices)
	}

	// The stream ends with the caller's context.
	cancel()
	if _, err := stream.next(2 * time.Second); status.Code(err) != codes.Canceled {
		t.Errorf("after cancel: %v", err)
	}
}

// checkDevices checks a list against triples of ID, health and NUMA node.
func checkDevices(t *testing.T, r *pluginapi.ListAndWatchResponse, want ...any) {
	t.Helper()
	if len(r.Devices) != len(want)/3 {
		t.Fatalf("%d devices, want %d: %v", len(r.Devices), len(want)/3, r.Devices)
	}
	for i, d := range r.Devices {
		id, health, numa := want[3*i].(string), want[3*i+1].(string), want[3*i+2].(int)
		if d.ID != id || d.Health != health {
			t.Errorf("device %d: %s %s, want %s %s", i, d.ID, d.Health, id, health)
		}
		if n := d.GetTopology().GetNodes(); len(n) != 1 || n[0].ID != int64(numa) {
			t.Errorf("device %s: topology %v, want NUMA node %d", d.ID, d.Topology, numa)
		}
	}
}

func TestResourcesAppearAndVanish(t *testing.T) {
	pool := newFakePool(gpus(true))
	e := newEnv(t, pool)
	k := startKubelet(t, e.cfg.Dir)
	e.run(e.plugin())
	eventually(t, "registration", func() bool { return len(k.registrations()) == 1 })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := e.dial("fusiond-gpu-h200.sock").ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	stream := readLists(s)
	if _, err := stream.next(2 * time.Second); err != nil {
		t.Fatal(err)
	}

	// An FPGA bitstream appears: its resource is served and registered.
	pool.setResources(fpgas(), gpus(true))
	eventually(t, "the new resource registered", func() bool { return len(k.registrations()) == 2 })
	if got := registeredResources(k); !slices.Equal(got, []string{fpga, gpu}) {
		t.Errorf("registered %v", got)
	}

	// The GPU resource vanishes: its stream gets an empty list and ends,
	// its socket goes.
	pool.setResources(fpgas())
	r, err := stream.next(2 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Devices) != 0 {
		t.Errorf("last list of a vanished resource: %v", r.Devices)
	}
	if _, err := stream.next(2 * time.Second); !errors.Is(err, io.EOF) {
		t.Errorf("stream of a vanished resource: %v, want EOF", err)
	}
	eventually(t, "the socket removed", func() bool {
		_, err := os.Stat(filepath.Join(e.cfg.Dir, "fusiond-gpu-h200.sock"))
		return errors.Is(err, os.ErrNotExist)
	})
	if _, err := os.Stat(filepath.Join(e.cfg.Dir, "fusiond-fpga-u55c.sock")); err != nil {
		t.Errorf("the other resource's socket: %v", err)
	}
	// It may come back.
	pool.setResources(fpgas(), gpus(false))
	eventually(t, "the resource registered again", func() bool { return len(k.registrations()) == 3 })
}

func TestInvalidResourceNotServed(t *testing.T) {
	pool := newFakePool(Resource{Name: "gpu"}, Resource{Name: "kubernetes.io/gpu"}, gpus(true))
	e := newEnv(t, pool)
	k := startKubelet(t, e.cfg.Dir)
	e.run(e.plugin())
	eventually(t, "registration", func() bool { return len(k.registrations()) == 1 })
	pool.fire()
	time.Sleep(50 * time.Millisecond)
	if got := registeredResources(k); !slices.Equal(got, []string{gpu}) {
		t.Errorf("registered %v", got)
	}
	if n := e.logs.count("resource not served"); n != 2 {
		t.Errorf("invalid resources logged %d times, want once each:\n%s", n, e.logs)
	}
}

func TestStartStop(t *testing.T) {
	e := newEnv(t, newFakePool(gpus(true)))
	k := startKubelet(t, e.cfg.Dir)
	p := e.plugin()
	ctx, cancel := context.WithCancel(context.Background())
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cancel() // Start's context does not stop the plugin
	eventually(t, "registration", func() bool { return len(k.registrations()) == 1 })
	if err := p.Start(context.Background()); err == nil {
		t.Error("a second Start succeeded")
	}
	if err := p.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(context.Background()); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	entries, _ := os.ReadDir(e.cfg.Dir)
	for _, ent := range entries {
		if strings.HasPrefix(ent.Name(), "fusiond-") {
			t.Errorf("socket %s left after Stop", ent.Name())
		}
	}
}

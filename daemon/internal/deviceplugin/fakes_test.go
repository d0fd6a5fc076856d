package deviceplugin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/devices"
)

// fakePool stands in for the daemon.
type fakePool struct {
	mu        sync.Mutex
	resources []Resource
	features  map[string]string
	holds     []Hold
	nextHold  int
	watchers  map[int]func()
	nextWatch int
	now       func() time.Time

	// allocErr, when set, refuses an Allocate.
	allocErr func(resource string, ids []string) error
	// prefer, when set, answers Prefer.
	prefer func(resource string, available, mustInclude []string, size int) ([]string, error)
	// extra is added to every Allocation (nodes, env) to test the
	// conversion.
	extraNodes []devices.DeviceNode
	mounts     []string

	allocCalls  [][]string
	preferCalls []preferCall
	released    map[string]string // hold → why
	bound       map[string]api.PodRef
	bindCount   int
}

type preferCall struct {
	resource           string
	available, include []string
	size               int
}

func newFakePool(rs ...Resource) *fakePool {
	return &fakePool{resources: rs, watchers: map[int]func(){}, released: map[string]string{}, bound: map[string]api.PodRef{}, now: time.Now}
}

func (f *fakePool) Resources() []Resource {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Resource, len(f.resources))
	for i, r := range f.resources {
		out[i] = Resource{Name: r.Name, Devices: slices.Clone(r.Devices)}
	}
	return out
}

func (f *fakePool) Watch(fn func()) func() {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := f.nextWatch
	f.nextWatch++
	f.watchers[id] = fn
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		delete(f.watchers, id)
	}
}

func (f *fakePool) watching() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.watchers)
}

// fire calls the watchers, as the daemon does after a change.
func (f *fakePool) fire() {
	f.mu.Lock()
	fns := make([]func(), 0, len(f.watchers))
	for _, fn := range f.watchers {
		fns = append(fns, fn)
	}
	f.mu.Unlock()
	for _, fn := range fns {
		fn()
	}
}

func (f *fakePool) setResources(rs ...Resource) {
	f.mu.Lock()
	f.resources = rs
	f.mu.Unlock()
	f.fire()
}

func (f *fakePool) setFeatures(m map[string]string) {
	f.mu.Lock()
	f.features = m
	f.mu.Unlock()
	f.fire()
}

func (f *fakePool) Prefer(resource string, available, mustInclude []string, size int) ([]string, error) {
	f.mu.Lock()
	f.preferCalls = append(f.preferCalls, preferCall{resource, slices.Clone(available), slices.Clone(mustInclude), size})
	fn := f.prefer
	f.mu.Unlock()
	if fn != nil {
		return fn(resource, available, mustInclude, size)
	}
	out := slices.Clone(mustInclude)
	for _, id := range available {
		if len(out) < size && !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out, nil
}

func (f *fakePool) Allocate(_ context.Context, resource string, ids []string) (Allocation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.allocCalls = append(f.allocCalls, slices.Clone(ids))
	if f.allocErr != nil {
		if err := f.allocErr(resource, ids); err != nil {
			return Allocation{}, err
		}
	}
	f.nextHold++
	h := Hold{ID: fmt.Sprintf("hold-%d", f.nextHold), Resource: resource, Devices: slices.Clone(ids), Created: f.now()}
	f.holds = append(f.holds, h)
	a := Allocation{Hold: h.ID, Env: map[string]string{"FUSIOND_DEVICES": strings.Join(ids, ",")}}
	for _, id := range ids {
		a.Nodes = append(a.Nodes, devices.DeviceNode{Path: "/dev/fake-" + id, Type: devices.CharDevice, Access: "rw"})
		a.CDI = append(a.CDI, "fusiond.io/fake="+id)
	}
	a.Nodes = append(a.Nodes, f.extraNodes...)
	a.Mounts = f.mounts
	return a, nil
}

func (f *fakePool) Holds() []Hold {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Hold, len(f.holds))
	for i, h := range f.holds {
		out[i] = h
		out[i].Devices = slices.Clone(h.Devices)
		if h.Pod != nil {
			p := *h.Pod
			out[i].Pod = &p
		}
	}
	return out
}

func (f *fakePool) addHold(h Hold) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.holds = append(f.holds, h)
}

func (f *fakePool) Bind(id string, pod api.PodRef) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.holds {
		if f.holds[i].ID == id {
			f.holds[i].Pod = &pod
			f.bound[id] = pod
			f.bindCount++
			return nil
		}
	}
	return fmt.Errorf("no hold %s", id)
}

func (f *fakePool) Release(id, why string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.holds {
		if f.holds[i].ID == id {
			f.holds = slices.Delete(f.holds, i, i+1)
			f.released[id] = why
			return nil
		}
	}
	return fmt.Errorf("no hold %s", id)
}

func (f *fakePool) Features() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]string, len(f.features))
	for k, v := range f.features {
		out[k] = v
	}
	return out
}

func (f *fakePool) allocCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.allocCalls)
}

func (f *fakePool) releasedWhy(id string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	why, ok := f.released[id]
	return why, ok
}

func (f *fakePool) boundTo(id string) (api.PodRef, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.bound[id]
	return p, ok
}

// fakeKubelet is kubelet's registration service on Dir/kubelet.sock. Like
// kubelet it calls the plugin back on the endpoint it was given before it
// answers, so a registration of a socket not served fails.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	t   *testing.T
	dir string

	mu       sync.Mutex
	srv      *grpc.Server
	regs     []*pluginapi.RegisterRequest
	attempts int
	// refuse, when set, answers Register with an error.
	refuse error
}

func startKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	k := &fakeKubelet{t: t, dir: dir}
	k.start()
	t.Cleanup(k.stop)
	return k
}

func (k *fakeKubelet) start() {
	k.t.Helper()
	l := listenUnix(k.t, filepath.Join(k.dir, kubeletSocket))
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, k)
	k.mu.Lock()
	k.srv = srv
	k.mu.Unlock()
	go func() { _ = srv.Serve(l) }()
}

func (k *fakeKubelet) stop() {
	k.mu.Lock()
	srv := k.srv
	k.srv = nil
	k.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
	_ = os.Remove(filepath.Join(k.dir, kubeletSocket))
}

// restart is kubelet restarting: it stops, removes every socket in Dir and
// listens on a new kubelet.sock.
func (k *fakeKubelet) restart() {
	k.t.Helper()
	k.stop()
	entries, err := os.ReadDir(k.dir)
	if err != nil {
		k.t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.Remove(filepath.Join(k.dir, e.Name())); err != nil {
			k.t.Fatal(err)
		}
	}
	k.start()
}

func (k *fakeKubelet) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.mu.Lock()
	k.attempts++
	refuse := k.refuse
	k.mu.Unlock()
	if refuse != nil {
		return nil, refuse
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.dir, req.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	opts, err := pluginapi.NewDevicePluginClient(conn).GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "calling the plugin back: %v", err)
	}
	if !opts.GetPreferredAllocationAvailable {
		return nil, status.Error(codes.FailedPrecondition, "plugin options differ from its registration")
	}
	k.mu.Lock()
	k.regs = append(k.regs, req)
	k.mu.Unlock()
	return &pluginapi.Empty{}, nil
}

func (k *fakeKubelet) registrations() []*pluginapi.RegisterRequest {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.regs)
}

func (k *fakeKubelet) attemptCount() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.attempts
}

func (k *fakeKubelet) setRefuse(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.refuse = err
}

// listenUnix listens on path. Closing the listener does not remove the
// socket file (the fakes remove it): a listener closed late (gRPC's Serve
// closes it when the server stopped first) must not remove the socket of
// the next server on the same path.
func listenUnix(t *testing.T, path string) *net.UnixListener {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	return l
}

// fakePodResources is kubelet's pod-resources API.
type fakePodResources struct {
	podresources.UnimplementedPodResourcesListerServer
	mu    sync.Mutex
	pods  []*podresources.PodResources
	lists int
	srv   *grpc.Server
	path  string
}

func startPodResources(t *testing.T, path string) *fakePodResources {
	t.Helper()
	f := &fakePodResources{path: path}
	l := listenUnix(t, path)
	f.srv = grpc.NewServer()
	podresources.RegisterPodResourcesListerServer(f.srv, f)
	go func() { _ = f.srv.Serve(l) }()
	t.Cleanup(f.stop)
	return f
}

func (f *fakePodResources) stop() {
	f.srv.Stop()
	_ = os.Remove(f.path)
}

func (f *fakePodResources) List(context.Context, *podresources.ListPodResourcesRequest) (*podresources.ListPodResourcesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists++
	return &podresources.ListPodResourcesResponse{PodResources: f.pods}, nil
}

func (f *fakePodResources) listCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lists
}

func (f *fakePodResources) setPods(pods ...*podresources.PodResources) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pods = pods
}

func pod(ns, name string, containers ...*podresources.ContainerResources) *podresources.PodResources {
	return &podresources.PodResources{Namespace: ns, Name: name, Containers: containers}
}

func container(name, resource string, ids ...string) *podresources.ContainerResources {
	return &podresources.ContainerResources{Name: name, Devices: []*podresources.ContainerDevices{{ResourceName: resource, DeviceIds: ids}}}
}

// logBuffer is a concurrency-safe log sink for counting messages.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), msg)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// env is one test's plugin directory, kubelet and pool.
type env struct {
	t    *testing.T
	dir  string
	pool *fakePool
	logs *logBuffer
	cfg  Config
}

// newEnv makes a short temporary directory (unix socket paths are short)
// with the leak check registered first, so it runs after every other
// cleanup.
func newEnv(t *testing.T, pool *fakePool) *env {
	t.Helper()
	checkLeaks(t)
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Mkdir(filepath.Join(dir, "plugins"), 0o750); err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	return &env{t: t, dir: dir, pool: pool, logs: logs, cfg: Config{
		Dir:          filepath.Join(dir, "plugins"),
		PodResources: filepath.Join(dir, "pod-resources.sock"),
		Reconcile:    time.Hour, // tests reconcile on registration or by hand
		Grace:        time.Hour,
		Logger:       slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}}
}

// fastTiming is the plugin's timing shortened for tests.
func fastTiming() timing {
	return timing{poll: 10 * time.Millisecond, backoffMax: 40 * time.Millisecond, rpcTimeout: 2 * time.Second, closeGrace: time.Second, now: time.Now}
}

func (e *env) plugin() *Plugin {
	e.t.Helper()
	p, err := New(e.pool, e.cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	p.t = fastTiming()
	return p
}

// run runs p (Start, as the daemon does) until the test ends; the cleanup
// checks Stop returned and left none of its sockets in Dir.
func (e *env) run(p *Plugin) {
	e.t.Helper()
	if err := p.Start(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := p.Stop(ctx); err != nil {
			e.t.Fatalf("Stop: %v", err)
		}
		entries, _ := os.ReadDir(e.cfg.Dir)
		for _, ent := range entries {
			if strings.HasPrefix(ent.Name(), "fusiond-") {
				e.t.Errorf("socket %s left in Dir after Stop returned", ent.Name())
			}
		}
		if n := e.pool.watching(); n != 0 {
			e.t.Errorf("%d Pool.Watch callbacks left after Stop returned", n)
		}
	})
}

// dial connects to the plugin's socket sock as kubelet does.
func (e *env) dial(sock string) pluginapi.DevicePluginClient {
	e.t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(e.cfg.Dir, sock), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

// eventually polls cond until it holds or 3 s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkLeaks fails the test if goroutines of this package or of gRPC
// outlive it.
func checkLeaks(t *testing.T) {
	t.Cleanup(func() {
		var leaked []string
		deadline := time.Now().Add(3 * time.Second)
		for {
			leaked = leaked[:0]
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			for g := range strings.SplitSeq(string(buf), "\n\n") {
				if strings.Contains(g, "testing.tRunner") || strings.Contains(g, "deviceplugin.checkLeaks") {
					continue
				}
				if strings.Contains(g, "internal/deviceplugin.") || strings.Contains(g, "google.golang.org/grpc.") {
					leaked = append(leaked, g)
				}
			}
			if len(leaked) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if len(leaked) > 0 {
			t.Errorf("%d goroutines left behind:\n%s", len(leaked), strings.Join(leaked, "\n\n"))
		}
	})
}

// lists reads a ListAndWatch stream in the background; next takes one
// list from it, or errTimeout after d.
type lists struct {
	ch chan listOrErr
}

type listOrErr struct {
	r   *pluginapi.ListAndWatchResponse
	err error
}

func readLists(s grpc.ServerStreamingClient[pluginapi.ListAndWatchResponse]) *lists {
	l := &lists{ch: make(chan listOrErr, 100)}
	go func() {
		for {
			r, err := s.Recv()
			l.ch <- listOrErr{r, err}
			if err != nil {
				return
			}
		}
	}()
	return l
}

func (l *lists) next(d time.Duration) (*pluginapi.ListAndWatchResponse, error) {
	select {
	case x := <-l.ch:
		return x.r, x.err
	case <-time.After(d):
		return nil, errTimeout
	}
}

var errTimeout = errors.New("no message in time")

package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/devices"
)

// served starts a plugin over pool with a kubelet and returns a client on
// the GPU resource's socket.
func served(t *testing.T, pool *fakePool) pluginapi.DevicePluginClient {
	t.Helper()
	c, _ := servedPlugin(t, pool)
	return c
}

// servedPlugin is served with the plugin, for its Stats.
func servedPlugin(t *testing.T, pool *fakePool) (pluginapi.DevicePluginClient, *Plugin) {
	t.Helper()
	e := newEnv(t, pool)
	k := startKubelet(t, e.cfg.Dir)
	p := e.plugin()
	e.run(p)
	eventually(t, "registration", func() bool { return len(k.registrations()) == len(pool.Resources()) })
	return e.dial("fusiond-gpu-h200.sock"), p
}

func allocReq(containers ...[]string) *pluginapi.AllocateRequest {
	r := &pluginapi.AllocateRequest{}
	for _, ids := range containers {
		r.ContainerRequests = append(r.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: ids})
	}
	return r
}

func TestAllocate(t *testing.T) {
	pool := newFakePool(gpus(true, true, true))
	pool.extraNodes = []devices.DeviceNode{
		{Path: "/dev/fakectl", Access: "r"},
		{Path: "/dev/fakectl", Access: "w"}, // the same node twice: merged
		{Path: "/dev/fake-uvm", Access: ""}, // no access given: rw
		{Path: "/dev/fake-mknod", Access: "mr"},
	}
	pool.mounts = []string{"/run/fusiond/mps/GPU-a/pipe"}
	c := served(t, pool)
	resp, err := c.Allocate(context.Background(), allocReq([]string{"GPU-a", "GPU-b"}, []string{"GPU-c"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.ContainerResponses) != 2 {
		t.Fatalf("%d container responses", len(resp.ContainerResponses))
	}
	first := resp.ContainerResponses[0]
	if want := map[string]string{"FUSIOND_DEVICES": "GPU-a,GPU-b"}; !maps.Equal(first.Envs, want) {
		t.Errorf("envs %v, want %v", first.Envs, want)
	}
	if want := map[string]string{HoldAnnotation: "hold-1"}; !maps.Equal(first.Annotations, want) {
		t.Errorf("annotations %v, want %v", first.Annotations, want)
	}
	var specs []string
	for _, d := range first.Devices {
		if d.ContainerPath != d.HostPath {
			t.Errorf("device %s: container path %s", d.HostPath, d.ContainerPath)
		}
		specs = append(specs, d.HostPath+":"+d.Permissions)
	}
	want := []string{"/dev/fake-GPU-a:rw", "/dev/fake-GPU-b:rw", "/dev/fakectl:rw", "/dev/fake-uvm:rw", "/dev/fake-mknod:rm"}
	if !slices.Equal(specs, want) {
		t.Errorf("devices %v, want %v", specs, want)
	}
	var cdi []string
	for _, d := range first.CdiDevices {
		cdi = append(cdi, d.Name)
	}
	if want := []string{"fusiond.io/fake=GPU-a", "fusiond.io/fake=GPU-b"}; !slices.Equal(cdi, want) {
		t.Errorf("CDI devices %v, want %v", cdi, want)
	}
	if m := first.Mounts; len(m) != 1 || m[0].HostPath != "/run/fusiond/mps/GPU-a/pipe" || m[0].ContainerPath != m[0].HostPath || m[0].ReadOnly {
		t.Errorf("mounts %v, want the MPS pipe directory at its own path", m)
	}
	if got := resp.ContainerResponses[1].Annotations[HoldAnnotation]; got != "hold-2" {
		t.Errorf("second container's hold %q", got)
	}
	if n := len(pool.Holds()); n != 2 {
		t.Errorf("%d holds, want 2", n)
	}
}

func TestAllocateAllOrNothing(t *testing.T) {
	pool := newFakePool(gpus(true, true, true))
	pool.allocErr = func(_ string, ids []string) error {
		if slices.Contains(ids, "GPU-c") {
			return fmt.Errorf("admission: %w", api.QuotaError("limits.per_user.pending_jobs", "too many pending jobs"))
		}
		return nil
	}
	c := served(t, pool)
	_, err := c.Allocate(context.Background(), allocReq([]string{"GPU-a"}, []string{"GPU-b"}, []string{"GPU-c"}))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("error %v, want ResourceExhausted", err)
	}
	msg := status.Convert(err).Message()
	for _, part := range []string{"container 3 of 3", "GPU-c", "too many pending jobs", "released the 2 holds"} {
		if !strings.Contains(msg, part) {
			t.Errorf("message %q does not say %q", msg, part)
		}
	}
	for _, h := range []string{"hold-1", "hold-2"} {
		if why, ok := pool.releasedWhy(h); !ok || why != whyOther {
			t.Errorf("%s released: %v, why %q", h, ok, why)
		}
	}
	if n := len(pool.Holds()); n != 0 {
		t.Errorf("%d holds left", n)
	}
}

func TestAllocateBadNodeReleasesAll(t *testing.T) {
	pool := newFakePool(gpus(true, true))
	pool.extraNodes = []devices.DeviceNode{{Path: "/dev/fakectl", Access: "rwx"}}
	c := served(t, pool)
	_, err := c.Allocate(context.Background(), allocReq([]string{"GPU-a"}, []string{"GPU-b"}))
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), `"rwx"`) {
		t.Fatalf("error %v, want Internal naming the access", err)
	}
	if why, _ := pool.releasedWhy("hold-1"); !strings.Contains(why, "could not be given to kubelet") {
		t.Errorf("hold-1 released for %q", why)
	}
	if n := len(pool.Holds()); n != 0 {
		t.Errorf("%d holds left", n)
	}
	if n := pool.allocCount(); n != 1 {
		t.Errorf("%d Pool.Allocate calls after the first failed", n)
	}
}

func TestAllocateBadInput(t *testing.T) {
	pool := newFakePool(gpus(true, true))
	c := served(t, pool)
	for name, req := range map[string]*pluginapi.AllocateRequest{
		"no containers":  allocReq(),
		"no devices":     allocReq([]string{"GPU-a"}, nil),
		"empty ID":       allocReq([]string{""}),
		"unknown device": allocReq([]string{"GPU-a"}, []string{"GPU-x"}),
		"device twice":   allocReq([]string{"GPU-a"}, []string{"GPU-b", "GPU-a"}),
		"twice in one":   allocReq([]string{"GPU-b", "GPU-b"}),
	} {
		_, err := c.Allocate(context.Background(), req)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	if n := pool.allocCount(); n != 0 {
		t.Errorf("%d Pool.Allocate calls for bad requests", n)
	}
}

func TestGetPreferredAllocation(t *testing.T) {
	pool := newFakePool(gpus(true, true, true, true))
	c, plugin := servedPlugin(t, pool)
	req := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: []string{"GPU-a", "GPU-b", "GPU-c"}, MustIncludeDeviceIDs: []string{"GPU-c"}, AllocationSize: 2},
		{AvailableDeviceIDs: []string{"GPU-d"}, AllocationSize: 1},
	}}
	resp, err := c.GetPreferredAllocation(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.ContainerResponses) != 2 ||
		!slices.Equal(resp.ContainerResponses[0].DeviceIDs, []string{"GPU-c", "GPU-a"}) ||
		!slices.Equal(resp.ContainerResponses[1].DeviceIDs, []string{"GPU-d"}) {
		t.Errorf("response %v", resp.ContainerResponses)
	}
	pool.mu.Lock()
	calls := slices.Clone(pool.preferCalls)
	pool.mu.Unlock()
	if len(calls) != 2 || calls[0].resource != gpu || calls[0].size != 2 ||
		!slices.Equal(calls[0].available, []string{"GPU-a", "GPU-b", "GPU-c"}) || !slices.Equal(calls[0].include, []string{"GPU-c"}) {
		t.Errorf("Prefer calls %+v", calls)
	}

	// The daemon's refusal and a wrong choice (the daemon's bug, not
	// kubelet's) are no preference: kubelet chooses, and its Allocate is
	// where the daemon may refuse. The pod never fails for want of a
	// preference.
	pool.mu.Lock()
	pool.prefer = func(_ string, avail, _ []string, _ int) ([]string, error) {
		if slices.Contains(avail, "GPU-d") {
			return []string{"GPU-a"}, nil // not offered
		}
		return nil, fmt.Errorf("placement: %w", api.Errorf(api.CodeUnsatisfiable, "no NUMA node has 2 free GPUs"))
	}
	pool.mu.Unlock()
	before := plugin.Stats().Preferred.Unanswered
	resp, err = c.GetPreferredAllocation(context.Background(), req)
	if err != nil || len(resp.ContainerResponses) != 2 || len(resp.ContainerResponses[0].DeviceIDs) != 0 {
		t.Errorf("the daemon's refusal: %v, %v; want no preference", resp, err)
	}
	if got := plugin.Stats().Preferred.Unanswered; got != before+1 {
		t.Errorf("unanswered preferences %d, want %d", got, before+1)
	}
	// A choice kubelet did not offer is no preference: kubelet chooses.
	resp, err = c.GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{ContainerRequests: req.ContainerRequests[1:]})
	if err != nil || len(resp.ContainerResponses) != 1 || len(resp.ContainerResponses[0].DeviceIDs) != 0 {
		t.Errorf("a device not offered: %v, %v", resp, err)
	}
	for name, cr := range map[string]*pluginapi.ContainerPreferredAllocationRequest{
		"size 0":         {AvailableDeviceIDs: []string{"GPU-a"}},
		"size too large": {AvailableDeviceIDs: []string{"GPU-a"}, AllocationSize: 2},
		"must > size":    {AvailableDeviceIDs: []string{"GPU-a", "GPU-b"}, MustIncludeDeviceIDs: []string{"GPU-a", "GPU-b"}, AllocationSize: 1},
		"empty ID":       {AvailableDeviceIDs: []string{""}, AllocationSize: 1},
	} {
		_, err := c.GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{cr}})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
}

func TestPreStartAndOptions(t *testing.T) {
	c := served(t, newFakePool(gpus(true)))
	if _, err := c.PreStartContainer(context.Background(), &pluginapi.PreStartContainerRequest{DevicesIds: []string{"GPU-a"}}); err != nil {
		t.Errorf("PreStartContainer: %v", err)
	}
	o, err := c.GetDevicePluginOptions(context.Background(), &pluginapi.Empty{})
	if err != nil || !o.GetPreferredAllocationAvailable || o.PreStartRequired {
		t.Errorf("options %v, %v", o, err)
	}
}

func TestPoolStatusCodes(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want codes.Code
	}{
		{errors.New("plain"), codes.Unknown},
		{fmt.Errorf("wrapped: %w", api.ErrNotFound), codes.NotFound},
		{api.FieldError("resources.gpu", "bad"), codes.InvalidArgument},
		{api.Errorf(api.CodeForbidden, "no"), codes.PermissionDenied},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{status.Error(codes.Unavailable, "mig busy"), codes.Unavailable},
	} {
		if got := status.Code(poolStatus(tc.err, "m")); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestStatsCountCalls(t *testing.T) {
	pool := newFakePool(gpus(true, true))
	e := newEnv(t, pool)
	k := startKubelet(t, e.cfg.Dir)
	p := e.plugin()
	e.run(p)
	eventually(t, "registration", func() bool { return len(k.registrations()) == 1 })
	c := e.dial("fusiond-gpu-h200.sock")
	if _, err := c.Allocate(context.Background(), allocReq([]string{"GPU-a"})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Allocate(context.Background(), allocReq([]string{"GPU-x"})); err == nil {
		t.Fatal("unknown device allocated")
	}
	if _, err := c.GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: []string{"GPU-a", "GPU-b"}, AllocationSize: 1}}}); err != nil {
		t.Fatal(err)
	}
	s := p.Stats()
	if s.Allocate.Count != 2 || s.Allocate.Errors != 1 || s.Preferred.Count != 1 || s.Preferred.Errors != 0 {
		t.Errorf("stats %+v", s)
	}
	if s.Allocate.P50 <= 0 || s.Allocate.P99 < s.Allocate.P50 || s.Allocate.Max < s.Allocate.P99 {
		t.Errorf("allocate latencies %+v", s.Allocate)
	}
}

package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/devices"
)

// options are the device-plugin options every resource registers with.
func options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true, PreStartRequired: false}
}

// GetDevicePluginOptions implements pluginapi.DevicePluginServer.
func (e *endpoint) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return options(), nil
}

// PreStartContainer implements pluginapi.DevicePluginServer; kubelet does
// not call it (PreStartRequired is false).
func (e *endpoint) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// ListAndWatch implements pluginapi.DevicePluginServer: the resource's
// devices at once, then again after each change, until kubelet goes away,
// the server stops or the resource vanishes (then an empty list is the
// last).
func (e *endpoint) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	for {
		devs, changed, gone := e.snapshot()
		if err := s.Send(listResponse(devs)); err != nil {
			return err
		}
		if gone {
			return nil
		}
		select {
		case <-s.Context().Done():
			return nil
		case <-changed:
		}
	}
}

func listResponse(devs []Device) *pluginapi.ListAndWatchResponse {
	r := &pluginapi.ListAndWatchResponse{Devices: make([]*pluginapi.Device, 0, len(devs))}
	for _, d := range devs {
		pd := &pluginapi.Device{ID: d.ID, Health: pluginapi.Unhealthy}
		if d.Healthy {
			pd.Health = pluginapi.Healthy
		}
		if d.NUMA >= 0 {
			pd.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(d.NUMA)}}}
		}
		r.Devices = append(r.Devices, pd)
	}
	return r
}

// GetPreferredAllocation implements pluginapi.DevicePluginServer by the
// daemon's placement.
func (e *endpoint) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	start := time.Now()
	resp, err := e.preferred(req)
	e.p.preferred.record(time.Since(start), err)
	if err != nil {
		e.log.Warn("GetPreferredAllocation failed", "err", err)
	}
	return resp, err
}

func (e *endpoint) preferred(req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	if e.isGone() {
		return nil, status.Errorf(codes.NotFound, "fusiond: resource %s is no longer served", e.resource)
	}
	if len(req.GetContainerRequests()) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "fusiond: %s: a preferred-allocation request without containers", e.resource)
	}
	resp := &pluginapi.PreferredAllocationResponse{}
	for i, cr := range req.GetContainerRequests() {
		avail, must, size := cr.GetAvailableDeviceIDs(), cr.GetMustIncludeDeviceIDs(), int(cr.GetAllocationSize())
		switch {
		case size <= 0:
			return nil, status.Errorf(codes.InvalidArgument, "fusiond: %s: container %d: allocation size %d", e.resource, i+1, size)
		case size > len(avail):
			return nil, status.Errorf(codes.InvalidArgument, "fusiond: %s: container %d: allocation size %d but only %d devices available", e.resource, i+1, size, len(avail))
		case len(must) > size:
			return nil, status.Errorf(codes.InvalidArgument, "fusiond: %s: container %d: %d devices must be included in an allocation of %d", e.resource, i+1, len(must), size)
		}
		if slices.Contains(avail, "") || slices.Contains(must, "") {
			return nil, status.Errorf(codes.InvalidArgument, "fusiond: %s: container %d: an empty device ID", e.resource, i+1)
		}
		ids, err := e.p.pool.Prefer(e.resource, avail, must, size)
		if err != nil {
			// A preference is advice: kubelet fails the pod on an error
			// here, so it is told none and chooses itself; its Allocate
			// is where the daemon may refuse.
			e.log.Warn("no preferred allocation: kubelet chooses", "resource", e.resource, "container", i+1, "err", err)
			e.p.preferred.recordUnanswered()
			ids = nil
		} else if err := checkPreferred(ids, avail, must, size); err != nil {
			// The daemon's bug: kubelet is given no preference for the
			// container and chooses itself, rather than the pod failing.
			e.log.Error("the daemon's preferred allocation is not valid: kubelet chooses", "container", i+1, "err", err)
			e.p.preferred.recordInvalid()
			ids = nil
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// checkPreferred checks the daemon's choice against what kubelet asked.
func checkPreferred(ids, avail, must []string, size int) error {
	if len(ids) != size {
		return fmt.Errorf("the daemon chose %d devices, not %d", len(ids), size)
	}
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		if seen[id] {
			return fmt.Errorf("the daemon chose device %q twice", id)
		}
		seen[id] = true
		if !slices.Contains(avail, id) && !slices.Contains(must, id) {
			return fmt.Errorf("the daemon chose device %q, which kubelet did not offer", id)
		}
	}
	for _, id := range must {
		if !seen[id] {
			return fmt.Errorf("the daemon left out device %q, which kubelet requires", id)
		}
	}
	return nil
}

// Allocate implements pluginapi.DevicePluginServer: one hold per container,
// all or nothing.
func (e *endpoint) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	start := time.Now()
	resp, err := e.allocate(ctx, req)
	e.p.allocate.record(time.Since(start), err)
	if err != nil {
		e.log.Warn("Allocate failed", "err", err)
	}
	return resp, err
}

// whyOther is the reason given for the holds released when another
// container of the same Allocate failed.
const whyOther = "kubelet's Allocate failed for another container"

func (e *endpoint) allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	crs := req.GetContainerRequests()
	if len(crs) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "fusiond: %s: an allocate request without containers", e.resource)
	}
	// Check every container before holding anything.
	seen := map[string]int{}
	for i, cr := range crs {
		ids := cr.GetDevicesIds()
		if len(ids) == 0 {
			return nil, status.Errorf(codes.InvalidArgument, "fusiond: %s: container %d of %d asks for no devices", e.resource, i+1, len(crs))
		}
		for _, id := range ids {
			if id == "" {
				return nil, status.Errorf(codes.InvalidArgument, "fusiond: %s: container %d of %d: an empty device ID", e.resource, i+1, len(crs))
			}
			if j, dup := seen[id]; dup && j == i {
				return nil, status.Errorf(codes.InvalidArgument, "fusiond: %s: container %d of %d asks for device %q twice", e.resource, i+1, len(crs), id)
			} else if dup {
				return nil, status.Errorf(codes.InvalidArgument, "fusiond: %s: device %q asked for by containers %d and %d", e.resource, id, j+1, i+1)
			}
			seen[id] = i
		}
		unknown, gone := e.known(ids)
		if gone {
			return nil, status.Errorf(codes.NotFound, "fusiond: resource %s is no longer served", e.resource)
		}
		if unknown != "" {
			return nil, status.Errorf(codes.InvalidArgument, "fusiond: %s: container %d of %d: unknown device %q", e.resource, i+1, len(crs), unknown)
		}
	}

	var held []string
	fail := func(err error) (*pluginapi.AllocateResponse, error) {
		if n := e.releaseAll(held, whyOther); n > 0 {
			return nil, status.Errorf(status.Code(err), "%s (released the %d holds made for the other containers)", status.Convert(err).Message(), n)
		}
		return nil, err
	}
	resp := &pluginapi.AllocateResponse{}
	for i, cr := range crs {
		ids := cr.GetDevicesIds()
		what := fmt.Sprintf("fusiond: %s: container %d of %d (devices %s)", e.resource, i+1, len(crs), strings.Join(ids, ","))
		a, err := e.p.pool.Allocate(ctx, e.resource, ids)
		if err != nil {
			return fail(poolStatus(err, "%s: %v", what, err))
		}
		if a.Hold == "" {
			return fail(status.Errorf(codes.Internal, "%s: the daemon returned no hold", what))
		}
		held = append(held, a.Hold)
		car, err := containerResponse(a)
		if err != nil {
			held = held[:len(held)-1]
			if rerr := e.p.pool.Release(a.Hold, "its allocation could not be given to kubelet: "+err.Error()); rerr != nil {
				e.log.Error("cannot release a hold", "hold", a.Hold, "err", rerr)
			}
			return fail(status.Errorf(codes.Internal, "%s: hold %s: %v", what, a.Hold, err))
		}
		resp.ContainerResponses = append(resp.ContainerResponses, car)
	}
	if err := ctx.Err(); err != nil {
		// kubelet gave up: it will not see these holds.
		n := e.releaseAll(held, "kubelet gave up on Allocate")
		return nil, status.Errorf(status.FromContextError(err).Code(), "fusiond: %s: kubelet gave up on Allocate (released %d holds)", e.resource, n)
	}
	e.log.Info("allocated", "holds", held)
	return resp, nil
}

// releaseAll releases holds, logging failures; it returns how many.
func (e *endpoint) releaseAll(holds []string, why string) int {
	for _, h := range holds {
		if err := e.p.pool.Release(h, why); err != nil {
			e.log.Error("cannot release a hold", "hold", h, "err", err)
		}
	}
	return len(holds)
}

// containerResponse is what kubelet gives the container for a.
func containerResponse(a Allocation) (*pluginapi.ContainerAllocateResponse, error) {
	r := &pluginapi.ContainerAllocateResponse{
		Envs:        make(map[string]string, len(a.Env)),
		Annotations: map[string]string{HoldAnnotation: a.Hold},
	}
	for k, v := range a.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, fmt.Errorf("environment variable %q", k)
		}
		r.Envs[k] = v
	}
	byPath := map[string]*pluginapi.DeviceSpec{}
	for _, n := range a.Nodes {
		if n.Path == "" || !filepath.IsAbs(n.Path) {
			return nil, fmt.Errorf("device node path %q is not absolute", n.Path)
		}
		perms, err := permissions(n)
		if err != nil {
			return nil, err
		}
		if d, ok := byPath[n.Path]; ok {
			d.Permissions = mergePermissions(d.Permissions, perms)
			continue
		}
		d := &pluginapi.DeviceSpec{ContainerPath: n.Path, HostPath: n.Path, Permissions: perms}
		byPath[n.Path] = d
		r.Devices = append(r.Devices, d)
	}
	for _, name := range a.CDI {
		if name == "" {
			return nil, errors.New("an empty CDI device name")
		}
		r.CdiDevices = append(r.CdiDevices, &pluginapi.CDIDevice{Name: name})
	}
	for _, dir := range a.Mounts {
		if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
			return nil, fmt.Errorf("mount path %q is not a clean absolute path", dir)
		}
		r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: dir, HostPath: dir})
	}
	return r, nil
}

// permissions is a node's cgroup access as kubelet takes it: a subset of
// "rwm" in that order; an empty access is "rw", as for fusiond's own jobs.
func permissions(n devices.DeviceNode) (string, error) {
	if n.Access == "" {
		return "rw", nil
	}
	if strings.Trim(n.Access, "rwm") != "" {
		return "", fmt.Errorf("device node %s: access %q is not a subset of \"rwm\"", n.Path, n.Access)
	}
	return mergePermissions(n.Access, ""), nil
}

// mergePermissions is the union of two subsets of "rwm", in that order.
func mergePermissions(a, b string) string {
	var out []byte
	for _, c := range []byte("rwm") {
		if strings.IndexByte(a, c) >= 0 || strings.IndexByte(b, c) >= 0 {
			out = append(out, c)
		}
	}
	return string(out)
}

// poolStatus is err from the daemon as a gRPC status with the message
// format and args make: the code follows the daemon's error code.
func poolStatus(err error, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
		return status.Error(s.Code(), msg)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return status.Error(status.FromContextError(err).Code(), msg)
	}
	var ae *api.Error
	if errors.As(err, &ae) {
		return status.Error(apiCode(ae.Code), msg)
	}
	return status.Error(codes.Unknown, msg)
}

// apiCode maps a daemon error code to a gRPC code.
func apiCode(code string) codes.Code {
	switch code {
	case api.CodeBadRequest, api.CodeInvalid:
		return codes.InvalidArgument
	case api.CodeNotFound:
		return codes.NotFound
	case api.CodeForbidden:
		return codes.PermissionDenied
	case api.CodeConflict:
		return codes.Aborted
	case api.CodeUnsatisfiable:
		return codes.FailedPrecondition
	case api.CodeQuota, api.CodeTooLarge:
		return codes.ResourceExhausted
	case api.CodeUnavailable:
		return codes.Unavailable
	case api.CodeInternal:
		return codes.Internal
	}
	return codes.Unknown
}

package deviceplugin

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// endpoint is one resource's device-plugin server: its socket, its gRPC
// server and its registration with kubelet. The serving and registration
// fields are owned by the supervisor goroutine; the device list is shared
// with the gRPC handlers under mu.
type endpoint struct {
	pluginapi.UnimplementedDevicePluginServer

	p        *Plugin
	resource string
	sock     string // base name, the Endpoint kubelet is given
	path     string
	log      *slog.Logger

	// Owned by the supervisor.
	srv        *grpc.Server
	serving    sync.WaitGroup // the Serve goroutine
	served     fileID         // the socket file srv listens on
	serveErr   string         // the last failure to serve, logged once
	registered bool
	rejected   string // kubelet's last refusal, logged once
	backoff    time.Duration
	nextTry    time.Time

	mu      sync.Mutex
	devices []Device
	changed chan struct{} // closed (and replaced) when devices change
	gone    bool          // the resource vanished; streams end
}

func newEndpoint(p *Plugin, resource, sock string) *endpoint {
	return &endpoint{
		p: p, resource: resource, sock: sock, path: filepath.Join(p.cfg.Dir, sock),
		log:     p.log.With("resource", resource, "socket", sock),
		changed: make(chan struct{}),
	}
}

// setDevices makes devs the list ListAndWatch sends; streams are woken only
// when it differs from the last.
func (e *endpoint) setDevices(devs []Device) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.gone || slices.Equal(e.devices, devs) {
		return
	}
	e.devices = slices.Clone(devs)
	close(e.changed)
	e.changed = make(chan struct{})
}

// snapshot is the current list, the channel closed at its next change and
// whether the resource is gone.
func (e *endpoint) snapshot() ([]Device, <-chan struct{}, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.devices, e.changed, e.gone
}

// known says whether id is one of the resource's devices and whether the
// resource is gone.
func (e *endpoint) known(ids []string) (unknown string, gone bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, id := range ids {
		if !slices.ContainsFunc(e.devices, func(d Device) bool { return d.ID == id }) {
			return id, e.gone
		}
	}
	return "", e.gone
}

func (e *endpoint) isGone() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.gone
}

// serve listens on the endpoint's socket (replacing a stale one) and serves
// the device-plugin API on it.
func (e *endpoint) serve() error {
	if len(e.path) > maxSocketPath {
		return fmt.Errorf("socket path %s is longer than %d bytes", e.path, maxSocketPath)
	}
	if fi, err := os.Lstat(e.path); err == nil {
		if fi.Mode()&fs.ModeSocket == 0 {
			return fmt.Errorf("%s exists and is not a socket", e.path)
		}
		if err := os.Remove(e.path); err != nil {
			return fmt.Errorf("removing the stale socket: %w", err)
		}
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: e.path, Net: "unix"})
	if err != nil {
		return err
	}
	// The socket file is removed by stop, and only while it is still the
	// one listened on: kubelet removes it when it restarts, and a new one
	// may be at the path when the old listener closes.
	l.SetUnlinkOnClose(false)
	if err := os.Chmod(e.path, 0o600); err != nil {
		_ = l.Close()
		_ = os.Remove(e.path)
		return err
	}
	id, err := statID(e.path)
	if err != nil {
		_ = l.Close()
		return err
	}
	srv := grpc.NewServer(grpc.WaitForHandlers(true))
	pluginapi.RegisterDevicePluginServer(srv, e)
	e.srv, e.served = srv, id
	e.serving.Add(1)
	go func() {
		defer e.serving.Done()
		if err := srv.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			e.log.Warn("device-plugin server ended", "err", err)
		}
	}()
	return nil
}

// stop stops the server, waiting for its handlers when graceful (at most
// grace, then they are cancelled), and removes its socket if it is still
// the one served.
func (e *endpoint) stop(graceful bool, grace time.Duration) {
	if e.srv == nil {
		return
	}
	if graceful {
		done := make(chan struct{})
		go func() { e.srv.GracefulStop(); close(done) }()
		t := time.NewTimer(grace)
		select {
		case <-done:
		case <-t.C:
			e.srv.Stop()
			<-done
		}
		t.Stop()
	} else {
		e.srv.Stop()
	}
	e.serving.Wait()
	if id, err := statID(e.path); err == nil && id == e.served {
		if err := os.Remove(e.path); err != nil {
			e.log.Warn("cannot remove the socket", "err", err)
		}
	}
	e.srv, e.served, e.registered = nil, fileID{}, false
}

// close ends the endpoint of a resource that vanished: its streams send an
// empty list (kubelet then counts none of its devices at once) and end,
// then the server stops.
func (e *endpoint) close(grace time.Duration) {
	e.mu.Lock()
	if !e.gone {
		e.gone, e.devices = true, nil
		close(e.changed)
		e.changed = make(chan struct{})
	}
	e.mu.Unlock()
	e.stop(true, grace)
}

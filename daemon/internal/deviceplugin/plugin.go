package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// timing holds the plugin's fixed intervals; tests shorten them.
type timing struct {
	// poll is how often kubelet.sock and the plugin's sockets are checked
	// (kubelet removes the sockets and makes kubelet.sock again when it
	// restarts); it is also the first registration retry delay.
	poll time.Duration
	// backoffMax caps the delay between registration attempts while
	// kubelet.sock exists but kubelet does not answer.
	backoffMax time.Duration
	// rpcTimeout bounds each call to kubelet (Register, List).
	rpcTimeout time.Duration
	// closeGrace is how long the server of a vanished resource waits for
	// its calls before it cancels them.
	closeGrace time.Duration
	// now is the wall clock of the reconcile loop, compared with
	// Hold.Created.
	now func() time.Time
}

var defaultTiming = timing{
	poll:       time.Second,
	backoffMax: 30 * time.Second,
	rpcTimeout: 5 * time.Second,
	closeGrace: 2 * time.Second,
	now:        time.Now,
}

// Plugin serves the Pool's resources to kubelet. Make it with New and run
// it once, with Start and Stop.
type Plugin struct {
	pool Pool
	cfg  Config
	log  *slog.Logger
	t    timing

	allocate, preferred latencies

	// kick is signalled (without blocking) by Pool.Watch; a burst of
	// changes becomes one refresh.
	kick chan struct{}
	// reconcileNow asks for a reconcile before the next tick.
	reconcileNow chan struct{}

	mu      sync.Mutex
	started bool
	cancel  context.CancelFunc // Start's; nil before it
	done    chan struct{}      // closed when Start's run returns
	// upSince is when kubelet's pod-resources API last came back (zero
	// while it is down or kubelet just restarted): holds count as missing
	// only from then.
	upSince        time.Time
	podResourcesUp bool
	resources      int
	registered     int
	registrations  uint64
	binds          uint64
	releases       uint64
}

// New returns a plugin serving pool's resources as cfg says, or the
// errors of cfg.
func New(pool Pool, cfg Config) (*Plugin, error) {
	if pool == nil {
		return nil, errors.New("deviceplugin: no pool")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Plugin{
		pool: pool, cfg: cfg, log: cfg.Logger.With("part", "deviceplugin"), t: defaultTiming,
		kick: make(chan struct{}, 1), reconcileNow: make(chan struct{}, 1),
	}, nil
}

// Start runs the plugin in the background until Stop, for the daemon's
// lifecycle; ctx's cancellation does not stop it. Kubelet being down,
// refusing a registration or its pod-resources API failing are retried
// and logged, never returned. It fails only when the plugin already ran:
// a plugin runs once. Stop stops every server and removes its sockets
// (the features file stays; see features.go).
func (p *Plugin) Start(ctx context.Context) error {
	if err := p.claim(); err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	p.mu.Lock()
	p.cancel, p.done = cancel, done
	p.mu.Unlock()
	go func() {
		defer close(done)
		p.run(runCtx)
	}()
	return nil
}

// Stop stops what Start started and waits for it (sockets removed) or for
// ctx. It does nothing for a plugin not started by Start, and is safe to
// call twice.
func (p *Plugin) Stop(ctx context.Context) error {
	p.mu.Lock()
	cancel, done := p.cancel, p.done
	p.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("deviceplugin: stopping: %w", ctx.Err())
	}
}

func (p *Plugin) claim() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started {
		return errors.New("deviceplugin: the plugin already ran; make another with New")
	}
	p.started = true
	return nil
}

// Stats returns the plugin's counters and latencies.
func (p *Plugin) Stats() Stats {
	s := Stats{Allocate: p.allocate.stats(), Preferred: p.preferred.stats()}
	p.mu.Lock()
	defer p.mu.Unlock()
	s.Resources, s.Registered, s.Registrations = p.resources, p.registered, p.registrations
	s.PodResourcesUp, s.Binds, s.Releases = p.podResourcesUp, p.binds, p.releases
	return s
}

// signal is the Pool.Watch callback: it never blocks.
func (p *Plugin) signal() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func (p *Plugin) triggerReconcile() {
	select {
	case p.reconcileNow <- struct{}{}:
	default:
	}
}

func (p *Plugin) run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopWatch := p.pool.Watch(p.signal)
	defer stopWatch()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		p.reconcileLoop(ctx)
	}()
	s := &supervisor{p: p, eps: map[string]*endpoint{}, refused: map[string]string{}}
	if p.cfg.FeaturesFile != "" {
		s.features = &featuresFile{path: p.cfg.FeaturesFile, prefix: p.cfg.FeaturePrefix}
	}
	s.run(ctx)
	cancel()
	wg.Wait()
}

// supervisor owns the endpoints: it follows the resources, serves and
// registers them, notices kubelet's restarts and writes the features file.
// Everything it does runs in one goroutine.
type supervisor struct {
	p   *Plugin
	eps map[string]*endpoint // by resource name
	// kubelet is kubelet.sock as last seen, zero while it is missing.
	kubelet     fileID
	kubeletSeen bool
	// kubeletDown says the current kubelet outage was logged.
	kubeletDown bool
	// refused are the resources not served for their name, logged once.
	refused  map[string]string
	features *featuresFile
}

func (s *supervisor) run(ctx context.Context) {
	defer s.stopAll()
	tick := time.NewTicker(s.p.t.poll)
	defer tick.Stop()
	s.p.log.Info("device plugin started", "dir", s.p.cfg.Dir, "pod_resources", s.p.cfg.PodResources)
	s.refresh()
	for {
		s.check()
		s.register(ctx)
		select {
		case <-ctx.Done():
			return
		case <-s.p.kick:
			s.refresh()
		case <-tick.C:
			if s.features != nil && s.features.stale() {
				s.writeFeatures()
			}
		}
	}
}

// sorted is the endpoints in resource-name order.
func (s *supervisor) sorted() []*endpoint {
	eps := make([]*endpoint, 0, len(s.eps))
	for _, ep := range s.eps {
		eps = append(eps, ep)
	}
	slices.SortFunc(eps, func(a, b *endpoint) int { return strings.Compare(a.resource, b.resource) })
	return eps
}

// refresh follows Pool.Resources: new resources get an endpoint (served at
// the next check), vanished ones are closed, and every stream is given its
// resource's list.
func (s *supervisor) refresh() {
	want := map[string]bool{}
	for _, r := range s.p.pool.Resources() {
		if want[r.Name] {
			continue
		}
		if err := checkResourceName(r.Name); err != nil {
			if s.refused[r.Name] != err.Error() {
				s.p.log.Error("resource not served", "err", err)
				s.refused[r.Name] = err.Error()
			}
			continue
		}
		want[r.Name] = true
		ep := s.eps[r.Name]
		if ep == nil {
			sock := socketName(r.Name, func(name string) bool {
				for _, ep := range s.eps {
					if ep.sock == name {
						return true
					}
				}
				return name == kubeletSocket
			})
			ep = newEndpoint(s.p, r.Name, sock)
			s.eps[r.Name] = ep
			ep.log.Info("serving a new resource", "devices", len(r.Devices))
		}
		ep.setDevices(r.Devices)
	}
	for _, ep := range s.sorted() {
		if !want[ep.resource] {
			ep.close(s.p.t.closeGrace)
			delete(s.eps, ep.resource)
			ep.log.Info("resource vanished: stopped serving it")
		}
	}
	s.count()
	if s.features != nil {
		s.writeFeatures()
	}
}

func (s *supervisor) writeFeatures() {
	skipped, err := s.features.update(s.p.pool.Features())
	if len(skipped) > 0 {
		s.p.log.Warn("features left out of the features file: not valid as labels", "features", skipped)
	}
	if err != nil {
		s.p.log.Error("cannot write the features file; retrying", "path", s.features.path, "err", err)
	}
}

// check notices kubelet's restart (kubelet.sock made again) and sockets
// removed, and serves every endpoint not served.
func (s *supervisor) check() {
	id, err := statID(filepath.Join(s.p.cfg.Dir, kubeletSocket))
	switch {
	case err != nil:
		s.kubelet = fileID{}
	case id != s.kubelet:
		if s.kubeletSeen {
			s.p.log.Info("kubelet.sock was made again (kubelet restarted): registering again")
		}
		s.kubelet, s.kubeletSeen = id, true
		for _, ep := range s.eps {
			ep.registered, ep.backoff, ep.nextTry = false, 0, time.Time{}
		}
		s.p.kubeletRestarted()
	}
	for _, ep := range s.sorted() {
		if ep.srv != nil {
			if id, err := statID(ep.path); err == nil && id == ep.served {
				continue
			}
			ep.log.Info("socket removed (kubelet restarted?): serving it again")
			ep.stop(false, 0)
		}
		if err := ep.serve(); err != nil {
			if err.Error() != ep.serveErr {
				ep.log.Error("cannot serve the resource; retrying", "err", err)
				ep.serveErr = err.Error()
			}
			continue
		}
		if ep.serveErr != "" {
			ep.log.Info("serving the resource again")
			ep.serveErr = ""
		}
		ep.registered, ep.backoff, ep.nextTry = false, 0, time.Time{}
	}
	s.count()
}

// register registers the served, unregistered endpoints whose retry time
// has come. A kubelet outage is logged once.
func (s *supervisor) register(ctx context.Context) {
	pending := false
	for _, ep := range s.eps {
		pending = pending || (ep.srv != nil && !ep.registered)
	}
	if !pending {
		return
	}
	if s.kubelet == (fileID{}) {
		if !s.kubeletDown {
			s.p.log.Warn("kubelet is not up (no kubelet.sock): waiting for it", "dir", s.p.cfg.Dir)
			s.kubeletDown = true
		}
		return
	}
	now := time.Now()
	registered := false
	for _, ep := range s.sorted() {
		if ep.srv == nil || ep.registered || now.Before(ep.nextTry) {
			continue
		}
		err := s.p.registerEndpoint(ctx, ep)
		if err == nil {
			ep.registered, ep.backoff, ep.rejected = true, 0, ""
			registered = true
			s.p.mu.Lock()
			s.p.registrations++
			s.p.mu.Unlock()
			ep.log.Info("registered with kubelet")
			continue
		}
		if ctx.Err() != nil {
			return
		}
		ep.backoff = min(max(2*ep.backoff, s.p.t.poll), s.p.t.backoffMax)
		ep.nextTry = now.Add(ep.backoff)
		switch status.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
			if !s.kubeletDown {
				s.p.log.Warn("kubelet does not answer: registering again until it does", "err", err)
				s.kubeletDown = true
			}
		default:
			if err.Error() != ep.rejected {
				ep.log.Error("kubelet refused the registration; retrying", "err", err)
				ep.rejected = err.Error()
			}
		}
	}
	if registered {
		if s.kubeletDown {
			s.p.log.Info("kubelet is up again")
			s.kubeletDown = false
		}
		s.p.triggerReconcile()
	}
	s.count()
}

// count publishes the numbers of resources and registrations for Stats.
func (s *supervisor) count() {
	n := 0
	for _, ep := range s.eps {
		if ep.registered {
			n++
		}
	}
	s.p.mu.Lock()
	s.p.resources, s.p.registered = len(s.eps), n
	s.p.mu.Unlock()
}

func (s *supervisor) stopAll() {
	for _, ep := range s.sorted() {
		ep.stop(false, 0)
	}
	s.count()
	s.p.log.Info("device plugin stopped")
}

// registerEndpoint registers ep with kubelet; kubelet then calls back on
// ep's socket.
func (p *Plugin) registerEndpoint(ctx context.Context, ep *endpoint) error {
	conn, err := grpc.NewClient("unix://"+filepath.Join(p.cfg.Dir, kubeletSocket),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("registering %s: %w", ep.resource, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, p.t.rpcTimeout)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     ep.sock,
		ResourceName: ep.resource,
		Options:      options(),
	})
	if err != nil {
		return fmt.Errorf("registering %s: %w", ep.resource, err)
	}
	return nil
}

// kubeletRestarted restarts the clock of missing holds: a kubelet that
// just started may list its pods late.
func (p *Plugin) kubeletRestarted() {
	p.mu.Lock()
	p.upSince = time.Time{}
	p.mu.Unlock()
}

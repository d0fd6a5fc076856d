package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/apiserver"
	"github.com/fusiond/fusiond/daemon/internal/audit"
	"github.com/fusiond/fusiond/daemon/internal/executor"
	"github.com/fusiond/fusiond/daemon/internal/hardware"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/metrics"
	"github.com/fusiond/fusiond/daemon/internal/peers"
	"github.com/fusiond/fusiond/daemon/internal/qos"
	"github.com/fusiond/fusiond/daemon/internal/reclaim"
	"github.com/fusiond/fusiond/daemon/internal/store"
	"github.com/fusiond/fusiond/daemon/internal/telemetry"
	"github.com/fusiond/fusiond/devices"
)

// Options are New's (and Run's) inputs.
type Options struct {
	Config  Config
	Logger  *slog.Logger
	Version api.Version
	// OnReady, if set, is called once the socket accepts requests.
	OnReady func()
	// Listener, if set, is the API socket already open (systemd socket
	// activation): Run serves it instead of creating Config.Socket, and
	// leaves the socket file to whoever opened it.
	Listener net.Listener
	// Watchdog, if set, is called from Run's main loop every
	// WatchdogInterval, but only after the daemon answered a request on its
	// own socket (HTTP server and job manager both responsive), so a hung
	// daemon stops calling it and systemd restarts it.
	Watchdog         func()
	WatchdogInterval time.Duration
	// OnStopping, if set, is called when a graceful shutdown begins.
	OnStopping func()
}

// Daemon is a built fusiond: its store open, its hardware discovered, its
// jobs recovered, its API handler ready. New builds one without a socket;
// Serve runs it on a listener.
type Daemon struct {
	cfg     Config
	log     *slog.Logger
	version api.Version
	o       Options

	store    *store.Store
	hw       *hardware.Host
	capacity api.NodeResources
	mgr      *jobs.Manager
	srv      *apiserver.Server
	audit    *audit.Log
	metrics  *metrics.Metrics
	peers    *peers.Node

	unsubscribeMetrics func()

	// disconnect stops the device updates reaching the placer.
	disconnect func()
	// stopQoS stops the QoS loop and detaches the latency probes.
	stopQoS func()
	// stopTelemetry stops the telemetry bus's sampler, stopElastic the
	// elastic-job controller.
	stopTelemetry func()
	stopElastic   func()
	// stopReclaim stops the reclaimed-capacity loop.
	stopReclaim func()
	stopPower   context.CancelFunc
	powerDone   chan struct{}
	closeOnce   sync.Once
}

// New builds the daemon: it opens the store and the host's hardware,
// builds the placer, executor and job manager, recovers the jobs an
// earlier daemon left, applies the GPU configuration and starts the
// hardware's background loops. Jobs are not placed until Serve. Close
// undoes New; Serve closes the daemon itself when it returns.
func New(ctx context.Context, o Options) (_ *Daemon, err error) {
	cfg, log := o.Config, o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// Job monitors run in other directories than the daemon: every path
	// they are handed must be absolute.
	for _, p := range []*string{&cfg.StateDir, &cfg.Socket} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return nil, fmt.Errorf("resolving %s: %w", *p, err)
		}
		*p = abs
	}
	if sock, ok := strings.CutPrefix(cfg.Metrics.Listen, "unix:"); ok {
		abs, err := filepath.Abs(sock)
		if err != nil {
			return nil, fmt.Errorf("resolving metrics.listen %s: %w", sock, err)
		}
		cfg.Metrics.Listen = "unix:" + abs
	}
	d := &Daemon{cfg: cfg, log: log, version: o.Version, o: o}
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	if d.store, err = store.Open(filepath.Join(cfg.StateDir, "fusiond.db"), store.Options{Logger: log}); err != nil {
		return nil, err
	}
	if d.hw, err = hardware.Open(ctx, cfg.GPU.hostConfig(hardware.Config{StateDir: cfg.StateDir, Simulate: cfg.Simulate}), log); err != nil {
		return nil, err
	}
	if d.capacity, err = hostCapacity(); err != nil {
		return nil, err
	}
	// Guaranteed jobs get exclusive cores where cgroups can pin them: the
	// placer chooses them (with the engine, from the topology's cores) and
	// rewrites the shared pool's cpusets after every change.
	cg, cgErr := jobCgroups(cfg, log)
	var cores func() []cgroups.Core
	popts := placementOptions(d.hw)
	popts.Logger = log
	if cg != nil {
		if cores, err = hostCores(ctx, d.hw); err != nil {
			return nil, err
		}
		popts.KeepSharedCores, popts.OnShared = 1, cg.SetSharedCPUs
	}
	inventory := func() hostplacer.Hardware {
		hw := hardwareOf(context.WithoutCancel(ctx), d.hw, d.capacity, log)
		if cores != nil {
			hw.Cores = cores()
		}
		return hw
	}
	// The telemetry bus is built before the placer, which scores with the
	// configured profiles and the live load the bus reads (GPU
	// utilisation and power, CPU busy per NUMA node); it samples from when
	// the job manager is there.
	bus, err := newTelemetry(ctx, cfg.Telemetry, d.hw, func() *jobs.Manager { return d.mgr }, cg, log)
	if err != nil {
		return nil, err
	}
	popts.Profiles = cfg.Placement.profiles()
	popts.Live = busLive{r: bus, over: liveOver}
	engine := hostplacer.New(inventory(), popts)
	runner, err := newExecutor(cfg, cg, cgErr, engine.SharedCPUs, log)
	if err != nil {
		return nil, err
	}
	if cg != nil {
		log.Info("job cgroups ready", "mode", cg.Mode(), "parent", cfg.CgroupParent, "cores", len(engine.Hardware().Cores))
	}
	// The QoS loop starts after the job manager, which needs the metrics:
	// the scrape reads it through qosLoopRef once it is there.
	var qosLoopRef atomic.Pointer[qos.Loop]
	d.metrics = metrics.New(metrics.Options{Version: o.Version.Version, Logger: log, Sources: metrics.Sources{
		Jobs:      func() jobs.Stats { return d.mgr.Stats() },
		Capacity:  engine.Capacity,
		Allocated: engine.Allocated,
		Devices:   func(ctx context.Context) []devices.Device { return inventories(ctx, d.hw, log) },
		Tiers:     tierStats(cg),
		QoS:       qosMetrics(&qosLoopRef),
	}})
	d.unsubscribeMetrics = d.hw.Subscribe(d.metrics.Update)
	// The audit log records every admission (the job manager's) and
	// every privileged or refused request (the API's).
	if d.audit, err = audit.Open(filepath.Join(cfg.StateDir, "audit.log"),
		audit.Options{MaxBytes: int64(cfg.Audit.MaxBytes), Keep: cfg.Audit.Keep, MaxAge: time.Duration(cfg.Audit.MaxAge),
			RefusedRate: cfg.Audit.RefusedRate, RefusedBurst: cfg.Audit.RefusedBurst}, log); err != nil {
		return nil, err
	}
	prep := &devicePreparer{drivers: d.hw.Drivers(), log: log}
	d.mgr = jobs.New(jobs.Config{
		LogDir:           filepath.Join(cfg.StateDir, "jobs"),
		DefaultTiers:     cfg.Tiers,
		CancelGrace:      time.Duration(cfg.CancelGrace),
		MaxFinished:      cfg.Retention.MaxFinishedJobs,
		MaxAge:           time.Duration(cfg.Retention.MaxAge),
		DaemonUID:        uint32(os.Geteuid()),
		LeaveJobsRunning: cfg.LeaveJobsOnShutdown,
		Preparer:         prep,
		Limits: jobs.Limits{
			MaxSpecBytes: int64(cfg.Limits.MaxSpecBytes),
			PendingJobs:  cfg.Limits.PerUser.PendingJobs,
			RunningJobs:  cfg.Limits.PerUser.RunningJobs,
			SpecBytes:    int64(cfg.Limits.PerUser.SpecBytes),
			SpecBudget:   int64(cfg.Limits.SpecBudget),
			LogBytes:     int64(cfg.Limits.PerUser.LogBytes),
			LogBudget:    int64(cfg.Limits.LogBudget),
			ExemptRoot:   cfg.Limits.ExemptRoot,
		},
		Observer: d.metrics,
		Queue:    cfg.Scheduling.queue(),
		Audit:    d.audit,
	}, d.store, runner, engine, log)
	prep.holders = d.mgr
	if cfg.Peers.Enabled {
		if d.peers, err = startPeers(cfg, d.mgr, engine, d.audit, log); err != nil {
			return nil, err
		}
	}
	if err := d.mgr.Recover(); err != nil {
		return nil, err
	}
	if err := applyGPUConfig(d.hw, cfg.GPU, log); err != nil {
		return nil, err
	}
	d.stopTelemetry = startTelemetry(ctx, bus)
	if d.stopElastic, err = startElastic(ctx, cfg.Elastic, d.mgr, bus, cg, filepath.Join(cfg.StateDir, "jobs"), log); err != nil {
		return nil, err
	}
	var knobs *beKnobs
	if cg != nil {
		knobs = &beKnobs{cg: cg, jobs: mgrJobCPU{mgr: d.mgr, cg: cg}}
	}
	reclaimLoop, reclaimOff, stopReclaim, err := startReclaim(ctx, cfg.Reclaim, cg, knobs, d.mgr, engine, bus, engine.Capacity, int64(cfg.QoS.MinBestEffortCPU), log)
	if err != nil {
		return nil, err
	}
	d.stopReclaim = stopReclaim
	qosLoop, qosOff, stopQoS := startQoS(ctx, cfg.QoS, cg, knobs, d.mgr, bus, log)
	d.stopQoS = stopQoS
	qosLoopRef.Store(qosLoop)
	d.disconnect = connectDevices(d.hw, engine, d.mgr, inventory)
	powerCtx, stopPower := context.WithCancel(context.WithoutCancel(ctx))
	d.stopPower, d.powerDone = stopPower, make(chan struct{})
	go func() {
		defer close(d.powerDone)
		powerCaps(powerCtx, d.hw.GPUs(), cfg.GPU.Power, engine, log)
	}()

	var adminGID *uint32
	if cfg.AdminGroup != "" {
		gid, err := lookupGroup(cfg.AdminGroup)
		if err != nil {
			return nil, fmt.Errorf("admin_group: %w", err)
		}
		adminGID = &gid
	}
	svc := &service{Manager: d.mgr, placer: engine, runner: runner, hw: d.hw, version: o.Version.Version, started: time.Now().UTC(), qos: qosLoop, qosOff: qosOff, telemetry: bus,
		reclaim: reclaimLoop, reclaimOff: reclaimOff, fileLimit: fileLimitNote(cfg, log)}
	d.srv = apiserver.New(svc, apiserver.Config{
		MaxBodyBytes:      int64(cfg.MaxRequestBytes),
		AdminGID:          adminGID,
		Version:           o.Version,
		Logger:            log,
		Devices:           hardware.NewBackend(d.hw, d.mgr), // MIG apply and FPGA programming spare what jobs hold
		MaxBitstreamBytes: int64(cfg.MaxBitstreamBytes),
		Audit:             d.audit,
		MaxStreamsPerUser: cfg.Limits.PerUser.Streams,
		StreamsExemptRoot: cfg.Limits.ExemptRoot,
		StreamIdleTimeout: time.Duration(cfg.Limits.StreamIdleTimeout),
		Observer:          d.metrics,
		Peers:             peerBackend(d.peers),
	})
	return d, nil
}

// Close stops what New started — the power loop, the hardware's
// background work — and closes the store. It does not stop jobs (Serve's
// shutdown does). It is safe to call more than once.
func (d *Daemon) Close() error {
	var err error
	d.closeOnce.Do(func() {
		if d.peers != nil {
			d.peers.Close()
		}
		if d.disconnect != nil {
			d.disconnect()
		}
		if d.unsubscribeMetrics != nil {
			d.unsubscribeMetrics()
		}
		if d.stopQoS != nil {
			d.stopQoS()
		}
		if d.stopElastic != nil {
			d.stopElastic()
		}
		if d.stopReclaim != nil {
			d.stopReclaim()
		}
		if d.stopTelemetry != nil {
			d.stopTelemetry()
		}
		if d.stopPower != nil {
			d.stopPower()
			<-d.powerDone
		}
		if d.hw != nil {
			d.hw.Close()
		}
		if d.store != nil {
			err = d.store.Close()
		}
		if d.audit != nil {
			err = errors.Join(err, d.audit.Close())
		}
	})
	return err
}

// Run builds the daemon, opens its socket (or takes Options.Listener) and
// serves until ctx is cancelled.
func Run(ctx context.Context, o Options) error {
	d, err := New(ctx, o)
	if err != nil {
		return err
	}
	defer d.Close()
	ln := o.Listener
	if ln == nil {
		if ln, err = listen(d.cfg); err != nil {
			return err
		}
		defer os.Remove(d.cfg.Socket)
	}
	return d.Serve(ctx, ln)
}

// Serve starts placing jobs and serves the API on ln until ctx is
// cancelled, then shuts down gracefully: it stops accepting connections,
// finishes in-flight requests and store writes and stops (or, with
// leave_jobs_on_shutdown, leaves) running jobs. It closes the daemon when
// it returns.
func (d *Daemon) Serve(ctx context.Context, ln net.Listener) error {
	defer d.Close()
	cfg, log, o := d.cfg, d.log, d.o
	// The metrics listener opens first: a bad address stops the start
	// before any job is placed.
	var mln net.Listener
	network, addr, _ := cfg.Metrics.Endpoint()
	if network != "" {
		var err error
		if mln, err = listenMetrics(cfg, network, addr); err != nil {
			return err
		}
		if network == "unix" {
			defer os.Remove(addr)
		}
	}
	d.mgr.Start()
	if d.peers != nil {
		d.peers.Start()
	}
	// Every connection counts against the limits from its accept on (an
	// idle one too), and the servers close idle and slow ones, so no user
	// can hold the daemon's descriptors or keep another user out.
	hs := &http.Server{
		Handler:           d.srv,
		ConnContext:       d.srv.ConnContext,
		ReadHeaderTimeout: time.Duration(cfg.Limits.HeaderTimeout),
		IdleTimeout:       time.Duration(cfg.Limits.IdleTimeout),
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	conns := apiserver.LimitListener(ln, apiserver.ConnLimits{Total: cfg.Limits.Connections, Reserve: cfg.Limits.AdminConnections,
		PerUser: cfg.Limits.PerUser.Connections, TotalLimit: apiserver.LimitConnections}, d.srv.Identify, log.With("listener", "api"))
	serveErr := make(chan error, 2) // the API and metrics servers
	go func() { serveErr <- hs.Serve(conns) }()
	var ms *http.Server
	if mln != nil {
		ms = &http.Server{
			Handler:           d.metrics.Handler(),
			ReadHeaderTimeout: time.Duration(cfg.Limits.HeaderTimeout),
			ReadTimeout:       time.Duration(cfg.Limits.HeaderTimeout),
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       time.Duration(cfg.Limits.IdleTimeout),
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		}
		defer ms.Close() // after Shutdown below; at once on an early return
		mlim := apiserver.LimitListener(mln, apiserver.ConnLimits{Total: cfg.Metrics.MaxConnections, TotalLimit: apiserver.LimitMetricsConnections}, nil, log.With("listener", "metrics"))
		go func() { serveErr <- ms.Serve(mlim) }()
		log.Info("metrics listening", "network", network, "address", mln.Addr().String())
	}
	log.Info("fusiond ready", "socket", cfg.Socket, "state_dir", cfg.StateDir,
		"cpu", d.capacity.CPU.String(), "memory", d.capacity.Memory.String(), "version", d.version.Version)
	if o.OnReady != nil {
		o.OnReady()
	}

	var tick <-chan time.Time
	if o.Watchdog != nil && o.WatchdogInterval > 0 {
		t := time.NewTicker(o.WatchdogInterval)
		defer t.Stop()
		tick = t.C
	}
	for running := true; running; {
		select {
		case <-ctx.Done():
			running = false
		case err := <-serveErr:
			return fmt.Errorf("API or metrics server: %w", err)
		case <-tick:
			if err := selfCheck(ctx, cfg.Socket, o.WatchdogInterval); err != nil {
				log.Warn("health check failed: withholding the watchdog ping", "err", err)
				continue
			}
			o.Watchdog()
		}
	}
	if o.OnStopping != nil {
		o.OnStopping()
	}
	log.Info("shutting down: no new requests; finishing in-flight work")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), time.Duration(cfg.ShutdownTimeout))
	defer cancel()
	d.srv.CloseStreams()
	if err := hs.Shutdown(shutdownCtx); err != nil {
		log.Warn("API server did not finish in time", "err", err)
	}
	if ms != nil {
		if err := ms.Shutdown(shutdownCtx); err != nil {
			log.Warn("metrics server did not finish in time", "err", err)
		}
	}
	d.mgr.Stop(shutdownCtx)
	log.Info("fusiond stopped")
	return nil
}

// selfCheck asks the daemon's own socket for the node status, which goes
// through the HTTP server and takes the job manager's lock.
func selfCheck(ctx context.Context, socket string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c := api.NewClient(socket)
	defer c.Close()
	_, err := c.Node(ctx)
	return err
}

// hostCapacity is what the placer hands out: every online CPU and
// all physical memory.
func hostCapacity() (api.NodeResources, error) {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return api.NodeResources{}, fmt.Errorf("sysinfo: %w", err)
	}
	return api.NodeResources{
		CPU:    api.MilliCPU(runtime.NumCPU() * 1000),
		Memory: api.Bytes(uint64(si.Totalram) * uint64(si.Unit)),
	}, nil
}

func lookupGroup(name string) (uint32, error) {
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, fmt.Errorf("group %q: %w (create it with: groupadd --system %s)", name, err, name)
	}
	gid, err := strconv.ParseUint(g.Gid, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("group %q has gid %q: %w", name, g.Gid, err)
	}
	return uint32(gid), nil
}

// listen opens the API socket (see listenUnix).
func listen(cfg Config) (net.Listener, error) {
	return listenUnix(cfg, cfg.Socket)
}

// listenUnix opens a Unix socket at path the way the API's is made: it
// refuses to take over a socket another process is serving, removes a
// stale one, and sets the socket's group (socket_group) and mode
// (socket_mode) before anyone can connect to it.
func listenUnix(cfg Config, path string) (net.Listener, error) {
	mode, _ := cfg.Mode()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("socket directory: %w", err)
	}
	if _, err := os.Lstat(path); err == nil {
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("another fusiond is already serving %s", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing stale socket %s: %w", path, err)
		}
	}
	gid := -1
	if cfg.SocketGroup != "" {
		g, err := lookupGroup(cfg.SocketGroup)
		if err != nil {
			return nil, fmt.Errorf("socket_group: %w", err)
		}
		gid = int(g)
	}
	// Create the socket with no access for anyone but its owner, then
	// widen it once the group is right.
	old := unix.Umask(0o177)
	ln, err := net.Listen("unix", path)
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if gid >= 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			ln.Close()
			return nil, fmt.Errorf("socket group of %s: %w", path, err)
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("socket mode of %s: %w", path, err)
	}
	return ln, nil
}

// service adds node status to the job manager to make the API backend.
type service struct {
	*jobs.Manager
	placer  jobs.Placer
	runner  *executor.MonitorRunner
	hw      *hardware.Host
	version string
	started time.Time
	// qos is the QoS loop, nil when it does not run (qosOff says why).
	qos    *qos.Loop
	qosOff api.QoSStatus
	// telemetry is the telemetry bus.
	telemetry *telemetry.Bus
	// reclaim is the reclaimed-capacity loop, nil when it does not run
	// (reclaimOff says why).
	reclaim    *reclaim.Loop
	reclaimOff api.ReclaimStatus
	// fileLimit says why the open-file limit is too low for the
	// connection limits ("" when it is not).
	fileLimit string
}

var _ apiserver.Backend = (*service)(nil)

// Node reports the host's capacity, allocation, job counts and devices.
func (s *service) Node(ctx context.Context, _ api.Caller) (api.NodeStatus, error) {
	host, _ := os.Hostname()
	counts, cordoned := s.Counts()
	return api.NodeStatus{
		Hostname:  host,
		Version:   s.version,
		StartedAt: s.started,
		Cordoned:  cordoned,
		Capacity:  s.placer.Capacity(),
		Allocated: s.placer.Allocated(),
		Jobs:      counts,
		Simulated: s.hw.Simulated() != "",
		Devices:   s.hw.Devices(ctx),
		Isolation: s.runner.Isolation(),
		Notes:     s.notes(),
		QoS:       s.qosStatus(),
		Telemetry: s.telemetryStatus(),
		Reclaim:   s.reclaimStatus(),
	}, nil
}

// notes are the hardware's notes and, while the job manager is not ready
// (its state database refused the last write), why.
func (s *service) notes() []string {
	notes := s.hw.Notes()
	if s.fileLimit != "" {
		notes = append(notes, s.fileLimit)
	}
	if err := s.Ready(); err != nil {
		notes = append(notes, "not ready: "+err.Error())
	}
	return notes
}

func (s *service) reclaimStatus() *api.ReclaimStatus {
	st := s.reclaimOff
	if s.reclaim != nil {
		st = s.reclaim.Status()
	}
	return &st
}

func (s *service) telemetryStatus() *api.TelemetryStatus {
	if s.telemetry == nil {
		return nil
	}
	st := s.telemetry.Status()
	return &st
}

func (s *service) qosStatus() *api.QoSStatus {
	if s.qos == nil {
		st := s.qosOff
		return &st
	}
	st := s.qos.Status()
	return &st
}

// Get adds a running job's run-queue latency and SLO state.
func (s *service) Get(ctx context.Context, c api.Caller, id string) (api.Job, error) {
	j, err := s.Manager.Get(ctx, c, id)
	if err == nil && s.qos != nil && j.State == api.StateRunning {
		j.Latency = s.qos.JobLatency(id)
	}
	return j, err
}

// ListPage adds the running jobs' run-queue latency and SLO state, as Get
// does, to the manager's page (one snapshot).
func (s *service) ListPage(ctx context.Context, c api.Caller, opts api.ListOptions) ([]api.Job, string, error) {
	page, next, err := s.Manager.ListPage(ctx, c, opts)
	if err == nil && s.qos != nil {
		for i := range page {
			if page[i].State == api.StateRunning {
				page[i].Latency = s.qos.JobLatency(page[i].ID)
			}
		}
	}
	return page, next, err
}

// fileDescriptorsOwnUse is what the daemon keeps open besides its API and
// metrics connections (state database, job logs, cgroup and BPF files,
// monitors' sockets, peers), with room to spare.
const fileDescriptorsOwnUse = 1024

// fileLimitNote checks that the open-file limit leaves room for every
// connection the limits allow on top of the daemon's own files (Go raises
// the soft limit to the hard one at start; the unit sets LimitNOFILE), and
// says what to change when it does not. Without that room a flood within
// the limits could still exhaust the descriptors.
func fileLimitNote(cfg Config, log *slog.Logger) string {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return ""
	}
	l := cfg.Limits
	need := uint64(l.Connections+l.AdminConnections+cfg.Metrics.MaxConnections) + fileDescriptorsOwnUse
	if l.Connections == 0 || rl.Cur >= need {
		return ""
	}
	note := fmt.Sprintf("open-file limit %d is below the %d that limits.connections (%d), limits.admin_connections (%d) and metrics.max_connections (%d) need with the daemon's own files: raise LimitNOFILE or lower limits.connections",
		rl.Cur, need, l.Connections, l.AdminConnections, cfg.Metrics.MaxConnections)
	log.Warn(note)
	return note
}

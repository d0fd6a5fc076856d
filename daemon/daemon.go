package daemon

import (
	"context"
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
	"time"

	"golang.org/x/sys/unix"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/apiserver"
	"github.com/fusiond/fusiond/daemon/internal/audit"
	"github.com/fusiond/fusiond/daemon/internal/deviceplugin"
	"github.com/fusiond/fusiond/daemon/internal/executor"
	"github.com/fusiond/fusiond/daemon/internal/hardware"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/lifecycle"
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
	// qos is the QoS loop, nil when it does not run.
	qos *qos.Loop
	// plugin is the kubelet device plugin, nil when it does not run
	// (kubernetes.device_plugin); Serve starts it.
	plugin *deviceplugin.Plugin
	// profiles learns task profiles from ended jobs, nil when it does not
	// (profiles.enabled).
	profiles *profileLearner

	// parts are what New starts, in the order of their needs; Close
	// stops them.
	parts *lifecycle.Group
}

// New builds the daemon: it opens the store and the host's hardware,
// builds the placer, executor and job manager, recovers the jobs an
// earlier daemon left, applies the GPU configuration and starts the
// hardware's background loops. Jobs are not placed until Serve. Close
// undoes New; Serve closes the daemon itself when it returns.
//
// Each of those is a part of a lifecycle.Group with the parts it needs:
// the group derives the start order from the needs and stops in reverse.
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
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	d := &Daemon{cfg: cfg, log: log, version: o.Version, o: o, parts: lifecycle.New(log.With("lifecycle", "daemon"))}
	for _, p := range d.newParts(ctx) {
		if err := d.parts.Add(p); err != nil {
			return nil, err
		}
	}
	// A failed start has stopped the parts that started.
	if err := d.parts.Start(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

// newParts are New's parts. What one part builds and a later one uses
// lives in the variables below (or in d); a part's Needs name every part
// whose results it uses, so those are there when it starts.
func (d *Daemon) newParts(ctx context.Context) []lifecycle.Part {
	cfg, log, o := d.cfg, d.log, d.o
	var (
		cg        *cgroups.Manager // nil: jobs run without cgroups (cgErr says why)
		cgErr     error
		bus       *telemetry.Bus
		engine    *hostplacer.Placer
		inventory func() hostplacer.Hardware
		runner    *executor.MonitorRunner
		knobs     *beKnobs // the best-effort tier's limits, shared by reclaim and QoS; nil without cgroups

		unsubscribeMetrics, disconnect                   func()
		stopTelemetry, stopElastic, stopReclaim, stopQoS func()
		qosOff                                           api.QoSStatus
		reclaimLoop                                      *reclaim.Loop
		reclaimOff                                       api.ReclaimStatus
		stopPower                                        context.CancelFunc
		powerDone                                        chan struct{}
		memCap                                           *memCapWatch // nil without GPUs
		stopMemCap                                       func()
	)
	noErr := func(stop func()) func(context.Context) error {
		return func(context.Context) error { stop(); return nil }
	}
	return []lifecycle.Part{{
		Name: "store",
		Start: func(context.Context) (err error) {
			d.store, err = store.Open(filepath.Join(cfg.StateDir, "fusiond.db"), store.Options{Logger: log})
			return err
		},
		Stop: func(context.Context) error { return d.store.Close() },
	}, {
		// The audit log records every admission (the job manager's) and
		// every privileged or refused request (the API's).
		Name: "audit",
		Start: func(context.Context) (err error) {
			d.audit, err = audit.Open(filepath.Join(cfg.StateDir, "audit.log"),
				audit.Options{MaxBytes: int64(cfg.Audit.MaxBytes), Keep: cfg.Audit.Keep, MaxAge: time.Duration(cfg.Audit.MaxAge),
					RefusedRate: cfg.Audit.RefusedRate, RefusedBurst: cfg.Audit.RefusedBurst}, log)
			return err
		},
		Stop: func(context.Context) error { return d.audit.Close() },
	}, {
		Name: "hardware",
		Start: func(ctx context.Context) (err error) {
			if d.hw, err = hardware.Open(ctx, cfg.GPU.hostConfig(hardware.Config{StateDir: cfg.StateDir, Simulate: cfg.Simulate}), log); err != nil {
				return err
			}
			d.capacity, err = hostCapacity()
			return err
		},
		Stop: func(context.Context) error { return d.hw.Close() },
	}, {
		Name: "cgroups",
		Start: func(context.Context) error {
			cg, cgErr = jobCgroups(cfg, log)
			return nil
		},
	}, {
		// The bus reads the running jobs from the job manager, which is
		// built after it (the manager places with the placer, which
		// scores with the bus's live load): the bus holds a function that
		// reads d.mgr, and samples only once the telemetry part starts,
		// which needs the manager. Values that hold each other must be
		// built one after the other; the needs order when they run.
		Name:  "telemetry-bus",
		Needs: []string{"hardware", "cgroups"},
		Start: func(ctx context.Context) (err error) {
			bus, err = newTelemetry(ctx, cfg.Telemetry, d.hw, func() *jobs.Manager { return d.mgr }, cg, log)
			return err
		},
	}, {
		// Task profiles, learned from the attempts the job manager sees
		// end (with the bus's summaries of their use), kept under the
		// state directory: loaded here, saved on a timer and when the
		// daemon stops, after the job manager (which needs this part).
		Name:  "profiles",
		Needs: []string{"telemetry-bus"},
		Start: func(context.Context) (err error) {
			if !cfg.Profiles.Enabled {
				return nil
			}
			if d.profiles, err = openProfiles(cfg.Profiles, cfg.StateDir, bus, log); err != nil {
				return err
			}
			d.profiles.start()
			return nil
		},
		Stop: func(context.Context) error {
			if d.profiles == nil {
				return nil
			}
			return d.profiles.close()
		},
	}, {
		// Guaranteed jobs get exclusive cores where cgroups can pin them:
		// the placer chooses them (with the engine, from the topology's
		// cores) and rewrites the shared pool's cpusets after every change.
		// It scores with the configured profiles and the live load the bus
		// reads (GPU utilisation and power, CPU busy per NUMA node).
		Name:  "placer",
		Needs: []string{"hardware", "cgroups", "telemetry-bus", "profiles"},
		Start: func(ctx context.Context) (err error) {
			var cores func() []cgroups.Core
			var memNodes func(int) []int
			popts := placementOptions(d.hw)
			popts.Logger = log
			if cg != nil {
				topo, err := jobTopology(ctx, d.hw)
				if err != nil {
					return err
				}
				if cores, err = hostCores(topo); err != nil {
					return err
				}
				memNodes = hostMemNodes(topo)
				popts.KeepSharedCores, popts.OnShared = 1, cg.SetSharedCPUs
			}
			inventory = func() hostplacer.Hardware {
				hw := hardwareOf(context.WithoutCancel(ctx), d.hw, d.capacity, log)
				if cores != nil {
					hw.Cores = cores()
				}
				return hw
			}
			popts.Profiles = cfg.Placement.profiles()
			popts.Pods = cfg.Kubernetes.podOptions(d.hw, log)
			popts.Live = busLive{r: bus, over: liveOver}
			engine = hostplacer.New(inventory(), popts)
			// A restarted daemon starts with the mix of jobs it learned.
			engine.SeedProfiles(d.profileUse().shapes())
			if runner, err = newExecutor(cfg, cg, cgErr, engine.SharedCPUs, memNodes, log); err != nil {
				return err
			}
			if cg != nil {
				log.Info("job cgroups ready", "mode", cg.Mode(), "parent", cfg.CgroupParent, "cores", len(engine.Hardware().Cores))
			}
			return nil
		},
	}, {
		// The metrics' sources are read at a scrape, and the only scrapes
		// are the metrics server's, which Serve starts after New: the job
		// manager and the QoS loop, built after the metrics (the manager
		// reports to them), are in d by then.
		Name:  "metrics",
		Needs: []string{"hardware", "cgroups", "placer"},
		Start: func(context.Context) error {
			d.metrics = metrics.New(metrics.Options{Version: o.Version.Version, Logger: log, Sources: metrics.Sources{
				Jobs:      func() jobs.Stats { return d.mgr.Stats() },
				Capacity:  engine.Capacity,
				Allocated: engine.Allocated,
				Devices:   func(ctx context.Context) []devices.Device { return inventories(ctx, d.hw, log) },
				Tiers:     tierStats(cg),
				QoS:       func() metrics.QoS { return qosMetrics(d.qos) },
				Telemetry: func() metrics.Telemetry { return telemetryMetrics(bus) },
				GPUMemCap: func() metrics.GPUMemCap { return memCap.stats() },
			}})
			unsubscribeMetrics = d.hw.Subscribe(d.metrics.Update)
			return nil
		},
		Stop: noErr(func() { unsubscribeMetrics() }),
	}, {
		// The job manager; its loops start in Serve.
		Name:  "jobs",
		Needs: []string{"store", "audit", "hardware", "placer", "metrics", "profiles"},
		Start: func(context.Context) error {
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
					PodHolds:     cfg.Kubernetes.MaxHolds,
				},
				Observer:  d.metrics,
				Queue:     cfg.Scheduling.queue(),
				Audit:     d.audit,
				RunEnded:  d.profiles.runEndedFunc(),
				Estimator: d.profileUse().estimator(),
			}, d.store, runner, engine, log)
			if d.profiles != nil {
				d.profiles.get = d.mgr.Get
			}
			prep.holders = d.mgr
			if cg != nil {
				knobs = &beKnobs{cg: cg, jobs: mgrJobCPU{mgr: d.mgr, cg: cg}}
			}
			return nil
		},
	}, {
		// With peers on, the manager may hand jobs over (SetHandover).
		Name:  "peers",
		Needs: []string{"jobs", "placer", "audit"},
		Start: func(context.Context) (err error) {
			if cfg.Peers.Enabled {
				d.peers, err = startPeers(cfg, d.mgr, engine, d.audit, log)
			}
			return err
		},
		Stop: func(context.Context) error {
			if d.peers != nil {
				d.peers.Close()
			}
			return nil
		},
	}, {
		// Recovery resumes following earlier hand-overs: it needs the
		// peers.
		Name:  "recovery",
		Needs: []string{"jobs", "peers"},
		Start: func(context.Context) error { return d.mgr.Recover() },
	}, {
		// The GPU sharing configuration is applied once the recovered jobs
		// hold their devices again.
		Name:  "gpu-config",
		Needs: []string{"hardware", "recovery"},
		Start: func(context.Context) error { return applyGPUConfig(d.hw, cfg.GPU, log) },
	}, {
		Name:  "telemetry",
		Needs: []string{"telemetry-bus", "jobs"},
		Start: func(ctx context.Context) error {
			stopTelemetry = startTelemetry(ctx, bus)
			return nil
		},
		Stop: noErr(func() { stopTelemetry() }),
	}, {
		Name:  "elastic",
		Needs: []string{"jobs", "telemetry", "cgroups"},
		Start: func(ctx context.Context) (err error) {
			stopElastic, err = startElastic(ctx, cfg.Elastic, d.mgr, bus, cg, filepath.Join(cfg.StateDir, "jobs"), log)
			return err
		},
		Stop: noErr(func() { stopElastic() }),
	}, {
		Name:  "reclaim",
		Needs: []string{"jobs", "placer", "telemetry", "cgroups", "profiles"},
		Start: func(ctx context.Context) (err error) {
			reclaimLoop, reclaimOff, stopReclaim, err = startReclaim(ctx, cfg.Reclaim, cg, knobs, d.mgr, engine, bus, engine.Capacity, int64(cfg.QoS.MinBestEffortCPU), d.profileUse().reclaimPrior, log)
			return err
		},
		Stop: noErr(func() { stopReclaim() }),
	}, {
		Name:  "qos",
		Needs: []string{"jobs", "placer", "telemetry", "cgroups"},
		Start: func(ctx context.Context) error {
			d.qos, qosOff, stopQoS = startQoS(ctx, cfg.QoS, cg, knobs, d.mgr, bus, engine.SharedCPUs, log)
			return nil
		},
		Stop: noErr(func() { stopQoS() }),
	}, {
		// The memory caps of time-sliced GPU shares (gpu.sharing.over_cap).
		Name:  "gpu-memcap",
		Needs: []string{"hardware", "cgroups", "jobs", "gpu-config"},
		Start: func(ctx context.Context) (err error) {
			memCap, stopMemCap, err = startMemCap(ctx, cfg, d.hw, cg, d.mgr, log)
			return err
		},
		Stop: noErr(func() { stopMemCap() }),
	}, {
		// Device updates reach the placer and the event stream.
		Name:  "devices",
		Needs: []string{"hardware", "placer", "jobs"},
		Start: func(context.Context) error {
			disconnect = connectDevices(d.hw, engine, d.mgr, inventory)
			return nil
		},
		Stop: noErr(func() { disconnect() }),
	}, {
		Name:  "power",
		Needs: []string{"hardware", "placer"},
		Start: func(ctx context.Context) error {
			var powerCtx context.Context
			powerCtx, stopPower = context.WithCancel(context.WithoutCancel(ctx))
			powerDone = make(chan struct{})
			go func() {
				defer close(powerDone)
				powerCaps(powerCtx, d.hw.GPUs(), cfg.GPU.Power, engine, log)
			}()
			return nil
		},
		Stop: noErr(func() { stopPower(); <-powerDone }),
	}, {
		// The kubelet device plugin over the placer's resources and the
		// manager's holds, once recovery holds the pods' devices again;
		// Serve starts it.
		Name:  "kubernetes",
		Needs: []string{"jobs", "placer", "hardware", "recovery", "qos"},
		Start: func(context.Context) (err error) {
			d.plugin, err = newDevicePlugin(cfg.Kubernetes, d.mgr, engine, d.hw, func() bool { return d.qos != nil }, o.Version.Version, log)
			return err
		},
	}, {
		// The API's handler; Serve serves it.
		Name:  "api",
		Needs: []string{"jobs", "placer", "hardware", "audit", "metrics", "peers", "telemetry-bus", "qos", "reclaim", "kubernetes", "profiles"},
		Start: func(context.Context) error {
			var adminGID *uint32
			if cfg.AdminGroup != "" {
				gid, err := lookupGroup(cfg.AdminGroup)
				if err != nil {
					return fmt.Errorf("admin_group: %w", err)
				}
				adminGID = &gid
			}
			svc := &service{Manager: d.mgr, placer: engine, runner: runner, hw: d.hw, version: o.Version.Version, started: time.Now().UTC(), qos: d.qos, qosOff: qosOff, telemetry: bus,
				reclaim: reclaimLoop, reclaimOff: reclaimOff, fileLimit: fileLimitNote(cfg, log), plugin: d.plugin}
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
				Profiles:          d.profiles.backend(),
			})
			return nil
		},
	}}
}

// Close stops what New started, in the reverse of its start order — the
// background loops, the peers, the hardware's background work — and
// closes the store and the audit log. It does not stop jobs (Serve's
// shutdown does). It is safe to call more than once.
func (d *Daemon) Close() error {
	return d.parts.Stop(context.Background())
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
//
// What it starts is a lifecycle.Group too: the servers need the job
// manager's loops, so they stop (finishing their requests) before the
// manager stops the jobs.
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
	serveErr := make(chan error, 2) // the API and metrics servers
	var hs, ms *http.Server
	defer func() {
		switch {
		case ms != nil:
			ms.Close() // after Shutdown below; at once on an early return
		case mln != nil:
			mln.Close() // its server did not start
		}
	}()
	serving := lifecycle.New(log.With("lifecycle", "serve"))
	for _, p := range []lifecycle.Part{{
		Name:  "scheduling",
		Start: func(context.Context) error { d.mgr.Start(); return nil },
		Stop:  func(ctx context.Context) error { d.mgr.Stop(ctx); return nil },
	}, {
		// The peer API stops serving before the manager stops (no offer,
		// commit or start reaches a stopping manager); gossip and the
		// client side are closed with the daemon (Close), after the
		// manager's Stop, which cancels the jobs handed over to peers.
		Name:  "peering",
		Needs: []string{"scheduling"},
		Start: func(context.Context) error {
			if d.peers != nil {
				d.peers.Start()
			}
			return nil
		},
		Stop: func(ctx context.Context) error {
			if d.peers == nil {
				return nil
			}
			if err := d.peers.StopServing(ctx); err != nil {
				log.Warn("peer API requests did not finish in time", "err", err)
			}
			return nil
		},
	}, {
		// Kubelet's calls admit pods' holds through the manager: the
		// plugin registers once the manager runs, and stops before it.
		Name:  "device-plugin",
		Needs: []string{"scheduling"},
		Start: func(ctx context.Context) error {
			if d.plugin == nil {
				return nil
			}
			return d.plugin.Start(ctx)
		},
		Stop: func(ctx context.Context) error {
			if d.plugin == nil {
				return nil
			}
			return d.plugin.Stop(ctx)
		},
	}, {
		Name:  "metrics-server",
		Needs: []string{"scheduling"},
		Start: func(context.Context) error {
			if mln == nil {
				return nil
			}
			ms = &http.Server{
				Handler:           d.metrics.Handler(),
				ReadHeaderTimeout: time.Duration(cfg.Limits.HeaderTimeout),
				ReadTimeout:       time.Duration(cfg.Limits.HeaderTimeout),
				WriteTimeout:      30 * time.Second,
				IdleTimeout:       time.Duration(cfg.Limits.IdleTimeout),
				ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
			}
			mlim := apiserver.LimitListener(mln, apiserver.ConnLimits{Total: cfg.Metrics.MaxConnections, TotalLimit: apiserver.LimitMetricsConnections}, nil, log.With("listener", "metrics"))
			go func() { serveErr <- ms.Serve(mlim) }()
			log.Info("metrics listening", "network", network, "address", mln.Addr().String())
			return nil
		},
		Stop: func(ctx context.Context) error {
			if ms != nil {
				if err := ms.Shutdown(ctx); err != nil {
					log.Warn("metrics server did not finish in time", "err", err)
				}
			}
			return nil
		},
	}, {
		// Every connection counts against the limits from its accept on
		// (an idle one too), and the servers close idle and slow ones, so
		// no user can hold the daemon's descriptors or keep another user
		// out.
		Name:  "api-server",
		Needs: []string{"scheduling"},
		Start: func(context.Context) error {
			hs = &http.Server{
				Handler:           d.srv,
				ConnContext:       d.srv.ConnContext,
				ReadHeaderTimeout: time.Duration(cfg.Limits.HeaderTimeout),
				IdleTimeout:       time.Duration(cfg.Limits.IdleTimeout),
				ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
			}
			conns := apiserver.LimitListener(ln, apiserver.ConnLimits{Total: cfg.Limits.Connections, Reserve: cfg.Limits.AdminConnections,
				PerUser: cfg.Limits.PerUser.Connections, TotalLimit: apiserver.LimitConnections}, d.srv.Identify, log.With("listener", "api"))
			go func() { serveErr <- hs.Serve(conns) }()
			return nil
		},
		Stop: func(ctx context.Context) error {
			d.srv.CloseStreams()
			if err := hs.Shutdown(ctx); err != nil {
				log.Warn("API server did not finish in time", "err", err)
			}
			return nil
		},
	}} {
		if err := serving.Add(p); err != nil {
			return err
		}
	}
	if err := serving.Start(ctx); err != nil {
		return err
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
			// As before, a failed server ends Serve at once, without the
			// graceful stop of the servers and jobs below.
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
	err := serving.Stop(shutdownCtx)
	log.Info("fusiond stopped")
	return err
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
	// plugin is the kubelet device plugin, nil when it does not run.
	plugin *deviceplugin.Plugin
}

var _ apiserver.Backend = (*service)(nil)

// Node reports the host's capacity, allocation, job counts and devices.
func (s *service) Node(ctx context.Context, _ api.Caller) (api.NodeStatus, error) {
	host, _ := os.Hostname()
	counts, cordoned := s.Counts()
	return api.NodeStatus{
		Hostname:   host,
		Version:    s.version,
		StartedAt:  s.started,
		Cordoned:   cordoned,
		Capacity:   s.placer.Capacity(),
		Allocated:  s.placer.Allocated(),
		Jobs:       counts,
		Simulated:  s.hw.Simulated() != "",
		Devices:    s.hw.Devices(ctx),
		Isolation:  s.runner.Isolation(),
		Notes:      s.notes(),
		QoS:        s.qosStatus(),
		Telemetry:  s.telemetryStatus(),
		Reclaim:    s.reclaimStatus(),
		Kubernetes: kubernetesStatus(s.plugin, s.Manager),
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
	return append(notes, boundNotes(s.telemetryStatus(), s.qosStatus())...)
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

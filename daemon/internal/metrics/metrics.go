// Package metrics is fusiond's Prometheus instrumentation: the collectors
// of the job manager (jobs by state, class and tier; submissions;
// transitions), the placer (decisions, decision latency, queue length and
// wait), the API server (requests and latency by route), the hardware
// (GPU, MIG instance and FPGA region health, GPU utilisation, memory, power
// and temperature from the drivers' telemetry updates), the cgroup usage
// of each QoS tier, the QoS loop (its state, actions, the protected
// jobs' run-queue latency per class, the probe's kernel cost and slots)
// and the telemetry bus's following of jobs against its bound. Everything is registered on a private
// prometheus.Registry that Handler serves; nothing touches the client
// library's global registry.
//
// Metric names follow Prometheus conventions: the fusiond_ prefix, base
// units (seconds, bytes, ratios), _total on counters. docs/metrics.md lists
// them.
package metrics

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/devices"
)

// Sources are what a scrape reads from the daemon. Every field is
// optional: a nil source's metrics are left out.
type Sources struct {
	// Jobs snapshots the job table and queue.
	Jobs func() jobs.Stats
	// Capacity and Allocated are the node's totals (placement's view).
	Capacity, Allocated func() api.NodeResources
	// Devices lists every device of every driver (their inventories).
	Devices func(ctx context.Context) []devices.Device
	// Tiers reads the cgroup accounting of each QoS tier; nil when jobs
	// run without cgroups.
	Tiers func() (map[api.Tier]cgroups.Stats, error)
	// QoS reads the QoS loop's state; nil leaves the QoS metrics out.
	QoS func() QoS
	// Telemetry reads how the telemetry bus follows the running jobs;
	// nil leaves its metrics out.
	Telemetry func() Telemetry
	// GPUMemCap reads the memory-cap watch of time-sliced GPU shares; nil
	// leaves its metrics out.
	GPUMemCap func() GPUMemCap
}

// GPUMemCap is the memory-cap watch of time-sliced GPU shares at a
// scrape: Over jobs' shares hold more than their caps now; Episodes counts
// every episode of a share over its cap since start, Kills the jobs
// stopped for one (gpu.sharing.over_cap: kill).
type GPUMemCap struct {
	Over            int
	Episodes, Kills uint64
}

// Telemetry is the telemetry bus's following of jobs at a scrape.
type Telemetry struct {
	// Followed of at most Max running jobs are read; Unfollowed are not
	// (Max was reached when they started); UnfollowedTotal counts every
	// job refused, each once.
	Followed, Max, Unfollowed int
	UnfollowedTotal           uint64
}

// QoS is the QoS loop's state at a scrape. When Enabled is false (the
// loop does not run) only fusiond_qos_loop_enabled is reported.
type QoS struct {
	Enabled bool
	// BestEffortCPUMilli is the best-effort tier's CPU quota (0: none);
	// BestEffortMemoryHigh its memory.high in bytes (0: none).
	BestEffortCPUMilli, BestEffortMemoryHigh int64
	Protected, Breaching                     int
	// Actions counts the loop's actions since it started.
	Actions []QoSAction
	// Latency is the protected jobs' run-queue latency by job class.
	Latency map[api.Class]Log2Histogram
	// ProbeStats is true while the kernel counts the probe's programs
	// (kernel.bpf_stats_enabled=1): ProbeRuns runs taking ProbeRunNs.
	ProbeStats            bool
	ProbeRuns, ProbeRunNs uint64
	// ProbeSlots is how many job cgroups the probe can time, of which
	// ProbeSlotsUsed are; Untimed the running jobs it has no slot for,
	// UntimedTotal every such job, each once.
	ProbeSlots, ProbeSlotsUsed, Untimed int
	UntimedTotal                        uint64
	// Delay is the protected jobs' run-queue wait by who held the CPU
	// (idle, guaranteed, burstable, besteffort, job, outside, kernel), in
	// ns since the loop started.
	Delay map[string]uint64
	// LostWaits is the waits the probe dropped since it was loaded.
	LostWaits uint64
}

// QoSAction is one kind of QoS action and how often the loop took it.
type QoSAction struct {
	// Op is shrink or restore, Resource cpu or memory, Result applied
	// or failed.
	Op, Resource, Result string
	Count                uint64
}

// Log2Histogram is the eBPF probe's histogram: Buckets[i] counts
// latencies in [2^i, 2^(i+1)) ns, the last bucket everything above;
// SumNs is their sum.
type Log2Histogram struct {
	Buckets []uint64
	SumNs   uint64
}

// Options configure New.
type Options struct {
	Version string
	Logger  *slog.Logger
	Sources Sources
}

// Metrics holds fusiond's collectors. It implements jobs.Observer and
// apiserver.RequestObserver; Update takes the drivers' updates.
type Metrics struct {
	reg *prometheus.Registry
	log *slog.Logger
	src Sources

	submissions  *prometheus.CounterVec
	transitions  *prometheus.CounterVec
	preemptions  *prometheus.CounterVec
	moves        *prometheus.CounterVec
	decisions    *prometheus.CounterVec
	decisionTime prometheus.Histogram
	queueWait    *prometheus.HistogramVec
	requests     *prometheus.CounterVec
	requestTime  *prometheus.HistogramVec
	updates      *prometheus.CounterVec
	healthChange *prometheus.CounterVec

	mu      sync.Mutex
	samples map[string]devices.Sample // latest telemetry by device ID
}

var (
	_ jobs.Observer           = (*Metrics)(nil)
	_ jobs.PreemptionObserver = (*Metrics)(nil)
	_ jobs.MoveObserver       = (*Metrics)(nil)
)

// Buckets of the latency histograms, in seconds.
var (
	// decisionBuckets: a placement decision over one host takes
	// microseconds to milliseconds.
	decisionBuckets = prometheus.ExponentialBuckets(10e-6, 4, 10) // 10 µs … 2.6 s
	// waitBuckets: queue waits from instant to hours.
	waitBuckets = []float64{0.01, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600}
	// requestBuckets: API requests (streams last as long as they are
	// followed).
	requestBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60}
)

// New builds the collectors and registers them, with the Go runtime's and
// the process's, on a registry of their own.
func New(o Options) *Metrics {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Metrics{
		reg: prometheus.NewRegistry(), log: log, src: o.Sources,
		samples: map[string]devices.Sample{},
		submissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fusiond_job_submissions_total", Help: "Jobs accepted and stored, by class and effective tier.",
		}, []string{"class", "tier"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fusiond_job_transitions_total", Help: "Recorded job state transitions, by state left and state entered.",
		}, []string{"from", "to"}),
		preemptions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fusiond_preemptions_total", Help: "Jobs preempted (told to stop to make room for a job of a higher tier), by the preempted job's tier.",
		}, []string{"tier"}),
		moves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fusiond_defrag_moves_total", Help: "Jobs moved (told to stop and started again elsewhere on this host to make room for the job first in the queue), by the moved job's tier.",
		}, []string{"tier"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fusiond_placement_decisions_total", Help: "Placement decisions (one job or one whole gang), by result: placed or unplaced (left queued).",
		}, []string{"result"}),
		decisionTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "fusiond_placement_decision_duration_seconds", Help: "Time one placement decision took.", Buckets: decisionBuckets,
		}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "fusiond_queue_wait_seconds", Help: "Time jobs waited pending before they were placed, by class.", Buckets: waitBuckets,
		}, []string{"class"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fusiond_api_requests_total", Help: "API requests answered, by route pattern and status code.",
		}, []string{"route", "code"}),
		requestTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "fusiond_api_request_duration_seconds", Help: "Time the API took to answer, by route pattern (streams count until they end).", Buckets: requestBuckets,
		}, []string{"route"}),
		updates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fusiond_device_updates_total", Help: "Updates the device drivers reported, by kind: health, telemetry, changed.",
		}, []string{"kind"}),
		healthChange: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fusiond_device_health_changes_total", Help: "Device health transitions the drivers reported, by device and new state (healthy, unhealthy).",
		}, []string{"device", "health"}),
	}
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fusiond_build_info", Help: "Always 1; the daemon's version as a label.",
	}, []string{"version"})
	build.WithLabelValues(o.Version).Set(1)
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		build, m.submissions, m.transitions, m.preemptions, m.moves, m.decisions, m.decisionTime, m.queueWait,
		m.requests, m.requestTime, m.updates, m.healthChange,
		&scrape{m: m},
	)
	// Counters with a known label set start at zero, so rate() and the
	// dashboards see them before the first event.
	for _, r := range []string{"placed", "unplaced"} {
		m.decisions.WithLabelValues(r)
	}
	for _, k := range []devices.UpdateKind{devices.HealthChanged, devices.Telemetry, devices.DeviceChanged} {
		m.updates.WithLabelValues(string(k))
	}
	return m
}

// Handler serves the registry in the Prometheus text (or OpenMetrics)
// format. It answers GET and HEAD only.
func (m *Metrics) Handler() http.Handler {
	h := promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog:          slog.NewLogLogger(m.log.Handler(), slog.LevelWarn),
		ErrorHandling:     promhttp.ContinueOnError,
		EnableOpenMetrics: true,
	})
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h) // GET patterns match HEAD too
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "the metrics listener is read-only: GET /metrics", http.StatusMethodNotAllowed)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "not found: the metrics listener serves GET /metrics only", http.StatusNotFound)
	})
	return mux
}

// Submitted implements jobs.Observer.
func (m *Metrics) Submitted(class api.Class, tier api.Tier) {
	m.submissions.WithLabelValues(string(class), string(tier)).Inc()
}

// Transitioned implements jobs.Observer.
func (m *Metrics) Transitioned(from, to api.State) {
	m.transitions.WithLabelValues(string(from), string(to)).Inc()
}

// Preempted implements jobs.PreemptionObserver.
func (m *Metrics) Preempted(tier api.Tier) {
	m.preemptions.WithLabelValues(string(tier)).Inc()
}

// Moved implements jobs.MoveObserver.
func (m *Metrics) Moved(tier api.Tier) {
	m.moves.WithLabelValues(string(tier)).Inc()
}

// Decided implements jobs.Observer.
func (m *Metrics) Decided(placed bool, _ int, took time.Duration) {
	result := "unplaced"
	if placed {
		result = "placed"
	}
	m.decisions.WithLabelValues(result).Inc()
	m.decisionTime.Observe(took.Seconds())
}

// Waited implements jobs.Observer.
func (m *Metrics) Waited(class api.Class, waited time.Duration) {
	m.queueWait.WithLabelValues(string(class)).Observe(waited.Seconds())
}

// ObserveRequest implements apiserver.RequestObserver.
func (m *Metrics) ObserveRequest(route string, code int, took time.Duration) {
	m.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
	m.requestTime.WithLabelValues(route).Observe(took.Seconds())
}

// Update takes one driver update (hardware.Host.Subscribe): telemetry
// samples are kept for the next scrape, health transitions counted.
func (m *Metrics) Update(u devices.Update) {
	m.updates.WithLabelValues(string(u.Kind)).Inc()
	switch u.Kind {
	case devices.Telemetry:
		if u.Sample != nil && u.Device != "" {
			m.mu.Lock()
			m.samples[u.Device] = *u.Sample
			m.mu.Unlock()
		}
	case devices.HealthChanged:
		if u.Health != nil && u.Device != "" {
			h := "unhealthy"
			if u.Health.Healthy {
				h = "healthy"
			}
			m.healthChange.WithLabelValues(u.Device, h).Inc()
		}
	}
}

// scrape is the collector of everything read when Prometheus scrapes:
// the job table, the node's totals, the devices and the tiers.
type scrape struct{ m *Metrics }

var (
	descJobs = prometheus.NewDesc("fusiond_jobs",
		"Jobs the daemon remembers, by state, class and effective tier.", []string{"state", "class", "tier"}, nil)
	descQueueLength = prometheus.NewDesc("fusiond_queue_length",
		"Jobs pending (queued, not yet placed).", nil, nil)
	descQueueOldest = prometheus.NewDesc("fusiond_queue_oldest_wait_seconds",
		"How long the longest-waiting pending job has waited (0 when none waits).", nil, nil)
	descCordoned = prometheus.NewDesc("fusiond_node_cordoned",
		"1 while the node is cordoned (places no new jobs).", nil, nil)
	descCPUCap = prometheus.NewDesc("fusiond_node_cpu_capacity_cores",
		"CPU the placer hands out, in cores.", nil, nil)
	descCPUAlloc = prometheus.NewDesc("fusiond_node_cpu_allocated_cores",
		"CPU reserved by placed and running jobs, in cores.", nil, nil)
	descMemCap = prometheus.NewDesc("fusiond_node_memory_capacity_bytes",
		"Memory the placer hands out.", nil, nil)
	descMemAlloc = prometheus.NewDesc("fusiond_node_memory_allocated_bytes",
		"Memory reserved by placed and running jobs.", nil, nil)
	descGPUCap = prometheus.NewDesc("fusiond_node_gpus",
		"GPUs the placer knows.", nil, nil)
	descGPUAlloc = prometheus.NewDesc("fusiond_node_gpus_allocated",
		"Whole GPUs reserved by jobs.", nil, nil)
	descHealthy = prometheus.NewDesc("fusiond_device_healthy",
		"1 while a device takes work, 0 while it is out of service; kind is gpu or fpga.", []string{"kind", "device", "model"}, nil)
	descMIG = prometheus.NewDesc("fusiond_mig_instance_healthy",
		"1 while a MIG instance is healthy, by GPU, instance and profile.", []string{"gpu", "instance", "profile"}, nil)
	descRegion = prometheus.NewDesc("fusiond_fpga_region_programmed",
		"1 while an FPGA region holds a library bitstream (the bitstream label), 0 while empty or unknown.", []string{"region", "bitstream"}, nil)
	descUtil = prometheus.NewDesc("fusiond_gpu_utilization_ratio",
		"GPU compute utilisation, 0 to 1, from the driver's latest telemetry sample.", []string{"gpu", "model"}, nil)
	descMemUsed = prometheus.NewDesc("fusiond_gpu_memory_used_bytes",
		"GPU memory in use, from the latest telemetry sample.", []string{"gpu", "model"}, nil)
	descMemTotal = prometheus.NewDesc("fusiond_gpu_memory_total_bytes",
		"GPU memory size.", []string{"gpu", "model"}, nil)
	descPower = prometheus.NewDesc("fusiond_gpu_power_watts",
		"GPU power draw, from the latest telemetry sample.", []string{"gpu", "model"}, nil)
	descTemp = prometheus.NewDesc("fusiond_gpu_temperature_celsius",
		"GPU temperature, from the latest telemetry sample.", []string{"gpu", "model"}, nil)
	descTierCPU = prometheus.NewDesc("fusiond_tier_cpu_seconds_total",
		"CPU time used by the jobs of a QoS tier (the tier's cgroup).", []string{"tier"}, nil)
	descTierThrottled = prometheus.NewDesc("fusiond_tier_cpu_throttled_seconds_total",
		"Time the tier's cgroup was held back by CPU quotas.", []string{"tier"}, nil)
	descTierMem = prometheus.NewDesc("fusiond_tier_memory_bytes",
		"Memory the tier's cgroup holds now.", []string{"tier"}, nil)
	descTierOOM = prometheus.NewDesc("fusiond_tier_oom_kills_total",
		"Processes the OOM killer ended in the tier's cgroup.", []string{"tier"}, nil)
	descQoSEnabled = prometheus.NewDesc("fusiond_qos_loop_enabled",
		"1 while the QoS loop runs (latency probes attached), 0 when it is off.", nil, nil)
	descQoSQuota = prometheus.NewDesc("fusiond_qos_besteffort_cpu_quota_cores",
		"The CPU quota the QoS loop set on the best-effort tier, in cores (0: none).", nil, nil)
	descQoSMemHigh = prometheus.NewDesc("fusiond_qos_besteffort_memory_high_bytes",
		"The memory.high the QoS loop set on the best-effort tier (0: none).", nil, nil)
	descQoSProtected = prometheus.NewDesc("fusiond_qos_protected_jobs",
		"Running jobs with a QoS SLO (guaranteed and burstable jobs the loop protects).", nil, nil)
	descQoSBreaching = prometheus.NewDesc("fusiond_qos_breaching_jobs",
		"Protected jobs over their SLO in the loop's last window.", nil, nil)
	descQoSActions = prometheus.NewDesc("fusiond_qos_actions_total",
		"Actions the QoS loop took on the best-effort tier, by action (shrink, restore; spare: a breach best-effort did not cause, noted), resource (cpu, memory) and result (applied, failed, noted).", []string{"action", "resource", "result"}, nil)
	descQoSLatency = prometheus.NewDesc("fusiond_qos_runqueue_latency_seconds",
		"Run-queue latency (wakeup to running) of the protected jobs' threads, by job class, from the eBPF probe's log2 buckets.", []string{"class"}, nil)
	descQoSProbeRuns = prometheus.NewDesc("fusiond_qos_probe_events_total",
		"Runs of the latency probe's eBPF programs, as the kernel counts them (only while kernel.bpf_stats_enabled=1).", nil, nil)
	descQoSProbeTime = prometheus.NewDesc("fusiond_qos_probe_run_seconds_total",
		"CPU time the latency probe's eBPF programs took, as the kernel counts it (only while kernel.bpf_stats_enabled=1).", nil, nil)
	descQoSSlots = prometheus.NewDesc("fusiond_qos_probe_slots",
		"Job cgroups the latency probe can time at once (qos.max_jobs).", nil, nil)
	descQoSSlotsUsed = prometheus.NewDesc("fusiond_qos_probe_slots_used",
		"Job cgroups the latency probe times now.", nil, nil)
	descQoSUntimed = prometheus.NewDesc("fusiond_qos_untimed_jobs",
		"Running jobs the latency probe has no slot for (qos.max_jobs reached): not timed.", nil, nil)
	descQoSUntimedTotal = prometheus.NewDesc("fusiond_qos_untimed_jobs_total",
		"Jobs the latency probe had no slot for, each counted once.", nil, nil)
	descQoSLost = prometheus.NewDesc("fusiond_qos_probe_lost_waits_total",
		"Run-queue waits the latency probe dropped: two timed threads whose ids share a slot of its pending-wait array waited at once.", nil, nil)
	descQoSDelay = prometheus.NewDesc("fusiond_qos_delay_seconds_total",
		"Run-queue wait of the protected jobs, by who held the CPU meanwhile: idle, a fusiond tier (guaranteed, burstable, besteffort), a fusiond job of no tier (job), a task outside fusiond's cgroups (outside) or a kernel thread (kernel).", []string{"by"}, nil)
	descTelJobs = prometheus.NewDesc("fusiond_telemetry_jobs_followed",
		"Running jobs whose cgroups the telemetry bus reads.", nil, nil)
	descTelMax = prometheus.NewDesc("fusiond_telemetry_jobs_max",
		"The most jobs the telemetry bus follows at once (telemetry.max_jobs).", nil, nil)
	descTelUnfollowed = prometheus.NewDesc("fusiond_telemetry_jobs_unfollowed",
		"Running jobs the telemetry bus does not follow (telemetry.max_jobs reached): no usage readings.", nil, nil)
	descTelUnfollowedTotal = prometheus.NewDesc("fusiond_telemetry_jobs_unfollowed_total",
		"Jobs the telemetry bus refused to follow, each counted once.", nil, nil)
	descMemCapOver = prometheus.NewDesc("fusiond_gpu_share_over_cap",
		"Shares of time-sliced GPUs whose job's processes hold more GPU memory than the share's cap now.", nil, nil)
	descMemCapEpisodes = prometheus.NewDesc("fusiond_gpu_share_over_cap_episodes_total",
		"Episodes of a time-sliced GPU share's job holding more GPU memory than its cap, each counted once.", nil, nil)
	descMemCapKills = prometheus.NewDesc("fusiond_gpu_share_over_cap_kills_total",
		"Jobs stopped for holding more GPU memory than their share's cap (gpu.sharing.over_cap: kill).", nil, nil)
	descSourceFailed = prometheus.NewDesc("fusiond_metrics_source_failed",
		"1 when reading a metrics source failed during this scrape (its metrics may be missing), by source.", []string{"source"}, nil)
)

func (s *scrape) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descJobs, descQueueLength, descQueueOldest, descCordoned,
		descCPUCap, descCPUAlloc, descMemCap, descMemAlloc, descGPUCap, descGPUAlloc,
		descHealthy, descMIG, descRegion, descUtil, descMemUsed, descMemTotal, descPower, descTemp,
		descTierCPU, descTierThrottled, descTierMem, descTierOOM,
		descQoSEnabled, descQoSQuota, descQoSMemHigh, descQoSProtected, descQoSBreaching, descQoSActions,
		descQoSLatency, descQoSProbeRuns, descQoSProbeTime, descQoSSlots, descQoSSlotsUsed, descQoSUntimed, descQoSUntimedTotal, descQoSDelay, descQoSLost,
		descTelJobs, descTelMax, descTelUnfollowed, descTelUnfollowedTotal,
		descMemCapOver, descMemCapEpisodes, descMemCapKills, descSourceFailed} {
		ch <- d
	}
}

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func counter(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (s *scrape) Collect(ch chan<- prometheus.Metric) {
	src := s.m.src
	if src.Jobs != nil {
		st := src.Jobs()
		for _, g := range st.Groups {
			gauge(ch, descJobs, float64(g.Count), string(g.State), string(g.Class), string(g.Tier))
		}
		gauge(ch, descQueueLength, float64(st.Queued))
		gauge(ch, descQueueOldest, st.OldestWait.Seconds())
		gauge(ch, descCordoned, b2f(st.Cordoned))
	}
	if src.Capacity != nil && src.Allocated != nil {
		c, a := src.Capacity(), src.Allocated()
		gauge(ch, descCPUCap, float64(c.CPU)/1000)
		gauge(ch, descCPUAlloc, float64(a.CPU)/1000)
		gauge(ch, descMemCap, float64(c.Memory))
		gauge(ch, descMemAlloc, float64(a.Memory))
		gauge(ch, descGPUCap, float64(c.GPUs))
		gauge(ch, descGPUAlloc, float64(a.GPUs))
	}
	if src.Devices != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		devs := src.Devices(ctx)
		cancel()
		s.m.mu.Lock()
		samples := make(map[string]devices.Sample, len(s.m.samples))
		for k, v := range s.m.samples {
			samples[k] = v
		}
		s.m.mu.Unlock()
		for _, d := range devs {
			gauge(ch, descHealthy, b2f(d.Health.Healthy), string(d.Kind), d.ID, d.Model)
			switch d.Kind {
			case devices.GPU:
				if d.MemoryMB > 0 {
					gauge(ch, descMemTotal, float64(d.MemoryMB)*(1<<20), d.ID, d.Model)
				}
				if d.MIG != nil {
					for _, in := range d.MIG.Instances {
						healthy := d.Health.Healthy
						if in.Health != nil {
							healthy = in.Health.Healthy
						}
						gauge(ch, descMIG, b2f(healthy), d.ID, in.ID, in.Profile)
					}
				}
				if x, ok := samples[d.ID]; ok {
					gauge(ch, descUtil, x.Util, d.ID, d.Model)
					gauge(ch, descMemUsed, float64(x.MemUsedMB)*(1<<20), d.ID, d.Model)
					gauge(ch, descPower, x.PowerW, d.ID, d.Model)
					gauge(ch, descTemp, x.TempC, d.ID, d.Model)
				}
			case devices.FPGA:
				gauge(ch, descRegion, b2f(d.Bitstream != ""), d.ID, d.Bitstream)
			}
		}
	}
	if src.Tiers != nil {
		tiers, err := src.Tiers()
		if err != nil {
			s.m.log.Warn("metrics: reading tier cgroups", "err", err)
			gauge(ch, descSourceFailed, 1, "tiers")
		}
		for t, st := range tiers {
			counter(ch, descTierCPU, st.CPUUsage.Seconds(), string(t))
			counter(ch, descTierThrottled, st.ThrottledTime.Seconds(), string(t))
			gauge(ch, descTierMem, float64(st.MemoryCurrent), string(t))
			counter(ch, descTierOOM, float64(st.OOMKills), string(t))
		}
	}
	if src.QoS != nil {
		collectQoS(ch, src.QoS())
	}
	if src.Telemetry != nil {
		t := src.Telemetry()
		gauge(ch, descTelJobs, float64(t.Followed))
		gauge(ch, descTelMax, float64(t.Max))
		gauge(ch, descTelUnfollowed, float64(t.Unfollowed))
		counter(ch, descTelUnfollowedTotal, float64(t.UnfollowedTotal))
	}
	if src.GPUMemCap != nil {
		c := src.GPUMemCap()
		gauge(ch, descMemCapOver, float64(c.Over))
		counter(ch, descMemCapEpisodes, float64(c.Episodes))
		counter(ch, descMemCapKills, float64(c.Kills))
	}
}

// qosActions are the action label sets reported from zero.
var qosActions = []QoSAction{{Op: "shrink", Resource: "cpu"}, {Op: "restore", Resource: "cpu"},
	{Op: "shrink", Resource: "memory"}, {Op: "restore", Resource: "memory"}}

// minLatencyBucket is the smallest log2 bucket bound reported, 2^10 ns
// (about 1 µs): wakeups are never faster, and fewer bounds keep the
// series count down.
const minLatencyBucket = 10

func collectQoS(ch chan<- prometheus.Metric, q QoS) {
	gauge(ch, descQoSEnabled, b2f(q.Enabled))
	if !q.Enabled {
		return
	}
	gauge(ch, descQoSQuota, float64(q.BestEffortCPUMilli)/1000)
	gauge(ch, descQoSMemHigh, float64(q.BestEffortMemoryHigh))
	gauge(ch, descQoSProtected, float64(q.Protected))
	gauge(ch, descQoSBreaching, float64(q.Breaching))
	type key struct{ op, res, result string }
	counts := map[key]uint64{}
	for _, a := range qosActions {
		counts[key{a.Op, a.Resource, "applied"}] = 0
	}
	for _, a := range q.Actions {
		counts[key{a.Op, a.Resource, a.Result}] += a.Count
	}
	for k, n := range counts {
		counter(ch, descQoSActions, float64(n), k.op, k.res, k.result)
	}
	for class, h := range q.Latency {
		ch <- prometheus.MustNewConstHistogram(descQoSLatency, h.count(), float64(h.SumNs)/1e9, h.cumulative(), string(class))
	}
	if q.ProbeStats {
		counter(ch, descQoSProbeRuns, float64(q.ProbeRuns))
		counter(ch, descQoSProbeTime, float64(q.ProbeRunNs)/1e9)
	}
	if q.ProbeSlots > 0 {
		gauge(ch, descQoSSlots, float64(q.ProbeSlots))
		gauge(ch, descQoSSlotsUsed, float64(q.ProbeSlotsUsed))
	}
	gauge(ch, descQoSUntimed, float64(q.Untimed))
	counter(ch, descQoSUntimedTotal, float64(q.UntimedTotal))
	for by, ns := range q.Delay {
		counter(ch, descQoSDelay, float64(ns)/1e9, by)
	}
	counter(ch, descQoSLost, float64(q.LostWaits))
}

func (h Log2Histogram) count() uint64 {
	var n uint64
	for _, b := range h.Buckets {
		n += b
	}
	return n
}

// cumulative converts the log2 buckets to Prometheus's: the count of
// latencies below each upper bound 2^(i+1) ns, in seconds, from 2^10 ns
// up; the last log2 bucket (unbounded) is only in the +Inf count.
func (h Log2Histogram) cumulative() map[float64]uint64 {
	out := make(map[float64]uint64, len(h.Buckets))
	var cum uint64
	for i := 0; i < len(h.Buckets)-1; i++ {
		cum += h.Buckets[i]
		if i+1 >= minLatencyBucket {
			out[float64(uint64(1)<<(i+1))/1e9] = cum
		}
	}
	return out
}

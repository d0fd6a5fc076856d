// Package daemon is fusiond's composition root: it loads the configuration,
// opens the store, wires the job manager, placer and runner to the API
// server, listens on the Unix socket and runs until its context ends. Nothing
// imports it but cmd/fusiond.
//
// It may import every package of the module but the commands (cmd/...): it is
// the only place where the daemon's parts meet.
package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/apiserver"
	"github.com/fusiond/fusiond/daemon/internal/audit"
	"github.com/fusiond/fusiond/daemon/internal/hardware"
)

// DefaultConfigPath is where fusiond looks for its configuration.
const DefaultConfigPath = "/etc/fusiond/config.yaml"

// Config is fusiond's configuration file (YAML). Unknown keys are errors.
type Config struct {
	// StateDir holds the job database and job logs.
	StateDir string `json:"state_dir"`
	// Socket is the API's Unix socket.
	Socket string `json:"socket"`
	// SocketGroup owns the socket; its members may use the API. Empty
	// keeps the daemon's own group.
	SocketGroup string `json:"socket_group"`
	// SocketMode is the socket's permission bits, octal ("0660").
	SocketMode string `json:"socket_mode"`
	// AdminGroup's members see and manage every job, like root.
	AdminGroup string    `json:"admin_group,omitempty"`
	Log        LogConfig `json:"log"`
	// Tiers maps each job class to its default QoS tier.
	Tiers map[api.Class]api.Tier `json:"tiers"`
	// CancelGrace is the time between SIGTERM and SIGKILL on cancel.
	CancelGrace Duration `json:"cancel_grace"`
	// ShutdownTimeout bounds a graceful shutdown.
	ShutdownTimeout Duration `json:"shutdown_timeout"`
	// MaxRequestBytes caps API request bodies.
	MaxRequestBytes api.Bytes `json:"max_request_bytes"`
	Retention       Retention `json:"retention"`
	// CgroupParent is where fusiond's cgroup hierarchy (fusiond/<tier>/<job>)
	// lives, relative to the cgroup mount: "" for the root; under systemd
	// the unit's delegated subtree, e.g. system.slice/fusiond.service.
	CgroupParent string `json:"cgroup_parent,omitempty"`
	// LeaveJobsOnShutdown leaves running jobs to their monitors on a
	// graceful stop (for an upgrade or restart); the next fusiond
	// re-attaches to them. Default: jobs are terminated.
	LeaveJobsOnShutdown bool `json:"leave_jobs_on_shutdown,omitempty"`
	// AllowUnisolatedJobs lets jobs run when fusiond cannot give them
	// cgroups (it is not root, or a cgroup controller is missing): with no
	// CPU or memory limits, no device isolation and no accounting. Default
	// false: such a node refuses to start jobs (fusionctl status says why).
	AllowUnisolatedJobs bool `json:"allow_unisolated_jobs,omitempty"`
	// Simulate runs over a simulated host instead of the real devices:
	// "" (the real host), dgxa100, dgxh100, dgxh200, dgxb200 or mixed (one H100 and two L4s).
	Simulate string `json:"simulate,omitempty"`
	// MaxBitstreamBytes caps FPGA bitstream uploads (streamed to disk,
	// so separate from MaxRequestBytes).
	MaxBitstreamBytes api.Bytes `json:"max_bitstream_bytes"`
	// GPU holds GPU health, sharing and power settings (see GPUConfig).
	GPU GPUConfig `json:"gpu"`
	// Limits bound what one user may hold, and the logs of all jobs.
	Limits LimitsConfig `json:"limits"`
	// Audit bounds the audit files, <state_dir>/audit.log (the admins'),
	// audit-users.log and audit-refused.log.
	Audit AuditConfig `json:"audit"`
	// Metrics configures the Prometheus /metrics listener (off by default).
	Metrics MetricsConfig `json:"metrics"`
	// QoS holds the latency SLO defaults per class and the QoS loop's
	// tuning (see QoSConfig).
	QoS QoSConfig `json:"qos"`
	// Scheduling tunes the queue (aging, gangs) and preemption.
	Scheduling SchedulingConfig `json:"scheduling"`
	// Placement tunes the placement engine's scoring (see
	// PlacementConfig).
	Placement PlacementConfig `json:"placement,omitzero"`
	// Telemetry is the telemetry bus's sampling rate and ring sizes.
	Telemetry TelemetryConfig `json:"telemetry"`
	// Elastic tunes the controller of elastic (replicated) jobs.
	Elastic ElasticConfig `json:"elastic"`
	// Reclaim lets best-effort jobs use reserved-but-unused capacity.
	Reclaim ReclaimConfig `json:"reclaim"`
	// Peers is the membership among other fusiond and the hand-over of
	// jobs that do not fit here (see PeersConfig; off by default).
	Peers PeersConfig `json:"peers"`
	// Kubernetes serves the devices to kubelet as a device plugin (see
	// KubernetesConfig; off by default).
	Kubernetes KubernetesConfig `json:"kubernetes"`
	// Profiles is the task profiles learned from finished jobs (see
	// ProfilesConfig; on by default).
	Profiles ProfilesConfig `json:"profiles"`
}

// LimitsConfig bounds one user's jobs, specs, logs and streams, and the
// logs of all jobs together. 0 disables a limit.
type LimitsConfig struct {
	// MaxSpecBytes caps one job spec (its JSON, env included): 413.
	MaxSpecBytes api.Bytes `json:"max_spec_bytes"`
	// LogBudget caps the logs of all jobs in the state directory.
	LogBudget api.Bytes `json:"log_budget"`
	// SpecBudget caps the job specs the daemon holds for all users
	// together, finished jobs included (what users can make it keep in
	// memory): finished jobs are forgotten to stay within it, those of
	// the user holding the most first; past it with live jobs alone,
	// submissions are refused (429).
	SpecBudget api.Bytes `json:"spec_budget"`
	// StreamIdleTimeout ends an event stream that carried no event for
	// this long.
	StreamIdleTimeout Duration `json:"stream_idle_timeout"`
	// ExemptRoot exempts uid 0 from the per-user limits (not from
	// max_spec_bytes or log_budget).
	ExemptRoot bool `json:"exempt_root"`
	// Connections caps the API socket's connections open at once, every
	// user's together; AdminConnections more are kept for root, the
	// daemon's user and the admin group, so they can always connect. A
	// connection beyond a limit is answered 429 and closed at once.
	Connections      int `json:"connections"`
	AdminConnections int `json:"admin_connections"`
	// IdleTimeout closes a kept-alive connection that sends no request
	// for this long; HeaderTimeout one whose request headers take longer.
	IdleTimeout   Duration      `json:"idle_timeout"`
	HeaderTimeout Duration      `json:"header_timeout"`
	PerUser       PerUserLimits `json:"per_user"`
}

// PerUserLimits are each user's quotas.
type PerUserLimits struct {
	// PendingJobs: queued jobs (429 past it).
	PendingJobs int `json:"pending_jobs"`
	// RunningJobs: placed, starting or running jobs (more wait queued).
	RunningJobs int `json:"running_jobs"`
	// SpecBytes: the specs of the user's remembered jobs (429).
	SpecBytes api.Bytes `json:"spec_bytes"`
	// LogBytes: the logs of the user's jobs on disk.
	LogBytes api.Bytes `json:"log_bytes"`
	// Streams: open event streams and followed logs (429).
	Streams int `json:"streams"`
	// Connections: API socket connections open at once (429 and closed);
	// more than Streams, so that a user at the stream limit can still ask.
	Connections int `json:"connections"`
}

// AuditConfig bounds the audit file: rotated to audit.log.1 when it would
// grow beyond MaxBytes, with Keep rotated files kept.
type AuditConfig struct {
	// MaxBytes and Keep are each file's size before rotation and the
	// rotated files it keeps; MaxAge removes rotated files older than it
	// (0: by size alone).
	MaxBytes api.Bytes `json:"max_bytes"`
	Keep     int       `json:"keep"`
	MaxAge   Duration  `json:"max_age"`
	// RefusedRate and RefusedBurst bound the refused requests recorded per
	// user (a second, at once); beyond them they are counted in a summary
	// record. Admins' records are never rate-limited.
	RefusedRate  float64 `json:"refused_rate"`
	RefusedBurst int     `json:"refused_burst"`
}

// MetricsConfig is the Prometheus listener: read-only GET /metrics on an
// address of its own, never the API socket.
type MetricsConfig struct {
	// Listen is "" (off), a TCP address ("127.0.0.1:9464", "[::1]:9464")
	// or "unix:/path/to/metrics.sock" (a relative path is taken from the
	// directory fusiond starts in).
	Listen string `json:"listen"`
	// AllowRemote lets Listen name an address other machines can reach;
	// without it a TCP address must be a loopback one.
	AllowRemote bool `json:"allow_remote"`
	// MaxConnections caps the metrics listener's open connections (it
	// cannot tell who connects over TCP); more are closed at once.
	MaxConnections int `json:"max_connections"`
}

// Endpoint parses Listen into a network ("tcp" or "unix") and address;
// network "" means the listener is off.
func (m MetricsConfig) Endpoint() (network, addr string, err error) {
	switch {
	case m.Listen == "":
		return "", "", nil
	case strings.HasPrefix(m.Listen, "unix:"):
		p := strings.TrimPrefix(m.Listen, "unix:")
		if p == "" {
			return "", "", fmt.Errorf("want a socket path after unix:")
		}
		if len(p) > 107 {
			return "", "", fmt.Errorf("socket path longer than the 107 bytes a Unix socket address holds")
		}
		return "unix", p, nil
	}
	host, port, err := net.SplitHostPort(m.Listen)
	if err != nil {
		return "", "", fmt.Errorf("want host:port (127.0.0.1:9464) or unix:/path, got %q: %w", m.Listen, err)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || (n == 0 && port != "0") {
		return "", "", fmt.Errorf("bad port %q in %q", port, m.Listen)
	}
	if !m.AllowRemote {
		ip := net.ParseIP(host)
		if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return "", "", fmt.Errorf("%q is reachable from other machines; use a loopback address (127.0.0.1, [::1]) or a unix: socket, or set metrics.allow_remote: true", m.Listen)
		}
	}
	return "tcp", m.Listen, nil
}

// LogConfig selects the log format and level.
type LogConfig struct {
	// Format is text or json.
	Format string `json:"format"`
	// Level is debug, info, warn or error.
	Level string `json:"level"`
}

// Retention bounds how many finished jobs are remembered.
type Retention struct {
	MaxFinishedJobs int      `json:"max_finished_jobs"`
	MaxAge          Duration `json:"max_age"`
}

// Duration is a time.Duration written as "10s", "5m", "168h".
type Duration time.Duration

// UnmarshalJSON parses a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration such as \"10s\" or \"5m\", got %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration such as \"10s\" or \"5m\", got %q", s)
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes the duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// DefaultConfig is the configuration used for anything the file leaves out.
func DefaultConfig() Config {
	return Config{
		StateDir:    "/var/lib/fusiond",
		Socket:      "/run/fusiond/fusiond.sock",
		SocketGroup: "fusiond",
		SocketMode:  "0660",
		Log:         LogConfig{Format: "text", Level: "info"},
		Tiers: map[api.Class]api.Tier{
			api.ClassService:   api.TierGuaranteed,
			api.ClassInference: api.TierGuaranteed,
			api.ClassTraining:  api.TierBurstable,
			api.ClassBatch:     api.TierBestEffort,
		},
		CancelGrace:         Duration(10 * time.Second),
		ShutdownTimeout:     Duration(30 * time.Second),
		MaxRequestBytes:     apiserver.DefaultMaxBodyBytes,
		LeaveJobsOnShutdown: true,
		MaxBitstreamBytes:   apiserver.DefaultMaxBitstreamBytes,
		Retention:           Retention{MaxFinishedJobs: 10000, MaxAge: Duration(7 * 24 * time.Hour)},
		Audit: AuditConfig{MaxBytes: audit.DefaultMaxBytes, Keep: audit.DefaultKeep, MaxAge: Duration(audit.DefaultMaxAge),
			RefusedRate: audit.DefaultRefusedRate, RefusedBurst: audit.DefaultRefusedBurst},
		Metrics: MetricsConfig{MaxConnections: 32},
		GPU:     GPUConfig{HealthProbation: Duration(5 * time.Minute), HealthProbe: Duration(10 * time.Second)},
		Limits: LimitsConfig{
			MaxSpecBytes:      256 << 10,
			LogBudget:         20 << 30,
			SpecBudget:        256 << 20,
			StreamIdleTimeout: Duration(30 * time.Minute),
			ExemptRoot:        true,
			Connections:       1024,
			AdminConnections:  32,
			IdleTimeout:       Duration(time.Minute),
			HeaderTimeout:     Duration(10 * time.Second),
			PerUser: PerUserLimits{
				PendingJobs: 1000,
				RunningJobs: 256,
				SpecBytes:   64 << 20,
				LogBytes:    4 << 30,
				Streams:     64,
				Connections: 128,
			},
		},
		QoS:        DefaultQoSConfig(),
		Scheduling: DefaultSchedulingConfig(),
		Telemetry:  DefaultTelemetryConfig(),
		Elastic:    DefaultElasticConfig(),
		Reclaim:    DefaultReclaimConfig(),
		Profiles:   DefaultProfilesConfig(),
		Peers:      DefaultPeersConfig(),
		Kubernetes: DefaultKubernetesConfig(),
	}
}

// LoadConfig reads the YAML file at path over the defaults. A missing file
// is an error only when required (the user named it).
func LoadConfig(path string, required bool) (Config, error) {
	cfg := DefaultConfig()
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) && !required {
		return cfg, nil
	}
	if err != nil {
		return cfg, fmt.Errorf("config: %w", err)
	}
	if err := ParseConfig(data, &cfg); err != nil {
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig decodes YAML into cfg strictly and validates the result.
func ParseConfig(data []byte, cfg *Config) error {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return fmt.Errorf("not valid YAML: %w", err)
	}
	if strings.TrimSpace(string(js)) != "null" {
		// Decode over a zero value first so the strict decoder sees the
		// file alone, then merge over the defaults.
		if err := api.DecodeStrict(js, new(Config)); err != nil {
			return err
		}
		if err := json.Unmarshal(js, cfg); err != nil {
			return err
		}
	}
	return cfg.Validate()
}

// Validate checks values that decode but make no sense.
func (c *Config) Validate() error {
	bad := func(key, format string, args ...any) error {
		return &api.Error{Code: api.CodeInvalid, Field: key, Message: fmt.Sprintf(format, args...)}
	}
	switch {
	case c.StateDir == "" || !strings.HasPrefix(c.StateDir, "/") && !strings.HasPrefix(c.StateDir, "."):
		return bad("state_dir", "must be a path, got %q", c.StateDir)
	case c.Socket == "":
		return bad("socket", "required")
	case len(c.Socket) > 107:
		return bad("socket", "path longer than the 107 bytes a Unix socket address holds")
	}
	if _, err := c.Mode(); err != nil {
		return bad("socket_mode", "%v", err)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		return bad("log.format", "want text or json, got %q", c.Log.Format)
	}
	if _, err := ParseLevel(c.Log.Level); err != nil {
		return bad("log.level", "%v", err)
	}
	for class, tier := range c.Tiers {
		if !slices.Contains(api.Classes, class) {
			return bad("tiers."+string(class), "unknown class (want training, inference, batch or service)")
		}
		if !slices.Contains(api.Tiers, tier) {
			return bad("tiers."+string(class), "unknown tier %q (want guaranteed, burstable or besteffort)", tier)
		}
	}
	switch {
	case c.CancelGrace < 0:
		return bad("cancel_grace", "must not be negative")
	case c.ShutdownTimeout <= 0:
		return bad("shutdown_timeout", "must be positive")
	case c.MaxRequestBytes < 1024:
		return bad("max_request_bytes", "at least 1Ki")
	case c.Retention.MaxFinishedJobs < 0:
		return bad("retention.max_finished_jobs", "must not be negative")
	case c.Retention.MaxAge < 0:
		return bad("retention.max_age", "must not be negative")
	case c.CgroupParent != "" && (path.IsAbs(c.CgroupParent) || path.Clean(c.CgroupParent) != c.CgroupParent || strings.HasPrefix(c.CgroupParent, "..")):
		return bad("cgroup_parent", "want a clean relative cgroup path such as system.slice/fusiond.service, got %q", c.CgroupParent)
	case c.MaxBitstreamBytes < 1024:
		return bad("max_bitstream_bytes", "at least 1Ki")
	case c.Audit.MaxBytes < 64<<10:
		return bad("audit.max_bytes", "at least 64Ki")
	case c.Audit.Keep < 1 || c.Audit.Keep > 100:
		return bad("audit.keep", "between 1 and 100, got %d", c.Audit.Keep)
	case c.Audit.MaxAge < 0:
		return bad("audit.max_age", "must not be negative")
	case c.Audit.RefusedRate <= 0 || c.Audit.RefusedRate > 10000:
		return bad("audit.refused_rate", "between 0 and 10000 a second, got %g", c.Audit.RefusedRate)
	case c.Audit.RefusedBurst < 1 || c.Audit.RefusedBurst > 100000:
		return bad("audit.refused_burst", "between 1 and 100000, got %d", c.Audit.RefusedBurst)
	}
	l := c.Limits
	switch {
	case l.MaxSpecBytes < 0:
		return bad("limits.max_spec_bytes", "must not be negative")
	case l.MaxSpecBytes > 0 && l.MaxSpecBytes < 1024:
		return bad("limits.max_spec_bytes", "at least 1Ki (or 0: no limit)")
	case l.LogBudget < 0:
		return bad("limits.log_budget", "must not be negative")
	case l.SpecBudget < 0:
		return bad("limits.spec_budget", "must not be negative")
	case l.SpecBudget > 0 && l.SpecBudget < l.MaxSpecBytes:
		return bad("limits.spec_budget", "at least limits.max_spec_bytes (%s)", l.MaxSpecBytes.Human())
	case l.StreamIdleTimeout < 0:
		return bad("limits.stream_idle_timeout", "must not be negative")
	case l.PerUser.PendingJobs < 0:
		return bad("limits.per_user.pending_jobs", "must not be negative")
	case l.PerUser.RunningJobs < 0:
		return bad("limits.per_user.running_jobs", "must not be negative")
	case l.PerUser.SpecBytes < 0:
		return bad("limits.per_user.spec_bytes", "must not be negative")
	case l.PerUser.LogBytes < 0:
		return bad("limits.per_user.log_bytes", "must not be negative")
	case l.PerUser.Streams < 0:
		return bad("limits.per_user.streams", "must not be negative")
	case l.Connections < 0:
		return bad("limits.connections", "must not be negative")
	case l.AdminConnections < 0:
		return bad("limits.admin_connections", "must not be negative")
	case l.PerUser.Connections < 0:
		return bad("limits.per_user.connections", "must not be negative")
	case l.PerUser.Connections > 0 && l.PerUser.Streams > 0 && l.PerUser.Connections <= l.PerUser.Streams:
		return bad("limits.per_user.connections", "must exceed limits.per_user.streams (%d): a user at the stream limit must still be able to ask", l.PerUser.Streams)
	case l.IdleTimeout < Duration(time.Second):
		return bad("limits.idle_timeout", "at least 1s")
	case l.HeaderTimeout < Duration(time.Second):
		return bad("limits.header_timeout", "at least 1s")
	case c.Metrics.MaxConnections < 0:
		return bad("metrics.max_connections", "must not be negative")
	}
	if err := hardware.CheckSimulate(c.Simulate); err != nil {
		return bad("simulate", "%v", err)
	}
	if key, err := c.GPU.validate(); err != nil {
		return bad(key, "%v", err)
	}
	if _, _, err := c.Metrics.Endpoint(); err != nil {
		return bad("metrics.listen", "%v", err)
	}
	if key, err := c.QoS.validate(); err != nil {
		return bad(key, "%v", err)
	}
	if key, err := c.Scheduling.validate(); err != nil {
		return bad(key, "%v", err)
	}
	if key, err := c.Placement.validate(); err != nil {
		return bad(key, "%v", err)
	}
	if key, err := c.Telemetry.validate(); err != nil {
		return bad(key, "%v", err)
	}
	if key, err := c.Elastic.validate(); err != nil {
		return bad(key, "%v", err)
	}
	if key, err := c.Reclaim.validate(); err != nil {
		return bad(key, "%v", err)
	}
	if key, err := c.Peers.validate(); err != nil {
		return bad(key, "%v", err)
	}
	if key, err := c.Profiles.validate(); err != nil {
		return bad(key, "%v", err)
	}
	if key, err := c.Kubernetes.validate(); err != nil {
		return bad(key, "%v", err)
	}
	return nil
}

// Mode parses SocketMode.
func (c *Config) Mode() (os.FileMode, error) {
	m, err := strconv.ParseUint(c.SocketMode, 8, 32)
	if err != nil || m > 0o777 {
		return 0, fmt.Errorf("want octal permission bits such as 0660, got %q", c.SocketMode)
	}
	return os.FileMode(m), nil
}

// ParseLevel parses a log level name.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("want debug, info, warn or error, got %q", s)
	}
	return l, nil
}

// NewLogger builds the daemon's logger.
func NewLogger(c LogConfig, w *os.File) *slog.Logger {
	level, _ := ParseLevel(c.Level)
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

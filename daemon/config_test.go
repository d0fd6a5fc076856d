package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "c.yaml")
		os.WriteFile(p, []byte(s), 0o644)
		return p
	}
	cfg, err := LoadConfig(write("state_dir: /srv/f\ncancel_grace: 3s\ntiers: {batch: burstable}\nlog: {format: json}\n"), true)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.StateDir != "/srv/f" || time.Duration(cfg.CancelGrace) != 3*time.Second ||
		cfg.Tiers[api.ClassBatch] != api.TierBurstable || cfg.Log.Format != "json" || cfg.Log.Level != "info" ||
		cfg.Socket != DefaultConfig().Socket {
		t.Errorf("file values not merged over the defaults: %+v", cfg)
	}
	cfg, err = LoadConfig(write("simulate: dgxh200\nmax_bitstream_bytes: 2Gi\n"), true)
	if err != nil || cfg.Simulate != "dgxh200" || cfg.MaxBitstreamBytes != 2<<30 {
		t.Errorf("simulate/max_bitstream_bytes not read: %+v %v", cfg, err)
	}
	if DefaultConfig().MaxBitstreamBytes != 1<<30 || DefaultConfig().Simulate != "" {
		t.Errorf("defaults: %+v", DefaultConfig())
	}
	if DefaultConfig().AllowUnisolatedJobs {
		t.Error("unisolated jobs allowed by default")
	}
	// The development config (make run, not root) allows them.
	if cfg, err := LoadConfig("../examples/dev-config.yaml", true); err != nil || !cfg.AllowUnisolatedJobs {
		t.Errorf("examples/dev-config.yaml: allow_unisolated_jobs %v, %v", cfg.AllowUnisolatedJobs, err)
	}
	cfg, err = LoadConfig(write("limits: {exempt_root: false, per_user: {pending_jobs: 5, log_bytes: 1Gi}}\n"), true)
	if err != nil || cfg.Limits.PerUser.PendingJobs != 5 || cfg.Limits.PerUser.LogBytes != 1<<30 || cfg.Limits.ExemptRoot ||
		cfg.Limits.PerUser.Streams != 64 || cfg.Limits.MaxSpecBytes != 256<<10 {
		t.Errorf("limits not merged over the defaults: %+v %v", cfg.Limits, err)
	}
	cfg, err = LoadConfig(write("qos: {window: 500ms, classes: {batch: {runqueue_p99: 5ms}}}\n"), true)
	if err != nil || time.Duration(cfg.QoS.Window) != 500*time.Millisecond || cfg.QoS.Classes[api.ClassBatch].RunqueueP99 != api.Duration(5*time.Millisecond) ||
		cfg.QoS.Classes[api.ClassService].RunqueueP99 != api.Duration(2*time.Millisecond) || cfg.QoS.Shrink != 0.5 {
		t.Errorf("qos not merged over the defaults: %+v %v", cfg.QoS, err)
	}
	if slo := cfg.QoS.SLO(api.JobSpec{Class: api.ClassTraining}); slo != nil {
		t.Errorf("training job protected by default: %+v", slo)
	}
	if slo := cfg.QoS.SLO(api.JobSpec{Class: api.ClassService, QoS: &api.QoS{PSISomeAvg10: 3}}); slo == nil || slo.PSISomeAvg10 != 3 || slo.RunqueueP99 != 0 {
		t.Errorf("a spec's SLO must replace the class default: %+v", slo)
	}
	if _, err := LoadConfig(filepath.Join(dir, "none.yaml"), false); err != nil {
		t.Errorf("missing default config must mean defaults: %v", err)
	}
	if _, err := LoadConfig(filepath.Join(dir, "none.yaml"), true); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing named config: %v", err)
	}
	for body, want := range map[string]string{
		"metrics: {listen: \"127.0.0.1:9464\"}\n":                   "tcp 127.0.0.1:9464",
		"metrics: {listen: \"[::1]:9464\"}\n":                       "tcp [::1]:9464",
		"metrics: {listen: \"localhost:0\"}\n":                      "tcp localhost:0",
		"metrics: {listen: \"0.0.0.0:9464\", allow_remote: true}\n": "tcp 0.0.0.0:9464",
		"metrics: {listen: \"unix:/run/fusiond/metrics.sock\"}\n":   "unix /run/fusiond/metrics.sock",
		"gpu: {health_probe: 10s}\n":                                " ",
	} {
		cfg, err := LoadConfig(write(body), true)
		if err != nil {
			t.Errorf("%q: %v", body, err)
			continue
		}
		network, addr, err := cfg.Metrics.Endpoint()
		if got := network + " " + addr; err != nil || got != want {
			t.Errorf("%q: endpoint %q, %v; want %q", body, got, err, want)
		}
	}
	if _, err := LoadConfig(write(""), true); err != nil {
		t.Errorf("empty file: %v", err)
	}
	bad := map[string]string{
		"sokcet: /x\n":                                     "sokcet",
		"log: {level: loud}\n":                             "log.level",
		"log: {format: xml}\n":                             "log.format",
		"log: {colour: red}\n":                             "log.colour",
		"socket_mode: \"0999\"\n":                          "socket_mode",
		"cancel_grace: soon\n":                             "cancel_grace",
		"cancel_grace: -1s\n":                              "cancel_grace",
		"tiers: {gaming: guaranteed}\n":                    "tiers.gaming",
		"tiers: {batch: gold}\n":                           "tiers.batch",
		"retention: {max_finished_jobs: -1}\n":             "retention.max_finished_jobs",
		"max_request_bytes: 10\n":                          "max_request_bytes",
		"socket: " + strings.Repeat("x", 120) + "\n":       "socket",
		"state_dir: [1]\n":                                 "state_dir",
		"simulate: dgxz900\n":                              "simulate",
		"max_bitstream_bytes: 1\n":                         "max_bitstream_bytes",
		"cgroup_parent: /system.slice\n":                   "cgroup_parent",
		"cgroup_parent: ../escape\n":                       "cgroup_parent",
		"allow_unisolated_jobs: maybe\n":                   "allow_unisolated_jobs",
		"qos: {window: 1ms}\n":                             "qos.window",
		"qos: {shrink: 1.5}\n":                             "qos.shrink",
		"qos: {min_blame: 1}\n":                            "qos.min_blame",
		"qos: {breach_windows: 0}\n":                       "qos.breach_windows",
		"qos: {restore_step: 0}\n":                         "qos.restore_step",
		"qos: {classes: {gaming: {runqueue_p99: 2ms}}}\n":  "qos.classes.gaming",
		"qos: {classes: {service: {runqueue_p99: 1us}}}\n": "qos.classes.service.runqueue_p99",
		"qos: {classes: {service: {p99: 2ms}}}\n":          "qos.classes.service.p99",
		"- not a map\n":                                    "",
		"limits: {per_user: {pending_jobs: -1}}\n":         "limits.per_user.pending_jobs",
		"limits: {per_user: {streams: -2}}\n":              "limits.per_user.streams",
		"limits: {per_user: {log_bytes: -1Gi}}\n":          "limits.per_user.log_bytes",
		"limits: {max_spec_bytes: 10}\n":                   "limits.max_spec_bytes",
		"limits: {log_budget: lots}\n":                     "limits.log_budget",
		"limits: {stream_idle_timeout: -1m}\n":             "limits.stream_idle_timeout",
		"limits: {per_user: {pending: 1}}\n":               "limits.per_user.pending",
		"metrics: {listen: \"0.0.0.0:9464\"}\n":            "metrics.listen",
		"metrics: {listen: \":9464\"}\n":                   "metrics.listen",
		"metrics: {listen: \"10.1.2.3:9464\"}\n":           "metrics.listen",
		"metrics: {listen: \"127.0.0.1\"}\n":               "metrics.listen",
		"metrics: {listen: \"127.0.0.1:http\"}\n":          "metrics.listen",
		"metrics: {listen: \"unix:\"}\n":                   "metrics.listen",
		"metrics: {port: 9464}\n":                          "metrics.port",
		"scheduling: {aging_per_minute: -1}\n":             "scheduling.aging_per_minute",
		"scheduling: {gang_timeout: -1m}\n":                "scheduling.gang_timeout",
		"scheduling: {preemption: {max_evictions: 0}}\n":   "scheduling.preemption.max_evictions",
		"scheduling: {preemption: {window: 10ms}}\n":       "scheduling.preemption.window",
		"scheduling: {preemption: {budget: 3}}\n":          "scheduling.preemption.budget",
	}
	for body, key := range bad {
		p := write(body)
		_, err := LoadConfig(p, true)
		if err == nil {
			t.Errorf("%q accepted", body)
			continue
		}
		if !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), key) {
			t.Errorf("%q: error %q does not name the file and the key %q", body, err, key)
		}
	}
}

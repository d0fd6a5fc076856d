package daemon

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/admission"
	"github.com/fusiond/fusiond/daemon/internal/elastic"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/telemetry"
)

// ElasticConfig tunes the elastic-job controller.
type ElasticConfig struct {
	// Step is how often replicas are sized (default 10s).
	Step Duration `json:"step"`
	// Lead is how far ahead load is forecast: about the time a new
	// replica needs to serve (default 1m).
	Lead Duration `json:"lead"`
	// Cooldown is the least time between a change and a scale-down
	// (default 5m).
	Cooldown Duration `json:"cooldown"`
	// Tolerance is the scale-down hysteresis, in (0, 0.5) (default 0.1).
	Tolerance float64 `json:"tolerance"`
	// Resize sets burstable jobs' CPU limits from their usage (p95 of the
	// last ResizeLookback × 1.3, never below the request) every
	// ResizePeriod (default off; 30s over 5m).
	Resize         bool     `json:"resize"`
	ResizePeriod   Duration `json:"resize_period"`
	ResizeLookback Duration `json:"resize_lookback"`
}

// DefaultElasticConfig sizes replicas every 10 s, a minute ahead.
func DefaultElasticConfig() ElasticConfig {
	return ElasticConfig{Step: Duration(10 * time.Second), Lead: Duration(time.Minute), Cooldown: Duration(5 * time.Minute), Tolerance: 0.1,
		ResizePeriod: Duration(30 * time.Second), ResizeLookback: Duration(5 * time.Minute)}
}

func (c ElasticConfig) validate() (string, error) {
	switch {
	case c.Step < Duration(100*time.Millisecond):
		return "elastic.step", fmt.Errorf("at least 100ms, got %v", time.Duration(c.Step))
	case c.Lead < 0:
		return "elastic.lead", fmt.Errorf("must not be negative")
	case c.Cooldown < 0:
		return "elastic.cooldown", fmt.Errorf("must not be negative")
	case c.Tolerance <= 0 || c.Tolerance >= 0.5:
		return "elastic.tolerance", fmt.Errorf("between 0 and 0.5 (exclusive), got %g", c.Tolerance)
	case c.ResizePeriod < Duration(100*time.Millisecond):
		return "elastic.resize_period", fmt.Errorf("at least 100ms, got %v", time.Duration(c.ResizePeriod))
	case c.ResizeLookback < c.ResizePeriod:
		return "elastic.resize_lookback", fmt.Errorf("at least elastic.resize_period, got %v", time.Duration(c.ResizeLookback))
	}
	return "", nil
}

// elasticHost is the elastic controller's view of the job manager (the
// groups, and replica jobs submitted and cancelled) and the telemetry
// bus (their load).
type elasticHost struct {
	mgr    *jobs.Manager
	bus    telemetry.Reader
	step   time.Duration
	logDir string
	log    *slog.Logger
	// jobs are the live jobs of the last Groups call, by ID.
	jobs map[string]api.Job
}

var _ elastic.Host = (*elasticHost)(nil)

var admin = api.Caller{Admin: true}

// Groups lists the live elastic jobs with their replicas (the elastic
// job first, then by replica number). A replica whose elastic job has
// finished is cancelled.
func (h *elasticHost) Groups() []elastic.Group {
	live := h.mgr.Live()
	h.jobs = make(map[string]api.Job, len(live))
	for _, j := range live {
		h.jobs[j.ID] = j
	}
	var out []elastic.Group
	members := map[string][]api.Job{}
	for _, j := range live {
		of, ok := j.Spec.Labels[api.LabelReplicaOf]
		if !ok {
			continue
		}
		leader, live := h.jobs[of]
		switch {
		case live && leader.Spec.Replicas != nil && leader.Owner.UID == j.Owner.UID:
			members[of] = append(members[of], j)
			continue
		case live:
			continue // a label naming a job that is not this owner's elastic job
		}
		if _, err := h.mgr.Cancel(context.Background(), admin, j.ID); err != nil {
			h.log.Warn("cancelling a replica whose elastic job ended", "job", j.ID, "of", of, "err", err)
		} else {
			h.mgr.PublishScale(api.Event{Time: time.Now().UTC(), JobID: of, Reason: fmt.Sprintf("replica %s cancelled: its elastic job %s ended", j.ID, of)})
		}
	}
	for _, j := range live {
		if j.Spec.Replicas == nil || j.Spec.Labels[api.LabelReplicaOf] != "" {
			continue
		}
		g := elastic.Group{ID: j.ID, Replicas: *j.Spec.Replicas, Members: []string{j.ID}}
		rs := members[j.ID]
		slices.SortFunc(rs, func(a, b api.Job) int { return replicaNum(a) - replicaNum(b) })
		for _, r := range rs {
			g.Members = append(g.Members, r.ID)
		}
		out = append(out, g)
	}
	return out
}

func replicaNum(j api.Job) int {
	n, _ := strconv.Atoi(j.Spec.Labels[api.LabelReplica])
	return n
}

// Load sums the target metric over the group's running members. A member
// handed over to a peer runs where this host's telemetry does not reach
// (its output, and so the custom metric, comes back here): for the cpu
// and gpu_util metrics it counts as the mean of the members measured
// here, so that replicas on peers do not look idle and get scaled away.
func (h *elasticHost) Load(g elastic.Group) (float64, bool) {
	var sum float64
	measured, remote := 0, 0
	for _, id := range g.Members {
		j, ok := h.jobs[id]
		if !ok || j.State != api.StateRunning {
			continue
		}
		if v, ok := h.memberLoad(j, g.Replicas.Target.Metric); ok {
			sum += v
			measured++
		} else if j.Handover != nil {
			remote++
		}
	}
	if measured == 0 {
		return 0, false
	}
	return sum + float64(remote)*sum/float64(measured), true
}

func (h *elasticHost) memberLoad(j api.Job, m api.ScaleMetric) (float64, bool) {
	switch m {
	case api.MetricCPU:
		u, ok := h.bus.Job(j.ID, h.step)
		if !ok || j.Spec.Resources.CPU <= 0 {
			return 0, false
		}
		return u.CPUMilli / float64(j.Spec.Resources.CPU) * 100, true
	case api.MetricGPUUtil:
		if j.Allocation == nil || len(j.Allocation.GPUs) == 0 {
			return 0, false
		}
		var sum float64
		for _, id := range j.Allocation.GPUs {
			g, ok := h.bus.GPU(id, h.step)
			if !ok {
				return 0, false
			}
			sum += g.SMUtil
		}
		return sum / float64(len(j.Allocation.GPUs)), true
	case api.MetricCustom:
		return customMetric(filepath.Join(h.logDir, j.ID, "output.log"))
	}
	return 0, false
}

// customMetric is the value of the last "FUSIOND_METRIC=<number>" line in
// the last 8 KiB of a job's output.
func customMetric(file string) (float64, bool) {
	f, err := os.Open(file)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	const tail = 8 << 10
	if st, err := f.Stat(); err == nil && st.Size() > tail {
		if _, err := f.Seek(-tail, io.SeekEnd); err != nil {
			return 0, false
		}
	}
	b, err := io.ReadAll(io.LimitReader(f, tail))
	if err != nil {
		return 0, false
	}
	lines := bytes.Split(b, []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		if v, ok := bytes.CutPrefix(bytes.TrimSpace(lines[i]), []byte(api.CustomMetricPrefix)); ok {
			x, err := strconv.ParseFloat(string(v), 64)
			if err == nil && x >= 0 {
				return x, true
			}
		}
	}
	return 0, false
}

// Scale submits replica jobs (as the elastic job's owner, with its spec)
// or cancels the newest ones, and publishes the change.
func (h *elasticHost) Scale(g elastic.Group, n int, reason string) error {
	leader, ok := h.jobs[g.ID]
	if !ok {
		return fmt.Errorf("elastic job %s is gone", g.ID)
	}
	from := len(g.Members)
	var err error
	switch {
	case n > from:
		err = h.addReplicas(leader, g, n-from)
	case n < from:
		for _, id := range slices.Backward(g.Members[max(n, 1):]) {
			if _, cerr := h.mgr.Cancel(context.Background(), admin, id); cerr != nil {
				err = fmt.Errorf("cancelling replica %s: %w", id, cerr)
				break
			}
		}
	}
	if err != nil {
		return err
	}
	h.mgr.PublishScale(api.Event{Time: time.Now().UTC(), JobID: g.ID, Reason: fmt.Sprintf("replicas %d → %d: %s", from, n, reason)})
	return nil
}

func (h *elasticHost) addReplicas(leader api.Job, g elastic.Group, count int) error {
	next := 2
	for _, id := range g.Members[1:] {
		if j, ok := h.jobs[id]; ok {
			next = max(next, replicaNum(j)+1)
		}
	}
	owner := api.Caller{UID: leader.Owner.UID, GID: leader.Owner.GID, Groups: leader.Owner.Groups, User: leader.Owner.User}
	for i := range count {
		spec := leader.Spec
		spec.Replicas = nil
		spec.Labels = map[string]string{}
		for k, v := range leader.Spec.Labels {
			spec.Labels[k] = v
		}
		num := next + i
		spec.Labels[api.LabelReplicaOf] = leader.ID
		spec.Labels[api.LabelReplica] = strconv.Itoa(num)
		spec.Name = replicaName(leader.Spec.Name, num)
		// A replica is admitted like any job of its owner's (limits,
		// audit, the queue).
		if _, err := h.mgr.Admit(context.Background(), jobs.Entry{Source: admission.Replica, Caller: owner, Specs: []api.JobSpec{spec}}); err != nil {
			return fmt.Errorf("submitting replica %d of %s: %w", num, leader.ID, err)
		}
	}
	return nil
}

// replicaName is name-r<n>, cut to fit api.MaxNameLen.
func replicaName(name string, n int) string {
	suffix := "-r" + strconv.Itoa(n)
	if len(name)+len(suffix) > api.MaxNameLen {
		name = name[:api.MaxNameLen-len(suffix)]
	}
	return name + suffix
}

// resizeHost is the resizer's view: running burstable jobs, their usage
// from the bus, their cgroups' CPU quota.
type resizeHost struct {
	mgr      *jobs.Manager
	bus      telemetry.Reader
	cg       *cgroups.Manager
	lookback time.Duration
}

var _ elastic.ResizeHost = (*resizeHost)(nil)

func (h *resizeHost) Burstable() []elastic.Resizable {
	var out []elastic.Resizable
	for _, j := range h.mgr.Running() {
		if j.Tier != api.TierBurstable {
			continue
		}
		r := elastic.Resizable{ID: j.ID, Request: int64(j.Spec.Resources.CPU)}
		for _, u := range h.bus.JobWindow(j.ID, h.lookback) {
			r.Usage = append(r.Usage, u.CPUMilli)
		}
		out = append(out, r)
	}
	return out
}

func (h *resizeHost) SetCPULimit(id string, milli int64, reason string) error {
	c, err := h.cg.Load(id)
	if err != nil {
		return err
	}
	if err := c.SetCPUQuota(milli); err != nil {
		return err
	}
	h.mgr.PublishResize(api.Event{Time: time.Now().UTC(), JobID: id, Reason: reason})
	return nil
}

// startElastic starts the elastic controller over the job manager and
// the telemetry bus, and with elastic.resize and job cgroups the
// burstable resizer; stop ends them.
func startElastic(ctx context.Context, cfg ElasticConfig, mgr *jobs.Manager, bus telemetry.Reader, cg *cgroups.Manager, logDir string, log *slog.Logger) (func(), error) {
	host := &elasticHost{mgr: mgr, bus: bus, step: time.Duration(cfg.Step), logDir: logDir, log: log}
	ctl, err := elastic.New(elastic.Config{Step: time.Duration(cfg.Step), Lead: time.Duration(cfg.Lead),
		Cooldown: time.Duration(cfg.Cooldown), Tolerance: cfg.Tolerance}, host, log)
	if err != nil {
		return nil, err
	}
	var resizer *elastic.Resizer
	if cfg.Resize && cg != nil {
		if resizer, err = elastic.NewResizer(&resizeHost{mgr: mgr, bus: bus, cg: cg, lookback: time.Duration(cfg.ResizeLookback)},
			time.Duration(cfg.ResizePeriod), elastic.ResizeParams{}, log); err != nil {
			return nil, err
		}
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		if resizer != nil {
			wg.Go(func() { resizer.Run(runCtx) })
		}
		ctl.Run(runCtx)
		wg.Wait()
	}()
	return func() { cancel(); <-done }, nil
}

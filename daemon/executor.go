package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/internal/executor"
	"github.com/fusiond/fusiond/daemon/internal/hardware"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/topology"
)

// newExecutor builds the monitor runner and wraps the placer. As root on a
// host with usable cgroups every job gets a cgroup under cfg.CgroupParent
// and guaranteed jobs get exclusive cores, taken from the host's cores as
// the topology model (live, the hardware's unless it is simulated) has
// them; otherwise jobs run without cgroups (and the daemon says so in its
// log).
func newExecutor(ctx context.Context, cfg Config, placer jobs.Placer, live func(context.Context) (*topology.Host, error), log *slog.Logger) (jobs.Placer, *executor.MonitorRunner, *cgroups.Manager, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("locating the fusiond binary for job monitors: %w", err)
	}
	rcfg := executor.MonitorConfig{
		JobsDir:      filepath.Join(cfg.StateDir, "jobs"),
		Executable:   exe,
		CgroupRoot:   cgroups.DefaultRoot,
		CgroupParent: cfg.CgroupParent,
		Grace:        time.Duration(cfg.CancelGrace),
	}
	cg, err := jobCgroups(cfg, log)
	if err != nil {
		log.Warn("jobs run without cgroups: no limits, no device isolation, no accounting", "err", err)
	}
	if cg != nil {
		rcfg.Cgroups = cg
		host, err := live(ctx)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("host cores: %w", err)
		}
		cores := cgroups.CoresOf(host)
		if len(cores) == 0 {
			return nil, nil, nil, fmt.Errorf("host cores: the topology model has no cores")
		}
		ep, err := jobs.NewExclusiveCPUPlacer(placer, cores, 1, cg.SetSharedCPUs, log)
		if err != nil {
			return nil, nil, nil, err
		}
		placer, rcfg.SharedCPUs = ep, ep.SharedCPUs
		log.Info("job cgroups ready", "mode", cg.Mode(), "parent", cfg.CgroupParent, "cores", len(cores))
	}
	return placer, executor.NewMonitorRunner(rcfg, log), cg, nil
}

func jobCgroups(cfg Config, log *slog.Logger) (*cgroups.Manager, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("fusiond is not running as root")
	}
	cg, err := cgroups.NewManager(cgroups.WithParent(cfg.CgroupParent), cgroups.WithLogger(log))
	if err != nil {
		return nil, err
	}
	if err := cg.EnsureHierarchy(); err != nil {
		return nil, err
	}
	return cg, nil
}

// liveTopology is the topology of the machine jobs really run on: the
// hardware's model when it is live, a fresh discovery when the devices are
// simulated (their topology is the simulated host's) or the hardware has
// none.
func liveTopology(h *hardware.Host) func(context.Context) (*topology.Host, error) {
	return func(ctx context.Context) (*topology.Host, error) {
		if t := h.Topology(); t != nil && h.Simulated() == "" {
			return t, nil
		}
		return topology.Discover(ctx)
	}
}

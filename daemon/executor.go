package daemon

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/internal/executor"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
)

// newExecutor builds the monitor runner and wraps the placer. As root on a
// host with usable cgroups every job gets a cgroup under cfg.CgroupParent
// and guaranteed jobs get exclusive cores; otherwise jobs run without
// cgroups (and the daemon says so in its log).
func newExecutor(cfg Config, placer jobs.Placer, log *slog.Logger) (jobs.Placer, *executor.MonitorRunner, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, fmt.Errorf("locating the fusiond binary for job monitors: %w", err)
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
		cores, err := cgroups.HostCores("/sys")
		if err != nil {
			return nil, nil, fmt.Errorf("host cores: %w", err)
		}
		ep, err := jobs.NewExclusiveCPUPlacer(placer, cores, 1, cg.SetSharedCPUs, log)
		if err != nil {
			return nil, nil, err
		}
		placer, rcfg.SharedCPUs = ep, ep.SharedCPUs
		log.Info("job cgroups ready", "mode", cg.Mode(), "parent", cfg.CgroupParent, "cores", len(cores))
	}
	return placer, executor.NewMonitorRunner(rcfg, log), nil
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

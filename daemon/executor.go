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
	"github.com/fusiond/fusiond/topology"
)

// newExecutor builds the monitor runner. With cg (root on a host with
// usable cgroups) every job gets a cgroup under cfg.CgroupParent, and
// burstable and best-effort jobs run on shared, the shared CPU pool the
// placer keeps. Without cgroups (cgErr says why) every job is refused, or
// runs without cgroups when cfg.AllowUnisolatedJobs allows it (and the
// daemon says so in its log and its node status).
// memNodes, when not nil, maps a job's NUMA node onto the nodes its
// cpuset.mems names (hostMemNodes).
func newExecutor(cfg Config, cg *cgroups.Manager, cgErr error, shared func() []int, memNodes func(int) []int, log *slog.Logger) (*executor.MonitorRunner, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("locating the fusiond binary for job monitors: %w", err)
	}
	rcfg := executor.MonitorConfig{
		JobsDir:      filepath.Join(cfg.StateDir, "jobs"),
		Executable:   exe,
		CgroupRoot:   cgroups.DefaultRoot,
		CgroupParent: cfg.CgroupParent,
		Grace:        time.Duration(cfg.CancelGrace),
	}
	switch {
	case cgErr == nil:
	case cfg.AllowUnisolatedJobs:
		rcfg.NoCgroups, rcfg.AllowUnisolated = cgErr.Error(), true
		log.Warn("jobs run without cgroups: no limits, no device isolation, no accounting, no exclusive cores (allow_unisolated_jobs)", "err", cgErr)
	default:
		rcfg.NoCgroups = cgErr.Error()
		log.Error("jobs cannot be isolated, and every job will be refused; set allow_unisolated_jobs: true to run them without limits or device isolation", "err", cgErr)
	}
	if cg != nil {
		rcfg.Cgroups, rcfg.SharedCPUs, rcfg.MemNodes = cg, shared, memNodes
	}
	return executor.NewMonitorRunner(rcfg, log), nil
}

// jobCgroups is the cgroup manager jobs run under, or why there is none
// (the daemon then says so in its log and runs jobs without cgroups).
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

// hostCores returns the cores guaranteed jobs take exclusively: the cores
// of the topology model of the machine jobs really run on. That is the
// hardware's model when it is live (read again on every inventory, so a
// topology refresh reaches the placer), and one discovery of this machine
// when the devices are simulated (their topology is the simulated host's,
// but jobs run on this machine's CPUs) or the hardware has none.
func hostCores(ctx context.Context, h *hardware.Host) (func() []cgroups.Core, error) {
	t := h.Topology()
	live := t != nil && h.Simulated() == ""
	if !live {
		var err error
		if t, err = topology.Discover(ctx); err != nil {
			return nil, fmt.Errorf("host cores: %w", err)
		}
	}
	cores := cgroups.CoresOf(t)
	if len(cores) == 0 {
		return nil, fmt.Errorf("host cores: the topology model has no cores")
	}
	if live {
		return func() []cgroups.Core { return cgroups.CoresOf(h.Topology()) }, nil
	}
	return func() []cgroups.Core { return cores }, nil
}

// hostMemNodes returns where a job aligned to a NUMA node allocates its
// memory: the node itself, or for a memory-less node its nearest memory
// nodes (topology.Host.MemoryNodesFor), from the same model hostCores
// uses (the live hardware's, read again on every call, or one discovery
// of this machine when the devices are simulated).
func hostMemNodes(ctx context.Context, h *hardware.Host) (func(int) []int, error) {
	t := h.Topology()
	live := t != nil && h.Simulated() == ""
	if !live {
		var err error
		if t, err = topology.Discover(ctx); err != nil {
			return nil, fmt.Errorf("host memory nodes: %w", err)
		}
	}
	of := func(t *topology.Host, node int) []int {
		var out []int
		for _, n := range t.MemoryNodesFor(topology.NodeID(node)) {
			out = append(out, int(n))
		}
		return out
	}
	if live {
		return func(node int) []int {
			if cur := h.Topology(); cur != nil {
				return of(cur, node)
			}
			return of(t, node)
		}, nil
	}
	return func(node int) []int { return of(t, node) }, nil
}

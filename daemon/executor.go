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

// jobTopology returns the topology model of the machine jobs really run
// on: the hardware's model when it is live (read again on every call, so
// a topology refresh reaches the placer and the executor), and one
// discovery of this machine when the devices are simulated (their
// topology is the simulated host's, but jobs run on this machine's CPUs
// and memory) or the hardware has none.
func jobTopology(ctx context.Context, h *hardware.Host) (func() *topology.Host, error) {
	if t := h.Topology(); t != nil && h.Simulated() == "" {
		return func() *topology.Host {
			if cur := h.Topology(); cur != nil {
				return cur
			}
			return t
		}, nil
	}
	t, err := topology.Discover(ctx)
	if err != nil {
		return nil, fmt.Errorf("this machine's topology: %w", err)
	}
	return func() *topology.Host { return t }, nil
}

// hostCores returns the cores guaranteed jobs take exclusively: the cores
// of the model of the machine jobs run on (jobTopology).
func hostCores(topo func() *topology.Host) (func() []cgroups.Core, error) {
	if len(cgroups.CoresOf(topo())) == 0 {
		return nil, fmt.Errorf("host cores: the topology model has no cores")
	}
	return func() []cgroups.Core { return cgroups.CoresOf(topo()) }, nil
}

// hostMemNodes returns where a job aligned to a NUMA node allocates its
// memory: the node itself, or for a memory-less node its nearest memory
// nodes (topology.Host.MemoryNodesFor), in the model of the machine jobs
// run on (jobTopology).
func hostMemNodes(topo func() *topology.Host) func(int) []int {
	return func(node int) []int {
		var out []int
		for _, n := range topo().MemoryNodesFor(topology.NodeID(node)) {
			out = append(out, int(n))
		}
		return out
	}
}

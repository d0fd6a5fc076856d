package cgroups

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/containerd/cgroups/v3/cgroup1"
)

// SetTierCPUQuota caps the CPU time of a whole tier (all its jobs
// together), in millicores; zero removes the cap. The QoS loop shrinks and
// restores the best-effort tier with it: one write, whatever the number of
// jobs, and jobs started later are capped too.
func (m *Manager) SetTierCPUQuota(t Tier, milli int64) error {
	if !t.Valid() || milli < 0 {
		return fmt.Errorf("%w: tier %q cpu quota %dm", ErrInvalidPlacement, t, milli)
	}
	if err := m.ensureTier(t); err != nil {
		return err
	}
	if err := m.be.setCPUMax(m.tierRel(t), QuotaFor(milli, DefaultCPUPeriod), DefaultCPUPeriod); err != nil {
		return fmt.Errorf("set cpu quota of tier %s: %w", t, err)
	}
	m.log.Info("tier cpu quota set", "tier", t, "milli", milli)
	return nil
}

// SetTierMemoryHigh sets the memory the tier's jobs together may use before
// the kernel throttles and reclaims them: memory.high on v2, the soft limit
// (memory.soft_limit_in_bytes, reclaimed first under pressure) on v1; zero
// or less removes it.
func (m *Manager) SetTierMemoryHigh(t Tier, bytes int64) error {
	if !t.Valid() {
		return fmt.Errorf("%w: tier %q", ErrInvalidPlacement, t)
	}
	if err := m.ensureTier(t); err != nil {
		return err
	}
	rel := m.tierRel(t)
	var file, val string
	switch m.mode {
	case ModeV2:
		file, val = filepath.Join(m.opts.root, rel, "memory.high"), "max"
	default:
		file, val = filepath.Join(m.opts.root, string(cgroup1.Memory), rel, "memory.soft_limit_in_bytes"), "-1"
	}
	if bytes > 0 {
		val = strconv.FormatInt(bytes, 10)
	}
	if err := os.WriteFile(file, []byte(val), 0o644); err != nil {
		return fmt.Errorf("set memory high of tier %s: %w", t, err)
	}
	m.log.Info("tier memory high set", "tier", t, "bytes", bytes)
	return nil
}

// TierStats reads a tier's accounting (all its jobs together).
func (m *Manager) TierStats(t Tier) (Stats, error) {
	if !t.Valid() {
		return Stats{}, fmt.Errorf("%w: tier %q", ErrInvalidPlacement, t)
	}
	s, err := m.be.stats(m.tierRel(t))
	if err != nil {
		return Stats{}, fmt.Errorf("stats of tier %s: %w", t, err)
	}
	return s, nil
}

// CPUDir is the directory whose tasks the CPU scheduler groups as this
// job: on v2 the job's cgroup, on v1 its directory in the cpu hierarchy.
func (c *Cgroup) CPUDir() string {
	if c.m.mode == ModeV2 {
		return filepath.Join(c.m.opts.root, c.rel)
	}
	return filepath.Join(c.m.opts.root, string(cgroup1.Cpu), c.rel)
}

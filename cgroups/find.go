package cgroups

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"syscall"

	"github.com/containerd/cgroups/v3/cgroup1"
)

// TierCPUDir is the directory whose tasks the CPU scheduler groups as tier
// t (the tier's cgroup; on v1 in the cpu hierarchy), which the latency
// probe keys the tier by.
func (m *Manager) TierCPUDir(t Tier) string {
	return filepath.Join(m.cpuRoot(), m.tierRel(t))
}

// cpuRoot is the root of the hierarchy the cpu controller is on.
func (m *Manager) cpuRoot() string {
	if m.mode == ModeV2 {
		return m.opts.root
	}
	return filepath.Join(m.opts.root, string(cgroup1.Cpu))
}

// maxFindDirs bounds FindCPUCgroup's walk.
const maxFindDirs = 20000

// errFound stops the walk.
var errFound = errors.New("found")

// FindCPUCgroup names the cgroup of the cpu hierarchy whose directory has
// inode number id (the kernfs id the latency probe reports) as a path
// from the hierarchy's root, such as /system.slice/cron.service. It walks
// the hierarchy, at most 20,000 directories; a cgroup not found (gone, or
// beyond the bound) is an error.
func (m *Manager) FindCPUCgroup(id uint64) (string, error) {
	root := m.cpuRoot()
	var found string
	dirs := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == root {
				return err
			}
			return fs.SkipDir // a cgroup removed under the walk
		}
		if !d.IsDir() {
			return nil
		}
		if dirs++; dirs > maxFindDirs {
			return fmt.Errorf("more than %d cgroups under %s", maxFindDirs, root)
		}
		info, err := d.Info()
		if err != nil {
			return fs.SkipDir
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok && st.Ino == id {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			found = "/" + rel
			if rel == "." {
				found = "/"
			}
			return errFound
		}
		return nil
	})
	switch {
	case errors.Is(err, errFound):
		return found, nil
	case err != nil:
		return "", fmt.Errorf("find cgroup %d: %w", id, err)
	}
	return "", fmt.Errorf("find cgroup %d: no such cgroup under %s", id, root)
}

// TierThreads lists the thread ids of every task in tier t's cgroup and
// its descendants (the jobs and what they made), read from the cpu
// hierarchy: cgroup.threads on v2, tasks on v1.
func (m *Manager) TierThreads(t Tier) ([]int, error) {
	if !t.Valid() {
		return nil, fmt.Errorf("%w: tier %q", ErrInvalidPlacement, t)
	}
	file := "tasks"
	if m.mode == ModeV2 {
		file = "cgroup.threads"
	}
	var out []int
	root := m.TierCPUDir(t)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == root && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			return fs.SkipDir // no such tier yet, or removed under the walk
		}
		if !d.IsDir() {
			return nil
		}
		tids, err := readPids(filepath.Join(p, file))
		if err != nil {
			if errors.Is(err, ErrNotFound) {
				return fs.SkipDir // removed under the walk
			}
			return err
		}
		out = append(out, tids...)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("threads of tier %s: %w", t, err)
	}
	return out, nil
}

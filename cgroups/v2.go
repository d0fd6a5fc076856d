package cgroups

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/cgroups/v3/cgroup2"
	"golang.org/x/sys/unix"
)

// v2 drives a unified hierarchy through containerd's cgroup2 package, with
// device access enforced by an eBPF program.
type v2 struct {
	root    string
	filter  DeviceFilter
	timeout time.Duration
}

var _ backend = (*v2)(nil)

func newV2(root string, f DeviceFilter, timeout time.Duration) *v2 {
	return &v2{root: root, filter: f, timeout: timeout}
}

// v2Controllers are enabled down the fusiond subtree.
var v2Controllers = []string{"cpuset", "cpu", "memory", "pids"}

func (b *v2) dir(rel string) string { return filepath.Join(b.root, rel) }

// ensure creates rel and enables fusiond's controllers from the root down
// to rel, so rel's children get them.
func (b *v2) ensure(rel string) error {
	if err := os.MkdirAll(b.dir(rel), 0o755); err != nil {
		return err
	}
	avail, err := os.ReadFile(filepath.Join(b.root, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("read root controllers: %w", err)
	}
	have := strings.Fields(string(avail))
	var enable []string
	for _, c := range v2Controllers {
		if !containsStr(have, c) {
			return fmt.Errorf("%w: controller %s not available (have %v)", ErrNoCgroups, c, have)
		}
		enable = append(enable, "+"+c)
	}
	dirs := []string{""}
	parts := strings.Split(rel, "/")
	for i := range parts {
		dirs = append(dirs, path.Join(parts[:i+1]...))
	}
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(b.dir(d), "cgroup.subtree_control"), []byte(strings.Join(enable, " ")), 0o644); err != nil {
			return fmt.Errorf("enable controllers in %q: %w", d, err)
		}
	}
	return nil
}

func containsStr(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// v2Resources converts limits to containerd's cgroup2 resources. Devices
// are left out: they are handled by the DeviceFilter.
func v2Resources(l Limits) *cgroup2.Resources {
	orNil := func(n int64) *int64 {
		if n <= 0 {
			return nil // written as "max" by apply: the kernel rejects -1
		}
		return &n
	}
	weight := min(max(l.CPUWeight, MinWeight), MaxWeight)
	return &cgroup2.Resources{
		CPU: &cgroup2.CPU{
			Weight: &weight,
			Max:    cpuMax(l.CPUQuota, l.CPUPeriod),
			Cpus:   l.Cpus,
			Mems:   l.Mems,
		},
		Memory: &cgroup2.Memory{
			Low:  ptr(max(l.MemoryLow, 0)),
			High: orNil(l.MemoryHigh),
			Max:  orNil(l.MemoryMax),
		},
		Pids: &cgroup2.Pids{Max: l.PidsMax},
	}
}

func ptr[T any](v T) *T { return &v }

func cpuMax(quota int64, period uint64) cgroup2.CPUMax {
	if period == 0 {
		period = DefaultCPUPeriod
	}
	if quota <= 0 {
		return cgroup2.NewCPUMax(nil, &period)
	}
	return cgroup2.NewCPUMax(&quota, &period)
}

func (b *v2) apply(rel string, l Limits) error {
	if _, err := cgroup2.NewManager(b.root, "/"+rel, v2Resources(l)); err != nil {
		return err
	}
	for file, n := range map[string]int64{"memory.high": l.MemoryHigh, "memory.max": l.MemoryMax} {
		if n <= 0 {
			if err := os.WriteFile(filepath.Join(b.dir(rel), file), []byte("max"), 0o644); err != nil {
				return err
			}
		}
	}
	if len(l.Devices) > 0 {
		if err := b.filter.Attach(b.dir(rel), l.Devices); err != nil {
			return fmt.Errorf("device filter: %w", err)
		}
	}
	return nil
}

func (b *v2) setWeight(rel string, w uint64) error {
	w = min(max(w, MinWeight), MaxWeight)
	return os.WriteFile(filepath.Join(b.dir(rel), "cpu.weight"), []byte(strconv.FormatUint(w, 10)), 0o644)
}

func (b *v2) setCpus(rel, cpus string) error {
	return os.WriteFile(filepath.Join(b.dir(rel), "cpuset.cpus"), []byte(cpus), 0o644)
}

// cpus returns the cpuset in force: cpuset.cpus.effective where the kernel
// provides it (an empty cpuset.cpus inherits the parent's).
func (b *v2) cpus(rel string) (string, error) {
	for _, f := range []string{"cpuset.cpus.effective", "cpuset.cpus"} {
		s, err := os.ReadFile(filepath.Join(b.dir(rel), f))
		if err == nil && len(trimNL(s)) > 0 {
			return string(trimNL(s)), nil
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
	}
	return "", nil
}

func (b *v2) setCPUMax(rel string, quota int64, period uint64) error {
	return os.WriteFile(filepath.Join(b.dir(rel), "cpu.max"), []byte(cpuMax(quota, period)), 0o644)
}

func (b *v2) exists(rel string) bool {
	st, err := os.Stat(b.dir(rel))
	return err == nil && st.IsDir()
}

func (b *v2) addProc(rel string, pid int) error {
	m, err := cgroup2.Load("/"+rel, cgroup2.WithMountpoint(b.root))
	if err != nil {
		return err
	}
	return m.AddProc(uint64(pid))
}

func (b *v2) procs(rel string) ([]int, error) {
	return readPids(filepath.Join(b.dir(rel), "cgroup.procs"))
}

// kill writes cgroup.kill (Linux 5.14+); on older kernels it freezes the
// cgroup, SIGKILLs its processes and thaws it.
func (b *v2) kill(rel string) error {
	err := os.WriteFile(filepath.Join(b.dir(rel), "cgroup.kill"), []byte("1"), 0o644)
	if err == nil {
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, fs.ErrPermission) {
		return err
	}
	freeze := filepath.Join(b.dir(rel), "cgroup.freeze")
	if err := os.WriteFile(freeze, []byte("1"), 0o644); err != nil {
		return fmt.Errorf("freeze: %w", err)
	}
	pids, perr := b.procs(rel)
	var errs []error
	for _, pid := range pids {
		if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("kill %d: %w", pid, err))
		}
	}
	if err := os.WriteFile(freeze, []byte("0"), 0o644); err != nil {
		errs = append(errs, fmt.Errorf("thaw: %w", err))
	}
	return errors.Join(append(errs, perr)...)
}

func (b *v2) stats(rel string) (Stats, error) {
	var s Stats
	d := b.dir(rel)
	cpu, err := readKV(filepath.Join(d, "cpu.stat"))
	if err != nil {
		return s, err
	}
	s.CPUUsage = time.Duration(cpu["usage_usec"]) * time.Microsecond
	s.CPUUser = time.Duration(cpu["user_usec"]) * time.Microsecond
	s.CPUSystem = time.Duration(cpu["system_usec"]) * time.Microsecond
	s.NrThrottled = cpu["nr_throttled"]
	s.ThrottledTime = time.Duration(cpu["throttled_usec"]) * time.Microsecond
	if s.MemoryCurrent, err = readUint(filepath.Join(d, "memory.current")); err != nil {
		return s, err
	}
	// memory.peak exists since Linux 5.19.
	if s.MemoryPeak, err = readUint(filepath.Join(d, "memory.peak")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return s, err
	}
	ev, err := readKV(filepath.Join(d, "memory.events"))
	if err != nil {
		return s, err
	}
	s.OOMKills = ev["oom_kill"]
	var psi PSI
	for _, p := range []struct {
		file string
		dst  *Pressure
	}{{"cpu.pressure", &psi.CPU}, {"memory.pressure", &psi.Memory}, {"io.pressure", &psi.IO}} {
		pr, err := readPressure(filepath.Join(d, p.file))
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.EOPNOTSUPP) {
			continue // kernel without PSI, or psi=0
		}
		if err != nil {
			return s, err
		}
		*p.dst = pr
		s.PSI = &psi
	}
	return s, nil
}

func (b *v2) remove(rel string) error {
	err := unix.Rmdir(b.dir(rel))
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}

func (b *v2) children(rel string) ([]string, error) { return subdirs(b.dir(rel)) }

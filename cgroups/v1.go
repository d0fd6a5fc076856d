package cgroups

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/fusiond/fusiond/cgroups/devicefilter"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// v1 drives the per-controller hierarchies of a legacy or hybrid host
// through containerd's cgroup1 package.
type v1 struct {
	root    string
	timeout time.Duration
}

var _ backend = (*v1)(nil)

func newV1(root string, timeout time.Duration) *v1 { return &v1{root: root, timeout: timeout} }

// v1Controllers are the hierarchies every job cgroup is created in.
var v1Controllers = []cgroup1.Name{cgroup1.Cpu, cgroup1.Cpuacct, cgroup1.Cpuset, cgroup1.Memory, cgroup1.Pids, cgroup1.Devices, cgroup1.Freezer}

func (b *v1) hierarchy() ([]cgroup1.Subsystem, error) {
	return []cgroup1.Subsystem{
		cgroup1.NewCpu(b.root),
		cgroup1.NewCpuacct(b.root),
		cgroup1.NewCpuset(b.root),
		cgroup1.NewMemory(b.root),
		cgroup1.NewPids(b.root),
		cgroup1.NewDevices(b.root),
		cgroup1.NewFreezer(b.root),
	}, nil
}

func (b *v1) file(ctrl cgroup1.Name, rel, name string) string {
	return filepath.Join(b.root, string(ctrl), rel, name)
}

func (b *v1) ensure(rel string) error {
	_, err := cgroup1.New(cgroup1.StaticPath("/"+rel), &specs.LinuxResources{}, cgroup1.WithHierarchy(b.hierarchy))
	return err
}

func (b *v1) load(rel string) (cgroup1.Cgroup, error) {
	cg, err := cgroup1.Load(cgroup1.StaticPath("/"+rel), cgroup1.WithHierarchy(b.hierarchy))
	if err != nil {
		if errors.Is(err, cgroup1.ErrCgroupDeleted) {
			return nil, fmt.Errorf("%w: %s: %w", ErrNotFound, rel, err)
		}
		return nil, err
	}
	return cg, nil
}

// v1Resources converts limits to the OCI resources containerd writes.
func v1Resources(l Limits) *specs.LinuxResources {
	unlimited := func(n int64) *int64 {
		if n <= 0 {
			n = -1
		}
		return &n
	}
	shares := SharesFromWeight(l.CPUWeight)
	period := l.CPUPeriod
	if period == 0 {
		period = DefaultCPUPeriod
	}
	deny := specs.LinuxDeviceCgroup{Allow: false, Type: "a", Access: "rwm"}
	devs := []specs.LinuxDeviceCgroup{deny}
	for _, r := range l.Devices {
		major, minor := r.Major, r.Minor
		devs = append(devs, specs.LinuxDeviceCgroup{Allow: true, Type: string(r.Type), Major: &major, Minor: &minor, Access: r.Access})
	}
	return &specs.LinuxResources{
		CPU: &specs.LinuxCPU{
			Shares: &shares,
			Quota:  unlimited(l.CPUQuota),
			Period: &period,
			Cpus:   l.Cpus,
			Mems:   l.Mems,
		},
		Memory: &specs.LinuxMemory{
			Limit:       unlimited(l.MemoryMax),
			Reservation: unlimited(l.MemoryHigh),
		},
		Pids:    &specs.LinuxPids{Limit: &l.PidsMax},
		Devices: devs,
	}
}

func (b *v1) apply(rel string, l Limits) error {
	l.CPUQuota = b.underParent(rel, l.CPUQuota, l.CPUPeriod)
	res := v1Resources(l)
	if b.devicesMatch(rel, l.Devices) {
		// Rewriting the rules starts with deny-all: skip it when nothing
		// changed, so re-applying never narrows a running job's access.
		res.Devices = nil
	}
	_, err := cgroup1.New(cgroup1.StaticPath("/"+rel), res, cgroup1.WithHierarchy(b.hierarchy))
	return err
}

// devicesMatch reports whether devices.list of rel already allows exactly
// rules.
func (b *v1) devicesMatch(rel string, rules []devicefilter.Rule) bool {
	cur, err := os.ReadFile(b.file(cgroup1.Devices, rel, "devices.list"))
	if err != nil {
		return false
	}
	have := map[string]bool{}
	for line := range strings.Lines(string(cur)) {
		if line = strings.TrimSpace(line); line != "" {
			have[line] = true
		}
	}
	want := map[string]bool{}
	for _, r := range rules {
		want[r.String()] = true
	}
	return maps.Equal(have, want)
}

func (b *v1) setWeight(rel string, w uint64) error {
	return os.WriteFile(b.file(cgroup1.Cpu, rel, "cpu.shares"), []byte(strconv.FormatUint(SharesFromWeight(w), 10)), 0)
}

func (b *v1) setCpus(rel, cpus string) error {
	return os.WriteFile(b.file(cgroup1.Cpuset, rel, "cpuset.cpus"), []byte(cpus), 0)
}

func (b *v1) cpus(rel string) (string, error) {
	s, err := os.ReadFile(b.file(cgroup1.Cpuset, rel, "cpuset.cpus"))
	return string(trimNL(s)), err
}

func (b *v1) setCPUMax(rel string, quota int64, period uint64) error {
	if quota <= 0 {
		quota = -1
	}
	quota = b.underParent(rel, quota, period)
	if quota > 0 {
		if err := b.childrenUnder(rel, quota, period); err != nil {
			return err
		}
	}
	if err := os.WriteFile(b.file(cgroup1.Cpu, rel, "cpu.cfs_period_us"), []byte(strconv.FormatUint(period, 10)), 0); err != nil {
		return err
	}
	file := b.file(cgroup1.Cpu, rel, "cpu.cfs_quota_us")
	err := os.WriteFile(file, []byte(strconv.FormatInt(quota, 10)), 0)
	if errors.Is(err, unix.EINVAL) && quota > 0 {
		// A job's quota written since (one just started): bring it
		// under too and write again, once.
		if cerr := b.childrenUnder(rel, quota, period); cerr != nil {
			return errors.Join(err, cerr)
		}
		if err = os.WriteFile(file, []byte(strconv.FormatInt(quota, 10)), 0); err != nil {
			err = fmt.Errorf("%w (writing %d/%d; children's quotas: %s)", err, quota, period, b.childQuotas(rel))
		}
	}
	return err
}

// childQuotas lists rel's children's CFS quotas, to say why a write was
// refused.
func (b *v1) childQuotas(rel string) string {
	ents, _ := os.ReadDir(b.file(cgroup1.Cpu, rel, ""))
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, fmt.Sprintf("%s %d/%d", e.Name(), b.cpuInt(filepath.Join(rel, e.Name()), "cpu.cfs_quota_us"), b.cpuInt(filepath.Join(rel, e.Name()), "cpu.cfs_period_us")))
		}
	}
	return strings.Join(out, ", ")
}

// underParent is quota (µs per period; 0 or less: none) at most what
// the parent cgroup's CFS quota allows: v1 refuses a larger one (EINVAL)
// — as under the best-effort tier while the QoS or reclaim loop throttles
// it — and holds the cgroup to its parent's anyway.
func (b *v1) underParent(rel string, quota int64, period uint64) int64 {
	if quota <= 0 {
		return quota // none: the parent's holds
	}
	if period == 0 {
		period = DefaultCPUPeriod
	}
	parent := filepath.Dir(rel)
	pq, pp := b.cpuInt(parent, "cpu.cfs_quota_us"), b.cpuInt(parent, "cpu.cfs_period_us")
	if pq <= 0 || pp <= 0 {
		return quota
	}
	return min(quota, pq*int64(period)/pp)
}

// childrenUnder lowers the CFS quota of every child cgroup of rel that is
// over quota (µs per period) to it: v1 also refuses a cgroup's quota
// under one of its children's, so a tier can be throttled whatever its
// jobs were lent.
func (b *v1) childrenUnder(rel string, quota int64, period uint64) error {
	ents, err := os.ReadDir(b.file(cgroup1.Cpu, rel, ""))
	if err != nil {
		return nil // the write that follows says why
	}
	var errs []error
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		child := filepath.Join(rel, e.Name())
		cq, cp := b.cpuInt(child, "cpu.cfs_quota_us"), b.cpuInt(child, "cpu.cfs_period_us")
		if cp <= 0 || cq <= quota*cp/int64(period) {
			continue // unlimited (-1) takes the parent's
		}
		if err := b.setCPUMax(child, quota*cp/int64(period), uint64(cp)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cpuInt reads an integer file of rel's cpu controller (0 when it cannot).
func (b *v1) cpuInt(rel, name string) int64 {
	v, err := os.ReadFile(b.file(cgroup1.Cpu, rel, name))
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(v)), 10, 64)
	return n
}

func (b *v1) exists(rel string) bool {
	_, err := os.Stat(b.file(cgroup1.Memory, rel, ""))
	return err == nil
}

func (b *v1) addProc(rel string, pid int) error {
	cg, err := b.load(rel)
	if err != nil {
		return err
	}
	return cg.AddProc(uint64(pid), v1Controllers...)
}

func (b *v1) procs(rel string) ([]int, error) {
	return readPids(b.file(cgroup1.Freezer, rel, "cgroup.procs"))
}

// kill freezes the cgroup so nothing can fork, SIGKILLs every process and
// thaws it so the signals are delivered.
func (b *v1) kill(rel string) error {
	cg, err := b.load(rel)
	if err != nil {
		return err
	}
	if err := cg.Freeze(); err != nil {
		return fmt.Errorf("freeze: %w", err)
	}
	pids, perr := b.procs(rel)
	var errs []error
	for _, pid := range pids {
		if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("kill %d: %w", pid, err))
		}
	}
	if err := cg.Thaw(); err != nil {
		errs = append(errs, fmt.Errorf("thaw: %w", err))
	}
	return errors.Join(append(errs, perr)...)
}

func (b *v1) stats(rel string) (Stats, error) {
	var s Stats
	usage, err := readUint(b.file(cgroup1.Cpuacct, rel, "cpuacct.usage"))
	if err != nil {
		return s, err
	}
	s.CPUUsage = time.Duration(usage)
	if kv, err := readKV(b.file(cgroup1.Cpuacct, rel, "cpuacct.stat")); err == nil {
		// USER_HZ is 100 on every Linux architecture's user ABI.
		s.CPUUser = time.Duration(kv["user"]) * 10 * time.Millisecond
		s.CPUSystem = time.Duration(kv["system"]) * 10 * time.Millisecond
	}
	cpu, err := readKV(b.file(cgroup1.Cpu, rel, "cpu.stat"))
	if err != nil {
		return s, err
	}
	s.NrThrottled = cpu["nr_throttled"]
	s.ThrottledTime = time.Duration(cpu["throttled_time"])
	if s.MemoryCurrent, err = readUint(b.file(cgroup1.Memory, rel, "memory.usage_in_bytes")); err != nil {
		return s, err
	}
	if s.MemoryPeak, err = readUint(b.file(cgroup1.Memory, rel, "memory.max_usage_in_bytes")); err != nil {
		return s, err
	}
	oom, err := readKV(b.file(cgroup1.Memory, rel, "memory.oom_control"))
	if err != nil {
		return s, err
	}
	s.OOMKills = oom["oom_kill"]
	return s, nil
}

func (b *v1) remove(rel string) error {
	var errs []error
	for _, c := range v1Controllers {
		if err := os.Remove(b.file(c, rel, "")); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (b *v1) children(rel string) ([]string, error) {
	return subdirs(b.file(cgroup1.Memory, rel, ""))
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}

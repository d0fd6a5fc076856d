//go:build cgo

package container

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	occgroups "github.com/opencontainers/cgroups"
	_ "github.com/opencontainers/cgroups/devices" // device rules for libcontainer's cgroup manager
	devconfig "github.com/opencontainers/cgroups/devices/config"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	_ "github.com/opencontainers/runc/libcontainer/nsenter" // runs before the Go runtime in "init"
	"github.com/opencontainers/runc/libcontainer/specconv"
	"golang.org/x/sys/unix"

	"github.com/fusiond/fusiond/cgroups/devicefilter"
	"github.com/fusiond/fusiond/daemon/internal/executor"
	"github.com/fusiond/fusiond/devices"
)

// InitArg is the argument libcontainer re-executes the binary with.
const InitArg = "init"

// Init becomes libcontainer's container init (and never returns) when args
// (os.Args) ask for it.
func Init(args []string) {
	if len(args) > 1 && args[1] == InitArg {
		libcontainer.Init()
	}
}

// Runtime is the libcontainer ContainerRuntime.
type Runtime struct{}

var _ executor.ContainerRuntime = Runtime{}

// Start creates and starts the container of req.
func (Runtime) Start(req executor.ContainerRequest) (executor.JobProcess, error) {
	cfg, err := Config(req)
	if err != nil {
		return nil, err
	}
	// pivot_root(2) does not work when the host itself runs from an
	// initramfs (ramfs/tmpfs root): there, as runc --no-pivot does, the
	// container is entered with MS_MOVE and chroot.
	cfg.NoPivotRoot = rootOnRAMDisk()
	if err := os.MkdirAll(req.StateDir, 0o700); err != nil {
		return nil, err
	}
	c, err := libcontainer.Create(req.StateDir, "job-"+req.Spec.JobID, cfg)
	if err != nil {
		return nil, fmt.Errorf("create container: %w", err)
	}
	groups := make([]int, len(req.Spec.Groups))
	for i, g := range req.Spec.Groups {
		groups[i] = int(g)
	}
	p := &libcontainer.Process{
		Args: req.Spec.Args, Env: req.Spec.Env, Cwd: req.Spec.Dir,
		UID: int(req.Spec.UID), GID: int(req.Spec.GID), AdditionalGroups: groups,
		Stdout: req.Output, Stderr: req.Output,
		Init: true,
	}
	// Created, then checked, then run: the init waits on its exec fifo
	// with its root in place, and runs the job's command only once that
	// root is known to be the directory the job's user opened.
	if err := c.Start(p); err != nil {
		_ = c.Destroy()
		return nil, fmt.Errorf("run container: %w", err)
	}
	pid, err := p.Pid()
	if err != nil {
		_ = c.Destroy()
		return nil, err
	}
	if err := sameRoot(req.Root, pid); err != nil {
		_ = p.Signal(unix.SIGKILL)
		_, _ = p.Wait()
		_ = c.Destroy()
		return nil, fmt.Errorf("rootfs %s: %w", req.Spec.Rootfs, err)
	}
	if err := c.Exec(); err != nil {
		_ = c.Destroy()
		return nil, fmt.Errorf("run container: %w", err)
	}
	return &process{c: c, p: p, pid: pid}, nil
}

// sameRoot checks that the container's init (pid) has root as its root
// directory: a path swapped (a component renamed, a symlink planted)
// between the user's check and the runtime's mount is refused.
func sameRoot(root *os.File, pid int) error {
	if root == nil {
		return errors.New("not opened as the job's user")
	}
	var want, got unix.Stat_t
	if err := unix.Fstat(int(root.Fd()), &want); err != nil {
		return err
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/root/", pid), &got); err != nil {
		return fmt.Errorf("the container's root: %w", err)
	}
	if want.Dev != got.Dev || want.Ino != got.Ino {
		return errors.New("the directory changed while the container started")
	}
	return nil
}

// rootOnRAMDisk reports whether / is a ramfs or tmpfs (an initramfs).
func rootOnRAMDisk() bool {
	var st unix.Statfs_t
	if err := unix.Statfs("/", &st); err != nil {
		return false
	}
	return st.Type == unix.RAMFS_MAGIC || st.Type == unix.TMPFS_MAGIC
}

type process struct {
	c   *libcontainer.Container
	p   *libcontainer.Process
	pid int
}

func (p *process) Pid() int { return p.pid }

func (p *process) Wait() (syscall.WaitStatus, error) {
	st, err := p.p.Wait()
	if st != nil {
		if ws, ok := st.Sys().(syscall.WaitStatus); ok {
			return ws, nil
		}
	}
	if err == nil {
		err = errors.New("no wait status")
	}
	return 0, err
}

// Close destroys the container (its state; its cgroup is the monitor's).
func (p *process) Close() error { return p.c.Destroy() }

// defaultCaps is the capability set of a container job run as root (the
// set runc and Docker give by default); a non-root job has none.
var defaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
	"CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// Config is the libcontainer configuration of a container job. It is pure.
func Config(req executor.ContainerRequest) (*configs.Config, error) {
	s := req.Spec
	if !filepath.IsAbs(s.Rootfs) {
		return nil, fmt.Errorf("rootfs %q is not an absolute path", s.Rootfs)
	}
	rootfs := s.Rootfs
	if req.RootPath != "" {
		rootfs = req.RootPath
	}
	if req.CgroupPath == "" {
		return nil, errors.New("container job without a cgroup")
	}
	rules := make([]*devconfig.Rule, 0, len(req.Limits.Devices))
	for _, r := range req.Limits.Devices {
		rules = append(rules, rule(r))
	}
	var nodes []*devconfig.Device
	for _, d := range specconv.AllowedDevices {
		if d.Path != "" {
			nodes = append(nodes, d)
		}
	}
	for _, n := range s.Devices {
		nodes = append(nodes, node(n))
	}
	const mountFlags = unix.MS_NOEXEC | unix.MS_NOSUID | unix.MS_NODEV
	caps := &configs.Capabilities{}
	if s.UID == 0 {
		caps = &configs.Capabilities{Bounding: defaultCaps, Effective: defaultCaps, Permitted: defaultCaps}
	}
	rlimits := make([]configs.Rlimit, len(s.Rlimits))
	for i, r := range s.Rlimits {
		rlimits[i] = configs.Rlimit{Type: r.Resource, Soft: r.Soft, Hard: r.Hard}
	}
	return &configs.Config{
		Rootfs:       rootfs,
		Capabilities: caps,
		Namespaces: configs.Namespaces{
			{Type: configs.NEWNS}, {Type: configs.NEWUTS}, {Type: configs.NEWIPC},
			{Type: configs.NEWPID}, {Type: configs.NEWCGROUP},
		},
		Cgroups: &occgroups.Cgroup{
			Path: "/" + req.CgroupPath,
			// The monitor applied the limits; libcontainer re-states
			// only the device rules, which it will not start without.
			Resources: &occgroups.Resources{Devices: rules},
		},
		Devices:  nodes,
		Hostname: "job-" + s.JobID,
		Mounts: []*configs.Mount{
			{Source: "proc", Destination: "/proc", Device: "proc", Flags: mountFlags},
			{Source: "tmpfs", Destination: "/dev", Device: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_STRICTATIME, Data: "mode=755,size=65536k"},
			{Source: "devpts", Destination: "/dev/pts", Device: "devpts", Flags: unix.MS_NOSUID | unix.MS_NOEXEC, Data: "newinstance,ptmxmode=0666,mode=0620"},
			{Source: "shm", Destination: "/dev/shm", Device: "tmpfs", Flags: mountFlags, Data: "mode=1777,size=65536k"},
			{Source: "sysfs", Destination: "/sys", Device: "sysfs", Flags: mountFlags | unix.MS_RDONLY},
			{Source: "cgroup", Destination: "/sys/fs/cgroup", Device: "cgroup", Flags: mountFlags | unix.MS_RDONLY | unix.MS_RELATIME},
		},
		MaskPaths:       []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"},
		ReadonlyPaths:   []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		NoNewPrivileges: true,
		Rlimits:         rlimits,
	}, nil
}

func rule(r devicefilter.Rule) *devconfig.Rule {
	return &devconfig.Rule{
		Type: devconfig.Type(r.Type), Major: r.Major, Minor: r.Minor,
		Permissions: devconfig.Permissions(r.Access), Allow: true,
	}
}

func node(n devices.DeviceNode) *devconfig.Device {
	access := n.Access
	if access == "" {
		access = "rw"
	}
	return &devconfig.Device{
		Path: n.Path, FileMode: 0o666,
		Rule: devconfig.Rule{
			Type: devconfig.Type(n.Type), Major: int64(n.Major), Minor: int64(n.Minor),
			Permissions: devconfig.Permissions(access), Allow: true,
		},
	}
}

//go:build cgo

package container

// Real-kernel test (root, fails without it): a container job built from a
// busybox-static root filesystem sees its limits from inside and runs as
// the submitting uid.

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	osexec "os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/opencontainers/runc/libcontainer/configs"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/cgroups/devicefilter"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/executor"
	"github.com/fusiond/fusiond/daemon/internal/executor/exectest"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/devices"
	"github.com/fusiond/fusiond/topology"
)

// The test binary is fusiond here: container init, monitor and job modes.
func TestMain(m *testing.M) {
	Init(os.Args)
	if code, ok := executor.DispatchWith(os.Args, Runtime{}); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// busyboxRootfs builds a root filesystem of busybox-static with relative
// symlinks for its applets.
func busyboxRootfs(t *testing.T) string {
	t.Helper()
	bb, err := osexec.LookPath("busybox")
	if err != nil {
		t.Fatal("busybox missing (apt-get install -y busybox-static)")
	}
	if out, err := osexec.Command("ldd", bb).CombinedOutput(); err == nil {
		t.Fatalf("%s is dynamically linked (apt-get install -y busybox-static): %s", bb, out)
	}
	// A directory of our own that the job's uid can traverse; never widen
	// (or narrow) the permissions of directories we did not create, such
	// as /tmp itself.
	dir, err := os.MkdirTemp("", "fusiond-rootfs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "rootfs")
	if err := BuildBusyboxRootfs(root, bb); err != nil {
		t.Fatal(err)
	}
	return root
}

func TestKernelContainerSeesLimits(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("container tests need root")
	}
	rootfs := busyboxRootfs(t)
	parent := fmt.Sprintf("fusiond-ctrtest-%d", os.Getpid())
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cg, err := cgroups.NewManager(cgroups.WithParent(parent), cgroups.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	dir := t.TempDir()
	// Registered after TempDir so that it runs before the directory goes:
	// a failing test's monitors and job processes are killed first.
	t.Cleanup(func() {
		if err := exectest.Cleanup(cgroups.DefaultRoot, parent, dir, 10*time.Second); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	host, err := topology.Discover(context.Background())
	cores := cgroups.CoresOf(host)
	if err != nil {
		t.Fatal(err)
	}
	r := executor.NewMonitorRunner(executor.MonitorConfig{
		JobsDir: dir, Executable: exe, Cgroups: cg, CgroupParent: parent, CgroupRoot: cgroups.DefaultRoot,
		Grace: 2 * time.Second,
	}, log)
	logPath := filepath.Join(dir, "output.log")
	const limit = 48 << 20
	script := `id -u; id -g; nproc; cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes; echo pid $$`
	req := jobs.RunRequest{
		JobID: "ctr", Attempt: 1, Command: []string{"sh", "-c", script},
		Env: []string{"PATH=/bin"}, Workdir: "/", UID: 65534, GID: 65534,
		LogPath: logPath, Tier: api.TierGuaranteed, Rootfs: rootfs,
		Allocation: api.Allocation{CPU: 1000, Memory: limit, CPUSet: cgroups.FormatCPUList(cores[len(cores)-1].CPUs), NUMANode: -1},
	}
	p, err := r.Start(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	e, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	out, _ := os.ReadFile(logPath)
	if e.Code != 0 {
		t.Fatalf("container job exit %+v: %s", e, out)
	}
	want := fmt.Sprintf("65534\n65534\n%d\n%d\npid 1\n", len(cores[len(cores)-1].CPUs), limit)
	if string(out) != want {
		t.Errorf("container job saw\n%s\nwant\n%s", out, want)
	}
	if _, err := cg.Load("ctr"); err == nil {
		t.Error("container job's cgroup left behind")
	}
}

func TestConfig(t *testing.T) {
	req := executor.ContainerRequest{
		Spec: executor.Spec{JobID: "7", Rootfs: "/srv/root", UID: 1000, GID: 1000,
			Devices: []devices.DeviceNode{{Path: "/dev/nvidia0", Type: devices.CharDevice, Major: 195, Minor: 0}}},
		CgroupPath: "fusiond/burstable/7",
		Limits:     cgroups.Limits{Devices: append(cgroups.DefaultDevices(), devicefilter.Rule{Type: 'c', Major: 195, Minor: 0, Access: "rw"})},
	}
	cfg, err := Config(req)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Cgroups.Path != "/fusiond/burstable/7" || len(cfg.Cgroups.Resources.Devices) != len(req.Limits.Devices) {
		t.Errorf("cgroup %q with %d device rules", cfg.Cgroups.Path, len(cfg.Cgroups.Resources.Devices))
	}
	if len(cfg.Capabilities.Bounding) != 0 || !cfg.NoNewPrivileges {
		t.Errorf("a non-root job gets capabilities %v, no_new_privs %v", cfg.Capabilities.Bounding, cfg.NoNewPrivileges)
	}
	found := false
	for _, d := range cfg.Devices {
		found = found || (d.Path == "/dev/nvidia0" && d.Major == 195 && string(d.Permissions) == "rw")
	}
	if !found {
		t.Error("granted device node missing from the container's /dev")
	}
	for _, ns := range []configs.NamespaceType{configs.NEWNS, configs.NEWPID, configs.NEWCGROUP} {
		if !cfg.Namespaces.Contains(ns) {
			t.Errorf("namespace %s missing", ns)
		}
	}
	req.Spec.Rootfs = "relative"
	if _, err := Config(req); err == nil {
		t.Error("relative rootfs accepted")
	}
	req.Spec.Rootfs, req.CgroupPath = "/srv/root", ""
	if _, err := Config(req); err == nil {
		t.Error("container without a cgroup accepted")
	}
}

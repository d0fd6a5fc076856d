//go:build cgo

package container

// Real-kernel tests (root, fail without it) of a container job's root
// filesystem resolved with the job user's credentials: two unprivileged
// users, A owning a private root filesystem and B trying to use it.

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/executor"
	"github.com/fusiond/fusiond/daemon/internal/executor/exectest"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
)

type ctrRunner struct {
	*executor.MonitorRunner
	dir string
}

func newCtrRunner(t *testing.T) *ctrRunner {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("container tests need root")
	}
	parent := "fusiond-ctrcaller-" + strings.ToLower(t.Name())
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cg, err := cgroups.NewManager(cgroups.WithParent(parent), cgroups.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	dir := t.TempDir()
	t.Cleanup(func() {
		if err := exectest.Cleanup(cgroups.DefaultRoot, parent, dir, 10*time.Second); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	r := executor.NewMonitorRunner(executor.MonitorConfig{
		JobsDir: dir, Executable: exe, Cgroups: cg, CgroupParent: parent, CgroupRoot: cgroups.DefaultRoot,
		Grace: 2 * time.Second,
	}, log)
	return &ctrRunner{MonitorRunner: r, dir: dir}
}

// run starts a container job as u over rootfs; it returns the start error
// or, once the job ended, its output.
func (r *ctrRunner) run(t *testing.T, id string, u exectest.User, rootfs, workdir string, command ...string) (string, error) {
	t.Helper()
	logPath := filepath.Join(r.dir, id+".log")
	req := jobs.RunRequest{
		JobID: id, Attempt: 1, Command: command,
		Env: []string{"PATH=/bin"}, Workdir: workdir, UID: u.UID, GID: u.GID,
		LogPath: logPath, Tier: api.TierBurstable, Rootfs: rootfs,
		Allocation: api.Allocation{CPU: 500, Memory: 64 << 20, NUMANode: -1},
	}
	p, err := r.Start(context.Background(), req)
	out, _ := os.ReadFile(logPath)
	if err != nil {
		return string(out), err
	}
	e, err := p.Wait()
	out, _ = os.ReadFile(logPath)
	if err != nil || e.Code != 0 {
		t.Fatalf("job %s: exit %+v, %v: %s", id, e, err, out)
	}
	return string(out), nil
}

// TestKernelRootfsOpenedAsCaller: A's root filesystem under A's 0700 home
// runs A's job, and B's job over it is refused with the reason, its file
// never read.
func TestKernelRootfsOpenedAsCaller(t *testing.T) {
	// The users first: their removal then runs after the runner's
	// cleanup has ended what the test left running.
	a, b := exectest.NeedUser(t, "fusiond-ta"), exectest.NeedUser(t, "fusiond-tb")
	r := newCtrRunner(t)
	base, err := os.MkdirTemp("", "fusiond-homes-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(base, "a")
	rootfs := filepath.Join(home, "rootfs")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	bb := busyboxRootfs(t)
	if err := os.Rename(bb, rootfs); err != nil {
		t.Fatal(err)
	}
	const secret = "A's private weights"
	if err := os.MkdirAll(filepath.Join(rootfs, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "data", "weights"), []byte(secret), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, int(a.UID), int(a.GID)); err != nil {
		t.Fatal(err)
	}
	out, err := r.run(t, "theirs", b, rootfs, "/", "cat", "/data/weights")
	if err == nil {
		t.Fatalf("B's job over A's private rootfs ran: %q", out)
	}
	if !strings.Contains(err.Error(), "rootfs "+rootfs) || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("refusal does not say why: %v", err)
	}
	if strings.Contains(out, secret) {
		t.Errorf("B's job printed A's file: %q", out)
	}
	// A, who can open it, runs over it.
	if out, err := r.run(t, "mine", a, rootfs, "/", "cat", "/data/weights"); err != nil || out != secret {
		t.Errorf("A's job over A's rootfs: %q, %v", out, err)
	}
}

// TestKernelRootfsNothingCreated: root creates nothing inside a root
// filesystem a user names: not the working directory, not the mount points.
func TestKernelRootfsNothingCreated(t *testing.T) {
	b := exectest.NeedUser(t, "fusiond-tb") // before the runner: removed after its cleanup
	r := newCtrRunner(t)
	// A stand-in for /etc: root's, 0700.
	etc := t.TempDir()
	if err := os.WriteFile(filepath.Join(etc, "passwd"), []byte("root:x:0:0::/root:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	entries := func(dir string) []string {
		es, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range es {
			names = append(names, e.Name())
		}
		return names
	}
	_, err := r.run(t, "etc", b, etc, "/nologin", "true")
	if err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("B's job over a root-only directory: %v", err)
	}
	if got := entries(etc); len(got) != 1 {
		t.Errorf("the root-only directory now holds %v", got)
	}
	// A root filesystem B may read but not write: a missing working
	// directory is refused, by name, and not made.
	rootfs := busyboxRootfs(t)
	_, err = r.run(t, "nologin", b, rootfs, "/nologin", "true")
	if err == nil || !strings.Contains(err.Error(), "working directory /nologin does not exist") {
		t.Errorf("missing working directory: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(rootfs, "nologin")); err == nil {
		t.Error("root created /nologin in the job's rootfs")
	}
	// A missing mount point likewise.
	if err := os.Remove(filepath.Join(rootfs, "sys")); err != nil {
		t.Fatal(err)
	}
	_, err = r.run(t, "nosys", b, rootfs, "/", "true")
	if err == nil || !strings.Contains(err.Error(), "has no directory /sys") {
		t.Errorf("missing mount point: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(rootfs, "sys")); err == nil {
		t.Error("root created /sys in the job's rootfs")
	}
	// And with everything there, B's job runs.
	if err := os.Mkdir(filepath.Join(rootfs, "sys"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := r.run(t, "fine", b, rootfs, "/tmp", "pwd"); err != nil || out != "/tmp\n" {
		t.Errorf("B's job over a usable rootfs: %q, %v", out, err)
	}
}

// TestKernelContainerPathLookupAsCaller: inside a container too, a command
// in a directory the job's user cannot search is "not found", as a missing
// one is (libcontainer's init looks it up after taking the user's identity).
func TestKernelContainerPathLookupAsCaller(t *testing.T) {
	b := exectest.NeedUser(t, "fusiond-tb") // before the runner: removed after its cleanup
	r := newCtrRunner(t)
	rootfs := busyboxRootfs(t)
	hidden := filepath.Join(rootfs, "hidden")
	if err := os.Mkdir(hidden, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/bin/busybox", filepath.Join(hidden, "present-tool")); err != nil {
		t.Fatal(err)
	}
	startErr := func(id, name string) string {
		logPath := filepath.Join(r.dir, id+".log")
		_, err := r.Start(context.Background(), jobs.RunRequest{
			JobID: id, Attempt: 1, Command: []string{name}, Env: []string{"PATH=/hidden"}, Workdir: "/",
			UID: b.UID, GID: b.GID, LogPath: logPath, Tier: api.TierBurstable, Rootfs: rootfs,
			Allocation: api.Allocation{CPU: 500, Memory: 64 << 20, NUMANode: -1},
		})
		if err == nil {
			t.Fatalf("%s started in the container for uid %d", name, b.UID)
		}
		return strings.ReplaceAll(err.Error(), name, "NAME")
	}
	if present, absent := startErr("present", "present-tool"), startErr("absent", "absent-tool"); present != absent {
		t.Errorf("an executable in an unsearchable directory and a missing one differ:\n%s\n%s", present, absent)
	}
}

// TestSameRoot: the check that runs the container only over the directory
// the job's user opened.
func TestSameRoot(t *testing.T) {
	slash, err := os.Open("/")
	if err != nil {
		t.Fatal(err)
	}
	defer slash.Close()
	other, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := sameRoot(slash, os.Getpid()); err != nil {
		t.Errorf("this process's own root: %v", err)
	}
	if err := sameRoot(other, os.Getpid()); err == nil || !strings.Contains(err.Error(), "changed") {
		t.Errorf("another directory than the root: %v", err)
	}
	if err := sameRoot(nil, os.Getpid()); err == nil {
		t.Error("no opened directory accepted")
	}
}

// TestKernelRootfsSwapRace: while B's container jobs start over B's root
// filesystem, the path is swapped, again and again, for a symlink to a
// root-only directory (what B could do to their own directory). Root
// never creates anything there — the runtime is given the directory B
// opened, not the path — and a job that runs, runs over B's root
// filesystem. 200 attempts.
func TestKernelRootfsSwapRace(t *testing.T) {
	b := exectest.NeedUser(t, "fusiond-tb") // before the runner: removed after its cleanup
	r := newCtrRunner(t)
	// root's 0700 directory, without the mount points the runtime would
	// make if it ever got there.
	secret := t.TempDir()
	if err := os.Chmod(secret, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secret, "key"), []byte("root's"), 0o600); err != nil {
		t.Fatal(err)
	}
	real := busyboxRootfs(t)
	// B can traverse its parent, and could rename it as its owner would.
	if err := os.WriteFile(filepath.Join(real, "marker"), []byte("B's rootfs\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// B's job names the real path; B renames the directory away and puts a
	// symlink to root's directory in its place, and back, over and over:
	// after B's own check, a runtime that resolved the path again would
	// find root's directory.
	path, hold := real, real+".hold"
	stop := make(chan struct{})
	swapped := make(chan int)
	go func() {
		n := 0
		defer func() { swapped <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if os.Rename(path, hold) == nil {
				os.Symlink(secret, path)
				time.Sleep(time.Duration(n%5) * 200 * time.Microsecond)
				os.Remove(path)
				os.Rename(hold, path)
			}
			time.Sleep(time.Duration(n%7) * 200 * time.Microsecond)
			n++
		}
	}()
	ran, refused := 0, 0
	for i := range 200 {
		out, err := r.run(t, fmt.Sprint("swap-", i), b, path, "/", "cat", "/marker")
		switch {
		case err != nil:
			refused++
			if strings.Contains(err.Error(), secret) {
				t.Errorf("attempt %d: the refusal names root's directory: %v", i, err)
			}
		case out != "B's rootfs\n":
			t.Errorf("attempt %d ran over something else: %q", i, out)
		default:
			ran++
		}
	}
	close(stop)
	n := <-swapped
	ents, err := os.ReadDir(secret)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE rootfs swap race: 200 attempts against %d swaps: %d ran over B's rootfs, %d refused; root-only directory holds %d entries", n, ran, refused, len(ents))
	if len(ents) != 1 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("root created %v in a root-only directory while the path was swapped", names)
	}
	if ran == 0 || refused == 0 {
		t.Errorf("%d ran, %d refused: the swap did not race the starts", ran, refused)
	}
}

// TestKernelRootfsMountPointRace: B removes a mount point from B's own
// root filesystem and makes it again, over and over, while B's container
// jobs start. The runtime, root, never makes it in B's place: a start that
// meets it missing fails (the staged root is idmapped without root), and
// no root-owned sys ever appears in B's tree. 200 attempts.
func TestKernelRootfsMountPointRace(t *testing.T) {
	b := exectest.NeedUser(t, "fusiond-tb") // before the runner: removed after its cleanup
	r := newCtrRunner(t)
	rootfs := busyboxRootfs(t)
	if err := filepath.Walk(rootfs, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(b.UID), int(b.GID))
	}); err != nil {
		t.Fatal(err)
	}
	sys := filepath.Join(rootfs, "sys")
	stop := make(chan struct{})
	swapped := make(chan int)
	go func() {
		// This goroutine's thread takes B's identity for good (it dies
		// with the goroutine): B's own rmdir and mkdir.
		runtime.LockOSThread()
		n := 0
		defer func() { swapped <- n }()
		// Raw calls: unix.Setresuid would change every thread.
		if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
			t.Error(e)
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(b.GID), uintptr(b.GID), uintptr(b.GID)); e != 0 {
			t.Error(e)
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(b.UID), uintptr(b.UID), uintptr(b.UID)); e != 0 {
			t.Error(e)
			return
		}
		for {
			select {
			case <-stop:
				unix.Mkdir(sys, 0o755)
				return
			default:
			}
			unix.Rmdir(sys)
			time.Sleep(time.Duration(n%5) * 200 * time.Microsecond)
			unix.Mkdir(sys, 0o755)
			time.Sleep(time.Duration(n%7) * 200 * time.Microsecond)
			n++
		}
	}()
	rootMade, ran, refused := 0, 0, 0
	for i := range 200 {
		if _, err := r.run(t, fmt.Sprint("mp-", i), b, rootfs, "/", "true"); err != nil {
			if refused++; refused == 1 {
				t.Logf("first refusal: %v", err)
			}
		} else {
			ran++
		}
		var st unix.Stat_t
		if unix.Lstat(sys, &st) == nil && st.Uid == 0 {
			rootMade++
		}
	}
	close(stop)
	n := <-swapped
	t.Logf("FIGURE mount-point race: 200 attempts against %d removals of /sys: %d ran, %d refused; root-owned sys seen %d times", n, ran, refused, rootMade)
	if rootMade > 0 {
		t.Errorf("root made /sys in B's root filesystem %d times", rootMade)
	}
	if refused == 0 {
		t.Errorf("no start met /sys missing (%d ran): the race did not happen", ran)
	}
}

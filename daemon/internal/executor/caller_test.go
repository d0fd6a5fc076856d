package executor

import (
	"errors"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/executor/exectest"
)

// TestPathLookupAsCaller: a command found only in a directory the job's
// user cannot search gets the same error as a missing command: the look-up
// is the user's, not root's. It needs useradd, so it runs on the host, not
// in the cgroup v2 VM (which runs only TestKernel*).
func TestPathLookupAsCaller(t *testing.T) {
	r := newTestRunner(t)
	b := exectest.NeedUser(t, "fusiond-tb")
	base, err := os.MkdirTemp("", "fusiond-lookup-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	hidden := filepath.Join(base, "hidden")
	if err := os.Mkdir(hidden, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hidden, "present-tool"), []byte("#!/bin/sh\necho ran\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	startErr := func(id, name string) string {
		req := r.request(id, api.TierBurstable, 100, 64*mib, name)
		req.UID, req.GID = b.UID, b.GID
		req.Env = []string{"PATH=" + hidden}
		p, err := r.Start(t.Context(), req)
		if err == nil {
			e := waitExit(t, p, 10e9)
			t.Fatalf("%s started for uid %d (exit %+v: %s)", name, b.UID, e, readLog(t, req))
		}
		return strings.ReplaceAll(err.Error(), name, "NAME")
	}
	present, absent := startErr("present", "present-tool"), startErr("absent", "absent-tool")
	if present != absent {
		t.Errorf("an executable in an unsearchable directory and a missing one differ:\n%s\n%s", present, absent)
	}
	if !strings.Contains(absent, `"NAME" not found in the job's PATH`) {
		t.Errorf("missing command: %s", absent)
	}
	// Root, who can search the directory, finds it.
	req := r.request("root", api.TierBurstable, 100, 64*mib, "present-tool")
	req.Env = []string{"PATH=" + hidden}
	if e := waitExit(t, r.start(req), 10e9); e.Code != 0 || strings.TrimSpace(readLog(t, req)) != "ran" {
		t.Errorf("root's job: exit %+v: %s", e, readLog(t, req))
	}
}

// TestAsCallerLeavesTheMainThread: asCaller's goroutine, run on the
// process's main thread (the helper locks it there from init), does the
// work as the user on another thread and leaves the main thread — by
// which the kernel shows the process — root's. Taking the identity there
// would park that thread for good with the user's credentials: the
// process became the user's (ps -u, kill(2) permission), and userdel of
// the test account failed under the test binary itself.
func TestAsCallerLeavesTheMainThread(t *testing.T) {
	b := exectest.NeedUser(t, "fusiond-tb")
	cmd := osexec.Command(os.Args[0], strconv.FormatUint(uint64(b.UID), 10))
	cmd.Env = append(os.Environ(), helperEnv+"="+mainThreadHelper)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v: %s", err, out)
	}
	want := fmt.Sprintf("fn-euid %d; main thread euid 0; process uids 0 0 0 0", b.UID)
	if got := strings.TrimSpace(string(out)); got != want {
		t.Fatalf("asCaller on the main thread: %q, want %q", got, want)
	}
}

// TestStageRootNoRoot: the staged root of a job of user B is B's directory
// itself — B's files are B's, B creates files as ever — but root can
// create nothing through it, so a runtime cannot make a mount point or a
// working directory B removed (it fails instead). A job of root gets a
// plain bind. Needs useradd and an ext4-like /tmp, so it runs on the host
// (not TestKernel*: the cgroup v2 VM runs from a tmpfs).
func TestStageRootNoRoot(t *testing.T) {
	b := exectest.NeedUser(t, "fusiond-tb")
	base, err := os.MkdirTemp("", "fusiond-stage-") // B traverses it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	rootfs := filepath.Join(base, "rootfs")
	for _, d := range []string{rootfs, filepath.Join(rootfs, "proc")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, int(b.UID), int(b.GID)); err != nil {
			t.Fatal(err)
		}
	}
	open := func() *os.File {
		f, err := os.Open(rootfs)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	staged := filepath.Join(base, "staged")
	_, idmapErr, err := stageRoot(open(), staged, b.UID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(staged, unix.MNT_DETACH) })
	if idmapErr != nil {
		t.Fatalf("no idmapped mount on this host's %s: %v", base, idmapErr)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(staged, "proc"), &st); err != nil || st.Uid != b.UID {
		t.Errorf("B's proc through the staged root: uid %d, %v; want %d", st.Uid, err, b.UID)
	}
	if err := os.Mkdir(filepath.Join(staged, "sys"), 0o755); !errors.Is(err, unix.EOVERFLOW) {
		t.Errorf("root's mkdir through the staged root: %v, want EOVERFLOW", err)
	}
	if _, err := os.Lstat(filepath.Join(rootfs, "sys")); err == nil {
		t.Error("root created sys in B's root filesystem")
	}
	if err := asCaller(b.UID, b.GID, nil, func() error { return os.Mkdir(filepath.Join(staged, "mine"), 0o755) }); err != nil {
		t.Errorf("B's mkdir through the staged root: %v", err)
	}
	if err := unix.Stat(filepath.Join(rootfs, "mine"), &st); err != nil || st.Uid != b.UID {
		t.Errorf("B's new directory: uid %d, %v", st.Uid, err)
	}
	// root's own job: a plain bind, through which root creates.
	stagedRoot := filepath.Join(base, "staged-root")
	_, idmapErr, err = stageRoot(open(), stagedRoot, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(stagedRoot, unix.MNT_DETACH) })
	if idmapErr == nil {
		t.Error("root's job got an idmapped root")
	}
	if err := os.Mkdir(filepath.Join(stagedRoot, "tmp"), 0o755); err != nil {
		t.Errorf("root's mkdir in root's own job's root: %v", err)
	}
}

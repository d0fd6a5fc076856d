package executor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// ContainerMountPoints are the directories of a container's root
// filesystem that its runtime mounts over (proc, a tmpfs /dev, read-only
// sysfs). They must exist already: the monitor runs as root and never
// creates anything inside a root filesystem the job's user names.
var ContainerMountPoints = []string{"proc", "dev", "sys"}

// asCaller runs fn on an OS thread of its own that has first taken uid, gid
// and groups with the raw per-thread calls (as the job's first process
// does): every path fn resolves is resolved, and every file it opens is
// opened, with the caller's permissions, not root's. The thread is never
// handed back to the Go scheduler: the goroutine ends locked to it, which
// terminates it.
func asCaller(uid, gid uint32, groups []uint32, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: this thread's credentials are no longer the
		// monitor's, and it must die with this goroutine.
		if err := setIdentity(uid, gid, groups); err != nil {
			done <- fmt.Errorf("take the job user's identity (uid %d): %w", uid, err)
			return
		}
		done <- fn()
	}()
	return <-done
}

// openRootfs opens a container job's root filesystem and checks, with the
// job user's credentials (when the monitor can switch to them), that the
// user could use it themselves: open the directory, find the mount points
// (ContainerMountPoints) and search the working directory inside it. It
// returns the opened directory and the path it really is (symlinks
// resolved by the user's own look-up), which is what the runtime is given.
// Nothing is created: a missing mount point or working directory is an
// error naming it.
func openRootfs(s Spec) (*os.File, string, error) {
	var root *os.File
	check := func() error {
		fd, err := unix.Open(s.Rootfs, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("rootfs %s: %w (the job's user must be able to open it)", s.Rootfs, err)
		}
		root = os.NewFile(uintptr(fd), s.Rootfs)
		for _, name := range ContainerMountPoints {
			var st unix.Stat_t
			err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
			if err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
				err = unix.ENOTDIR
			}
			if err != nil {
				return fmt.Errorf("rootfs %s has no directory /%s (%w): container jobs mount proc, dev and sys there, and fusiond does not create them", s.Rootfs, name, err)
			}
		}
		dir := s.Dir
		if dir == "" {
			dir = "/"
		}
		wfd, err := unix.Openat2(fd, dir, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
		})
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("working directory %s does not exist in rootfs %s (fusiond does not create it)", dir, s.Rootfs)
		}
		if err != nil {
			return fmt.Errorf("working directory %s in rootfs %s: %w", dir, s.Rootfs, err)
		}
		defer unix.Close(wfd)
		if err := unix.Faccessat(wfd, ".", unix.X_OK, 0); err != nil {
			return fmt.Errorf("working directory %s in rootfs %s: %w", dir, s.Rootfs, err)
		}
		return nil
	}
	var err error
	if s.SetIdentity {
		err = asCaller(s.UID, s.GID, s.Groups, check)
	} else {
		// A monitor that is not root runs as the daemon's own user, which
		// is the job's: its look-up is already the caller's.
		err = check()
	}
	if err != nil {
		if root != nil {
			root.Close()
		}
		return nil, "", err
	}
	real, err := os.Readlink(filepath.Join("/proc/self/fd", strconv.Itoa(int(root.Fd()))))
	if err == nil && !filepath.IsAbs(real) {
		err = fmt.Errorf("not a path: %q", real)
	}
	if err != nil {
		root.Close()
		return nil, "", fmt.Errorf("rootfs %s: resolve the opened directory: %w", s.Rootfs, err)
	}
	return root, real, nil
}

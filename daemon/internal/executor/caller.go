package executor

import (
	"errors"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"

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
	go callerThread(uid, gid, groups, fn, done)
	return <-done
}

// callerThread is asCaller's goroutine. The one thread it must not take
// the caller's identity on is the process's main thread: that thread
// cannot exit (the runtime parks it for good when its goroutine ends
// locked to it), and the kernel shows a process by its main thread's
// credentials, so the process would be the caller's from then on (ps,
// kill(2) permission, userdel). On the main thread it holds that thread,
// unchanged, while another goroutine — on another thread, since this one
// runs only the goroutine locked to it — does the work.
func callerThread(uid, gid uint32, groups []uint32, fn func() error, done chan<- error) {
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		inner := make(chan error, 1)
		go callerThread(uid, gid, groups, fn, inner)
		err := <-inner
		runtime.UnlockOSThread()
		done <- err
		return
	}
	// No UnlockOSThread: this thread's credentials are no longer the
	// monitor's, and it must die with this goroutine.
	if err := setIdentity(uid, gid, groups); err != nil {
		done <- fmt.Errorf("take the job user's identity (uid %d): %w", uid, err)
		return
	}
	done <- fn()
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

// stagedRootDir is where, in a root monitor's attempt directory, a
// container job's root filesystem is mounted for the runtime.
const stagedRootDir = "root"

// stageRoot mounts root — the directory the job's user opened — on dir,
// which it makes (0700) in the attempt directory, and returns dir: the
// path the runtime is given. A root runtime resolves that path again, as
// root, more than once (validation, bind mounts, mount points) before
// fusiond can check what it found; every component of dir is root's, so
// no user can rename or replace any of it meanwhile, and the mount's
// source is the open directory itself, never the path the user named. The
// monitor runs in a mount namespace of its own whose mounts are slaves of
// the host's (see enterOwnMountNS), so the staged mount is seen by no one
// else and goes with the monitor; it is private, so the container's copy
// of it keeps no tie to it either.
//
// For a job of another user than root, the mount is idmapped with every
// uid and gid but 0 mapped to itself: the job's files are its own as
// ever, but nothing can be created through the mount by root (the kernel
// answers EOVERFLOW), so the runtime cannot make a mount point or a
// working directory the user removed after fusiond's check — it fails the
// start instead. Where the filesystem has no idmapped mounts (the kernel
// before 5.12, NFS, tmpfs before 6.3) the mount is a plain bind, and
// idmapErr says why.
func stageRoot(root *os.File, dir string, uid uint32) (path string, idmapErr, err error) {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", nil, fmt.Errorf("stage the root filesystem: %w", err)
	}
	if uid == 0 {
		idmapErr = errors.New("the job runs as root")
	} else if idmapErr = mountNoRoot(root, dir); idmapErr == nil {
		return dir, nil, private(dir)
	}
	src := "/proc/self/fd/" + strconv.Itoa(int(root.Fd()))
	if err := unix.Mount(src, dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return "", idmapErr, fmt.Errorf("stage the root filesystem: bind mount: %w", err)
	}
	return dir, idmapErr, private(dir)
}

func private(dir string) error {
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("stage the root filesystem: make it private: %w", err)
	}
	return nil
}

// mountNoRoot mounts a clone of root's mount tree on dir, idmapped through
// a user namespace that maps every id but 0 to itself.
func mountNoRoot(root *os.File, dir string) error {
	ns, err := noRootUserNS()
	if err != nil {
		return err
	}
	defer ns.Close()
	tree, err := unix.OpenTree(int(root.Fd()), "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH|unix.AT_RECURSIVE)
	if err != nil {
		return fmt.Errorf("open_tree: %w", err)
	}
	defer unix.Close(tree)
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(ns.Fd())}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, attr); err != nil {
		return fmt.Errorf("idmap the mount: %w", err)
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, dir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount: %w", err)
	}
	return nil
}

// noRootUserNS returns a user namespace whose uid and gid maps hold every
// id but 0, each to itself: a helper (this binary, usernsArg) is started
// in it, its namespace opened, and the helper ended.
func noRootUserNS() (*os.File, error) {
	all := []syscall.SysProcIDMap{{ContainerID: 1, HostID: 1, Size: 1<<32 - 2}}
	cmd := osexec.Command("/proc/self/exe", usernsArg)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, UidMappings: all, GidMappings: all}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("user namespace: %w", err)
	}
	ns, err := os.Open("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/user")
	in.Close()
	_ = cmd.Wait()
	if err != nil {
		return nil, fmt.Errorf("user namespace: %w", err)
	}
	return ns, nil
}

// enterOwnMountNS readies the mount namespace a root monitor of a
// container job was started in (CLONE_NEWNS): every mount becomes a slave
// of the host's, so that what the monitor mounts never reaches the host
// while the host's new mounts (devices, filesystems) still reach it.
func enterOwnMountNS() error {
	if err := unix.Mount("", "/", "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("monitor's mount namespace: %w", err)
	}
	return nil
}

package topology

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrMalformed is wrapped by errors about a sysfs or procfs file whose
// content cannot be parsed; the error text names the file.
var ErrMalformed = errors.New("topology: malformed file")

// ErrNotRegular is wrapped by errors about a path that should be a sysfs
// or procfs attribute (a regular file) but is a FIFO, a device, a socket
// or a directory: it is not read, since reading it could block
// discovery or never end.
var ErrNotRegular = errors.New("topology: not a regular file")

// maxFileBytes bounds one read: sysfs attributes are at most a page,
// procfs files here at most a few MiB (/proc/cpuinfo of a large host).
const maxFileBytes = 64 << 20

// dirCacheSize is how many directories fsRoot keeps open: enough for the
// interleaved reads of one CPU (its topology and cache directories and a
// sibling's topology directory).
const dirCacheSize = 8

// fsRoot reads files below an injected root ("/" on the live host), for
// one Discover call (it is not safe for concurrent use). Every read checks
// the call's context first, so that a cancelled discovery stops at the
// next file. Files are opened with O_NONBLOCK and read only when they are
// regular files (sysfs and procfs attributes are), so that a FIFO or a
// device in the tree cannot hang discovery; the error wraps ErrNotRegular.
// The last few directories stay open, and their files are opened relative
// to them (openat): one path lookup per directory instead of one per
// file, and about half the system calls of os.ReadFile.
type fsRoot struct {
	ctx  context.Context
	root string
	dirs [dirCacheSize]openDir
	next int // the dirs slot to reuse next
	buf  []byte
}

// openDir is a directory fsRoot holds open (fd), or failed to open (err).
type openDir struct {
	path string // in-host path; "" for an unused slot
	fd   int
	err  error
}

func newFSRoot(ctx context.Context, root string) *fsRoot {
	return &fsRoot{ctx: ctx, root: root}
}

// close closes the directories held open.
func (r *fsRoot) close() {
	for i := range r.dirs {
		if r.dirs[i].path != "" && r.dirs[i].err == nil {
			unix.Close(r.dirs[i].fd)
		}
		r.dirs[i] = openDir{}
	}
}

// path maps an absolute in-host path (/sys/...) to the real path.
func (r *fsRoot) path(p string) string { return filepath.Join(r.root, p) }

// dir returns an open descriptor of the in-host directory p.
func (r *fsRoot) dir(p string) (int, error) {
	if j := r.cached(p); j >= 0 {
		return r.dirs[j].fd, r.dirs[j].err
	}
	fd, err := openNoEINTR(unix.AT_FDCWD, r.path(p), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NONBLOCK|unix.O_CLOEXEC)
	r.hold(p, fd, err)
	return fd, err
}

func openNoEINTR(dirfd int, name string, flags int) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, flags, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// read returns the trimmed content of the in-host file p; errors name p
// and wrap fs.ErrNotExist, ErrNotRegular, the context's error or the
// system call's.
func (r *fsRoot) read(p string) (string, error) {
	b, err := r.readBytes(p)
	if err != nil {
		return "", err
	}
	// Some arm64 firmware leaves NUL bytes after the value ("0-31\n\x00").
	return string(bytes.Trim(b, " \t\r\n\x00")), nil
}

// readBytes returns the content of the in-host file p in a buffer that
// the next read reuses.
func (r *fsRoot) readBytes(p string) ([]byte, error) {
	if err := r.ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	i := strings.LastIndexByte(p, '/')
	if i < 0 || i == len(p)-1 {
		return nil, fmt.Errorf("%s: %w: not an absolute file path", p, fs.ErrInvalid)
	}
	dfd, rel, err := r.dirOf(p, i)
	if err == nil {
		var fd int
		if fd, err = openNoEINTR(dfd, rel, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC); err == nil {
			defer unix.Close(fd)
			return r.readFD(p, fd)
		}
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", p, fs.ErrNotExist)
	}
	return nil, fmt.Errorf("%s: %w", p, err)
}

// dirOf returns a directory to open the in-host file p (whose last slash
// is at i) relative to, and the relative name: p's directory when it is
// held open, else a held-open grandparent (cpuN/cache for
// cpuN/cache/indexM/level: the index directories are read once each and
// not worth opening), else p's directory, opened and held.
func (r *fsRoot) dirOf(p string, i int) (int, string, error) {
	dir := p[:i]
	if j := r.cached(dir); j >= 0 {
		return r.dirs[j].fd, p[i+1:], r.dirs[j].err
	}
	if k := strings.LastIndexByte(dir, '/'); k > 0 {
		if j := r.cached(dir[:k]); j >= 0 && r.dirs[j].err == nil {
			return r.dirs[j].fd, p[k+1:], nil
		}
	}
	fd, err := r.dir(dir)
	return fd, p[i+1:], err
}

func (r *fsRoot) cached(dir string) int {
	for j := range r.dirs {
		if r.dirs[j].path == dir {
			return j
		}
	}
	return -1
}

// resolveLink says whether the in-host path p is a symbolic link and, if
// so, returns its fully resolved real path, as os.Lstat and
// filepath.EvalSymlinks would (their errors are returned). Fast path, for
// the /sys/bus/pci/devices links: one readlinkat and one openat2 that
// refuses any symlink on the way (RESOLVE_NO_SYMLINKS), so the lexical
// target is the resolved one; the directory opened is then held as p's,
// so that p's files are opened relative to it. Anything else (an absolute
// or escaping target, a link on the way, an old kernel) takes the slow
// path.
func (r *fsRoot) resolveLink(p string) (bool, string, error) {
	if err := r.ctx.Err(); err != nil {
		return false, "", fmt.Errorf("%s: %w", p, err)
	}
	i := strings.LastIndexByte(p, '/')
	if i > 0 {
		if dfd, err := r.dir(p[:i]); err == nil {
			var buf [unix.PathMax]byte
			n, err := unix.Readlinkat(dfd, p[i+1:], buf[:])
			if err == unix.EINVAL {
				return false, "", nil // not a link
			}
			if err == nil && n > 0 && n < len(buf) && buf[0] != '/' {
				real := filepath.Join(r.path(p[:i]), string(buf[:n]))
				if fd, ok := r.openNoSymlinks(real); ok {
					r.hold(p, fd, nil)
					return true, real, nil
				}
			}
		}
	}
	st, err := os.Lstat(r.path(p))
	if err != nil || st.Mode()&fs.ModeSymlink == 0 {
		return false, "", err
	}
	target, err := filepath.EvalSymlinks(r.path(p))
	return err == nil, target, err
}

// openNoSymlinks opens the real directory path real, below the root,
// when no component below the root is a symbolic link.
func (r *fsRoot) openNoSymlinks(real string) (int, bool) {
	rel, err := filepath.Rel(r.path("/"), real)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return -1, false
	}
	rootFD, err := r.dir("/")
	if err != nil {
		return -1, false
	}
	how := unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NONBLOCK | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_BENEATH}
	for {
		fd, err := unix.Openat2(rootFD, rel, &how)
		if err == unix.EINTR {
			continue
		}
		return fd, err == nil
	}
}

// hold keeps fd open as the in-host directory p, or remembers that
// opening it failed with err (see dir), in place of the least recently
// added directory.
func (r *fsRoot) hold(p string, fd int, err error) {
	j := r.cached(p)
	if j < 0 {
		j = r.next
		r.next = (r.next + 1) % len(r.dirs)
	}
	if slot := r.dirs[j]; slot.path != "" && slot.err == nil {
		unix.Close(slot.fd)
	}
	r.dirs[j] = openDir{path: p, fd: fd, err: err}
}

// withHostFile calls use with the content of the file at the real path p
// (not below the root), after read's checks: mapped read-only where the
// file system allows (pci.ids is 1.4 MB; reading it into a fresh buffer
// per discovery cost a garbage collection), else read into the reused
// buffer. The content is valid only during use.
func (r *fsRoot) withHostFile(p string, use func([]byte)) error {
	if err := r.ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	fd, err := openNoEINTR(unix.AT_FDCWD, p, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s: %w", p, fs.ErrNotExist)
		}
		return fmt.Errorf("%s: %w", p, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Size > 0 && st.Size <= maxFileBytes {
		if m, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ, unix.MAP_PRIVATE); err == nil {
			use(m)
			return unix.Munmap(m)
		}
	}
	b, err := r.readFD(p, fd)
	if err != nil {
		return err
	}
	use(b)
	return nil
}

func (r *fsRoot) readFD(p string, fd int) ([]byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%s: %w (%s); not read", p, ErrNotRegular, fileKind(st.Mode))
	}
	if want := min(st.Size+1, maxFileBytes); int64(len(r.buf)) < want {
		r.buf = make([]byte, max(want, 4096))
	}
	n := 0
	for {
		if n == len(r.buf) {
			if n >= maxFileBytes {
				return nil, fmt.Errorf("%s: %w: more than %d bytes", p, ErrMalformed, maxFileBytes)
			}
			r.buf = append(r.buf, make([]byte, n)...)
		}
		m, err := unix.Read(fd, r.buf[n:])
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return nil, fmt.Errorf("%s: %w", p, err)
		case m == 0:
			return r.buf[:n], nil
		}
		n += m
		// A regular file read up to its size is complete: tmpfs and disk
		// trees report the true size. A sysfs attribute reports a page and
		// no blocks, and gives its whole value (at most a page) to the
		// first read. procfs reports 0 and is read to the end.
		if int64(n) == st.Size || st.Blocks == 0 && st.Size == int64(os.Getpagesize()) && int64(n) < st.Size {
			return r.buf[:n], nil
		}
	}
}

func fileKind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFLNK:
		return "a symbolic link"
	}
	return fmt.Sprintf("file type %#o", mode&unix.S_IFMT)
}

// readDir lists the in-host directory p, sorted by name, as os.ReadDir
// but names only. The directory is held open (see dirOf); opening it
// cannot block (O_NONBLOCK, O_DIRECTORY: a FIFO in its place fails with
// ENOTDIR).
func (r *fsRoot) readDir(p string) ([]dirName, error) {
	if err := r.ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	fd, err := r.dir(p)
	if err == nil {
		_, err = unix.Seek(fd, 0, io.SeekStart)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	if len(r.buf) < 8192 {
		r.buf = make([]byte, 8192)
	}
	var names []string
	for {
		n, err := unix.ReadDirent(fd, r.buf[:8192])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if n <= 0 {
			break
		}
		_, _, names = unix.ParseDirent(r.buf[:n], -1, names)
	}
	slices.Sort(names)
	out := make([]dirName, len(names))
	for i, n := range names {
		out[i] = dirName(n)
	}
	return out, nil
}

// dirName is a directory entry's name (readDir lists names only).
type dirName string

// Name returns the name, as fs.DirEntry.Name.
func (n dirName) Name() string { return string(n) }

func (r *fsRoot) readInt(p string) (int, error) {
	s, err := r.read(p)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%s: %w: %q is not an integer", p, ErrMalformed, s)
	}
	return n, nil
}

// readHex parses a 0x-prefixed hexadecimal file (vendor, device, class).
func (r *fsRoot) readHex(p string, bits int) (uint64, error) {
	s, err := r.read(p)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(strings.TrimPrefix(s, "0x"), 16, bits)
	if err != nil {
		return 0, fmt.Errorf("%s: %w: %q is not a %d-bit hex number", p, ErrMalformed, s, bits)
	}
	return v, nil
}

func (r *fsRoot) readCPUList(p string) (CPUSet, error) {
	s, err := r.read(p)
	if err != nil {
		return CPUSet{}, err
	}
	c, err := ParseCPUList(s)
	if err != nil {
		return CPUSet{}, fmt.Errorf("%s: %w", p, err)
	}
	return c, nil
}

func (r *fsRoot) readCPUMask(p string) (CPUSet, error) {
	s, err := r.read(p)
	if err != nil {
		return CPUSet{}, err
	}
	c, err := ParseCPUMask(s)
	if err != nil {
		return CPUSet{}, fmt.Errorf("%s: %w", p, err)
	}
	return c, nil
}

// ParseMeminfoTotal returns MemTotal in bytes from /proc/meminfo or a
// node meminfo file ("Node 0 MemTotal:  123 kB").
func ParseMeminfoTotal(s string) (uint64, error) {
	for _, line := range strings.Split(s, "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(key)
		if len(f) == 0 || f[len(f)-1] != "MemTotal" {
			continue
		}
		v := strings.Fields(val)
		if len(v) == 0 || len(v) > 2 || len(v) == 2 && v[1] != "kB" {
			return 0, fmt.Errorf("%w: MemTotal line %q", ErrSyntax, line)
		}
		n, err := strconv.ParseUint(v[0], 10, 64)
		if err != nil || n > (1<<54) {
			return 0, fmt.Errorf("%w: MemTotal line %q", ErrSyntax, line)
		}
		if len(v) == 2 {
			n *= 1024
		}
		return n, nil
	}
	return 0, fmt.Errorf("%w: no MemTotal line", ErrSyntax)
}

// ParseDistances parses a node's distance row ("10 21 21").
func ParseDistances(s string) ([]int, error) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return nil, fmt.Errorf("%w: empty distance row", ErrSyntax)
	}
	out := make([]int, len(f))
	for i, x := range f {
		n, err := strconv.Atoi(x)
		if err != nil || n < 0 || n > 255 {
			return nil, fmt.Errorf("%w: distance %q", ErrSyntax, x)
		}
		out[i] = n
	}
	return out, nil
}

// ParsePCIAddr checks and canonicalises (lower case) a PCI address of the
// form dddd:bb:dd.f (the domain may have up to 8 hex digits, as behind
// Intel VMD).
func ParsePCIAddr(s string) (PCIAddr, error) {
	s = strings.ToLower(s)
	bad := fmt.Errorf("%w: PCI address %q", ErrSyntax, s)
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return "", bad
	}
	dev, fn, ok := strings.Cut(parts[2], ".")
	if !ok || len(parts[0]) < 4 || len(parts[0]) > 8 || len(parts[1]) != 2 || len(dev) != 2 || len(fn) != 1 {
		return "", bad
	}
	for _, f := range []string{parts[0], parts[1], dev, fn} {
		if strings.Trim(f, "0123456789abcdef") != "" {
			return "", bad
		}
	}
	if dev[0] > '1' || fn[0] > '7' { // device 0-0x1f, function 0-7
		return "", bad
	}
	return PCIAddr(s), nil
}

// parseDevicePath splits a resolved PCI device path
// (/sys/devices/pci0000:17/0000:17:01.0/0000:18:00.0) into its host
// bridge ("pci0000:17") and the chain of PCI functions from the root port
// down to and including the device. Non-PCI path elements (e.g. a
// virtio or platform parent) are skipped.
func parseDevicePath(p string) (hostBridge string, chain []PCIAddr, err error) {
	for _, el := range strings.Split(filepath.ToSlash(p), "/") {
		if hostBridge == "" && strings.HasPrefix(el, "pci") && strings.Contains(el, ":") {
			hostBridge = el
			continue
		}
		if a, err := ParsePCIAddr(el); err == nil {
			chain = append(chain, a)
		}
	}
	if hostBridge == "" || len(chain) == 0 {
		return "", nil, fmt.Errorf("%w: PCI device path %q has no pciDDDD:BB host bridge", ErrSyntax, p)
	}
	return hostBridge, chain, nil
}

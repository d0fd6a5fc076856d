// Package resctrl owns the kernel's resctrl filesystem (Intel RDT, AMD
// PQoS): it reads what the hardware allocates (last-level and L2 cache
// ways, memory bandwidth), keeps one control group of fusiond's, writes
// its schemata as a share of the whole, and moves tasks into it. Nothing
// here mounts the filesystem; a host without it is told why.
//
// The filesystem (Documentation/arch/x86/resctrl.rst): info/<resource>/
// describes each resource (cbm_mask and min_cbm_bits for caches,
// min_bandwidth and bandwidth_gran for MB), the root's schemata holds one
// line per resource with a value per cache or memory domain
// ("L3:0=fffff;1=fffff", "MB:0=100;1=100"), a directory made at the root
// is a control group with its own schemata and tasks (thread ids, one per
// write; a thread's children start in its group).
package resctrl

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// DefaultRoot is where resctrl is mounted.
const DefaultRoot = "/sys/fs/resctrl"

// ErrUnavailable: there is no resctrl filesystem at the root (the CPU or
// the kernel lacks RDT/PQoS, or it is not mounted).
var ErrUnavailable = errors.New("resctrl: not available")

// resource is one allocatable resource of the root's schemata.
type resource struct {
	name    string            // L3, L3CODE, L3DATA, L2, ..., MB
	domains []string          // domain ids, in the root's order
	full    map[string]uint64 // the root's value per domain
	cache   bool              // a cache bitmask (else a bandwidth)
	minBits int               // caches: the fewest bits a mask may have
	gran    uint64            // bandwidth: the step of a value
	minBW   uint64            // bandwidth: the smallest value
	mbps    bool              // bandwidth in MBps (mba_MBps), not percent
}

// FS is a mounted resctrl filesystem.
type FS struct {
	root      string
	resources []resource
}

// Open reads the resctrl filesystem at root: ErrUnavailable (wrapped, with
// why) when there is none.
func Open(root string) (*FS, error) {
	if _, err := os.Stat(filepath.Join(root, "info")); err != nil {
		if supported() {
			return nil, fmt.Errorf("%w: the kernel has resctrl but it is not mounted at %s (mount -t resctrl resctrl %s)", ErrUnavailable, root, root)
		}
		return nil, fmt.Errorf("%w: no resctrl filesystem at %s (the CPU or kernel has no RDT/PQoS allocation)", ErrUnavailable, root)
	}
	b, err := os.ReadFile(filepath.Join(root, "schemata"))
	if err != nil {
		return nil, fmt.Errorf("resctrl: %w", err)
	}
	f := &FS{root: root}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		name, vals, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("resctrl: %s/schemata: line %q has no resource", root, line)
		}
		r, err := f.readResource(strings.TrimSpace(name), vals)
		if err != nil {
			return nil, err
		}
		if r != nil {
			f.resources = append(f.resources, *r)
		}
	}
	if len(f.resources) == 0 {
		return nil, fmt.Errorf("%w: %s allocates no cache or memory bandwidth", ErrUnavailable, root)
	}
	return f, nil
}

// supported reports whether the kernel knows the resctrl filesystem.
func supported() bool {
	b, err := os.ReadFile("/proc/filesystems")
	return err == nil && slices.Contains(strings.Fields(string(b)), "resctrl")
}

func (f *FS) readResource(name, vals string) (*resource, error) {
	// Under code/data prioritisation the kernel describes L3CODE and
	// L3DATA in info/ directories of those names.
	info := name
	if _, err := os.Stat(filepath.Join(f.root, "info", name)); err != nil {
		for _, suffix := range []string{"CODE", "DATA"} {
			info = strings.TrimSuffix(info, suffix)
		}
	}
	r := &resource{name: name, full: map[string]uint64{}}
	switch {
	case strings.HasPrefix(info, "L2") || strings.HasPrefix(info, "L3"):
		r.cache = true
		mask, err := f.infoHex(info, "cbm_mask")
		if err != nil {
			return nil, err
		}
		minBits, err := f.infoInt(info, "min_cbm_bits")
		if err != nil {
			return nil, err
		}
		if mask == 0 {
			return nil, fmt.Errorf("resctrl: info/%s/cbm_mask is 0", info)
		}
		r.minBits = int(max(1, minBits))
	case info == "MB":
		gran, err := f.infoInt("MB", "bandwidth_gran")
		if err != nil {
			return nil, err
		}
		minBW, err := f.infoInt("MB", "min_bandwidth")
		if err != nil {
			return nil, err
		}
		r.gran, r.minBW = max(1, gran), minBW
	default:
		return nil, nil // SMBA and what comes later: left to the root's value
	}
	for _, dv := range strings.Split(vals, ";") {
		d, v, ok := strings.Cut(strings.TrimSpace(dv), "=")
		if !ok {
			return nil, fmt.Errorf("resctrl: schemata %s: domain %q has no value", name, dv)
		}
		base := 10
		if r.cache {
			base = 16
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), base, 64)
		if err != nil {
			return nil, fmt.Errorf("resctrl: schemata %s: domain %s: %w", name, d, err)
		}
		r.domains = append(r.domains, d)
		r.full[d] = n
		if !r.cache && n > 100 {
			r.mbps = true
		}
	}
	return r, nil
}

func (f *FS) infoInt(res, file string) (uint64, error) { return f.info(res, file, 10) }

func (f *FS) infoHex(res, file string) (uint64, error) { return f.info(res, file, 16) }

// info reads the number in info/res/file.
func (f *FS) info(res, file string, base int) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(f.root, "info", res, file))
	if err != nil {
		return 0, fmt.Errorf("resctrl: %w", err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), base, 64)
	if err != nil {
		return 0, fmt.Errorf("resctrl: info/%s/%s: %w", res, file, err)
	}
	return n, nil
}

// Resources names what the filesystem allocates, with their domains:
// "L3 (2 domains), MB (2 domains)".
func (f *FS) Resources() string {
	parts := make([]string, 0, len(f.resources))
	for _, r := range f.resources {
		parts = append(parts, fmt.Sprintf("%s (%d domains)", r.name, len(r.domains)))
	}
	return strings.Join(parts, ", ")
}

// Schemata is the schemata of a group given share (0 < share ≤ 1) of each
// resource in every domain: a cache mask of the low share of the root's
// ways (at least min_cbm_bits, contiguous), a bandwidth of share of the
// root's rounded up to bandwidth_gran (at least min_bandwidth). It is
// pure: the plan a Group's SetShare writes.
func (f *FS) Schemata(share float64) (string, error) {
	if !(share > 0 && share <= 1) {
		return "", fmt.Errorf("resctrl: share %g: want 0 < share ≤ 1", share)
	}
	var b strings.Builder
	for _, r := range f.resources {
		vals := make([]string, 0, len(r.domains))
		for _, d := range r.domains {
			full := r.full[d]
			if r.cache {
				vals = append(vals, d+"="+strconv.FormatUint(cacheMask(full, share, r.minBits), 16))
				continue
			}
			v := uint64(math.Ceil(share*float64(full)/float64(r.gran))) * r.gran
			if !r.mbps {
				v = min(v, 100)
			}
			vals = append(vals, d+"="+strconv.FormatUint(min(max(v, r.minBW), full), 10))
		}
		fmt.Fprintf(&b, "%s:%s\n", r.name, strings.Join(vals, ";"))
	}
	return b.String(), nil
}

// cacheMask is the low ceil(share × ways) of the contiguous ways of full,
// at least minBits of them.
func cacheMask(full uint64, share float64, minBits int) uint64 {
	shift := bits.TrailingZeros64(full)
	ways := bits.OnesCount64(full)
	n := min(ways, max(minBits, int(math.Ceil(share*float64(ways)))))
	return (uint64(1)<<n - 1) << shift
}

// Group is a control group of the filesystem.
type Group struct {
	f   *FS
	dir string
	// share is the share written last (0 before the first write).
	share float64
}

// Group makes (or takes) the control group name at the root.
func (f *FS) Group(name string) (*Group, error) {
	if name == "" || name == "info" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." || strings.HasPrefix(name, "mon_") {
		return nil, fmt.Errorf("resctrl: bad group name %q", name)
	}
	dir := filepath.Join(f.root, name)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		if errors.Is(err, syscall.ENOSPC) {
			return nil, fmt.Errorf("resctrl: make group %s: every CLOSID is taken: %w", name, err)
		}
		return nil, fmt.Errorf("resctrl: make group %s: %w", name, err)
	}
	return &Group{f: f, dir: dir}, nil
}

// Share is the share last written (0: none yet).
func (g *Group) Share() float64 { return g.share }

// SetShare writes the group's schemata for share of every resource; 1
// gives it the root's.
func (g *Group) SetShare(share float64) error {
	s, err := g.f.Schemata(share)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(g.dir, "schemata"), []byte(s), 0o644); err != nil {
		// The kernel says why in info/last_cmd_status.
		if why, rerr := os.ReadFile(filepath.Join(g.f.root, "info", "last_cmd_status")); rerr == nil && len(why) > 0 {
			return fmt.Errorf("resctrl: write %s/schemata: %w (%s)", g.dir, err, strings.TrimSpace(string(why)))
		}
		return fmt.Errorf("resctrl: write %s/schemata: %w", g.dir, err)
	}
	g.share = share
	return nil
}

// Tasks lists the thread ids in the group.
func (g *Group) Tasks() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(g.dir, "tasks"))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("resctrl: %w", err)
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out, nil
}

// Add moves threads into the group, one write each (what the kernel
// takes); a thread gone meanwhile is not an error. It returns how many it
// moved.
func (g *Group) Add(tids []int) (int, error) {
	if len(tids) == 0 {
		return 0, nil
	}
	f, err := os.OpenFile(filepath.Join(g.dir, "tasks"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return 0, fmt.Errorf("resctrl: %w", err)
	}
	defer f.Close()
	n := 0
	for _, tid := range tids {
		if _, err := f.WriteString(strconv.Itoa(tid) + "\n"); err != nil {
			if errors.Is(err, syscall.ESRCH) {
				continue
			}
			return n, fmt.Errorf("resctrl: move thread %d into %s: %w", tid, g.dir, err)
		}
		n++
	}
	return n, nil
}

// Remove deletes the group; its threads go back to the root's.
func (g *Group) Remove() error {
	if err := os.Remove(g.dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("resctrl: remove %s: %w", g.dir, err)
	}
	return nil
}

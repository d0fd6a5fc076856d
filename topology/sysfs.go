package topology

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrMalformed is wrapped by errors about a sysfs or procfs file whose
// content cannot be parsed; the error text names the file.
var ErrMalformed = errors.New("topology: malformed file")

// fsRoot reads files below an injected root ("/" on the live host).
type fsRoot struct{ root string }

// path maps an absolute in-host path (/sys/...) to the real path.
func (r fsRoot) path(p string) string { return filepath.Join(r.root, p) }

// read returns the trimmed content of the in-host file p; errors name p.
func (r fsRoot) read(p string) (string, error) {
	b, err := os.ReadFile(r.path(p))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("%s: %w", p, fs.ErrNotExist)
		}
		return "", fmt.Errorf("%s: %w", p, err)
	}
	// Some arm64 firmware leaves NUL bytes after the value ("0-31\n\x00").
	return strings.Trim(string(b), " \t\r\n\x00"), nil
}

func (r fsRoot) readInt(p string) (int, error) {
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
func (r fsRoot) readHex(p string, bits int) (uint64, error) {
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

func (r fsRoot) readCPUList(p string) (CPUSet, error) {
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

func (r fsRoot) readCPUMask(p string) (CPUSet, error) {
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

package topology

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// MaxCPUs bounds the CPU numbers the parsers accept. The kernel's
// NR_CPUS tops out at 8192 on the largest distribution configs; a larger
// number in a sysfs file is malformed input, not a real machine.
const MaxCPUs = 1 << 14

// ErrSyntax is wrapped by every parse error of the text parsers (cpulist,
// CPU bitmap, meminfo, distance row, PCI address, distance label).
var ErrSyntax = errors.New("topology: syntax error")

// CPUSet is an immutable set of logical CPU numbers. The zero value is the
// empty set. It marshals to and from the kernel's cpulist form ("0-3,8").
type CPUSet struct {
	words []uint64 // bit i of words[i/64] is CPU i; no trailing zero words
}

// NewCPUSet returns the set of the given CPU numbers. Negative numbers and
// numbers of MaxCPUs or more are dropped.
func NewCPUSet(cpus ...int) CPUSet {
	var w []uint64
	for _, c := range cpus {
		if c < 0 || c >= MaxCPUs {
			continue
		}
		w = setBit(w, c)
	}
	return CPUSet{words: trim(w)}
}

func setBit(w []uint64, c int) []uint64 {
	for len(w) <= c/64 {
		w = append(w, 0)
	}
	w[c/64] |= 1 << (uint(c) % 64)
	return w
}

func trim(w []uint64) []uint64 {
	for len(w) > 0 && w[len(w)-1] == 0 {
		w = w[:len(w)-1]
	}
	if len(w) == 0 {
		return nil
	}
	return w
}

// ParseCPUList parses the kernel's cpulist format ("0-3,8,10-11", possibly
// with surrounding whitespace; "" is the empty set), as found in
// cpulist, local_cpulist, online and thread_siblings_list files.
func ParseCPUList(s string) (CPUSet, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return CPUSet{}, nil
	}
	var w []uint64
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := parseCPUNumber(lo)
		if err != nil {
			return CPUSet{}, fmt.Errorf("%w: %q: %v", ErrSyntax, part, err)
		}
		b := a
		if isRange {
			if b, err = parseCPUNumber(hi); err != nil {
				return CPUSet{}, fmt.Errorf("%w: %q: %v", ErrSyntax, part, err)
			}
			if b < a {
				return CPUSet{}, fmt.Errorf("%w: %q: descending range", ErrSyntax, part)
			}
		}
		for c := a; c <= b; c++ {
			w = setBit(w, c)
		}
	}
	return CPUSet{words: trim(w)}, nil
}

func parseCPUNumber(s string) (int, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, errors.New("not a decimal number")
	}
	n, err := strconv.Atoi(s)
	if err != nil || n >= MaxCPUs {
		return 0, fmt.Errorf("cpu number out of range [0,%d)", MaxCPUs)
	}
	return n, nil
}

// ParseCPUMask parses the kernel's hexadecimal bitmap format
// ("00000000,0000ff0f": comma-separated 32-bit words, most significant
// first), as found in cpumap, local_cpus and shared_cpu_map files.
func ParseCPUMask(s string) (CPUSet, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return CPUSet{}, nil
	}
	groups := strings.Split(s, ",")
	var w []uint64
	for i := range groups {
		g := groups[len(groups)-1-i] // least significant group first
		if g == "" || len(g) > 8 {
			return CPUSet{}, fmt.Errorf("%w: bitmap word %q", ErrSyntax, g)
		}
		v, err := strconv.ParseUint(g, 16, 32)
		if err != nil {
			return CPUSet{}, fmt.Errorf("%w: bitmap word %q", ErrSyntax, g)
		}
		for b := 0; v != 0; b++ {
			if v&1 != 0 {
				c := i*32 + b
				if c >= MaxCPUs {
					return CPUSet{}, fmt.Errorf("%w: cpu %d out of range", ErrSyntax, c)
				}
				w = setBit(w, c)
			}
			v >>= 1
		}
	}
	return CPUSet{words: trim(w)}, nil
}

// Len is the number of CPUs in the set.
func (c CPUSet) Len() int {
	n := 0
	for _, w := range c.words {
		n += bits.OnesCount64(w)
	}
	return n
}

// IsEmpty reports whether the set has no CPU.
func (c CPUSet) IsEmpty() bool { return len(c.words) == 0 }

// Contains reports whether cpu is in the set.
func (c CPUSet) Contains(cpu int) bool {
	if cpu < 0 || cpu/64 >= len(c.words) {
		return false
	}
	return c.words[cpu/64]&(1<<(uint(cpu)%64)) != 0
}

// List returns the CPUs in ascending order.
func (c CPUSet) List() []int {
	out := make([]int, 0, c.Len())
	for i, w := range c.words {
		for w != 0 {
			b := bits.TrailingZeros64(w)
			out = append(out, i*64+b)
			w &^= 1 << uint(b)
		}
	}
	return out
}

// Equal reports whether both sets hold the same CPUs.
func (c CPUSet) Equal(o CPUSet) bool {
	if len(c.words) != len(o.words) {
		return false
	}
	for i := range c.words {
		if c.words[i] != o.words[i] {
			return false
		}
	}
	return true
}

// IsSubsetOf reports whether every CPU of c is in o.
func (c CPUSet) IsSubsetOf(o CPUSet) bool {
	for i, w := range c.words {
		var ow uint64
		if i < len(o.words) {
			ow = o.words[i]
		}
		if w&^ow != 0 {
			return false
		}
	}
	return true
}

// Intersects reports whether c and o share a CPU.
func (c CPUSet) Intersects(o CPUSet) bool {
	for i := 0; i < len(c.words) && i < len(o.words); i++ {
		if c.words[i]&o.words[i] != 0 {
			return true
		}
	}
	return false
}

func (c CPUSet) combine(o CPUSet, f func(a, b uint64) uint64) CPUSet {
	n := max(len(c.words), len(o.words))
	w := make([]uint64, n)
	for i := range w {
		var a, b uint64
		if i < len(c.words) {
			a = c.words[i]
		}
		if i < len(o.words) {
			b = o.words[i]
		}
		w[i] = f(a, b)
	}
	return CPUSet{words: trim(w)}
}

// Union returns c ∪ o.
func (c CPUSet) Union(o CPUSet) CPUSet {
	return c.combine(o, func(a, b uint64) uint64 { return a | b })
}

// Intersection returns c ∩ o.
func (c CPUSet) Intersection(o CPUSet) CPUSet {
	return c.combine(o, func(a, b uint64) uint64 { return a & b })
}

// Difference returns c \ o.
func (c CPUSet) Difference(o CPUSet) CPUSet {
	return c.combine(o, func(a, b uint64) uint64 { return a &^ b })
}

// String returns the canonical cpulist form, e.g. "0-3,8".
func (c CPUSet) String() string {
	var sb strings.Builder
	list := c.List()
	for i := 0; i < len(list); {
		j := i
		for j+1 < len(list) && list[j+1] == list[j]+1 {
			j++
		}
		if sb.Len() > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(strconv.Itoa(list[i]))
		if j > i {
			sb.WriteByte('-')
			sb.WriteString(strconv.Itoa(list[j]))
		}
		i = j + 1
	}
	return sb.String()
}

// MarshalText encodes the set as a cpulist.
func (c CPUSet) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText decodes a cpulist.
func (c *CPUSet) UnmarshalText(b []byte) error {
	s, err := ParseCPUList(string(b))
	if err != nil {
		return err
	}
	*c = s
	return nil
}

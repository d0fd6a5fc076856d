package telemetry

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// cpuTimes is one /proc/stat cpu line's busy and total jiffies.
type cpuTimes struct{ busy, total uint64 }

// procReader reads /proc files into reused buffers, so a sample costs a
// few reads and no allocation beyond the file contents.
type procReader struct {
	root string
	buf  []byte
}

func (p *procReader) read(name string) ([]byte, error) {
	f, err := os.Open(filepath.Join(p.root, name))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	p.buf = p.buf[:0]
	for {
		if len(p.buf) == cap(p.buf) {
			p.buf = append(p.buf, 0)[:len(p.buf)]
		}
		n, err := f.Read(p.buf[len(p.buf):cap(p.buf)])
		p.buf = p.buf[:len(p.buf)+n]
		if err != nil || n == 0 {
			break
		}
	}
	return p.buf, nil
}

// parseStat parses /proc/stat's cpu lines into the host line and one per
// CPU (indexed by CPU number; CPUs absent from the file are left zero).
// Busy is everything but idle and iowait; guest time is already in user.
func parseStat(b []byte, host *cpuTimes, cpus []cpuTimes) ([]cpuTimes, error) {
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if !bytes.HasPrefix(line, []byte("cpu")) {
			continue
		}
		f := bytes.Fields(line)
		if len(f) < 5 {
			return cpus, fmt.Errorf("/proc/stat: short line %q", line)
		}
		var t cpuTimes
		for i, v := range f[1:] {
			if i >= 8 { // guest and guest_nice are counted in user and nice
				break
			}
			n, err := strconv.ParseUint(string(v), 10, 64)
			if err != nil {
				return cpus, fmt.Errorf("/proc/stat: %q: %w", line, err)
			}
			t.total += n
			if i != 3 && i != 4 { // idle, iowait
				t.busy += n
			}
		}
		name := f[0][3:]
		if len(name) == 0 {
			*host = t
			continue
		}
		n, err := strconv.Atoi(string(name))
		if err != nil || n < 0 || n > 1<<16 {
			return cpus, fmt.Errorf("/proc/stat: cpu %q", f[0])
		}
		for len(cpus) <= n {
			cpus = append(cpus, cpuTimes{})
		}
		cpus[n] = t
	}
	return cpus, nil
}

// busyFrac is the busy share of the interval between two readings.
func busyFrac(prev, cur cpuTimes) float64 {
	if cur.total <= prev.total || cur.busy < prev.busy {
		return 0
	}
	return min(1, float64(cur.busy-prev.busy)/float64(cur.total-prev.total))
}

// parseMeminfo reads MemTotal and MemAvailable (bytes).
func parseMeminfo(b []byte) (total, avail uint64, err error) {
	found := 0
	for len(b) > 0 && found < 2 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		var dst *uint64
		switch {
		case bytes.HasPrefix(line, []byte("MemTotal:")):
			dst = &total
		case bytes.HasPrefix(line, []byte("MemAvailable:")):
			dst = &avail
		default:
			continue
		}
		f := bytes.Fields(line)
		if len(f) < 2 {
			return 0, 0, fmt.Errorf("/proc/meminfo: %q", line)
		}
		v, err := strconv.ParseUint(string(f[1]), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/meminfo: %q: %w", line, err)
		}
		*dst = v << 10 // kB
		found++
	}
	if found < 2 {
		return 0, 0, fmt.Errorf("/proc/meminfo: no MemTotal and MemAvailable")
	}
	return total, avail, nil
}

// parseSomeAvg10 reads the "some" line's avg10 of a pressure file
// (percent of wall time some task stalled, over 10 s).
func parseSomeAvg10(b []byte) (float64, error) {
	i := bytes.Index(b, []byte("some avg10="))
	if i < 0 {
		return 0, fmt.Errorf("pressure: no some avg10 in %q", b)
	}
	rest := b[i+len("some avg10="):]
	j := bytes.IndexByte(rest, ' ')
	if j < 0 {
		j = len(rest)
	}
	return strconv.ParseFloat(string(bytes.TrimSpace(rest[:j])), 64)
}

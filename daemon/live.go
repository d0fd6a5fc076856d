package daemon

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
	"github.com/fusiond/fusiond/devices/nvidia"
)

// liveLoad is the placer's live source (hostplacer.LiveSource): each GPU's
// SM and memory utilisation and power draw from the GPU driver's telemetry
// sweep, and the CPU busy share of the host and of each NUMA node since
// the previous reading, from /proc/stat's per-CPU times mapped to NUMA
// nodes through the cores the placer places on. It is deliberately small:
// the host telemetry bus replaces it as the source when it lands.
type liveLoad struct {
	telemetry func() []nvidia.Sample
	cores     func() []cgroups.Core
	statPath  string

	mu   sync.Mutex
	prev map[int]cpuTime // by CPU; -1 is the host's "cpu" line
}

// cpuTime is one CPU's busy and total jiffies.
type cpuTime struct{ busy, total uint64 }

var _ hostplacer.LiveSource = (*liveLoad)(nil)

func newLiveLoad(telemetry func() []nvidia.Sample, cores func() []cgroups.Core) *liveLoad {
	l := &liveLoad{telemetry: telemetry, cores: cores, statPath: "/proc/stat"}
	l.cpuBusy() // the first reading: busy shares are deltas from here
	return l
}

// Live implements hostplacer.LiveSource.
func (l *liveLoad) Live() hostplacer.Live {
	out := hostplacer.Live{GPUs: map[string]hostplacer.GPULive{}}
	if l.telemetry != nil {
		for _, s := range l.telemetry() {
			out.GPUs[s.UUID] = hostplacer.GPULive{SMUtil: float64(s.SMUtil) / 100, MemUtil: float64(s.MemUtil) / 100, PowerW: s.PowerW}
		}
	}
	deltas := l.cpuBusy()
	if d, ok := deltas[-1]; ok && d.total > 0 {
		out.HostBusy = float64(d.busy) / float64(d.total)
	}
	if l.cores != nil {
		per := map[int]cpuTime{}
		for _, c := range l.cores() {
			for _, cpu := range c.CPUs {
				if d, ok := deltas[cpu]; ok {
					t := per[c.Node]
					t.busy += d.busy
					t.total += d.total
					per[c.Node] = t
				}
			}
		}
		out.NUMABusy = map[int]float64{}
		for n, t := range per {
			if t.total > 0 {
				out.NUMABusy[n] = float64(t.busy) / float64(t.total)
			}
		}
	}
	return out
}

// cpuBusy reads /proc/stat and returns each CPU's busy and total jiffies
// since the previous call (-1: the host). A read error gives no deltas.
func (l *liveLoad) cpuBusy() map[int]cpuTime {
	data, err := os.ReadFile(l.statPath)
	if err != nil {
		return nil
	}
	now := parseStat(data)
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[int]cpuTime, len(now))
	for cpu, t := range now {
		if p, ok := l.prev[cpu]; ok && t.total >= p.total && t.busy >= p.busy {
			out[cpu] = cpuTime{busy: t.busy - p.busy, total: t.total - p.total}
		}
	}
	l.prev = now
	return out
}

// parseStat reads the cpu lines of /proc/stat: user nice system idle
// iowait irq softirq steal (guest time is inside user); idle and iowait
// are not busy.
func parseStat(data []byte) map[int]cpuTime {
	out := map[int]cpuTime{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 || !strings.HasPrefix(f[0], "cpu") {
			continue
		}
		cpu := -1
		if f[0] != "cpu" {
			n, err := strconv.Atoi(f[0][3:])
			if err != nil {
				continue
			}
			cpu = n
		}
		var t cpuTime
		for i, s := range f[1:min(len(f), 9)] {
			v, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				break
			}
			t.total += v
			if i != 3 && i != 4 { // idle, iowait
				t.busy += v
			}
		}
		out[cpu] = t
	}
	return out
}

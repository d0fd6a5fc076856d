package telemetry

import (
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// Reader is the bus's read side: what placement scoring, the QoS loop,
// the forecasters and the elastic controller read live load through.
// Every method is a copy under a read lock; none does I/O.
type Reader interface {
	// Latest is the newest sample; false before the second sample.
	Latest() (Sample, bool)
	// Window is the samples of the last d, oldest first.
	Window(d time.Duration) []Sample
	// HostBusy is the host's mean CPU busy fraction (0..1) over the last d.
	HostBusy(d time.Duration) (float64, bool)
	// NodeBusy is NUMA node n's mean CPU busy fraction over the last d.
	NodeBusy(node int, d time.Duration) (float64, bool)
	// GPU is one GPU's mean utilisation and power over the last d, by the
	// device ID the placer uses (the UUID).
	GPU(id string, d time.Duration) (GPU, bool)
	// Job is a job's mean usage over the last d (CPUMilli, Memory and the
	// newest PSI).
	Job(id string, d time.Duration) (JobUsage, bool)
	// JobWindow is a job's readings of the last d, oldest first.
	JobWindow(id string, d time.Duration) []JobUsage
	// History is the per-minute points, oldest first.
	History() []Point
	// Forecast is a host series' forecast Horizon ahead.
	Forecast(series string) (api.SeriesForecast, bool)
}

var _ Reader = (*Bus)(nil)

// window calls fn for each sample of the last d, oldest first, under the
// read lock.
func (b *Bus) window(d time.Duration, fn func(*Sample)) {
	if b.count == 0 {
		return
	}
	newest := b.ring[(b.next-1+len(b.ring))%len(b.ring)].At
	since := newest.Add(-d)
	for i := range b.count {
		s := &b.ring[(b.next-b.count+i+len(b.ring))%len(b.ring)]
		if s.At.After(since) {
			fn(s)
		}
	}
}

// Latest implements Reader.
func (b *Bus) Latest() (Sample, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.count == 0 {
		return Sample{}, false
	}
	return cloneSample(b.ring[(b.next-1+len(b.ring))%len(b.ring)]), true
}

// Window implements Reader.
func (b *Bus) Window(d time.Duration) []Sample {
	b.mu.RLock()
	defer b.mu.RUnlock()
	var out []Sample
	b.window(d, func(s *Sample) { out = append(out, cloneSample(*s)) })
	return out
}

func (b *Bus) mean(d time.Duration, f func(*Sample) (float64, bool)) (float64, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	var sum float64
	n := 0
	b.window(d, func(s *Sample) {
		if v, ok := f(s); ok {
			sum += v
			n++
		}
	})
	if n == 0 {
		return 0, false
	}
	return sum / float64(n), true
}

// HostBusy implements Reader.
func (b *Bus) HostBusy(d time.Duration) (float64, bool) {
	return b.mean(d, func(s *Sample) (float64, bool) { return s.CPUBusy, true })
}

// NodeBusy implements Reader.
func (b *Bus) NodeBusy(node int, d time.Duration) (float64, bool) {
	return b.mean(d, func(s *Sample) (float64, bool) {
		if node < 0 || node >= len(s.Nodes) {
			return 0, false
		}
		return s.Nodes[node], true
	})
}

// GPU implements Reader.
func (b *Bus) GPU(id string, d time.Duration) (GPU, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.gpuLocked(id, d)
}

func (b *Bus) gpuLocked(id string, d time.Duration) (GPU, bool) {
	out := GPU{ID: id}
	n := 0
	b.window(d, func(s *Sample) {
		for _, g := range s.GPUs {
			if g.ID == id {
				out.SMUtil += g.SMUtil
				out.MemUtil += g.MemUtil
				out.PowerW += g.PowerW
				out.LimitW = g.LimitW // the cap in force: the latest, not a mean
				n++
				return
			}
		}
	})
	if n == 0 {
		return GPU{}, false
	}
	out.SMUtil /= float64(n)
	out.MemUtil /= float64(n)
	out.PowerW /= float64(n)
	return out, true
}

// Job implements Reader.
func (b *Bus) Job(id string, d time.Duration) (JobUsage, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	r := b.jobs[id]
	if r == nil || r.count == 0 {
		return JobUsage{}, false
	}
	newest := r.buf[(r.next-1+len(r.buf))%len(r.buf)]
	var out JobUsage
	n := 0
	r.each(newest.At.Add(-d), func(u JobUsage) {
		out.CPUMilli += u.CPUMilli
		out.Memory += u.Memory
		n++
	})
	out.At = newest.At
	out.CPUMilli /= float64(n)
	out.Memory /= uint64(n)
	out.PSI = newest.PSI
	return out, true
}

// JobWindow implements Reader.
func (b *Bus) JobWindow(id string, d time.Duration) []JobUsage {
	b.mu.RLock()
	defer b.mu.RUnlock()
	r := b.jobs[id]
	if r == nil || r.count == 0 {
		return nil
	}
	newest := r.buf[(r.next-1+len(r.buf))%len(r.buf)]
	var out []JobUsage
	r.each(newest.At.Add(-d), func(u JobUsage) { out = append(out, u) })
	return out
}

// History implements Reader.
func (b *Bus) History() []Point {
	b.mu.RLock()
	defer b.mu.RUnlock()
	out := make([]Point, 0, b.hCount)
	for i := range b.hCount {
		out = append(out, b.history[(b.hNext-b.hCount+i+len(b.history))%len(b.history)])
	}
	return out
}

// Point is one minute of the host, the mean of its samples: what the
// forecasters run on.
type Point struct {
	At time.Time `json:"at"`
	// CPUBusy is the host's busy fraction, GPUUtil the mean SM
	// utilisation of all GPUs (percent), MemUsed bytes in use
	// (MemTotal − MemAvailable), PackageW the sum over packages.
	CPUBusy  float64 `json:"cpu_busy"`
	GPUUtil  float64 `json:"gpu_util"`
	MemUsed  float64 `json:"mem_used"`
	PackageW float64 `json:"package_w"`
	// GPUs and Packages count the GPU and RAPL readings of the minute's
	// last sample (0: the host has none).
	GPUs     int `json:"gpus"`
	Packages int `json:"packages"`
}

// minuteAcc sums samples until a minute boundary passes.
type minuteAcc struct {
	start            time.Time
	n, gpuN          int
	cpu, gpu, mem, w float64
	gpus, packages   int
}

// add adds s and returns the finished minute's point when s starts a new
// minute.
func (a *minuteAcc) add(s *Sample) *Point {
	var done *Point
	m := s.At.Truncate(time.Minute)
	if !a.start.IsZero() && !m.Equal(a.start) && a.n > 0 {
		p := Point{At: a.start, CPUBusy: a.cpu / float64(a.n), MemUsed: a.mem / float64(a.n), PackageW: a.w / float64(a.n),
			GPUs: a.gpus, Packages: a.packages}
		if a.gpuN > 0 {
			p.GPUUtil = a.gpu / float64(a.gpuN)
		}
		done = &p
		*a = minuteAcc{}
	}
	if a.start.IsZero() || done != nil {
		a.start = m
	}
	a.n++
	a.gpus, a.packages = len(s.GPUs), len(s.PackageW)
	a.cpu += s.CPUBusy
	a.mem += float64(s.MemTotal - min(s.MemAvailable, s.MemTotal))
	for _, w := range s.PackageW {
		a.w += w
	}
	for _, g := range s.GPUs {
		a.gpu += g.SMUtil
		a.gpuN++
	}
	return done
}

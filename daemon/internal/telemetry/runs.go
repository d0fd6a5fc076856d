package telemetry

import (
	"maps"
	"math"
	"slices"
	"time"

	"github.com/fusiond/fusiond/daemon/profile"
)

// GPUHold is a GPU a job holds, for attributing the GPU's readings to it:
// the device's utilisation (in milli-GPUs, 1000 = busy) up to Milli and
// its used memory up to MemMiB (0: no cap). A whole GPU is Milli 1000 and
// no cap; a share its compute share and memory cap.
type GPUHold struct {
	ID     string
	Milli  float64
	MemMiB float64
}

// RunSummary is one job attempt's usage while the bus followed it: a
// bounded sketch per resource, fed at each job reading (JobInterval).
type RunSummary struct {
	// Readings is how many job readings were folded in.
	Readings int
	// Since is the first reading's time.
	Since time.Time
	// started is the attempt's start (JobRef.Started): a reading of
	// another attempt of the job starts a new summary, and TakeRun hands
	// over only the attempt asked for.
	started               time.Time
	cpu, mem, gpu, gpuMem profile.Sketch
}

// Typical is the readings' p50 of each resource.
func (s *RunSummary) Typical() profile.Usage { return s.quantile(0.5) }

// Peak is the readings' p95 of each resource.
func (s *RunSummary) Peak() profile.Usage { return s.quantile(0.95) }

func (s *RunSummary) quantile(q float64) profile.Usage {
	return profile.Usage{CPUMilli: s.cpu.Quantile(q), MemMiB: s.mem.Quantile(q), GPUMilli: s.gpu.Quantile(q), GPUMemMiB: s.gpuMem.Quantile(q)}
}

// ended is how long a job's summary waits to be taken after the bus last
// saw the job running, and endedMax how many such summaries it keeps
// (the oldest goes first).
const (
	endedKeep = 10 * time.Minute
	endedMax  = 1024
)

type endedRun struct {
	s  *RunSummary
	at time.Time
}

// addRun folds one job reading into its attempt's summary (the sampler's
// goroutine, under b.mu). gpus is the sample's GPU readings. A summary of
// an earlier attempt of the job (one that ended without being taken: it
// was preempted, moved or cancelled, and restarted before the bus saw it
// gone) is dropped, not mixed into the new attempt's.
func (b *Bus) addRun(j JobRef, u JobUsage, gpus []GPU) {
	s := b.runs[j.ID]
	if s == nil || !s.started.Equal(j.Started) {
		s = &RunSummary{Since: u.At, started: j.Started}
		b.runs[j.ID] = s
	}
	if e, ok := b.ended[j.ID]; ok && !e.s.started.Equal(j.Started) {
		delete(b.ended, j.ID) // an earlier attempt's, never to be taken
	}
	s.Readings++
	s.cpu.Add(u.CPUMilli)
	s.mem.Add(float64(u.Memory) / (1 << 20))
	var util, mem float64
	for _, h := range j.GPUs {
		for _, g := range gpus {
			if g.ID != h.ID {
				continue
			}
			util += math.Min(g.SMUtil*10, h.Milli)
			m := g.MemUsedMiB
			if h.MemMiB > 0 {
				m = math.Min(m, h.MemMiB)
			}
			mem += m
		}
	}
	s.gpu.Add(util)
	s.gpuMem.Add(mem)
}

// endRuns moves the summaries of jobs no longer running to the ended
// ones, and forgets ended ones older than endedKeep or beyond endedMax
// (under b.mu).
func (b *Bus) endRuns(seen map[string]bool, now time.Time) {
	for id, s := range b.runs {
		if !seen[id] {
			delete(b.runs, id)
			b.ended[id] = endedRun{s: s, at: now}
		}
	}
	for id, e := range b.ended {
		if now.Sub(e.at) > endedKeep {
			delete(b.ended, id)
		}
	}
	if extra := len(b.ended) - endedMax; extra > 0 {
		ids := slices.Collect(maps.Keys(b.ended))
		slices.SortFunc(ids, func(x, y string) int { return b.ended[x].at.Compare(b.ended[y].at) })
		for _, id := range ids[:extra] {
			delete(b.ended, id)
		}
	}
}

// TakeRun hands over and forgets job id's summary of its attempt that
// started at started (JobRef.Started): while it runs, or for a while (10
// minutes) after the bus saw it end. False when the bus has none of that
// attempt (it never read it: too short, not followed, no cgroup; or what
// it holds is another attempt's, which is left alone).
func (b *Bus) TakeRun(id string, started time.Time) (RunSummary, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.runs[id]; s != nil && s.started.Equal(started) {
		delete(b.runs, id)
		return *s, true
	}
	if e, ok := b.ended[id]; ok && e.s.started.Equal(started) {
		delete(b.ended, id)
		return *e.s, true
	}
	return RunSummary{}, false
}

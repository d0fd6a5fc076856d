package ebpf

import (
	"math"
	"time"
)

// Buckets is the number of log2 buckets of a Histogram.
const Buckets = 32

// Histogram is run-queue latency in log2 buckets: Buckets[i] counts
// latencies in [2^i, 2^(i+1)) ns (Buckets[0] holds [0, 2) ns; the last
// bucket everything from 2^31 ns up).
type Histogram struct {
	Buckets     [Buckets]uint64 `json:"buckets"`
	Count       uint64          `json:"count"`
	SumNs       uint64          `json:"sum_ns"`
	Preemptions uint64          `json:"preemptions"`
	PreemptNs   uint64          `json:"preempt_ns"`
	// BlameNs is the waits charged to whoever held the CPU meanwhile, by
	// Runner: it sums to SumNs but for the clocks' read races (a few per
	// mille) and the waits that began before the probe saw the CPU's
	// first switch.
	BlameNs [Runners]uint64 `json:"blame_ns"`
}

// Runner is a class of task that holds a CPU while a timed task waits.
type Runner int

// The runner classes, in the probe's numbering: the CPU idle (a wake-up
// that waited for an idle CPU to wake), each fusiond tier (numbers 1-3,
// as qos.TierNumber gives them), a fusiond job of no tier (4), a task of
// no registered cgroup (outside fusiond: system services, other cgroups)
// and kernel threads (softirq work in ksoftirqd, kworkers, migration).
const (
	RunnerIdle Runner = iota
	RunnerGuaranteed
	RunnerBurstable
	RunnerBestEffort
	RunnerOtherJob
	RunnerOutside
	RunnerKernel
	Runners int = iota
)

var runnerNames = [Runners]string{"idle", "guaranteed", "burstable", "besteffort", "job", "outside", "kernel"}

// String is the runner's name as the API and metrics spell it.
func (r Runner) String() string {
	if r < 0 || int(r) >= Runners {
		return "unknown"
	}
	return runnerNames[r]
}

// Sub returns h minus an earlier snapshot of the same cumulative
// histogram: the events between the two.
func (h Histogram) Sub(prev Histogram) Histogram {
	var d Histogram
	for i := range h.Buckets {
		d.Buckets[i] = h.Buckets[i] - prev.Buckets[i]
	}
	d.Count = h.Count - prev.Count
	d.SumNs = h.SumNs - prev.SumNs
	d.Preemptions = h.Preemptions - prev.Preemptions
	d.PreemptNs = h.PreemptNs - prev.PreemptNs
	for i := range h.BlameNs {
		d.BlameNs[i] = h.BlameNs[i] - prev.BlameNs[i]
	}
	return d
}

// BucketLow is the lower bound of bucket i in ns.
func BucketLow(i int) uint64 {
	if i == 0 {
		return 0
	}
	return 1 << i
}

// Quantile estimates the q-quantile (0 < q ≤ 1) by linear interpolation
// inside the bucket that holds it; 0 when the histogram is empty.
func (h Histogram) Quantile(q float64) time.Duration {
	var total uint64
	for _, n := range h.Buckets {
		total += n
	}
	if total == 0 {
		return 0
	}
	rank := q * float64(total)
	var cum float64
	for i, n := range h.Buckets {
		if n == 0 {
			continue
		}
		if cum+float64(n) >= rank {
			lo, hi := float64(BucketLow(i)), float64(uint64(1)<<(i+1))
			frac := (rank - cum) / float64(n)
			return time.Duration(math.Round(lo + frac*(hi-lo)))
		}
		cum += float64(n)
	}
	return time.Duration(uint64(1) << Buckets)
}

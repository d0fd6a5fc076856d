package deviceplugin

import (
	"math"
	"slices"
	"sync"
	"time"
)

// latencyWindow is how many recent calls the percentiles are taken over.
const latencyWindow = 1024

// Stats are the plugin's counters, for the daemon's status and metrics.
type Stats struct {
	// Allocate and Preferred are kubelet's Allocate and
	// GetPreferredAllocation calls, over every resource.
	Allocate  Latency
	Preferred Latency
	// Resources is the number of resources served now; Registered how
	// many of them kubelet has accepted since it last started.
	Resources  int
	Registered int
	// Registrations counts the successful registrations with kubelet
	// (each resource, each time kubelet restarted).
	Registrations uint64
	// PodResourcesUp says whether kubelet's pod-resources API answered
	// the last reconcile.
	PodResourcesUp bool
	// Binds and Releases count the holds the reconcile loop bound to a
	// pod and released.
	Binds    uint64
	Releases uint64
}

// Latency is the count and duration of one kind of call.
type Latency struct {
	// Count and Errors count the calls since the plugin started; Errors
	// those that returned an error. Invalid counts the
	// GetPreferredAllocation answers of the daemon that were not valid,
	// Unanswered the containers it could not choose for (kubelet was
	// given no preference instead, either way).
	Count      uint64
	Errors     uint64
	Invalid    uint64
	Unanswered uint64
	// P50, P99 and Max are taken over the last (at most 1024) calls; zero
	// before the first.
	P50 time.Duration
	P99 time.Duration
	Max time.Duration
}

// latencies records the durations of one kind of call in a bounded ring.
type latencies struct {
	mu         sync.Mutex
	count      uint64
	errors     uint64
	invalid    uint64
	unanswered uint64
	ring       [latencyWindow]time.Duration
}

func (l *latencies) recordInvalid() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.invalid++
}

// recordUnanswered counts a call the daemon could not answer (kubelet was
// given no preference).
func (l *latencies) recordUnanswered() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unanswered++
}

func (l *latencies) record(d time.Duration, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ring[l.count%latencyWindow] = d
	l.count++
	if err != nil {
		l.errors++
	}
}

func (l *latencies) stats() Latency {
	l.mu.Lock()
	n := min(l.count, latencyWindow)
	recent := slices.Clone(l.ring[:n])
	s := Latency{Count: l.count, Errors: l.errors, Invalid: l.invalid, Unanswered: l.unanswered}
	l.mu.Unlock()
	if n == 0 {
		return s
	}
	slices.Sort(recent)
	s.P50, s.P99, s.Max = rank(recent, 0.50), rank(recent, 0.99), recent[n-1]
	return s
}

// rank is the nearest-rank q-quantile of sorted, which is not empty.
func rank(sorted []time.Duration, q float64) time.Duration {
	k := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(k, len(sorted)-1))]
}

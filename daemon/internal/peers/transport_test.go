package peers

import (
	"encoding/binary"
	"net"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestGossipFloodBounded: 100 TCP streams of 20 MiB each to the gossip
// port, from someone with neither key nor certificate, each claiming an
// encrypted push/pull of just under memberlist's 20 MiB limit (which it
// would buffer whole before decrypting), leave the daemon's heap within
// a few stream limits of where it was; the streams beyond the limits are
// refused or cut, and the member keeps gossiping with a real peer.
func TestGossipFloodBounded(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", &fakeHost{cpu: 1000}, []string{key('k')})
	// The peak measures what the flood keeps live, not when the
	// collector last ran: a busy machine lets garbage pile up between
	// collections otherwise (the default GOGC doubles the heap first).
	defer debug.SetGCPercent(debug.SetGCPercent(20))
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	var peak atomic.Uint64
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
			select {
			case <-stopSampling:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	const streams, size = 100, 20 << 20
	chunk := make([]byte, 64<<10)
	var sent atomic.Int64
	var wg sync.WaitGroup
	for range streams {
		wg.Go(func() {
			conn, err := net.DialTimeout("tcp", a.GossipAddr(), 2*time.Second)
			if err != nil {
				return
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(15 * time.Second))
			hdr := []byte{10, 0, 0, 0, 0} // encryptMsg, then its length
			binary.BigEndian.PutUint32(hdr[1:], size-1)
			if _, err := conn.Write(hdr); err != nil {
				return
			}
			for n := 0; n < size; n += len(chunk) {
				w, err := conn.Write(chunk)
				sent.Add(int64(w))
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	close(stopSampling)
	<-sampled
	refused, _, cut := a.wire.Dropped()
	grew := int64(peak.Load()) - int64(base)
	t.Logf("FIGURE gossip flood: %d streams of 20 MiB, %d MiB sent, %d refused at once, %d cut at %d MiB; peak heap +%d MiB",
		streams, sent.Load()>>20, refused, cut, DefaultGossipLimits.StreamBytes>>20, grew>>20)
	if bound := int64(DefaultGossipLimits.StreamsPerSource) * 4 * DefaultGossipLimits.StreamBytes; grew > bound {
		t.Errorf("the flood grew the heap by %d MiB, more than %d MiB (the streams one source may hold, buffered)", grew>>20, bound>>20)
	}
	if refused+cut < streams-uint64(DefaultGossipLimits.StreamsPerSource) {
		t.Errorf("%d streams refused and %d cut of %d", refused, cut, streams)
	}
	// Still a member in good standing: a real peer joins and is seen.
	c.start("b", &fakeHost{cpu: 2000}, []string{key('k')}, a.GossipAddr())
	eventually(t, "b seen by a after the flood", func() bool { return len(loads(a)) == 2 })
}

package peers

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// GossipLimits bound what the gossip port takes from anyone, before
// memberlist decodes (or decrypts) a byte of it: a stream is read up to
// StreamBytes within StreamTime, at most Streams at once and
// StreamsPerSource from one address; packets beyond PacketsPerSecond
// from one address (a burst of twice that) are dropped. No key or
// certificate is needed to reach the port, so these hold for strangers
// too: 100 streams of 20 MiB no longer take the daemon's memory.
type GossipLimits struct {
	StreamBytes      int64
	StreamTime       time.Duration
	Streams          int
	StreamsPerSource int
	PacketsPerSecond float64
}

// DefaultGossipLimits fit the largest push/pull state this daemon sends
// (maxStateLoads loads of maxLoadBytes, and memberlist's node list) with
// room, and a cluster of thousands pulling every 30 s.
var DefaultGossipLimits = GossipLimits{
	StreamBytes:      6 << 20,
	StreamTime:       10 * time.Second,
	Streams:          16,
	StreamsPerSource: 2,
	PacketsPerSecond: 500,
}

func (g GossipLimits) withDefaults() GossipLimits {
	d := DefaultGossipLimits
	if g.StreamBytes <= 0 {
		g.StreamBytes = d.StreamBytes
	}
	if g.StreamTime <= 0 {
		g.StreamTime = d.StreamTime
	}
	if g.Streams <= 0 {
		g.Streams = d.Streams
	}
	if g.StreamsPerSource <= 0 {
		g.StreamsPerSource = d.StreamsPerSource
	}
	if g.PacketsPerSecond <= 0 {
		g.PacketsPerSecond = d.PacketsPerSecond
	}
	return g
}

// boundedTransport is memberlist's own TCP/UDP transport with
// GossipLimits applied to what arrives.
type boundedTransport struct {
	*memberlist.NetTransport
	lim      GossipLimits
	log      *slog.Logger
	streamCh chan net.Conn
	packetCh chan *memberlist.Packet
	stop     chan struct{}
	wg       sync.WaitGroup

	mu      sync.Mutex
	streams int
	bySrc   map[string]int
	packets keyedBuckets // per source address
	dropped struct{ streams, packets, bytes uint64 }
}

// newBoundedTransport opens memberlist's transport on addr:port (port 0:
// any; Port says which) and bounds it.
func newBoundedTransport(addr string, port int, lim GossipLimits, log *slog.Logger) (*boundedTransport, error) {
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{addr}, BindPort: port,
		Logger: slog.NewLogLogger(log.Handler(), slog.LevelDebug)})
	if err != nil {
		return nil, fmt.Errorf("gossip transport: %w", err)
	}
	t := &boundedTransport{NetTransport: nt, lim: lim.withDefaults(), log: log,
		streamCh: make(chan net.Conn), packetCh: make(chan *memberlist.Packet),
		stop: make(chan struct{}), bySrc: map[string]int{}}
	t.packets = keyedBuckets{rate: t.lim.PacketsPerSecond, burst: 2 * t.lim.PacketsPerSecond, max: 4096}
	t.wg.Add(2)
	go t.admitStreams()
	go t.admitPackets()
	return t, nil
}

// Port is the port bound.
func (t *boundedTransport) Port() int { return t.GetAutoBindPort() }

func (t *boundedTransport) StreamCh() <-chan net.Conn { return t.streamCh }

func (t *boundedTransport) PacketCh() <-chan *memberlist.Packet { return t.packetCh }

// Shutdown stops the listeners, then the admission goroutines.
func (t *boundedTransport) Shutdown() error {
	err := t.NetTransport.Shutdown()
	close(t.stop)
	t.wg.Wait()
	return err
}

func source(a net.Addr) string {
	if host, _, err := net.SplitHostPort(a.String()); err == nil {
		return host
	}
	return a.String()
}

func (t *boundedTransport) admitStreams() {
	defer t.wg.Done()
	for {
		var c net.Conn
		select {
		case <-t.stop:
			return
		case c = <-t.NetTransport.StreamCh():
		}
		src := source(c.RemoteAddr())
		t.mu.Lock()
		over := t.streams >= t.lim.Streams || t.bySrc[src] >= t.lim.StreamsPerSource
		if over {
			t.dropped.streams++
		} else {
			t.streams++
			t.bySrc[src]++
		}
		t.mu.Unlock()
		if over {
			c.Close()
			continue
		}
		deadline := time.Now().Add(t.lim.StreamTime)
		c.SetDeadline(deadline)
		bc := &boundedConn{Conn: c, left: t.lim.StreamBytes, deadline: deadline, t: t, src: src}
		select {
		case t.streamCh <- bc:
		case <-t.stop:
			bc.Close()
			return
		}
	}
}

func (t *boundedTransport) admitPackets() {
	defer t.wg.Done()
	for {
		var p *memberlist.Packet
		select {
		case <-t.stop:
			return
		case p = <-t.NetTransport.PacketCh():
		}
		if !t.allowPacket(source(p.From), p.Timestamp) {
			continue
		}
		select {
		case t.packetCh <- p:
		case <-t.stop:
			return
		}
	}
}

// allowPacket takes a token from src's packet allowance (a burst of two
// seconds' worth), for at most 4,096 sources at once.
func (t *boundedTransport) allowPacket(src string, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.packets.take(src, now) {
		t.dropped.packets++
		return false
	}
	return true
}

func (t *boundedTransport) release(src string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.streams--
	if t.bySrc[src]--; t.bySrc[src] <= 0 {
		delete(t.bySrc, src)
	}
}

// Dropped counts the streams and packets refused and the streams cut at
// their byte limit since the start.
func (t *boundedTransport) Dropped() (streams, packets, cut uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dropped.streams, t.dropped.packets, t.dropped.bytes
}

// errStreamTooLarge ends a stream past GossipLimits.StreamBytes.
var errStreamTooLarge = errors.New("gossip stream over its byte limit")

// boundedConn is an admitted stream: its reads stop at its byte limit,
// no deadline memberlist sets reaches past its own, and closing it gives
// its place back.
type boundedConn struct {
	net.Conn
	left     int64
	deadline time.Time
	t        *boundedTransport
	src      string
	cut      bool
	once     sync.Once
}

func (c *boundedConn) Read(p []byte) (int, error) {
	if c.left <= 0 {
		if !c.cut {
			c.cut = true
			c.t.mu.Lock()
			c.t.dropped.bytes++
			c.t.mu.Unlock()
		}
		return 0, errStreamTooLarge
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.Conn.Read(p)
	c.left -= int64(n)
	return n, err
}

func (c *boundedConn) SetDeadline(d time.Time) error {
	return c.Conn.SetDeadline(earliest(d, c.deadline))
}

func (c *boundedConn) SetReadDeadline(d time.Time) error {
	return c.Conn.SetReadDeadline(earliest(d, c.deadline))
}

func (c *boundedConn) SetWriteDeadline(d time.Time) error {
	return c.Conn.SetWriteDeadline(earliest(d, c.deadline))
}

func earliest(d, limit time.Time) time.Time {
	if d.IsZero() || d.After(limit) {
		return limit
	}
	return d
}

func (c *boundedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.t.release(c.src) })
	return err
}

// Package peers owns this daemon's place among its peers: membership over
// hashicorp/memberlist (join list or DNS seed, LAN/WAN profiles, an
// encrypted gossip keyring), the load each daemon gossips (free resources
// per device class, queue, health) with the age of every peer's view, the
// peer API over mutual TLS, and the hand-over of jobs that do not fit here
// or fit poorly (it implements handover.Overflow and handover.Ranker for the
// origin and serves offers, polls and cancels for the peers' jobs; every
// offer's answer carries this node's signed load). It is the only importer of memberlist.
package peers

import (
	"context"
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/handover"
	"github.com/fusiond/fusiond/daemon/sched"
)

// Config is the membership and peer API's configuration (the daemon's
// peers section).
type Config struct {
	// NodeName is this daemon's name among its peers (and the DNS name its
	// peer certificate must carry).
	NodeName string
	// Gossip is the memberlist address (host:port, port 0: any) bound for
	// UDP and TCP; AdvertiseGossip, when set, is what peers are told.
	Gossip          string
	AdvertiseGossip string
	// API is the peer API's TLS address; AdvertiseAPI what peers dial.
	API          string
	AdvertiseAPI string
	// Join lists gossip addresses of peers to join; DNSSeed is a
	// host:port whose name resolves to more of them.
	Join    []string
	DNSSeed string
	// Profile is lan, wan or local (memberlist's timing presets).
	Profile string
	// KeyringFile holds the gossip encryption keys. "" is refused unless
	// InsecureGossip is set (then gossip is plain, with a warning).
	KeyringFile    string
	InsecureGossip bool
	// GossipLimits bound what the gossip port takes from anyone (zero
	// fields: DefaultGossipLimits).
	GossipLimits GossipLimits
	// CertFile, KeyFile and CAFile are the peer API's mutual TLS.
	CertFile, KeyFile, CAFile string
	// Broadcast is how often at most this daemon gossips its load: when it
	// changed (looked at ten times per interval), and every 5 intervals
	// regardless.
	Broadcast time.Duration
	// Lease is how long a job handed over here runs without a poll from
	// its origin before it is stopped.
	Lease time.Duration
	// MaxLoadAge: a peer whose load is older is not offered jobs.
	MaxLoadAge time.Duration
	// MaxGangHold is the most this host keeps another host's gang member
	// placed and not started: the hold it grants before the commit, and
	// the start barrier after it (0: a minute, the most any peer grants).
	MaxGangHold time.Duration
	// Profiles are the placement engine's class profiles peers are
	// ranked with (nil: the engine's defaults), as the placer's.
	Profiles sched.Profiles
	// OfferRate and OfferBurst bound each peer's offers (a token
	// bucket; 0: no bound); MaxOfferBytes an offer's body (maxBody when
	// 0).
	OfferRate     float64
	OfferBurst    int
	MaxOfferBytes int64
	// Audit records the peer API's requests (optional).
	Audit Auditor

	// model is nil in the daemon. BenchmarkModelledConvergence sets it
	// to run many members in one process over a modelled network.
	model *modelled
}

// modelled replaces, for a benchmark, the two things that tie a member
// to real sockets: config gets the memberlist config before it is used
// (it sets the transport and may slow the timing), and key stands in for
// the mutual-TLS handshake that fetches a member's signing key
// (fetchKey). Everything else (gossip, NotifyMsg, merge with the
// signature check, relay) runs as in the daemon.
type modelled struct {
	config func(*memberlist.Config)
	key    func(name string) (crypto.PublicKey, error)
}

// Node is this daemon as a member.
type Node struct {
	cfg  Config
	log  *slog.Logger
	jobs Jobs
	host Host

	ml *memberlist.Memberlist
	// wire is the bounded transport under ml.
	wire    *boundedTransport
	keyring *memberlist.Keyring
	// queue holds the loads that changed (what a member held of that
	// node before differs); arrivals a node's first load held here
	// (nothing to differ from: a member joining, or one new to this
	// node); refresh the same load again (a heartbeat). Gossip takes
	// changes first, then arrivals, and fills what room is left with
	// refreshes, sent half as many times: a change never waits behind
	// heartbeats, nor behind a join burst's thousand first loads, within
	// the same packets per round.
	queue, arrivals, refresh *memberlist.TransmitLimitedQueue
	// lastBroadcast is this host's load as last gossiped (under mu).
	lastBroadcast *api.PeerLoad

	srvTLS *http.Server
	ln     net.Listener
	// transport is the peer API client's; clients holds one client per
	// peer, each checking that peer's name in its certificate.
	transport *http.Transport
	clients   map[string]*http.Client
	api       string // advertised peer API address

	// signer is the peer certificate's private key: it signs this
	// node's loads (sign.go).
	signer crypto.Signer

	// spreadRand, when set (tests), gives the spread choice of offers its
	// randomness (offerRand).
	spreadRand func() *rand.Rand

	// n.mu is never held while calling memberlist (which calls the
	// delegates under its own lock).
	mu sync.Mutex
	// view: the newest verified load of each member (and this node's
	// own), pruned with the member.
	view map[string]*peerView
	// members: memberlist's members as its events told (at most
	// maxMembers; kept a grace after they left); keys: each member's
	// verified signing key; tried: when its key was last asked for;
	// pending: a member's newest load waiting for its key. Only members
	// have entries, so none grows with names a peer makes up.
	members map[string]*member
	keys    map[string]crypto.PublicKey
	tried   map[string]time.Time
	pending map[string]signedLoad
	want    chan string
	dropped dropCounts
	// leases: last poll (monotonic) per hand-over key accepted here.
	leases map[string]time.Time
	// expired: keys whose lease ended, with when (stopped once; kept so
	// that polls after a healed partition say why the job stopped). An
	// origin polls no longer than 2 × lease + cancel_grace without an
	// answer, so a key is forgotten after expiredKeep (or, beyond
	// maxExpired keys, the oldest first): a poll after that finds the job
	// cancelled without saying why.
	expired map[string]time.Time
	seq     uint64

	// trust gates each calling peer (trust.go).
	trust trust

	sent    atomic.Int64
	started time.Time

	stop chan struct{}
	wg   sync.WaitGroup
}

type peerView struct {
	msg loadMsg
	// raw is the signed envelope, pushed on as it came.
	raw      []byte
	received time.Time
	// kind: what the load was to the view it replaced, and so the queue
	// it is relayed on.
	kind loadKind
}

// loadKind is what a load is to the view of its node held before it.
type loadKind uint8

const (
	refreshed loadKind = iota // the same load again (a heartbeat)
	changed                   // it differs from the load held
	arrived                   // the first load held of its node
)

// kindOf is what load l is to old, the view held before it (nil: none).
func kindOf(old *peerView, l api.PeerLoad) loadKind {
	switch {
	case old == nil:
		return arrived
	case !sameLoad(old.msg.Load, l):
		return changed
	}
	return refreshed
}

const (
	expiredKeep = time.Hour
	maxExpired  = 4096
	// maxClients bounds the peer API clients kept (one per peer name).
	maxClients = 1024
)

// New binds the gossip and peer API addresses and creates the member;
// Start joins the peers.
func New(cfg Config, j Jobs, h Host, log *slog.Logger) (_ *Node, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Broadcast <= 0 {
		cfg.Broadcast = time.Second
	}
	if cfg.Lease <= 0 {
		cfg.Lease = 10 * time.Second
	}
	if cfg.MaxLoadAge <= 0 {
		cfg.MaxLoadAge = 15 * cfg.Broadcast // three missed heartbeats
	}
	if !validName(cfg.NodeName) {
		return nil, fmt.Errorf("peers.node_name %q: want a DNS name (letters, digits, '-', '.', '_'; at most %d bytes), as the peer certificate carries it", cfg.NodeName, maxNodeName)
	}
	n := &Node{cfg: cfg, log: log.With("part", "peers"), jobs: j, host: h,
		view: map[string]*peerView{}, leases: map[string]time.Time{}, expired: map[string]time.Time{}, clients: map[string]*http.Client{},
		members: map[string]*member{}, keys: map[string]crypto.PublicKey{}, tried: map[string]time.Time{},
		pending: map[string]signedLoad{}, want: make(chan string, 256),
		seq: uint64(time.Now().UnixNano()), started: time.Now(), stop: make(chan struct{})}
	n.trust.offers = keyedBuckets{rate: cfg.OfferRate, burst: max(float64(cfg.OfferBurst), 1), max: maxMembers}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	srvTLS, cliTLS, err := tlsConfigs(cfg.CertFile, cfg.KeyFile, cfg.CAFile)
	if err != nil {
		return nil, err
	}
	if n.signer, err = signerOf(srvTLS); err != nil {
		return nil, err
	}
	if n.ln, err = net.Listen("tcp", cfg.API); err != nil {
		return nil, fmt.Errorf("peer API: %w", err)
	}
	n.api = cfg.AdvertiseAPI
	if n.api == "" {
		n.api = n.ln.Addr().String()
	}
	n.transport = &http.Transport{TLSClientConfig: cliTLS, MaxIdleConnsPerHost: 4, IdleConnTimeout: time.Minute}
	n.srvTLS = &http.Server{Handler: n.handler(), TLSConfig: srvTLS, ReadHeaderTimeout: 5 * time.Second,
		ErrorLog: slog.NewLogLogger(n.log.Handler(), slog.LevelDebug)}

	mc, err := memberlistConfig(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.KeyringFile != "" {
		keys, err := readKeyring(cfg.KeyringFile)
		if err != nil {
			return nil, err
		}
		if n.keyring, err = memberlist.NewKeyring(keys, keys[0]); err != nil {
			return nil, fmt.Errorf("gossip keyring: %w", err)
		}
		mc.Keyring = n.keyring
	} else if cfg.InsecureGossip {
		n.log.Warn("gossip is NOT encrypted (peers.insecure_gossip: true): anyone who reaches the gossip port can join and read every load; loads stay signed")
	} else {
		return nil, errors.New("gossip keyring: set peers.keyring_file (fusionctl peers keygen makes a key), or peers.insecure_gossip: true to gossip unencrypted")
	}
	mc.Delegate = n
	mc.Events = n
	mc.Logger = slog.NewLogLogger(n.log.Handler(), slog.LevelDebug)
	members := func() int {
		if n.ml == nil {
			return 1
		}
		return n.ml.NumMembers()
	}
	n.queue = &memberlist.TransmitLimitedQueue{RetransmitMult: mc.RetransmitMult, NumNodes: members}
	n.arrivals = &memberlist.TransmitLimitedQueue{RetransmitMult: mc.RetransmitMult, NumNodes: members}
	n.refresh = &memberlist.TransmitLimitedQueue{RetransmitMult: max(mc.RetransmitMult/2, 1), NumNodes: members}
	if cfg.model != nil {
		cfg.model.config(mc)
		if n.ml, err = memberlist.Create(mc); err != nil {
			return nil, fmt.Errorf("gossip: %w", err)
		}
		return n, nil
	}
	// The gossip port's own transport, bounded before anything is decoded.
	tr, err := newBoundedTransport(mc.BindAddr, mc.BindPort, cfg.GossipLimits, n.log.With("component", "gossip"))
	if err != nil {
		return nil, err
	}
	if mc.BindPort == 0 {
		mc.BindPort = tr.Port()
		if cfg.AdvertiseGossip == "" {
			mc.AdvertisePort = tr.Port()
		}
	}
	mc.Transport = tr
	n.wire = tr
	if n.ml, err = memberlist.Create(mc); err != nil {
		tr.Shutdown()
		return nil, fmt.Errorf("gossip: %w", err)
	}
	return n, nil
}

func memberlistConfig(cfg Config) (*memberlist.Config, error) {
	var mc *memberlist.Config
	switch cfg.Profile {
	case "", "lan":
		mc = memberlist.DefaultLANConfig()
	case "wan":
		mc = memberlist.DefaultWANConfig()
	case "local":
		mc = memberlist.DefaultLocalConfig()
	default:
		return nil, fmt.Errorf("peers.profile: want lan, wan or local, got %q", cfg.Profile)
	}
	mc.Name = cfg.NodeName
	host, port, err := splitPort(cfg.Gossip)
	if err != nil {
		return nil, fmt.Errorf("peers.gossip: %w", err)
	}
	mc.BindAddr, mc.BindPort = host, port
	mc.AdvertisePort = port
	if cfg.AdvertiseGossip != "" {
		if mc.AdvertiseAddr, mc.AdvertisePort, err = splitPort(cfg.AdvertiseGossip); err != nil {
			return nil, fmt.Errorf("peers.advertise_gossip: %w", err)
		}
	}
	return mc, nil
}

func splitPort(hostport string) (string, int, error) {
	host, p, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("bad port %q", p)
	}
	return host, int(port), nil
}

// GossipAddr is the gossip address peers reach this member at.
func (n *Node) GossipAddr() string {
	ln := n.ml.LocalNode()
	return net.JoinHostPort(ln.Addr.String(), strconv.Itoa(int(ln.Port)))
}

// APIAddr is the advertised peer API address.
func (n *Node) APIAddr() string { return n.api }

// Start serves the peer API, joins the configured peers (retrying while
// alone) and starts gossiping the load.
func (n *Node) Start() {
	n.wg.Add(6)
	go func() {
		defer n.wg.Done()
		if err := n.srvTLS.ServeTLS(n.ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("peer API stopped", "err", err)
		}
	}()
	go n.joinLoop()
	go n.broadcastLoop()
	go n.every(max(n.cfg.Lease/4, 50*time.Millisecond), n.checkLeases)
	go n.keyLoop()
	// The maps peers can grow stay bounded.
	go n.every(max(n.cfg.Broadcast, 50*time.Millisecond), func() { n.prune(time.Now()) })
}

// Close leaves the peers and stops the peer API.
// StopServing stops taking peer API requests (offers, polls, commits,
// starts, cancels), waiting up to ctx for those in flight, so nothing a
// peer asks reaches a job manager that is stopping. Gossip and the client
// side (this daemon's polls and cancels of its jobs on peers) go on until
// Close.
func (n *Node) StopServing(ctx context.Context) error {
	if n.srvTLS == nil {
		return nil
	}
	return n.srvTLS.Shutdown(ctx)
}

func (n *Node) Close() {
	select {
	case <-n.stop:
		return
	default:
		close(n.stop)
	}
	if n.ml != nil {
		_ = n.ml.Leave(time.Second)
		_ = n.ml.Shutdown()
	}
	if n.srvTLS != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = n.srvTLS.Shutdown(ctx)
		cancel()
	}
	if n.ln != nil {
		n.ln.Close()
	}
	if n.transport != nil {
		n.transport.CloseIdleConnections()
	}
	n.mu.Lock()
	for _, c := range n.clients {
		c.CloseIdleConnections()
	}
	n.mu.Unlock()
	n.wg.Wait()
}

// seeds are the join list and the DNS seed's addresses.
func (n *Node) seeds() []string {
	out := slices.Clone(n.cfg.Join)
	if n.cfg.DNSSeed != "" {
		host, port, err := net.SplitHostPort(n.cfg.DNSSeed)
		if err == nil {
			addrs, err := net.DefaultResolver.LookupHost(context.Background(), host)
			if err != nil {
				n.log.Warn("DNS seed", "seed", n.cfg.DNSSeed, "err", err)
			}
			for _, a := range addrs {
				out = append(out, net.JoinHostPort(a, port))
			}
		}
	}
	self := n.GossipAddr()
	return slices.DeleteFunc(out, func(s string) bool { return s == self })
}

func (n *Node) joinLoop() {
	defer n.wg.Done()
	wait := time.Duration(0)
	for {
		select {
		case <-n.stop:
			return
		case <-time.After(wait):
		}
		wait = 5 * time.Second
		if n.ml.NumMembers() > 1 {
			continue
		}
		seeds := n.seeds()
		if len(seeds) == 0 {
			continue
		}
		joined, err := n.ml.Join(seeds)
		if err != nil {
			n.log.Warn("joining peers", "seeds", seeds, "joined", joined, "err", err)
			continue
		}
		n.log.Info("joined peers", "contacted", joined, "members", n.ml.NumMembers())
	}
}

// broadcastLoop gossips this host's load when it changed, at most once
// per Broadcast interval, and every 5 intervals regardless (so peers'
// views stay fresh). It looks at the load ten times per interval, so a
// change after a quiet interval goes out within a tenth of it instead of
// waiting for the next interval; a change within an interval of the last
// message goes out when the interval has passed. Gossiping only changes,
// at most one per interval, keeps a large quiet cluster within
// memberlist's gossip budget (GossipNodes packets per GossipInterval),
// where every load change of every member must be relayed.
func (n *Node) broadcastLoop() {
	defer n.wg.Done()
	t := time.NewTicker(max(n.cfg.Broadcast/10, 5*time.Millisecond))
	defer t.Stop()
	var last api.PeerLoad
	var lastSent time.Time
	for {
		l := localLoad(n.host, n.jobs)
		since := time.Since(lastSent)
		if lastSent.IsZero() || since >= 5*n.cfg.Broadcast || since >= n.cfg.Broadcast && !sameLoad(l, last) {
			n.gossip(l)
			last, lastSent = l, time.Now()
		}
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
	}
}

// sameLoad compares loads, the predicted wait to the second.
func sameLoad(a, b api.PeerLoad) bool {
	a.Wait, b.Wait = a.Wait/api.Duration(time.Second), b.Wait/api.Duration(time.Second)
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// gossip broadcasts this host's load l: as a change when it differs from
// the load last broadcast (not from the own view, which an offer's answer
// may have sealed since: the cluster has not heard that one), else as a
// refresh.
func (n *Node) gossip(l api.PeerLoad) {
	b, err := n.seal(l)
	if err != nil {
		n.log.Warn("encoding this host's load", "err", err)
		return
	}
	n.mu.Lock()
	kind := arrived
	if n.lastBroadcast != nil {
		kind = changed
		if sameLoad(*n.lastBroadcast, l) {
			kind = refreshed
		}
	}
	n.lastBroadcast = &l
	n.mu.Unlock()
	n.queueFor(kind).QueueBroadcast(&broadcast{node: n.cfg.NodeName, msg: b})
}

// seal makes this host's load l a load message: clamped to the gossip's
// bounds, numbered next in this node's sequence and signed, kept as this
// node's own view (what push/pull passes on). Both the gossip and the
// offer answers (serveOffer) carry what it makes.
func (n *Node) seal(l api.PeerLoad) ([]byte, error) {
	msg := loadMsg{Node: n.cfg.NodeName, API: n.api, Load: clampLoad(l)}
	n.mu.Lock()
	n.seq++
	msg.Seq = n.seq
	n.mu.Unlock()
	b, err := encodeLoad(msg, func(body []byte) ([]byte, error) { return signLoad(n.signer, body) })
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	old := n.view[msg.Node]
	if old == nil || old.msg.Seq < msg.Seq {
		n.view[msg.Node] = &peerView{msg: msg, raw: b[1:], received: time.Now(), kind: kindOf(old, msg.Load)}
	}
	n.mu.Unlock()
	return b, nil
}

// queueFor is the queue of a load of kind k.
func (n *Node) queueFor(k loadKind) *memberlist.TransmitLimitedQueue {
	switch k {
	case changed:
		return n.queue
	case arrived:
		return n.arrivals
	}
	return n.refresh
}

// merge keeps msg if it is about a current member, newer than what is
// known of that member, and signed by it; it reports whether it was. A
// member's first load waits (pending, the newest only) while its key is
// fetched.
func (n *Node) merge(msg signedLoad) bool {
	if msg.Node == n.cfg.NodeName {
		return false // only this node speaks for itself
	}
	n.mu.Lock()
	m := n.members[msg.Node]
	if m == nil || !m.left.IsZero() {
		n.mu.Unlock()
		n.dropped.notMember.Add(1)
		n.log.Debug("dropping the load of a node that is not a member", "node", msg.Node)
		return false
	}
	if v, ok := n.view[msg.Node]; ok && v.msg.Seq >= msg.Seq {
		n.mu.Unlock()
		return false // known already
	}
	pub, ok := n.keys[msg.Node]
	if !ok {
		n.pendLocked(msg)
		n.mu.Unlock()
		return false
	}
	n.mu.Unlock()
	if !verifyLoad(pub, msg.body, msg.sig) {
		n.dropped.unsigned.Add(1)
		n.log.Debug("dropping a load not signed by its node", "node", msg.Node, "seq", msg.Seq)
		n.mu.Lock()
		n.pendLocked(msg) // its certificate may have changed: again with a new key
		n.mu.Unlock()
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if m := n.members[msg.Node]; m == nil || !m.left.IsZero() {
		return false
	}
	old, ok := n.view[msg.Node]
	if ok && old.msg.Seq >= msg.Seq {
		return false
	}
	n.view[msg.Node] = &peerView{msg: msg.loadMsg, raw: msg.raw, received: time.Now(), kind: kindOf(old, msg.Load)}
	return true
}

// pendLocked keeps msg, if it is its node's newest, until its node's key
// is fetched (n.mu held).
func (n *Node) pendLocked(msg signedLoad) {
	if p, ok := n.pending[msg.Node]; !ok || p.Seq < msg.Seq {
		n.pending[msg.Node] = msg
	}
	n.wantKeyLocked(msg.Node)
}

// relay passes a load that was new here on: as a change if it changed
// what this member held of its node, else as a refresh.
func (n *Node) relay(msg signedLoad) {
	b := append([]byte{kindLoad}, msg.raw...)
	n.mu.Lock()
	kind := changed // a view replaced meanwhile: relayed as news
	if v := n.view[msg.Node]; v != nil && v.msg.Seq == msg.Seq {
		kind = v.kind
	}
	n.mu.Unlock()
	n.queueFor(kind).QueueBroadcast(&broadcast{node: msg.Node, msg: b})
}

// broadcast is one node's load on the gossip queue: a newer one of the
// same node replaces it, so each queue (changes, arrivals, refreshes)
// holds at most one per node.
type broadcast struct {
	node string
	msg  []byte
}

func (b *broadcast) Invalidates(other memberlist.Broadcast) bool {
	o, ok := other.(*broadcast)
	return ok && o.node == b.node
}
func (b *broadcast) Name() string    { return b.node }
func (b *broadcast) Message() []byte { return b.msg }
func (b *broadcast) Finished()       {}

// NodeMeta is memberlist's Delegate: the peer API address.
func (n *Node) NodeMeta(limit int) []byte {
	b := []byte(`{"api":` + strconv.Quote(n.api) + `}`)
	if len(b) > limit {
		return nil
	}
	return b
}

// NotifyMsg takes a gossiped load: a valid, newer one signed by its
// node is kept and passed on (epidemic relay: every member re-gossips
// what is new to it); anything else is dropped here and goes no further.
func (n *Node) NotifyMsg(b []byte) {
	msg, err := decodeLoad(slices.Clone(b))
	if err != nil {
		n.dropped.invalid.Add(1)
		n.log.Debug("dropping a gossip message", "err", err)
		return
	}
	if n.merge(msg) {
		n.relay(msg)
	}
}

// GetBroadcasts hands memberlist the queued loads for the next gossip:
// changes first, then arrivals, then refreshes in the room left.
func (n *Node) GetBroadcasts(overhead, limit int) [][]byte {
	var out [][]byte
	used := 0
	for _, q := range []*memberlist.TransmitLimitedQueue{n.queue, n.arrivals, n.refresh} {
		if limit-used <= overhead {
			break
		}
		got := q.GetBroadcasts(overhead, limit-used)
		for _, b := range got {
			used += len(b) + overhead
		}
		out = append(out, got...)
	}
	for _, b := range out {
		n.sent.Add(int64(len(b) + overhead))
	}
	return out
}

// LocalState is every load known here, for a push/pull exchange.
func (n *Node) LocalState(join bool) []byte {
	n.mu.Lock()
	raws := make([][]byte, 0, min(len(n.view), maxStateLoads))
	for _, v := range n.view {
		if len(raws) < maxStateLoads && v.raw != nil {
			raws = append(raws, v.raw)
		}
	}
	n.mu.Unlock()
	b := encodeState(raws)
	n.sent.Add(int64(len(b)))
	return b
}

// MergeRemoteState merges a peer's push/pull state.
func (n *Node) MergeRemoteState(b []byte, join bool) {
	loads, bad, err := decodeState(b)
	if err != nil {
		n.dropped.invalid.Add(1)
		n.log.Debug("dropping a peer's state", "err", err)
		return
	}
	if bad > 0 {
		n.dropped.invalid.Add(uint64(bad))
		n.log.Debug("dropping loads of a peer's state", "invalid", bad)
	}
	for _, l := range loads {
		n.merge(l)
	}
}

// Peers lists the members and what they last gossiped.
func (n *Node) Peers() api.PeerList {
	out := api.PeerList{Enabled: true, Self: n.cfg.NodeName, Keys: fingerprints(n.keyring),
		InsecureGossip: n.keyring == nil, GossipDropped: n.dropped.snapshot()}
	if d := time.Since(n.started).Seconds(); d > 0 {
		out.GossipBytesPerSecond = float64(n.sent.Load()) / d
	}
	members := n.ml.Members() // before n.mu: memberlist calls the delegate under its own locks
	now := time.Now()
	seen := map[string]bool{}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, m := range members {
		p := api.Peer{Name: m.Name, Address: net.JoinHostPort(m.Addr.String(), strconv.Itoa(int(m.Port))),
			State: stateName(m.State), Self: m.Name == n.cfg.NodeName}
		p.APIAddress = apiAddr(m)
		if v, ok := n.view[m.Name]; ok {
			l := v.msg.Load
			p.Load, p.Seq, p.Age = &l, v.msg.Seq, api.Duration(now.Sub(v.received).Round(time.Millisecond))
		}
		seen[m.Name] = true
		out.Peers = append(out.Peers, p)
	}
	for name, v := range n.view {
		if !seen[name] {
			l := v.msg.Load
			out.Peers = append(out.Peers, api.Peer{Name: name, APIAddress: v.msg.API, State: "gone", Load: &l, Seq: v.msg.Seq,
				Age: api.Duration(now.Sub(v.received).Round(time.Millisecond))})
		}
	}
	slices.SortFunc(out.Peers, func(a, b api.Peer) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

func stateName(s memberlist.NodeStateType) string {
	switch s {
	case memberlist.StateAlive:
		return "alive"
	case memberlist.StateSuspect:
		return "suspect"
	case memberlist.StateDead:
		return "dead"
	case memberlist.StateLeft:
		return "left"
	}
	return "unknown"
}

// Keyring applies one keyring operation (install, use, remove), writes
// the keyring file back and returns the peer list with the new
// fingerprints. Each daemon's keyring is its own: rotate by installing the
// new key on every daemon, then using it on every daemon, then removing
// the old one.
func (n *Node) Keyring(req api.KeyringRequest) (api.PeerList, error) {
	if err := keyringOp(n.keyring, req.Op, req.Key); err != nil {
		return api.PeerList{}, &api.Error{Code: api.CodeInvalid, Field: "key", Message: err.Error()}
	}
	if err := writeKeyring(n.cfg.KeyringFile, n.keyring.GetKeys()); err != nil {
		return api.PeerList{}, fmt.Errorf("writing the keyring file: %w", err)
	}
	n.log.Info("gossip keyring changed", "op", req.Op, "key", fingerprint(mustKey(req.Key)))
	return n.Peers(), nil
}

func mustKey(s string) []byte {
	k, _ := decodeKey(s)
	return k
}

// candidates are the live peers whose load is fresh enough to offer to.
func (n *Node) candidates() []candidate {
	alive := map[string]string{}
	for _, m := range n.ml.Members() {
		if m.State == memberlist.StateAlive && m.Name != n.cfg.NodeName {
			alive[m.Name] = apiAddr(m)
		}
	}
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []candidate
	for name, addr := range alive {
		v, ok := n.view[name]
		if !ok || now.Sub(v.received) > n.cfg.MaxLoadAge {
			continue
		}
		out = append(out, candidate{name: name, api: cmpOr(addr, v.msg.API), load: v.msg.Load, age: now.Sub(v.received)})
	}
	return out
}

// ranker ranks peers with the engine and this daemon's profiles.
func (n *Node) ranker() ranker {
	return ranker{profiles: n.cfg.Profiles, maxAge: n.cfg.MaxLoadAge, spread: offerSpread(), rng: n.offerRand()}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

var (
	_ handover.Overflow = (*Node)(nil)
	_ handover.Ranker   = (*Node)(nil)
)

// every runs f every d until the node stops.
func (n *Node) every(d time.Duration, f func()) {
	defer n.wg.Done()
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
		f()
	}
}

// checkLeases stops jobs handed over here whose origin stopped polling
// them for a lease: the origin takes such a job back only after longer
// than that, so the job never runs here and elsewhere at once.
func (n *Node) checkLeases() {
	now := time.Now()
	live := map[string]bool{}
	for _, j := range n.jobs.Accepted() {
		key := j.Origin.Key
		live[key] = true
		n.mu.Lock()
		last, ok := n.leases[key]
		if !ok {
			// Accepted before this daemon started: the lease runs
			// from now.
			n.leases[key], last = now, now
		}
		n.mu.Unlock()
		n.mu.Lock()
		_, done := n.expired[key]
		if now.Sub(last) > n.cfg.Lease && !done {
			n.expireLocked(key, now)
		}
		n.mu.Unlock()
		if now.Sub(last) <= n.cfg.Lease || done {
			continue
		}
		n.log.Warn("origin stopped polling a handed-over job; stopping it", "job", j.ID, "origin", j.Origin.Node, "lease", n.cfg.Lease)
		caller := api.Caller{Admin: true, User: "lease: origin " + j.Origin.Node + " silent for " + n.cfg.Lease.String()}
		if _, err := n.jobs.Cancel(context.Background(), caller, j.ID); err != nil {
			n.log.Warn("stopping a job whose lease ended", "job", j.ID, "err", err)
		}
	}
	n.mu.Lock()
	for k := range n.leases {
		if !live[k] {
			delete(n.leases, k) // expired stays (expiredKeep): polls report the lease's end
		}
	}
	n.mu.Unlock()
}

// expireLocked records that key's lease ended, forgetting the oldest
// key beyond maxExpired (n.mu held).
func (n *Node) expireLocked(key string, now time.Time) {
	if len(n.expired) >= maxExpired {
		oldest, at := "", now
		for k, t := range n.expired {
			if t.Before(at) || oldest == "" {
				oldest, at = k, t
			}
		}
		delete(n.expired, oldest)
	}
	n.expired[key] = now
}

// prune reconciles the members with memberlist's (an event missed or
// raced), forgets members that left or died longer than MaxLoadAge ago
// with their view, key and pending load, drops whatever is kept of a name
// that is no member, and ages out expired lease keys.
func (n *Node) prune(now time.Time) {
	live := map[string]*memberlist.Node{}
	for _, m := range n.ml.Members() { // before n.mu
		if m.Name != n.cfg.NodeName {
			live[m.Name] = m
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for name, m := range n.members {
		_, alive := live[name]
		switch {
		case alive:
			m.left = time.Time{}
		case m.left.IsZero():
			m.left = now
		case now.Sub(m.left) > n.cfg.MaxLoadAge:
			delete(n.members, name)
		}
	}
	for name, node := range live {
		if _, ok := n.members[name]; !ok && len(n.members) < maxMembers {
			n.members[name] = &member{api: apiAddr(node)}
		}
	}
	notMember := func(name string) bool { return n.members[name] == nil }
	maps.DeleteFunc(n.view, func(name string, _ *peerView) bool { return name != n.cfg.NodeName && notMember(name) })
	maps.DeleteFunc(n.keys, func(name string, _ crypto.PublicKey) bool { return notMember(name) })
	maps.DeleteFunc(n.tried, func(name string, _ time.Time) bool { return notMember(name) })
	maps.DeleteFunc(n.pending, func(name string, _ signedLoad) bool { return notMember(name) })
	maps.DeleteFunc(n.expired, func(_ string, at time.Time) bool { return now.Sub(at) > expiredKeep })
}

func (n *Node) renew(key string) {
	n.mu.Lock()
	n.leases[key] = time.Now()
	n.mu.Unlock()
}

func readChunk(path string, offset int64) ([]byte, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, logChunk)
	k, err := f.ReadAt(buf, offset)
	if k > 0 || errors.Is(err, io.EOF) {
		return buf[:k], nil
	}
	return nil, err
}

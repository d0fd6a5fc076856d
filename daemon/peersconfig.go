package daemon

import (
	"cmp"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/admission"
	"github.com/fusiond/fusiond/daemon/internal/apiserver"
	"github.com/fusiond/fusiond/daemon/internal/audit"
	"github.com/fusiond/fusiond/daemon/internal/handover"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/peers"
)

// PeersConfig is the daemon's membership among its peers and the
// hand-over of jobs that do not fit here (off by default; docs/peers.md).
type PeersConfig struct {
	// Enabled joins the peers and hands over (and accepts) jobs.
	Enabled bool `json:"enabled"`
	// NodeName is this daemon's name among its peers; "" is the host
	// name. The peer certificate must carry it as a DNS name.
	NodeName string `json:"node_name,omitempty"`
	// Gossip is the memberlist address bound (UDP and TCP), host:port;
	// AdvertiseGossip what peers are told, when it differs.
	Gossip          string `json:"gossip"`
	AdvertiseGossip string `json:"advertise_gossip,omitempty"`
	// API is the peer API's mutual-TLS address; AdvertiseAPI what peers
	// dial, when it differs.
	API          string `json:"api"`
	AdvertiseAPI string `json:"advertise_api,omitempty"`
	// Join lists peers' gossip addresses (host:port); DNSSeed is a
	// host:port whose name resolves to more.
	Join    []string `json:"join,omitempty"`
	DNSSeed string   `json:"dns_seed,omitempty"`
	// Profile is memberlist's timing preset: lan, wan or local.
	Profile string `json:"profile"`
	// KeyringFile holds the gossip encryption keys (base64, one a line,
	// the primary first). Required with Enabled, unless InsecureGossip.
	KeyringFile string `json:"keyring_file,omitempty"`
	// InsecureGossip runs gossip without encryption (no keyring_file):
	// anyone who reaches the gossip port may join and read the loads.
	// Logged as a warning, and fusionctl status says so.
	InsecureGossip bool `json:"insecure_gossip,omitempty"`
	// Cert and Key are this daemon's peer certificate and key (PEM); CA
	// the certificate of the CA that issued every peer's.
	Cert string `json:"cert,omitempty"`
	Key  string `json:"key,omitempty"`
	CA   string `json:"ca,omitempty"`
	// BroadcastInterval is how often at most this daemon gossips its load
	// when it changed (it looks ten times per interval), and every 5
	// intervals regardless.
	BroadcastInterval Duration `json:"broadcast_interval"`
	// WaitBudget is, per class, how long a job may wait unplaced here
	// before it is offered to peers; a class left out is never offered.
	WaitBudget map[api.Class]Duration `json:"wait_budget"`
	// Poll is how often the origin polls a handed-over job; Lease how long
	// a peer runs a handed-over job without a poll before it stops it.
	// The origin takes a job back after 2 × lease + cancel_grace without
	// an answer.
	Poll  Duration `json:"poll"`
	Lease Duration `json:"lease"`
	// AcceptRootJobs lets peers hand over jobs that run as root here
	// (default false: refused, so holding a peer certificate never means
	// root on this host).
	AcceptRootJobs bool `json:"accept_root_jobs,omitempty"`
	// Users says which local users a peer's jobs may run as.
	Users PeerUsersConfig `json:"users"`
	// Limits bound what each peer may send and hold here.
	Limits PeerLimitsConfig `json:"limits"`
	// MaxGangHold is the most this host keeps another host's cross-host
	// gang member placed and not started: the hold before its gang's
	// commit, and the start barrier after it (default and most: 1m).
	// Shorter ties up less here for a slow origin, and fails gangs whose
	// origin needs longer.
	MaxGangHold Duration `json:"max_gang_hold,omitempty"`
	// RankSelf is the poor-fit rule: a job that fits here with an engine
	// score below RankSelf.Below is offered to peers that rank at least
	// RankSelf.Margin better (docs/peers.md, "Hand-over").
	RankSelf RankSelfConfig `json:"rank_self"`
}

// RankSelfConfig is peers.rank_self: below what engine score a job that
// fits here is ranked against the peers, and by how much a peer must rank
// better to be offered it (below: 0 turns the rule off).
type RankSelfConfig struct {
	Below  float64 `json:"below"`
	Margin float64 `json:"margin"`
}

// PeerUsersConfig is peers.users: the local users a peer's jobs may run as
// (docs/peers.md, "Trust"). Root-equivalent groups, system accounts and
// root itself are always refused (root: unless accept_root_jobs).
type PeerUsersConfig struct {
	// Allow and AllowGroups, when either is set, list the only users (and
	// the members of the only groups) a peer may name.
	Allow       []string `json:"allow,omitempty"`
	AllowGroups []string `json:"allow_groups,omitempty"`
	// Deny and DenyGroups are refused, on top of the built-in
	// root-equivalent groups (sudo, wheel, adm, docker, disk, …).
	Deny       []string `json:"deny,omitempty"`
	DenyGroups []string `json:"deny_groups,omitempty"`
	// MinUID and MaxUID bound a regular user's uid; outside them is a
	// system account (0: UID_MIN and UID_MAX of /etc/login.defs, else
	// 1000 and 60000).
	MinUID uint32 `json:"min_uid,omitempty"`
	MaxUID uint32 `json:"max_uid,omitempty"`
	// RequireSocketAccess refuses a user who could not use the API socket
	// (not in socket_group, unless socket_mode lets everyone in). Default
	// true.
	RequireSocketAccess *bool `json:"require_socket_access,omitempty"`
}

// PeerLimitsConfig is peers.limits: what one peer may send and hold here.
type PeerLimitsConfig struct {
	// OffersPerSecond and OfferBurst bound each peer's offers (a token
	// bucket; 429 past it).
	OffersPerSecond float64 `json:"offers_per_second"`
	OfferBurst      int     `json:"offer_burst"`
	// Jobs caps the unfinished jobs one peer holds here; SpecBytes their
	// specs' size.
	Jobs      int       `json:"jobs"`
	SpecBytes api.Bytes `json:"spec_bytes"`
}

// DefaultPeersConfig is off, with LAN timing and the default ports.
func DefaultPeersConfig() PeersConfig {
	return PeersConfig{
		Gossip:            "0.0.0.0:7946",
		API:               "0.0.0.0:7947",
		Profile:           "lan",
		BroadcastInterval: Duration(time.Second),
		WaitBudget: map[api.Class]Duration{
			api.ClassService:   Duration(10 * time.Second),
			api.ClassInference: Duration(10 * time.Second),
			api.ClassTraining:  Duration(time.Minute),
			api.ClassBatch:     Duration(30 * time.Second),
		},
		Poll:     Duration(500 * time.Millisecond),
		Lease:    Duration(10 * time.Second),
		Limits:   PeerLimitsConfig{OffersPerSecond: 20, OfferBurst: 40, Jobs: 256, SpecBytes: 64 << 20},
		RankSelf: RankSelfConfig{Below: 0.5, Margin: 0.1},
	}
}

func (c PeersConfig) validate() (string, error) {
	if !c.Enabled {
		return "", nil
	}
	for _, a := range []struct {
		key, addr string
		optional  bool
	}{{"peers.gossip", c.Gossip, false}, {"peers.api", c.API, false}, {"peers.advertise_gossip", c.AdvertiseGossip, true},
		{"peers.advertise_api", c.AdvertiseAPI, true}, {"peers.dns_seed", c.DNSSeed, true}} {
		if a.addr == "" && a.optional {
			continue
		}
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			return a.key, fmt.Errorf("want host:port, got %q", a.addr)
		}
	}
	for i, j := range c.Join {
		if _, _, err := net.SplitHostPort(j); err != nil {
			return fmt.Sprintf("peers.join[%d]", i), fmt.Errorf("want host:port, got %q", j)
		}
	}
	if !slices.Contains([]string{"lan", "wan", "local"}, c.Profile) {
		return "peers.profile", fmt.Errorf("want lan, wan or local, got %q", c.Profile)
	}
	for _, f := range [][2]string{{"peers.cert", c.Cert}, {"peers.key", c.Key}, {"peers.ca", c.CA}} {
		if f[1] == "" {
			return f[0], fmt.Errorf("required with peers.enabled: the peer API uses mutual TLS (fusionctl peers cert makes a test CA)")
		}
	}
	switch {
	case c.KeyringFile == "" && !c.InsecureGossip:
		return "peers.keyring_file", fmt.Errorf("required with peers.enabled: gossip is encrypted with its keys (make one with (umask 077; fusionctl peers keygen > gossip.keys)); set peers.insecure_gossip: true to gossip unencrypted instead")
	case c.KeyringFile != "" && c.InsecureGossip:
		return "peers.insecure_gossip", fmt.Errorf("set together with peers.keyring_file: gossip is encrypted; drop one of them")
	}
	switch {
	case c.BroadcastInterval < Duration(10*time.Millisecond):
		return "peers.broadcast_interval", fmt.Errorf("at least 10ms")
	case c.Poll < Duration(10*time.Millisecond):
		return "peers.poll", fmt.Errorf("at least 10ms")
	case c.Lease < 4*c.Poll:
		return "peers.lease", fmt.Errorf("at least 4 × peers.poll (%v), got %v", time.Duration(4*c.Poll), time.Duration(c.Lease))
	case c.MaxGangHold < 0 || c.MaxGangHold > Duration(time.Minute):
		return "peers.max_gang_hold", fmt.Errorf("between 0 (the default, 1m) and 1m, got %v", time.Duration(c.MaxGangHold))
	}
	switch l := c.Limits; {
	case l.OffersPerSecond <= 0:
		return "peers.limits.offers_per_second", fmt.Errorf("must be above 0")
	case l.OfferBurst < 1:
		return "peers.limits.offer_burst", fmt.Errorf("at least 1")
	case l.Jobs < 1:
		return "peers.limits.jobs", fmt.Errorf("at least 1")
	case l.SpecBytes < 1:
		return "peers.limits.spec_bytes", fmt.Errorf("at least 1 byte")
	}
	switch r := c.RankSelf; {
	case !(r.Below >= 0 && r.Below <= 1):
		return "peers.rank_self.below", fmt.Errorf("between 0 (the rule off) and 1, got %v", r.Below)
	case !(r.Margin >= 0 && r.Margin <= 1):
		return "peers.rank_self.margin", fmt.Errorf("between 0 and 1, got %v", r.Margin)
	}
	if u := c.Users; u.MaxUID != 0 && u.MinUID > u.MaxUID {
		return "peers.users.min_uid", fmt.Errorf("%d is above peers.users.max_uid %d", u.MinUID, u.MaxUID)
	}
	for class, d := range c.WaitBudget {
		if !slices.Contains(api.Classes, class) {
			return "peers.wait_budget." + string(class), fmt.Errorf("unknown class (want training, inference, batch or service)")
		}
		if d < 0 {
			return "peers.wait_budget." + string(class), fmt.Errorf("must not be negative")
		}
	}
	return "", nil
}

// startPeers joins the peers and lets the job manager hand jobs over
// (before Recover, which resumes following earlier hand-overs).
func startPeers(cfg Config, mgr *jobs.Manager, host peers.Host, auditLog *audit.Log, log *slog.Logger) (*peers.Node, error) {
	p := cfg.Peers
	name := p.NodeName
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("peers.node_name: none set and no host name: %w", err)
		}
		name = h
	}
	users, err := peerUsers(cfg)
	if err != nil {
		return nil, err
	}
	budgets := map[api.Class]time.Duration{}
	for c, d := range p.WaitBudget {
		budgets[c] = time.Duration(d)
	}
	// The hand-over is built first: the peers serve its held gang
	// members, and it hands jobs over through them.
	ho := handover.New(mgr.Records(), handover.Config{
		Budget: budgets, Poll: time.Duration(p.Poll),
		Lost:     2*time.Duration(p.Lease) + time.Duration(cfg.CancelGrace),
		Retry:    5 * time.Second,
		RankSelf: handover.RankSelf{Below: p.RankSelf.Below, Margin: p.RankSelf.Margin},
	}, log.With("part", "handover"))
	n, err := peers.New(peers.Config{
		NodeName: name, Gossip: p.Gossip, AdvertiseGossip: p.AdvertiseGossip,
		API: p.API, AdvertiseAPI: p.AdvertiseAPI, Join: p.Join, DNSSeed: p.DNSSeed,
		Profile: p.Profile, KeyringFile: p.KeyringFile, InsecureGossip: p.InsecureGossip,
		CertFile: p.Cert, KeyFile: p.Key, CAFile: p.CA,
		Broadcast: time.Duration(p.BroadcastInterval), Lease: time.Duration(p.Lease),
		MaxGangHold: time.Duration(p.MaxGangHold),
		Profiles:    cfg.Placement.profiles(), // peers are ranked as the placer scores this host
		OfferRate:   p.Limits.OffersPerSecond, OfferBurst: p.Limits.OfferBurst,
		MaxOfferBytes: offerBytes(cfg.Limits.MaxSpecBytes),
		Audit:         auditLog,
	}, peerJobs{mgr, ho}, host, log)
	if err != nil {
		return nil, fmt.Errorf("peers: %w", err)
	}
	ho.Connect(n)
	mgr.SetHandover(ho, jobs.PeerPolicy{
		Users: users, Limits: jobs.PeerLimits{Jobs: p.Limits.Jobs, SpecBytes: int64(p.Limits.SpecBytes)},
	})
	log.Info("peers ready", "node", name, "gossip", n.GossipAddr(), "api", n.APIAddr(), "profile", p.Profile, "encrypted", p.KeyringFile != "")
	return n, nil
}

// peerJobs is what the peers use of this host's jobs: the records and
// the hand-over's held gang members.
type peerJobs struct {
	*jobs.Manager
	*handover.Agent
}

// peerBackend is the API's view of the peers: nil (no peer routes but the
// empty list) when the daemon runs without them.
func peerBackend(n *peers.Node) apiserver.PeerBackend {
	if n == nil {
		return nil
	}
	return n
}

// peerUsers is the peers.users policy, with the API socket's group when
// the socket is not open to everyone (a user who could not use it locally
// is not named by a peer either).
func peerUsers(cfg Config) (admission.PeerUsers, error) {
	u := cfg.Peers.Users
	p := admission.PeerUsers{Allow: u.Allow, AllowGroups: u.AllowGroups, Deny: u.Deny, DenyGroups: u.DenyGroups,
		AcceptRoot: cfg.Peers.AcceptRootJobs, MinUID: u.MinUID, MaxUID: u.MaxUID}
	minUID, maxUID := admission.LoginDefsUIDRange("/etc/login.defs")
	p.MinUID, p.MaxUID = cmp.Or(p.MinUID, minUID), cmp.Or(p.MaxUID, maxUID)
	mode, err := cfg.Mode()
	if err != nil {
		return p, fmt.Errorf("socket_mode: %w", err)
	}
	if (u.RequireSocketAccess == nil || *u.RequireSocketAccess) && mode&0o006 != 0o006 {
		gid := uint32(os.Getegid())
		if cfg.SocketGroup != "" {
			if gid, err = lookupGroup(cfg.SocketGroup); err != nil {
				return p, fmt.Errorf("socket_group: %w", err)
			}
		}
		p.SocketGID = &gid
	}
	return p, nil
}

// offerBytes bounds an offer's body: the spec limit and room for the
// offer around it (the key, the user, the hold).
func offerBytes(maxSpec api.Bytes) int64 {
	if maxSpec <= 0 {
		return 0 // the peer API's own bound
	}
	return int64(maxSpec) + 16<<10
}

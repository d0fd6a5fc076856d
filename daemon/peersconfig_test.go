package daemon

import (
	"errors"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
)

func TestPeersConfigValidation(t *testing.T) {
	tls := "peers:\n  enabled: true\n  cert: /c.pem\n  key: /k.pem\n  ca: /ca.pem\n"
	base := tls + "  keyring_file: /gossip.keys\n"
	for _, tc := range []struct{ yaml, field string }{
		{"peers:\n  enabled: true\n", "peers.cert"},
		{tls, "peers.keyring_file"},
		{base + "  insecure_gossip: true\n", "peers.insecure_gossip"},
		{base + "  join: [nohost]\n", "peers.join[0]"},
		{base + "  gossip: \"7946\"\n", "peers.gossip"},
		{base + "  profile: moon\n", "peers.profile"},
		{base + "  poll: 1s\n  lease: 2s\n", "peers.lease"},
		{base + "  wait_budget: {gpu: 1s}\n", "peers.wait_budget.gpu"},
		{base + "  wait_budget: {batch: -1s}\n", "peers.wait_budget.batch"},
		{base + "  broadcast_interval: 1ms\n", "peers.broadcast_interval"},
		{base + "  bogus: 1\n", "peers.bogus"},
		{base + "  rank_self: {below: 1.5}\n", "peers.rank_self.below"},
		{base + "  rank_self: {below: -0.1}\n", "peers.rank_self.below"},
		{base + "  rank_self: {margin: -0.1}\n", "peers.rank_self.margin"},
		{base + "  rank_self: {margin: 2}\n", "peers.rank_self.margin"},
	} {
		cfg := DefaultConfig()
		err := ParseConfig([]byte(tc.yaml), &cfg)
		var e *api.Error
		if !errors.As(err, &e) || e.Field != tc.field {
			t.Errorf("%q: error %v, want one about %s", tc.yaml, err, tc.field)
		}
	}
	cfg := DefaultConfig()
	if err := ParseConfig([]byte(base+"  join: [10.0.0.2:7946]\n  dns_seed: peers.example.com:7946\n  wait_budget: {batch: 0s}\n"), &cfg); err != nil {
		t.Fatalf("a good peers section: %v", err)
	}
	if !cfg.Peers.Enabled || len(cfg.Peers.WaitBudget) != 4 || cfg.Peers.WaitBudget[api.ClassBatch] != 0 {
		t.Errorf("parsed %+v", cfg.Peers)
	}
	cfg = DefaultConfig()
	if err := ParseConfig([]byte(tls+"  insecure_gossip: true\n"), &cfg); err != nil || !cfg.Peers.InsecureGossip {
		t.Fatalf("peers without a keyring, with insecure_gossip: %v (%+v)", err, cfg.Peers)
	}
	if d := DefaultConfig(); d.Peers.Enabled || d.Peers.RankSelf != (RankSelfConfig{Below: 0.5, Margin: 0.1}) {
		t.Errorf("peers by default: enabled %v, rank_self %+v", d.Peers.Enabled, d.Peers.RankSelf)
	}
	cfg = DefaultConfig()
	if err := ParseConfig([]byte(base+"  rank_self: {below: 0}\n"), &cfg); err != nil || cfg.Peers.RankSelf != (RankSelfConfig{Below: 0, Margin: 0.1}) {
		t.Fatalf("rank_self below 0 (off): %v (%+v)", err, cfg.Peers.RankSelf)
	}
}

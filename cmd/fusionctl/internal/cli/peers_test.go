package cli

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

func TestPeerTable(t *testing.T) {
	l := api.PeerList{Enabled: true, Self: "a", GossipBytesPerSecond: 812, Keys: []string{"6b9fa745", "01020304"}, Peers: []api.Peer{
		{Name: "a", Self: true, State: "alive", Address: "10.0.0.1:7946", APIAddress: "10.0.0.1:7947",
			Load: &api.PeerLoad{CPU: 2000, Memory: 1 << 30, Health: "ok"}, Age: api.Duration(3 * time.Millisecond)},
		{Name: "dgx", State: "suspect", Address: "10.0.0.2:7946", Age: api.Duration(1500 * time.Millisecond),
			Load: &api.PeerLoad{CPU: 64000, Memory: 2 << 40, GPUs: map[string]int{"NVIDIA H200": 7, "NVIDIA A100": 1}, Queue: 2, Wait: api.Duration(4 * time.Second), Health: "cordoned"}},
		{Name: "old", State: "gone"},
	}}
	var b bytes.Buffer
	if err := peerTable(&b, l); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"a (self)", "10.0.0.1:7947", "1 NVIDIA A100, 7 NVIDIA H200", "2 (wait 4s)", "cordoned", "1.5s", "suspect",
		"old", "812 B/s", "6b9fa745, 01020304 (primary first)"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "NOT encrypted") {
		t.Errorf("a keyring's table says gossip is not encrypted:\n%s", out)
	}
	b.Reset()
	l.Keys, l.InsecureGossip, l.GossipDropped = nil, true, map[string]uint64{"invalid": 3, "not signed by its node": 2}
	peerTable(&b, l)
	for _, want := range []string{"keyring: off: gossip: NOT encrypted (peers.insecure_gossip: true)", "Gossip dropped: 3 invalid, 2 not signed by its node"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	peerTable(&b, api.PeerList{})
	if !strings.Contains(b.String(), "peers are off") {
		t.Errorf("disabled: %q", b.String())
	}
}

// TestStatusSaysGossipIsNotEncrypted: fusionctl status's peer lines say
// so when the daemon gossips without a keyring, and only then.
func TestStatusSaysGossipIsNotEncrypted(t *testing.T) {
	l := api.PeerList{Enabled: true, Self: "a", Keys: []string{"6b9fa745"}, Peers: []api.Peer{{Name: "a", Self: true, State: "alive"}}}
	var b bytes.Buffer
	if err := writePeerSummary(&b, l); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "Peers: a is one of 1 members (1 alive)") || strings.Contains(b.String(), "NOT encrypted") {
		t.Errorf("status with a keyring:\n%s", b.String())
	}
	b.Reset()
	l.Keys, l.InsecureGossip = nil, true
	writePeerSummary(&b, l)
	if !strings.Contains(b.String(), "gossip: NOT encrypted (peers.insecure_gossip: true)") {
		t.Errorf("status with insecure gossip:\n%s", b.String())
	}
}

func TestShowSaysWhereTheJobWent(t *testing.T) {
	j := api.Job{ID: "4", State: api.StateRunning, Handover: &api.Handover{Key: "a/4#2", Peer: "dgx", Address: "10.0.0.2:7947", RemoteID: "9",
		Why: "cannot run on this host (no GPUs); peer dgx ranked 1 of 2"}}
	var b bytes.Buffer
	if err := showJob(&b, j); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"to peer dgx (10.0.0.2:7947) as job 9, key a/4#2", "Why:", "ranked 1 of 2"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("show lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	showJob(&b, api.Job{ID: "9", Origin: &api.Provenance{Node: "a", JobID: "4", Key: "a/4#2"}})
	if !strings.Contains(b.String(), "From peer:") || !strings.Contains(b.String(), "a, its job 4 (key a/4#2)") {
		t.Errorf("peer side show:\n%s", b.String())
	}
}

// The test CA's node certificates verify against it for the node's name,
// as server and as client.
func TestPeersCert(t *testing.T) {
	dir := t.TempDir()
	if err := makeCA(dir, 1); err != nil {
		t.Fatal(err)
	}
	if err := makeNodeCert(dir, "dgx-1", []string{"10.0.0.5"}, 1); err != nil {
		t.Fatal(err)
	}
	if err := makeNodeCert(dir, "bad/name", nil, 1); err == nil {
		t.Error("a node name with a slash was accepted")
	}
	kp, err := tls.LoadX509KeyPair(filepath.Join(dir, "dgx-1.pem"), filepath.Join(dir, "dgx-1-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(kp.Certificate[0])
	caPEM, _ := os.ReadFile(filepath.Join(dir, "ca.pem"))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "dgx-1", Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			t.Errorf("usage %v: %v", usage, err)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "dgx-2", Roots: pool}); err == nil {
		t.Error("the certificate verifies for another node's name")
	}
	if st, _ := os.Stat(filepath.Join(dir, "dgx-1-key.pem")); st.Mode().Perm() != 0o600 {
		t.Errorf("key mode %v", st.Mode().Perm())
	}
}

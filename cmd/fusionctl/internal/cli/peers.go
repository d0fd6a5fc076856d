package cli

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/fusiond/fusiond/daemon/api"
)

func newPeersCmd(o *options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "peers",
		Short: "List the daemon's peers: members, addresses, gossiped load, its age, health",
		Long: `fusionctl peers lists the members this daemon gossips with (hashicorp/memberlist),
the address of each, the load each last gossiped (free CPU, memory and GPUs,
queue) and how old that view is. Subcommands change the gossip keyring and
make test certificates for the peer API (see docs/peers.md).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c := o.client()
			defer c.Close()
			l, err := c.Peers(cmd.Context())
			if err != nil {
				return err
			}
			return o.print(l, func(w io.Writer) error { return peerTable(w, l) })
		},
	}
	cmd.AddCommand(newKeyringCmd(o), newCertCmd(o), newKeygenCmd(o))
	return cmd
}

func peerTable(w io.Writer, l api.PeerList) error {
	if !l.Enabled {
		_, err := fmt.Fprintln(w, "peers are off (peers.enabled: false in the daemon's configuration)")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tADDRESS\tAPI\tCPU FREE\tMEMORY FREE\tGPUS FREE\tPOWER HEADROOM\tQUEUE\tHEALTH\tAGE")
	for _, p := range l.Peers {
		name := esc(p.Name)
		if p.Self {
			name += " (self)"
		}
		cpu, mem, gpus, power, queue, health := "-", "-", "-", "-", "-", "-"
		if ld := p.Load; ld != nil {
			cpu, mem, gpus = ld.CPU.String(), ld.Memory.Human(), gpuCounts(ld.GPUs)
			if ld.PowerMeasured {
				power = fmt.Sprintf("%d W", ld.EnergyHeadroomWatts)
			}
			queue, health = fmt.Sprintf("%d (wait %s)", ld.Queue, time.Duration(ld.Wait)), esc(ld.Health)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, esc(p.State), esc(p.Address), esc(dash(p.APIAddress)),
			cpu, mem, gpus, power, queue, health, time.Duration(p.Age))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	keys := "off (gossip not encrypted)"
	if l.InsecureGossip {
		keys = "off: " + insecureGossip
	}
	if len(l.Keys) > 0 {
		keys = strings.Join(l.Keys, ", ") + " (primary first)"
	}
	if _, err := fmt.Fprintf(w, "\nGossip: %.0f B/s sent by this daemon; keyring: %s\n", l.GossipBytesPerSecond, keys); err != nil {
		return err
	}
	if len(l.GossipDropped) > 0 {
		var parts []string
		for _, why := range slices.Sorted(maps.Keys(l.GossipDropped)) {
			parts = append(parts, fmt.Sprintf("%d %s", l.GossipDropped[why], esc(why)))
		}
		_, err := fmt.Fprintf(w, "Gossip dropped: %s\n", strings.Join(parts, ", "))
		return err
	}
	return nil
}

// insecureGossip is what fusionctl says of a daemon gossiping without a
// keyring.
const insecureGossip = "gossip: NOT encrypted (peers.insecure_gossip: true)"

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func gpuCounts(m map[string]int) string {
	if len(m) == 0 {
		return "0"
	}
	var out []string
	for model, n := range m {
		out = append(out, fmt.Sprintf("%d %s", n, esc(model)))
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// peerSummary is fusionctl status's peer line.
func peerSummary(ctx context.Context, w io.Writer, c *api.Client) error {
	l, err := c.Peers(ctx)
	if err != nil {
		return nil // a daemon without the peer routes: nothing to add
	}
	return writePeerSummary(w, l)
}

func writePeerSummary(w io.Writer, l api.PeerList) error {
	if !l.Enabled {
		_, err := fmt.Fprintln(w, "\nPeers: off")
		return err
	}
	states := map[string]int{}
	var oldest time.Duration
	for _, p := range l.Peers {
		states[p.State]++
		if !p.Self {
			oldest = max(oldest, time.Duration(p.Age))
		}
	}
	var parts []string
	for _, s := range []string{"alive", "suspect", "dead", "left", "gone"} {
		if states[s] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", states[s], s))
		}
	}
	_, err := fmt.Fprintf(w, "\nPeers: %s is one of %d members (%s); oldest load view %s; fusionctl peers lists them\n",
		esc(l.Self), len(l.Peers), strings.Join(parts, ", "), oldest)
	if err == nil && l.InsecureGossip {
		_, err = fmt.Fprintln(w, insecureGossip)
	}
	return err
}

// showProvenance adds where a job went (on the origin) or came from (on
// the peer) to fusionctl show.
func showProvenance(p func(k, format string, args ...any), j api.Job) {
	if h := j.Handover; h != nil {
		remote := h.RemoteID
		if remote == "" {
			remote = "? (answer lost)"
		}
		p("Handed over", "to peer %s (%s) as job %s, key %s, at %s", h.Peer, h.Address, remote, h.Key, h.At.Format(time.RFC3339))
		p("Why", "%s", h.Why)
	}
	if g := j.Origin; g != nil {
		p("From peer", "%s, its job %s (key %s)", g.Node, g.JobID, g.Key)
	}
}

func newKeyringCmd(o *options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keyring",
		Short: "Change the gossip encryption keyring (install, use, remove; admin)",
		Long: `Rotate the gossip key on every daemon: install the new key everywhere,
then use it everywhere, then remove the old one. Each command changes this
daemon's live keyring and its keyring file (peers.keyring_file).`,
	}
	for _, op := range []string{"install", "use", "remove"} {
		cmd.AddCommand(&cobra.Command{
			Use:   op + " KEY",
			Short: map[string]string{"install": "add a key (base64)", "use": "make an installed key the primary", "remove": "remove a key that is not the primary"}[op],
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				c := o.client()
				defer c.Close()
				l, err := c.Keyring(cmd.Context(), api.KeyringRequest{Op: op, Key: args[0]})
				if err != nil {
					return err
				}
				return o.print(l, func(w io.Writer) error {
					_, err := fmt.Fprintf(w, "keyring: %s (primary first)\n", strings.Join(l.Keys, ", "))
					return err
				})
			},
		})
	}
	return cmd
}

func newKeygenCmd(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "keygen",
		Short: "Print a new random gossip key (32 bytes, base64) for peers.keyring_file",
		Long: `keygen prints a new random gossip key (32 bytes, base64). Keep the keyring
file private: fusiond refuses one that other users can read, e.g.
  (umask 077; fusionctl peers keygen > gossip.keys)`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			k := make([]byte, 32)
			if _, err := rand.Read(k); err != nil {
				return err
			}
			_, err := fmt.Fprintln(o.stdout, base64.StdEncoding.EncodeToString(k))
			return err
		},
	}
}

func newCertCmd(o *options) *cobra.Command {
	var dir string
	var ips []string
	var days int
	cmd := &cobra.Command{
		Use:   "cert ca | cert node NAME",
		Short: "Make a test CA, or a node certificate it signs, for the peer API's mutual TLS",
		Long: `fusionctl peers cert ca writes DIR/ca.pem and DIR/ca-key.pem, a new CA for
tests. fusionctl peers cert node NAME writes DIR/NAME.pem and DIR/NAME-key.pem,
a certificate for node NAME (its DNS name, plus --ip addresses) signed by
DIR/ca.pem, good for both server and client authentication. In production
issue node certificates from your own CA instead (docs/peers.md).`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(_ *cobra.Command, args []string) error {
			switch {
			case args[0] == "ca" && len(args) == 1:
				return makeCA(dir, days)
			case args[0] == "node" && len(args) == 2:
				if err := makeNodeCert(dir, args[1], ips, days); err != nil {
					return err
				}
				fmt.Fprintf(o.stdout, "wrote %s and %s\n", filepath.Join(dir, args[1]+".pem"), filepath.Join(dir, args[1]+"-key.pem"))
				return nil
			}
			return errors.New("want: cert ca, or cert node NAME")
		},
	}
	cmd.Flags().StringVar(&dir, "dir", ".", "directory of the CA and the certificates")
	cmd.Flags().StringSliceVar(&ips, "ip", nil, "IP addresses the node certificate also names")
	cmd.Flags().IntVar(&days, "days", 365, "validity in days")
	return cmd
}

func writePEM(path, kind string, der []byte, mode os.FileMode) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), mode)
}

func makeCA(dir string, days int) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "fusiond peers test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Duration(days) * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, "ca-key.pem"), "PRIVATE KEY", kder, 0o600); err != nil {
		return err
	}
	return writePEM(filepath.Join(dir, "ca.pem"), "CERTIFICATE", der, 0o644)
}

func readPEM(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("%s holds no PEM block", path)
	}
	return blk.Bytes, nil
}

func makeNodeCert(dir, name string, ips []string, days int) error {
	if name == "" || strings.ContainsAny(name, "/ ") {
		return fmt.Errorf("node name %q: want the daemon's peers.node_name", name)
	}
	caDER, err := readPEM(filepath.Join(dir, "ca.pem"))
	if err != nil {
		return fmt.Errorf("CA certificate (make one with fusionctl peers cert ca): %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	caKeyDER, err := readPEM(filepath.Join(dir, "ca-key.pem"))
	if err != nil {
		return fmt.Errorf("CA key: %w", err)
	}
	caKey, err := x509.ParsePKCS8PrivateKey(caKeyDER)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Duration(days) * 24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, s := range ips {
		ip := net.ParseIP(s)
		if ip == nil {
			return fmt.Errorf("--ip %q is not an IP address", s)
		}
		tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, name+"-key.pem"), "PRIVATE KEY", kder, 0o600); err != nil {
		return err
	}
	return writePEM(filepath.Join(dir, name+".pem"), "CERTIFICATE", der, 0o644)
}

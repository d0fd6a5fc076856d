package peers

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// tlsConfigs builds the peer API's server and client TLS settings: both
// sides present a certificate issued by the cluster's CA (caFile), and
// accept only certificates that CA issued (TLS 1.3). The client checks
// that the server's certificate names the peer it meant to reach (its node
// name as a DNS name); the server reads the calling peer's name from its
// certificate.
func tlsConfigs(certFile, keyFile, caFile string) (server, client *tls.Config, err error) {
	if err := checkSecret(keyFile, "peer private key"); err != nil {
		return nil, nil, err
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("peer certificate: %w", err)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, nil, fmt.Errorf("peer CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, nil, fmt.Errorf("peer CA %s holds no PEM certificate", caFile)
	}
	server = &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
	}
	client = &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
	}
	return server, client, nil
}

// peerName is the node name a verified client certificate carries: its
// first DNS name, else its common name.
func peerName(state *tls.ConnectionState) (string, error) {
	if state == nil || len(state.VerifiedChains) == 0 || len(state.VerifiedChains[0]) == 0 {
		return "", errors.New("no verified peer certificate")
	}
	c := state.VerifiedChains[0][0]
	if len(c.DNSNames) > 0 {
		return c.DNSNames[0], nil
	}
	if c.Subject.CommonName != "" {
		return c.Subject.CommonName, nil
	}
	return "", errors.New("peer certificate names no node")
}

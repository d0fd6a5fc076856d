package peers

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/handover"
)

// The messages peers exchange. Gossip messages (memberlist user messages
// and push/pull state) start with a kind byte; the peer API's bodies are
// plain JSON. Every decoder is strict (unknown fields are errors), bounded
// and fuzzed (wire_fuzz_test.go).

const (
	// kindLoad is a signed load message (an envelope), kindState a
	// push/pull state of them. They replaced the unsigned 'L' and 'S',
	// which this version drops (an older daemon drops these in turn).
	kindLoad  byte = 'G'
	kindState byte = 'H'
	// maxLoadBytes bounds one encoded load message (envelope and
	// signature included) so it fits a gossip packet with room for
	// memberlist's framing.
	maxLoadBytes = 1024
	// maxSigBytes bounds a signature (ECDSA P-256 in ASN.1: at most 72;
	// Ed25519: 64; RSA up to 4096 bits: 512).
	maxSigBytes = 512
	// maxStateLoads bounds the loads one push/pull state carries.
	maxStateLoads = 4096
	// maxMetaBytes is memberlist's node metadata limit.
	maxMetaBytes = 512
	// maxBody bounds a peer API request or answer body (a job spec, a
	// status with a log chunk).
	maxBody = 2 << 20
	// logChunk is the most output one poll returns.
	logChunk = 256 << 10
)

// loadMsg is one node's gossiped load; Seq orders a node's messages (a
// newer one replaces an older one everywhere).
type loadMsg struct {
	Node string       `json:"node"`
	Seq  uint64       `json:"seq"`
	API  string       `json:"api,omitempty"`
	Load api.PeerLoad `json:"load"`
}

// envelope is a load message as it travels: Body is the loadMsg as its
// node encoded it (the exact bytes it signed), Sig that node's signature
// over them with the private key of its peer certificate (sign.go).
// Relays and push/pull pass the envelope on byte for byte.
type envelope struct {
	Body json.RawMessage `json:"body"`
	Sig  []byte          `json:"sig"`
}

// signedLoad is a decoded and validated load message, not yet verified:
// its loadMsg, the body and signature to verify, and the envelope as it
// came (what this node relays and pushes).
type signedLoad struct {
	loadMsg
	body, sig, raw []byte
}

// meta is the node metadata memberlist carries with each member.
type meta struct {
	API string `json:"api"`
}

// offerRequest is the body of POST /peer/v1/offers.
type offerRequest struct {
	// Key is the global job ID, "<origin node>/<id>#<n>"; it must start
	// with the name in the origin's certificate.
	Key   string      `json:"key"`
	JobID string      `json:"job_id"`
	User  string      `json:"user"`
	Spec  api.JobSpec `json:"spec"`
	// Hold, when set, reserves a gang member: placed and held, started
	// only by a commit, released when the hold passes first.
	Hold api.Duration `json:"hold,omitempty"`
}

// offerAnswer is its answer.
type offerAnswer struct {
	Accepted bool   `json:"accepted"`
	RemoteID string `json:"remote_id,omitempty"`
	Why      string `json:"why,omitempty"`
	// Load is the answering peer's load as it was when it answered: a
	// load message's envelope exactly as the peer gossips it (signed by
	// it, numbered in its gossip's sequence), so the origin verifies and
	// keeps it as it would a gossiped one (Node.answerLoad). An older
	// peer answers without it.
	Load json.RawMessage `json:"load,omitempty"`
	// load is Load decoded and validated (decodeAnswer), nil when absent
	// or invalid; loadErr says why it was invalid.
	load    *signedLoad
	loadErr error
}

// strict decodes a message that asks this daemon to act (an offer, its
// answer, a status): a field this version does not know is an error, so
// a job is never run without a part of its spec.
func strict(b []byte, v any) error { return decode(b, v, true) }

// tolerant decodes gossip (load, state, metadata): fields a newer daemon
// adds are ignored, so a cluster can be upgraded one daemon at a time.
func tolerant(b []byte, v any) error { return decode(b, v, false) }

func decode(b []byte, v any, strict bool) error {
	if len(b) > maxBody {
		return fmt.Errorf("message of %d bytes is over the %d-byte limit", len(b), maxBody)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	if strict {
		d.DisallowUnknownFields()
	}
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errors.New("trailing data after the message")
	}
	return nil
}

// encodeLoad signs m with sign and wraps it in its envelope. The
// envelope is written by hand so that the body is the very bytes signed.
func encodeLoad(m loadMsg, sign func([]byte) ([]byte, error)) ([]byte, error) {
	for {
		body, err := json.Marshal(m)
		if err != nil {
			return nil, err
		}
		sig, err := sign(body)
		if err != nil {
			return nil, fmt.Errorf("signing the load: %w", err)
		}
		b := make([]byte, 0, len(body)+len(sig)*4/3+32)
		b = append(b, kindLoad)
		b = append(b, `{"body":`...)
		b = append(b, body...)
		b = append(b, `,"sig":"`...)
		b = base64.StdEncoding.AppendEncode(b, sig)
		b = append(b, `"}`...)
		if len(b) <= maxLoadBytes {
			return b, nil
		}
		// Too many models, profiles or bitstreams to gossip: drop the
		// longest lists first (what is left stays true, only less
		// complete).
		switch {
		case len(m.Load.Bitstreams) > 0:
			m.Load.Bitstreams = m.Load.Bitstreams[:len(m.Load.Bitstreams)/2]
		case len(m.Load.MIG) > 0:
			m.Load.MIG = nil
		case len(m.Load.GPUs) > 0:
			m.Load.GPUs = nil
		default:
			return nil, fmt.Errorf("load message of %d bytes does not fit %d", len(b), maxLoadBytes)
		}
	}
}

// decodeLoad decodes and validates a load message (validateMsg); its
// signature is checked by the receiver, which knows the node's key.
func decodeLoad(b []byte) (signedLoad, error) {
	if len(b) == 0 || b[0] != kindLoad {
		return signedLoad{}, errors.New("not a load message")
	}
	if len(b) > maxLoadBytes {
		return signedLoad{}, fmt.Errorf("load message of %d bytes is over the %d-byte limit", len(b), maxLoadBytes)
	}
	return decodeEnvelope(b[1:])
}

func decodeEnvelope(raw []byte) (signedLoad, error) {
	var e envelope
	if len(raw)+1 > maxLoadBytes {
		return signedLoad{}, fmt.Errorf("load message of %d bytes is over the %d-byte limit", len(raw)+1, maxLoadBytes)
	}
	if err := tolerant(raw, &e); err != nil {
		return signedLoad{}, fmt.Errorf("load message: %w", err)
	}
	if len(e.Sig) == 0 || len(e.Body) == 0 {
		return signedLoad{}, errors.New("load message without a body or a signature")
	}
	if len(e.Sig) > maxSigBytes {
		return signedLoad{}, fmt.Errorf("load message with a signature of %d bytes, over %d", len(e.Sig), maxSigBytes)
	}
	var m loadMsg
	if err := tolerant(e.Body, &m); err != nil {
		return signedLoad{}, fmt.Errorf("load message: %w", err)
	}
	if err := validateMsg(m); err != nil {
		return signedLoad{}, err
	}
	return signedLoad{loadMsg: m, body: e.Body, sig: e.Sig, raw: raw}, nil
}

// encodeState is a push/pull state: the envelopes, each as it came.
func encodeState(raws [][]byte) []byte {
	n := 3
	for _, r := range raws {
		n += len(r) + 1
	}
	b := make([]byte, 0, n)
	b = append(b, kindState, '[')
	for i, r := range raws {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, r...)
	}
	return append(b, ']')
}

// decodeState decodes a push/pull state: the loads that decode and
// validate, and how many did not (dropped one by one, not the state).
func decodeState(b []byte) ([]signedLoad, int, error) {
	if len(b) == 0 || b[0] != kindState {
		return nil, 0, errors.New("not a state message")
	}
	var raws []json.RawMessage
	if err := tolerant(b[1:], &raws); err != nil {
		return nil, 0, fmt.Errorf("state message: %w", err)
	}
	if len(raws) > maxStateLoads {
		return nil, 0, fmt.Errorf("state message with %d loads, over %d", len(raws), maxStateLoads)
	}
	out := make([]signedLoad, 0, len(raws))
	bad := 0
	for _, r := range raws {
		l, err := decodeEnvelope(r)
		if err != nil {
			bad++
			continue
		}
		out = append(out, l)
	}
	return out, bad, nil
}

func decodeMeta(b []byte) (meta, error) {
	var m meta
	if len(b) == 0 {
		return m, nil
	}
	if len(b) > maxMetaBytes {
		return m, fmt.Errorf("node metadata of %d bytes, over %d", len(b), maxMetaBytes)
	}
	err := tolerant(b, &m)
	return m, err
}

func decodeOffer(b []byte) (offerRequest, error) {
	var o offerRequest
	if err := strict(b, &o); err != nil {
		return o, fmt.Errorf("offer: %w", err)
	}
	if o.Key == "" || o.JobID == "" {
		return o, errors.New("offer without key or job_id")
	}
	return o, nil
}

func decodeAnswer(b []byte) (offerAnswer, error) {
	var a offerAnswer
	if err := strict(b, &a); err != nil {
		return a, fmt.Errorf("offer answer: %w", err)
	}
	if a.Accepted && a.RemoteID == "" {
		return a, errors.New("offer accepted without the job's ID")
	}
	if len(a.Load) > 0 {
		// A bad load does not make the answer bad (the peer may have
		// accepted the job): it is dropped alone, as gossip would be.
		l, err := decodeEnvelope(a.Load)
		if err != nil {
			a.loadErr = err
		} else {
			a.load = &l
		}
	}
	return a, nil
}

func decodeStatus(b []byte) (handover.RemoteStatus, error) {
	var s handover.RemoteStatus
	if err := strict(b, &s); err != nil {
		return s, fmt.Errorf("job status: %w", err)
	}
	if s.ID == "" || s.State == "" {
		return s, errors.New("job status without id or state")
	}
	if len(s.Log) > logChunk {
		return s, fmt.Errorf("job status with %d bytes of output, over %d", len(s.Log), logChunk)
	}
	return s, nil
}

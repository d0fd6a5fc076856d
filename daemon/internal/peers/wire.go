package peers

import (
	"bytes"
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
	kindLoad  byte = 'L'
	kindState byte = 'S'
	// maxLoadBytes bounds one encoded load message so it fits a gossip
	// packet with room for memberlist's framing.
	maxLoadBytes = 1024
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

func encodeLoad(m loadMsg) ([]byte, error) {
	for {
		b, err := json.Marshal(m)
		if err != nil {
			return nil, err
		}
		if len(b)+1 <= maxLoadBytes {
			return append([]byte{kindLoad}, b...), nil
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

func decodeLoad(b []byte) (loadMsg, error) {
	var m loadMsg
	if len(b) == 0 || b[0] != kindLoad {
		return m, errors.New("not a load message")
	}
	if len(b) > maxLoadBytes {
		return m, fmt.Errorf("load message of %d bytes is over the %d-byte limit", len(b), maxLoadBytes)
	}
	if err := tolerant(b[1:], &m); err != nil {
		return m, fmt.Errorf("load message: %w", err)
	}
	if m.Node == "" {
		return m, errors.New("load message names no node")
	}
	return m, nil
}

func encodeState(loads []loadMsg) ([]byte, error) {
	b, err := json.Marshal(loads)
	if err != nil {
		return nil, err
	}
	return append([]byte{kindState}, b...), nil
}

func decodeState(b []byte) ([]loadMsg, error) {
	if len(b) == 0 || b[0] != kindState {
		return nil, errors.New("not a state message")
	}
	var loads []loadMsg
	if err := tolerant(b[1:], &loads); err != nil {
		return nil, fmt.Errorf("state message: %w", err)
	}
	if len(loads) > maxStateLoads {
		return nil, fmt.Errorf("state message with %d loads, over %d", len(loads), maxStateLoads)
	}
	for _, l := range loads {
		if l.Node == "" {
			return nil, errors.New("state message with a load that names no node")
		}
	}
	return loads, nil
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

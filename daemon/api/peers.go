package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"time"
)

// Handover is where an origin daemon's job went when it did not fit on the
// origin within its wait budget: the peer that accepted it, the job's ID
// there, and why that peer was chosen. The origin keeps the record;
// fusionctl show, logs and cancel on the origin reach the job on the peer.
type Handover struct {
	// Key is the job's global ID, "<origin node>/<job id>#<n>": a peer
	// that is offered the same key twice (a retry, a healed partition)
	// answers with the job it already has, never a second one.
	Key string `json:"key"`
	// Peer is the accepting peer's node name; Address its peer API.
	Peer    string `json:"peer"`
	Address string `json:"address"`
	// RemoteID is the job's ID on the peer.
	RemoteID string `json:"remote_id,omitempty"`
	// Why says why the job left and why this peer took it (its score and
	// the peers that refused before it).
	Why string    `json:"why"`
	At  time.Time `json:"at"`
}

// Provenance marks a job a peer accepted from another daemon: the origin's
// node name and job ID, and the global key (see Handover.Key).
type Provenance struct {
	Node  string `json:"node"`
	JobID string `json:"job_id"`
	Key   string `json:"key"`
}

// PeerLoad is what a daemon gossips about itself: its free resources per
// device class, its queue and its health.
type PeerLoad struct {
	// CPU and Memory are free (capacity minus what placed jobs hold).
	CPU    MilliCPU `json:"cpu"`
	Memory Bytes    `json:"memory"`
	// GPUs counts free, healthy whole GPUs by model.
	GPUs map[string]int `json:"gpus,omitempty"`
	// MIG counts, per MIG profile, the instances that could still be
	// created (or taken) on MIG-mode GPUs.
	MIG map[string]int `json:"mig,omitempty"`
	// GPUShareMilli is the GPU share headroom: thousandths of a GPU free
	// for shares on free whole GPUs and on GPUs already shared.
	GPUShareMilli int `json:"gpu_share_milli,omitempty"`
	// FPGAFree counts free FPGA regions; Bitstreams the bitstreams loaded
	// on them.
	FPGAFree   int      `json:"fpga_free,omitempty"`
	Bitstreams []string `json:"bitstreams,omitempty"`
	// NVLink is, per GPU model, the most free whole GPUs connected to
	// each other by NVLink (a multi-GPU job there gets linked GPUs).
	NVLink map[string]int `json:"nvlink,omitempty"`
	// CPULoad is the host's live CPU load, GPULoad the mean live
	// utilisation of the GPUs a new job could get (free and shared
	// ones), both 0..1 to a hundredth (0 where not measured): the
	// engine's load dimension.
	CPULoad float64 `json:"cpu_load,omitempty"`
	GPULoad float64 `json:"gpu_load,omitempty"`
	// Queue is the number of pending jobs; Wait the predicted wait of a
	// new one (how long the oldest pending job has waited so far).
	Queue int      `json:"queue"`
	Wait  Duration `json:"wait"`
	// Health is "ok", "cordoned" or "not ready: <why>".
	Health string `json:"health"`
	// EnergyHeadroomWatts is the power the GPUs a new job could get (free
	// and shared ones) may still draw before their power limits in force
	// hold them back: the sum of each one's limit less its measured draw,
	// in whole watts. PowerMeasured says whether any of them reported
	// both; without it (no reading, or a daemon from before this field)
	// the headroom is unknown, not 0.
	EnergyHeadroomWatts int  `json:"energy_headroom_watts"`
	PowerMeasured       bool `json:"power_measured,omitempty"`
}

// Peer is one member as this daemon sees it.
type Peer struct {
	Name string `json:"name"`
	// Address is the gossip address, APIAddress the peer API (mutual TLS).
	Address    string `json:"address"`
	APIAddress string `json:"api_address,omitempty"`
	// State is memberlist's: alive, suspect, dead or left.
	State string `json:"state"`
	Self  bool   `json:"self,omitempty"`
	// Load is the last load the peer gossiped; Age how old this view is
	// (since it arrived here); Seq its sequence number.
	Load *PeerLoad `json:"load,omitempty"`
	Age  Duration  `json:"age"`
	Seq  uint64    `json:"seq,omitempty"`
}

// PeerList is the body of GET /v1/peers.
type PeerList struct {
	// Enabled is false when the daemon runs without peers.
	Enabled bool   `json:"enabled"`
	Self    string `json:"self,omitempty"`
	Peers   []Peer `json:"peers"`
	// GossipBytesPerSecond is what this daemon sent of load state (its
	// own and relayed broadcasts, push/pull state), averaged since start.
	GossipBytesPerSecond float64 `json:"gossip_bytes_per_second"`
	// Keys are the fingerprints (first 8 hex digits of the SHA-256) of
	// the gossip keyring's keys, the primary first; never the keys.
	Keys []string `json:"keys,omitempty"`
	// InsecureGossip is true when gossip is not encrypted: the daemon
	// runs without a keyring because its configuration says
	// peers.insecure_gossip: true. Loads are signed either way.
	InsecureGossip bool `json:"insecure_gossip,omitempty"`
	// GossipDropped counts, by why, the gossiped loads this daemon
	// dropped since it started: "invalid" (undecodable, or a number out
	// of its bounds), "not a member", "not signed by its node", and
	// "key fetch failed" (a member's signing key could not be fetched).
	GossipDropped map[string]uint64 `json:"gossip_dropped,omitempty"`
}

// KeyringRequest is the body of POST /v1/peers/keyring: Op is install
// (add a key), use (make an installed key primary) or remove; Key is the
// base64 of a 16, 24 or 32-byte AES key.
type KeyringRequest struct {
	Op  string `json:"op"`
	Key string `json:"key"`
}

// Peers lists the daemon's peers.
func (c *Client) Peers(ctx context.Context) (PeerList, error) {
	var out PeerList
	err := c.do(ctx, "GET", "/v1/peers", nil, &out)
	return out, err
}

// Keyring changes the gossip keyring (admin) and returns the peer list
// with the new key fingerprints.
func (c *Client) Keyring(ctx context.Context, req KeyringRequest) (PeerList, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return PeerList{}, err
	}
	var out PeerList
	err = c.do(ctx, "POST", "/v1/peers/keyring", body, &out)
	return out, err
}

// Validate checks a keyring request's operation and key.
func (k KeyringRequest) Validate() error {
	switch k.Op {
	case "install", "use", "remove":
	default:
		return FieldError("op", "want install, use or remove, got %q", k.Op)
	}
	b, err := base64.StdEncoding.DecodeString(k.Key)
	if err != nil {
		return FieldError("key", "not base64: %v", err)
	}
	if n := len(b); n != 16 && n != 24 && n != 32 {
		return FieldError("key", "a key is 16, 24 or 32 bytes (AES-128/192/256), got %d", n)
	}
	return nil
}

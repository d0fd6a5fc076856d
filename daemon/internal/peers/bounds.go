package peers

import (
	"fmt"
	"maps"
	"net"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/fusiond/fusiond/daemon/api"
)

// Every number a peer gossips is checked against these bounds when it is
// decoded; a message with a value outside them is dropped whole (counted
// in api.PeerList.GossipDropped, logged at debug). They are far beyond
// any real host, so an honest daemon never trips them (it clamps its own
// load to them before gossiping, clampLoad), and tight enough that a lie
// cannot buy a peer a better rank: nothing negative (a queue of −1000
// once outranked every honest peer), no fraction outside [0, 1].
const (
	// maxGossipCPU is 65,536 cores in millicores.
	maxGossipCPU = 65536 * 1000
	// maxGossipMemory is 1 PiB.
	maxGossipMemory = 1 << 50
	// maxGossipGPUs bounds whole GPUs (all models together), NVLink
	// groups and FPGA regions on one host; peerNode models no more.
	maxGossipGPUs = 64
	// maxGossipMIG bounds MIG instances per profile (7 a GPU).
	maxGossipMIG = 7 * maxGossipGPUs
	// maxGossipKinds bounds the GPU models, MIG profiles and bitstreams
	// one load names; maxGossipName the length of each name.
	maxGossipKinds = 16
	maxGossipName  = 128
	// maxGossipQueue and maxGossipWait bound the pending jobs and the
	// oldest's wait.
	maxGossipQueue = 1_000_000
	maxGossipWait  = 365 * 24 * time.Hour
	// maxGossipHealth bounds the health text ("not ready: <why>").
	maxGossipHealth = 256
	// maxGossipWatts bounds the energy headroom (10 MW).
	maxGossipWatts = 10_000_000
	// maxNodeName is a DNS name's limit; maxAPIAddr a host:port's.
	maxNodeName = 253
	maxAPIAddr  = 300
)

// validName reports whether s can be a node name: what a certificate
// carries as a DNS name (letters, digits, '-', '.', and '_'), 1 to 253
// bytes. A hand-over key is "<node>/<job>", so a name holds no '/'.
func validName(s string) bool {
	if s == "" || len(s) > maxNodeName {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '.', r == '_':
		default:
			return false
		}
	}
	return true
}

// validateMsg checks a decoded load message: its node's name, sequence
// number, API address and every number of its load.
func validateMsg(m loadMsg) error {
	if !validName(m.Node) {
		return fmt.Errorf("node name %.64q is not a DNS name of at most %d bytes", m.Node, maxNodeName)
	}
	if m.Seq == 0 {
		return fmt.Errorf("load of %s without a sequence number", m.Node)
	}
	if m.API != "" {
		if len(m.API) > maxAPIAddr {
			return fmt.Errorf("load of %s: API address of %d bytes", m.Node, len(m.API))
		}
		if _, _, err := net.SplitHostPort(m.API); err != nil {
			return fmt.Errorf("load of %s: API address: %v", m.Node, err)
		}
	}
	if err := validateLoad(m.Load); err != nil {
		return fmt.Errorf("load of %s: %w", m.Node, err)
	}
	return nil
}

// validateLoad checks every gossiped number against its bound.
func validateLoad(l api.PeerLoad) error {
	if err := inRange("cpu", int64(l.CPU), maxGossipCPU); err != nil {
		return err
	}
	if err := inRange("memory", int64(l.Memory), maxGossipMemory); err != nil {
		return err
	}
	whole := 0
	for _, c := range []struct {
		field  string
		counts map[string]int
		limit  int64
	}{{"gpus", l.GPUs, maxGossipGPUs}, {"mig", l.MIG, maxGossipMIG}, {"nvlink", l.NVLink, maxGossipGPUs}} {
		if len(c.counts) > maxGossipKinds {
			return fmt.Errorf("%s names %d kinds, over %d", c.field, len(c.counts), maxGossipKinds)
		}
		for k, v := range c.counts {
			if k == "" || len(k) > maxGossipName || !utf8.ValidString(k) {
				return fmt.Errorf("%s: a name of %d bytes", c.field, len(k))
			}
			if err := inRange(c.field+"["+k+"]", int64(v), c.limit); err != nil {
				return err
			}
		}
	}
	for _, v := range l.GPUs {
		whole += v
	}
	if err := inRange("gpus (all models)", int64(whole), maxGossipGPUs); err != nil {
		return err
	}
	if err := inRange("gpu_share_milli", int64(l.GPUShareMilli), maxGossipGPUs*1000); err != nil {
		return err
	}
	if err := inRange("fpga_free", int64(l.FPGAFree), maxGossipGPUs); err != nil {
		return err
	}
	if len(l.Bitstreams) > maxGossipKinds {
		return fmt.Errorf("bitstreams: %d, over %d", len(l.Bitstreams), maxGossipKinds)
	}
	for _, b := range l.Bitstreams {
		if b == "" || len(b) > maxGossipName || !utf8.ValidString(b) {
			return fmt.Errorf("bitstreams: a name of %d bytes", len(b))
		}
	}
	for _, f := range []struct {
		field string
		v     float64
	}{{"cpu_load", l.CPULoad}, {"gpu_load", l.GPULoad}} {
		if !(f.v >= 0 && f.v <= 1) { // also NaN
			return fmt.Errorf("%s %v outside [0, 1]", f.field, f.v)
		}
	}
	if err := inRange("queue", int64(l.Queue), maxGossipQueue); err != nil {
		return err
	}
	if err := inRange("wait", int64(l.Wait), int64(maxGossipWait)); err != nil {
		return err
	}
	if err := inRange("energy_headroom_watts", int64(l.EnergyHeadroomWatts), maxGossipWatts); err != nil {
		return err
	}
	switch h := l.Health; {
	case len(h) > maxGossipHealth || !utf8.ValidString(h):
		return fmt.Errorf("health of %d bytes, over %d", len(h), maxGossipHealth)
	case h == "ok", h == "cordoned", len(h) > len("not ready: ") && h[:len("not ready: ")] == "not ready: ":
	default:
		return fmt.Errorf("health %.64q: want ok, cordoned or not ready: <why>", h)
	}
	return nil
}

func inRange(field string, v, limit int64) error {
	if v < 0 || v > limit {
		return fmt.Errorf("%s %d outside [0, %d]", field, v, limit)
	}
	return nil
}

// clampLoad brings this host's own load within the bounds, so that peers
// never drop what an honest daemon gossips (a host beyond them is told
// as the most they believe).
func clampLoad(l api.PeerLoad) api.PeerLoad {
	l.CPU = min(max(l.CPU, 0), maxGossipCPU)
	l.Memory = min(max(l.Memory, 0), maxGossipMemory)
	l.Queue = min(max(l.Queue, 0), maxGossipQueue)
	l.Wait = min(max(l.Wait, 0), api.Duration(maxGossipWait))
	l.GPUShareMilli = min(max(l.GPUShareMilli, 0), maxGossipGPUs*1000)
	l.FPGAFree = min(max(l.FPGAFree, 0), maxGossipGPUs)
	l.CPULoad, l.GPULoad = min(max(l.CPULoad, 0), 1), min(max(l.GPULoad, 0), 1)
	if len(l.Bitstreams) > maxGossipKinds {
		l.Bitstreams = l.Bitstreams[:maxGossipKinds]
	}
	whole := 0
	for _, m := range slices.Sorted(maps.Keys(l.GPUs)) {
		l.GPUs[m] = min(l.GPUs[m], maxGossipGPUs-whole)
		whole += l.GPUs[m]
	}
	for k, v := range l.MIG {
		l.MIG[k] = min(v, maxGossipMIG)
	}
	for k, v := range l.NVLink {
		l.NVLink[k] = min(v, maxGossipGPUs)
	}
	if len(l.Health) > maxGossipHealth {
		h := l.Health[:maxGossipHealth]
		for !utf8.ValidString(h) {
			h = h[:len(h)-1]
		}
		l.Health = h
	}
	return l
}

package peers

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"net"
	"reflect"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// Every decoder of a peer message takes any bytes without panicking, and
// what it accepts survives a round trip.

// testSigner signs the fuzzers' and unit tests' load messages.
var testSigner = func() crypto.Signer {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	return k
}()

func testSign(body []byte) ([]byte, error) { return signLoad(testSigner, body) }

func seedLoad() loadMsg {
	return loadMsg{Node: "dgx-1", Seq: 42, API: "10.0.0.1:7947", Load: api.PeerLoad{
		CPU: 64000, Memory: 1 << 40, GPUs: map[string]int{"NVIDIA H200": 8}, MIG: map[string]int{"1g.18gb": 7},
		GPUShareMilli: 8000, FPGAFree: 1, Bitstreams: []string{"nlb0"}, Queue: 3, Wait: api.Duration(2 * time.Second), Health: "ok"}}
}

func FuzzDecodeLoad(f *testing.F) {
	b, _ := encodeLoad(seedLoad(), testSign)
	f.Add(b)
	f.Add([]byte("G{}"))
	f.Add([]byte("G{\"body\":{\"node\":\"x\",\"seq\":1,\"load\":{\"cpu\":\"1\",\"memory\":\"1Gi\",\"queue\":0,\"wait\":\"1s\",\"health\":\"ok\",\"energy_headroom_watts\":0}},\"sig\":\"AAAA\"}"))
	f.Add([]byte("G{\"body\":{\"node\":\"x\",\"seq\":1,\"load\":{\"queue\":-1000,\"health\":\"ok\"}},\"sig\":\"AAAA\"}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeLoad(b)
		if err != nil {
			return
		}
		if err := validateMsg(m.loadMsg); err != nil {
			t.Fatalf("accepted a load out of its bounds: %v", err)
		}
		again, err := encodeLoad(m.loadMsg, testSign)
		if err != nil {
			return // accepted but too large to re-gossip whole: encodeLoad trims or refuses
		}
		m2, err := decodeLoad(again)
		if err != nil {
			t.Fatalf("re-encoded load does not decode: %v", err)
		}
		if !verifyLoad(testSigner.Public(), m2.body, m2.sig) {
			t.Fatal("a re-encoded load does not verify")
		}
		if len(again) <= len(b) && !reflect.DeepEqual(normal(m.loadMsg), normal(m2.loadMsg)) {
			t.Fatalf("round trip changed the load:\n%+v\n%+v", m, m2)
		}
	})
}

// normal makes empty and nil lists and maps compare equal.
func normal(m loadMsg) string {
	b, _ := json.Marshal(m)
	return string(b)
}

func FuzzDecodeState(f *testing.F) {
	one, _ := encodeLoad(seedLoad(), testSign)
	two, _ := encodeLoad(loadMsg{Node: "b", Seq: 1, Load: api.PeerLoad{Health: "ok"}}, testSign)
	f.Add(encodeState([][]byte{one[1:], two[1:]}))
	f.Add([]byte("H[]"))
	f.Add([]byte("H[{\"body\":{\"node\":\"\"},\"sig\":\"AAAA\"}]"))
	f.Fuzz(func(t *testing.T, b []byte) {
		loads, _, err := decodeState(b)
		if err != nil {
			return
		}
		for _, l := range loads {
			if err := validateMsg(l.loadMsg); err != nil || len(l.sig) == 0 {
				t.Fatalf("accepted a load out of its bounds or unsigned: %v", err)
			}
		}
	})
}

func FuzzDecodeMeta(f *testing.F) {
	f.Add([]byte(`{"api":"127.0.0.1:7947"}`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = decodeMeta(b)
	})
}

func FuzzDecodeOffer(f *testing.F) {
	f.Add([]byte(`{"key":"a/1#1","job_id":"1","user":"root","spec":{"name":"x","class":"batch","command":["true"],"resources":{"cpu":"1","memory":"1Mi"}}}`))
	f.Add([]byte(`{"key":"","job_id":"1"}`))
	f.Add([]byte(`{"key":"a/1#1g1","job_id":"1","user":"root","spec":{"name":"x","class":"training","command":["true"],"resources":{"cpu":"1","memory":"1Mi","gpu":{"count":8}},"gang":{"name":"g","size":2}},"hold":"10s"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		o, err := decodeOffer(b)
		if err == nil && (o.Key == "" || o.JobID == "") {
			t.Fatal("accepted an offer without key or job id")
		}
	})
}

func FuzzDecodeAnswer(f *testing.F) {
	f.Add([]byte(`{"accepted":true,"remote_id":"3"}`))
	f.Add([]byte(`{"accepted":false,"why":"full"}`))
	f.Add([]byte(`{"accepted":true}`))
	if env, err := encodeLoad(seedLoad(), testSign); err == nil {
		f.Add([]byte(`{"accepted":true,"remote_id":"3","load":` + string(env[1:]) + `}`))
		f.Add([]byte(`{"accepted":false,"why":"full","load":` + string(env[1:]) + `}`))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := decodeAnswer(b)
		if err == nil && a.Accepted && a.RemoteID == "" {
			t.Fatal("accepted an acceptance without the job's ID")
		}
		if err == nil && a.load != nil {
			if len(a.Load)+1 > maxLoadBytes || validateMsg(a.load.loadMsg) != nil || len(a.load.sig) == 0 {
				t.Fatalf("kept an answer's load out of its bounds: %d bytes, %+v", len(a.Load), a.load.loadMsg)
			}
		}
	})
}

func FuzzDecodeStatus(f *testing.F) {
	f.Add([]byte(`{"id":"3","state":"running","attempt":1,"pid":99,"log":"aGVsbG8K"}`))
	f.Add([]byte(`{"id":"3","state":"succeeded","exit":{"code":0}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := decodeStatus(b)
		if err == nil && (s.ID == "" || s.State == "" || len(s.Log) > logChunk) {
			t.Fatalf("accepted a bad status %+v", s)
		}
	})
}

// FuzzGossipStream feeds any bytes, as a stranger would send them to the
// gossip port, through the bounded stream reader into the push/pull
// state's and a load message's decoders: the reader never passes its
// limit (it ends the stream with errStreamTooLarge), and the decoders
// take whatever it let through without panicking.
func FuzzGossipStream(f *testing.F) {
	load, _ := encodeLoad(seedLoad(), testSign)
	state := encodeState([][]byte{load[1:]})
	f.Add(state, uint16(4096))
	f.Add(load, uint16(16))
	f.Add([]byte{10, 0x01, 0x3f, 0xff, 0xff}, uint16(3))
	f.Fuzz(func(t *testing.T, data []byte, limit uint16) {
		server, client := net.Pipe()
		go func() {
			client.Write(data)
			client.Close()
		}()
		bt := &boundedTransport{lim: DefaultGossipLimits, bySrc: map[string]int{"pipe": 1}, streams: 1}
		c := &boundedConn{Conn: server, left: int64(limit), deadline: time.Now().Add(time.Second), t: bt, src: "pipe"}
		got, err := io.ReadAll(c)
		c.Close()
		if len(got) > int(limit) {
			t.Fatalf("read %d bytes through a limit of %d", len(got), limit)
		}
		if len(data) > int(limit) && !errors.Is(err, errStreamTooLarge) {
			t.Fatalf("%d bytes through a limit of %d ended with %v, not errStreamTooLarge", len(data), limit, err)
		}
		if bt.streams != 0 || len(bt.bySrc) != 0 {
			t.Fatalf("closing did not give the stream's place back: %d, %v", bt.streams, bt.bySrc)
		}
		decodeState(got)
		decodeLoad(got)
	})
}

package peers

import (
	"fmt"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
)

// changingHost is a host whose free CPU the benchmark changes.
type changingHost struct{ cpu atomic.Int64 }

func (h *changingHost) Capacity() api.NodeResources {
	return api.NodeResources{CPU: api.MilliCPU(h.cpu.Load()), Memory: 1 << 30}
}
func (h *changingHost) Allocated() api.NodeResources            { return api.NodeResources{} }
func (h *changingHost) Hardware() hostplacer.Hardware           { return hostplacer.Hardware{} }
func (h *changingHost) LiveLoad() (float64, map[string]float64) { return 0, nil }
func (h *changingHost) PowerHeadroom() map[string]float64       { return nil }

// BenchmarkConvergence measures, for N daemons' memberlists on loopback
// (LAN profile, load gossiped every second), how long one daemon's load
// change takes to reach all N once it is gossiped: each op changes node
// 0's free CPU, gossips it and waits until every node holds the new
// value. It also reports the load-gossip bytes each node sent per second.
//
//	go test -run '^$' -bench Convergence -benchtime 20x ./daemon/internal/peers/
func BenchmarkConvergence(b *testing.B) { benchConvergence(b, true) }

// BenchmarkLoadChange is BenchmarkConvergence from the change of the
// host's load itself: the broadcast loop notices it and gossips it. Each
// change comes a broadcast interval after the last (outside the timing),
// as a change after a quiet second does.
//
//	go test -run '^$' -bench LoadChange -benchtime 10x ./daemon/internal/peers/
func BenchmarkLoadChange(b *testing.B) { benchConvergence(b, false) }

func benchConvergence(b *testing.B, direct bool) {
	for _, n := range []int{3, 10, 100} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			ca := newTestCA(b, b.TempDir())
			hosts := make([]*changingHost, n)
			nodes := make([]*Node, n)
			for i := range n {
				name := fmt.Sprintf("n%03d", i)
				cert, key := ca.issue(b, name)
				cfg := Config{NodeName: name, Gossip: "127.0.0.1:0", API: "127.0.0.1:0", Profile: "lan", InsecureGossip: true,
					CertFile: cert, KeyFile: key, CAFile: filepath.Join(ca.dir, "ca.pem"), Broadcast: time.Second}
				if i > 0 {
					cfg.Join = []string{nodes[0].GossipAddr()}
				}
				hosts[i] = &changingHost{}
				hosts[i].cpu.Store(1000)
				nd, err := New(cfg, newFakeJobs(), hosts[i], nil)
				if err != nil {
					b.Fatal(err)
				}
				nd.Start()
				defer nd.Close()
				nodes[i] = nd
			}
			sees := func(nd *Node, cpu int64) bool {
				nd.mu.Lock()
				defer nd.mu.Unlock()
				v, ok := nd.view["n000"]
				return ok && int64(v.msg.Load.CPU) == cpu
			}
			all := func(cpu int64) bool {
				return !slices.ContainsFunc(nodes, func(nd *Node) bool { return !sees(nd, cpu) })
			}
			deadline := time.Now().Add(60 * time.Second)
			for !all(1000) {
				if time.Now().After(deadline) {
					b.Fatal("the members did not converge at all")
				}
				time.Sleep(10 * time.Millisecond)
			}
			start := time.Now()
			sent0 := int64(0)
			for _, nd := range nodes {
				sent0 += nd.sent.Load()
			}
			var took []time.Duration
			b.ResetTimer()
			for i := range b.N {
				cpu := int64(2000 + i)
				if !direct {
					b.StopTimer()
					time.Sleep(nodes[0].cfg.Broadcast)
					b.StartTimer()
				}
				hosts[0].cpu.Store(cpu)
				t0 := time.Now()
				if direct {
					nodes[0].gossip(localLoad(nodes[0].host, nodes[0].jobs))
				}
				for !all(cpu) {
					if time.Since(t0) > 30*time.Second {
						b.Fatalf("load change %d did not reach every member in 30s", i)
					}
					time.Sleep(5 * time.Millisecond)
				}
				took = append(took, time.Since(t0))
			}
			b.StopTimer()
			sent := int64(0)
			for _, nd := range nodes {
				sent += nd.sent.Load()
			}
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Milliseconds()), "ms-p50")
			b.ReportMetric(float64(took[len(took)-1].Milliseconds()), "ms-max")
			b.ReportMetric(float64(sent-sent0)/time.Since(start).Seconds()/float64(n), "B/s/node")
		})
	}
}

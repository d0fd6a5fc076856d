package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/hardware"
	"github.com/fusiond/fusiond/daemon/internal/metrics"
	"github.com/fusiond/fusiond/daemon/internal/qos"
	"github.com/fusiond/fusiond/daemon/internal/telemetry"
	"github.com/fusiond/fusiond/devices"
	"github.com/fusiond/fusiond/ebpf"
)

// inventories lists every device of every driver, for the metrics.
func inventories(ctx context.Context, h *hardware.Host, log *slog.Logger) []devices.Device {
	var out []devices.Device
	for _, drv := range h.Drivers() {
		inv, err := drv.Inventory(ctx)
		if err != nil {
			log.Warn("metrics: device inventory incomplete", "driver", drv.Kind(), "err", err)
		}
		out = append(out, inv.Devices...)
	}
	return out
}

// tierStats reads each QoS tier's cgroup; nil without cgroups.
func tierStats(cg *cgroups.Manager) func() (map[api.Tier]cgroups.Stats, error) {
	if cg == nil {
		return nil
	}
	return func() (map[api.Tier]cgroups.Stats, error) {
		out := map[api.Tier]cgroups.Stats{}
		var errs []error
		for _, t := range api.Tiers {
			st, err := cg.TierStats(t)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			out[t] = st
		}
		return out, errors.Join(errs...)
	}
}

// qosMetrics reads the QoS loop l at a scrape (nil when it does not run:
// reported as off).
func qosMetrics(l *qos.Loop) metrics.QoS {
	if l == nil {
		return metrics.QoS{}
	}
	st, c := l.Status(), l.Counters()
	out := metrics.QoS{Enabled: st.Enabled, BestEffortCPUMilli: int64(st.BestEffortQuota), BestEffortMemoryHigh: int64(st.BestEffortMemoryHigh),
		Protected: st.Protected, Breaching: st.Breaching,
		ProbeStats: c.ProbeStats, ProbeRuns: c.ProbeRuns, ProbeRunNs: c.ProbeRunNs,
		ProbeSlots: c.Slots.Max, ProbeSlotsUsed: c.Slots.Used, Untimed: c.Untimed, UntimedTotal: c.UntimedTotal, LostWaits: c.LostWaits,
		Latency: make(map[api.Class]metrics.Log2Histogram, len(c.Latency)), Delay: make(map[string]uint64, len(c.Delay))}
	for r, ns := range c.Delay {
		out.Delay[ebpf.Runner(r).String()] = ns
	}
	for k, n := range c.Actions {
		out.Actions = append(out.Actions, metrics.QoSAction{Op: k.Op, Resource: k.Resource, Result: k.Result, Count: n})
	}
	for class, h := range c.Latency {
		out.Latency[class] = metrics.Log2Histogram{Buckets: h.Buckets[:], SumNs: h.SumNs}
	}
	return out
}

// telemetryMetrics reads the telemetry bus's following of jobs at a
// scrape (the bus is built after the metrics, before any scrape; nil
// reports nothing followed).
func telemetryMetrics(bus *telemetry.Bus) metrics.Telemetry {
	if bus == nil {
		return metrics.Telemetry{}
	}
	f := bus.FollowStats()
	return metrics.Telemetry{Followed: f.Followed, Max: f.Max, Unfollowed: f.Unfollowed, UnfollowedTotal: f.UnfollowedTotal}
}

// listenMetrics opens the metrics listener: a TCP address, or a Unix
// socket made like the API's (listenUnix).
func listenMetrics(cfg Config, network, addr string) (net.Listener, error) {
	if network == "tcp" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("metrics.listen: %w", err)
		}
		return ln, nil
	}
	ln, err := listenUnix(cfg, addr)
	if err != nil {
		return nil, fmt.Errorf("metrics.listen: %w", err)
	}
	return ln, nil
}

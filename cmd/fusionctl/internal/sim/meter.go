package sim

import "github.com/fusiond/fusiond/daemon/sched"

// protocolMeter records a protocol replay's figures as pods arrive, the
// same way for the centralised replay (runProtocol) and the decentralised
// one (RunDecentralised): allocation and fragmentation at the thresholds,
// failures at FailThresholds, and the curve.
type protocolMeter struct {
	res                       *RunResult
	nodes                     []*sched.Node
	frag                      *sched.FragModel
	capMilli                  int64
	arrived, alloc, failed    int64
	failedBig, next, nextFail int
	nextCurve                 float64
	// idle records RunResult.Idle at the last threshold.
	idle bool
}

// newProtocolMeter readies res (figures NaN until their threshold is
// reached) for a replay over nodes.
func newProtocolMeter(res *RunResult, nodes []*sched.Node, frag *sched.FragModel) *protocolMeter {
	m := &protocolMeter{res: res, nodes: nodes, frag: frag}
	for _, n := range nodes {
		m.capMilli += int64(len(n.GPUs)) * sched.MilliPerGPU
		res.BigGPUs = max(res.BigGPUs, len(n.GPUs))
	}
	res.AllocPct = make([]float64, len(res.Thresholds))
	res.FragPct = make([]float64, len(res.Thresholds))
	for i := range res.Thresholds {
		res.AllocPct[i], res.FragPct[i] = nan(), nan()
	}
	res.FailAt = make([]FailPoint, len(FailThresholds))
	for i, t := range FailThresholds {
		res.FailAt[i] = FailPoint{ArrivedPct: t, GPUs: nan()}
	}
	return m
}

// pod records one arrived pod, placed or failed.
func (m *protocolMeter) pod(req *sched.Request, placed bool) {
	res := m.res
	m.arrived += req.GPUMilliTotal()
	if placed {
		m.alloc += req.GPUMilliTotal()
	} else {
		res.Failed++
		if req.GPUs > 0 {
			res.FailedGPU++
		}
		m.failed += req.GPUMilliTotal()
		if req.GPUs >= res.BigGPUs && req.GPUMilli == sched.MilliPerGPU {
			m.failedBig++
		}
	}
	if m.capMilli == 0 {
		return
	}
	arrivedPct := 100 * float64(m.arrived) / float64(m.capMilli)
	allocPct := 100 * float64(m.alloc) / float64(m.capMilli)
	for m.next < len(res.Thresholds) && arrivedPct >= res.Thresholds[m.next] {
		res.AllocPct[m.next] = allocPct
		res.FragPct[m.next] = clusterFragPct(m.nodes, m.frag)
		m.next++
		if m.idle && m.next == len(res.Thresholds) {
			res.Idle = idleOf(m.nodes)
		}
	}
	for m.nextFail < len(FailThresholds) && arrivedPct >= FailThresholds[m.nextFail] {
		res.FailAt[m.nextFail] = FailPoint{ArrivedPct: FailThresholds[m.nextFail], Pods: float64(res.Failed), GPUs: float64(m.failed) / sched.MilliPerGPU, BigPods: float64(m.failedBig)}
		m.nextFail++
	}
	if arrivedPct >= m.nextCurve {
		res.Curve = append(res.Curve, CurvePoint{ArrivedPct: arrivedPct, AllocPct: allocPct, FailedPct: 100 * float64(m.failed) / float64(m.capMilli)})
		m.nextCurve = arrivedPct + 1
	}
}

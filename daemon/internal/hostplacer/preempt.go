package hostplacer

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/sched"
)

var (
	_ jobs.Backfiller = (*Placer)(nil)
	_ jobs.Preempter  = (*Placer)(nil)
)

// PlaceBehind is Place for a job (or gang) behind the head of the queue,
// which holds a reservation: it places group only if, in every resource
// group takes, what head needs still fits afterwards
// (sched.BackfillAllowed), so backfill never delays the head.
func (p *Placer) PlaceBehind(group, head []*api.Job) ([]api.Allocation, string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	heads := p.headRequests(head)
	return p.place(group, func(reqs []sched.Request) string {
		for i := range reqs {
			for h := range heads {
				if !sched.BackfillAllowed(&heads[h], &reqs[i], p.node) {
					return fmt.Sprintf("would take what job %s, first in the queue, is waiting for", head[0].ID)
				}
			}
		}
		return ""
	})
}

// headRequests are the requests a reservation for group keeps room for:
// one job's request; for a gang, the members' CPU, memory and whole GPUs
// summed in one request (they are needed together), and each member that
// asks for a GPU share, a MIG instance or an FPGA region on its own. The
// caller holds p.mu.
func (p *Placer) headRequests(group []*api.Job) []sched.Request {
	if len(group) == 1 {
		return []sched.Request{p.jobRequest(group[0])}
	}
	sum := sched.Request{ID: group[0].ID, GPUMilli: sched.MilliPerGPU}
	var out []sched.Request
	for _, j := range group {
		r := p.jobRequest(j)
		sum.CPUMilli += r.CPUMilli
		sum.ExclusiveCores += r.ExclusiveCores
		sum.MemMiB += r.MemMiB
		if r.GPUs > 0 && !r.Shared() {
			sum.GPUs += r.GPUs
			sum.GPUModels = append(sum.GPUModels, r.GPUModels...)
		}
		if r.Shared() || r.MIGProfile != "" || r.Bitstream != "" {
			out = append(out, sched.Request{ID: r.ID, GPUs: r.GPUs, GPUMilli: r.GPUMilli, GPUMemMiB: r.GPUMemMiB,
				MIGProfile: r.MIGProfile, MIGSlices: r.MIGSlices, GPUModels: r.GPUModels, Bitstream: r.Bitstream})
		}
	}
	if sum.GPUs == 0 {
		sum.GPUMilli = 0
	}
	slices.Sort(sum.GPUModels)
	sum.GPUModels = slices.Compact(sum.GPUModels)
	return append([]sched.Request{sum}, out...)
}

// FitsEmpty reports whether group (a job or a whole gang) would fit on
// this host with nothing else placed: ever, with every device in service
// (a gang that does not can never run here), and now, with the devices
// out of service left out (a job that does not waits for a repair, and
// holds no reservation meanwhile).
func (p *Placer) FitsEmpty(group []*api.Job) (ever, now bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	reqs := make([]sched.Request, len(group))
	for i, j := range group {
		reqs[i] = p.jobRequest(j)
	}
	fits := func(n *sched.Node) bool {
		eng := sched.NewEngine(sched.Options{Policy: sched.NewWeighted(p.opts.Profiles, nil), Seed: p.opts.Seed})
		_, err := eng.PlaceGang(slices.Clone(reqs), []*sched.Node{n})
		return err == nil
	}
	if !fits(p.base.Clone()) {
		return false, false
	}
	idle := p.node.Clone()
	for _, h := range p.held {
		idle.Release(&h.assign)
	}
	for gi, g := range p.hw.GPUs {
		if p.down[g.ID] && gi < len(idle.GPUs) {
			idle.GPUs[gi].MilliFree, idle.GPUs[gi].MemFreeMiB = 0, 0
			if m := idle.GPUs[gi].MIG; m != nil {
				m.Instances = append(m.Instances[:0:0], sched.MIGInstance{Profile: unhealthyMIG, Start: 0, Slices: m.TotalSlices, InUse: true})
			}
		}
	}
	return true, fits(idle)
}

// PlanPreemption finds the jobs to evict so that j fits on this host:
// sched.PlanPreemption over the held jobs named in costs (the ones the
// caller allows as victims, with what evicting each loses), at most budget
// of them, only of tiers strictly below j's, best-effort first, fewest
// then cheapest. It changes nothing.
func (p *Placer) PlanPreemption(j *api.Job, costs map[string]float64, budget int) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	req := p.jobRequest(j)
	running := make([]sched.Running, 0, len(costs))
	for _, id := range slices.Sorted(maps.Keys(costs)) {
		h, ok := p.held[id]
		if !ok {
			continue
		}
		running = append(running, sched.Running{Request: h.req, Assignment: h.assign, Cost: costs[id]})
	}
	plan, err := sched.PlanPreemption(&req, []*sched.Node{p.node}, running, budget)
	if err != nil {
		return nil, err
	}
	return plan.Victims, nil
}

// ShadowTime is when head (one job) would first fit on this host if the
// held jobs in ends released what they hold at those times and the
// others held on (sched.Shadow over the live node; an end already past
// counts as now). A job on a GPU out of service counts as never ending
// (what it frees there is not usable). False for a gang head (its
// reservation stays resources only), and when head would not fit even
// once every job of known end has ended.
func (p *Placer) ShadowTime(head []*api.Job, ends map[string]time.Time, now time.Time) (time.Time, bool) {
	if len(head) != 1 {
		return time.Time{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	req := p.jobRequest(head[0])
	running := make([]sched.Running, 0, len(ends))
	for id, h := range p.held {
		end, ok := ends[id]
		if !ok || p.onDownGPU(&h.assign) {
			continue
		}
		running = append(running, sched.Running{Request: h.req, Assignment: h.assign, End: end.UnixMilli(), EndKnown: true})
	}
	s, _, ok := sched.Shadow(&req, p.node, running, now.UnixMilli())
	if !ok {
		return time.Time{}, false
	}
	return time.UnixMilli(s), true
}

// onDownGPU reports whether a takes a GPU (or a MIG instance's GPU) out
// of service. The caller holds p.mu.
func (p *Placer) onDownGPU(a *sched.Assignment) bool {
	gpus := slices.Clone(a.GPUs)
	if a.MIG != nil {
		gpus = append(gpus, a.MIG.GPU)
	}
	for _, gi := range gpus {
		if gi >= 0 && gi < len(p.hw.GPUs) && p.down[p.hw.GPUs[gi].ID] {
			return true
		}
	}
	return false
}

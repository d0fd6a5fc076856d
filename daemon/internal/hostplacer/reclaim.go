package hostplacer

import (
	"fmt"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/sched"
)

// Reclaimed capacity (docs/load.md, "Reclaimed capacity"): the CPU and
// memory guaranteed and burstable jobs reserved but are not predicted to
// use, as the reclaim loop last accounted it (SetReclaimable). A group
// of best-effort jobs only is placed against the unreserved capacity plus
// what of it is not lent yet, and takes the lendable part first: that
// part of their requests is borrowed, not taken from the node, so a
// guaranteed or burstable job, which is placed against the unreserved
// capacity only, never waits for it. It stays borrowed for the job's life
// and is taken back by the reclaim loop — the best-effort tier throttled,
// then the jobs placed on reclaimed capacity evicted first — not by
// preemption. Devices are never lent.

// amount is CPU (millicores) and memory (MiB) as the node counts them.
type amount struct{ cpu, mem int64 }

func (a amount) zero() bool { return a.cpu == 0 && a.mem == 0 }

// SetReclaimable is the reclaim loop's latest account: the reclaimable CPU
// and memory best-effort jobs may be placed on (zero: none, as when the
// loop does not run).
func (p *Placer) SetReclaimable(cpu api.MilliCPU, memory api.Bytes) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reclaimable = amount{cpu: max(0, int64(cpu)), mem: max(0, memory.WholeMiB())}
}

// OnReclaimed lists the jobs placed partly on reclaimed capacity, with the
// CPU and memory of their requests borrowed from it.
func (p *Placer) OnReclaimed() map[string]api.NodeResources {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]api.NodeResources, len(p.borrowed))
	for id, b := range p.borrowed {
		out[id] = api.NodeResources{CPU: api.MilliCPU(b.cpu), Memory: api.BytesOfMiB(b.mem)}
	}
	return out
}

// lendable is the reclaimable capacity not borrowed yet. The caller holds
// p.mu.
func (p *Placer) lendable() amount {
	held := p.reclaimedHeld()
	return amount{cpu: max(0, p.reclaimable.cpu-held.cpu), mem: max(0, p.reclaimable.mem-held.mem)}
}

// lend adds the lendable capacity to the node's free CPU and memory while
// the engine places reqs, when they are all best-effort; it returns what
// it added (zero otherwise), for unlend or borrow to take off again. The
// caller holds p.mu.
func (p *Placer) lend(reqs []sched.Request) amount {
	for i := range reqs {
		if reqs[i].Tier != sched.TierBestEffort {
			return amount{}
		}
	}
	l := p.lendable()
	p.node.CPUFreeMilli += l.cpu
	p.node.MemFreeMiB += l.mem
	return l
}

// unlend takes back what lend added when nothing was placed.
func (p *Placer) unlend(l amount) {
	p.node.CPUFreeMilli -= l.cpu
	p.node.MemFreeMiB -= l.mem
}

// borrow takes back what lend added once the engine committed assigns:
// as much of the group's CPU and memory as was lendable is borrowed
// (reclaimed capacity is used first, so the unreserved capacity stays for
// guaranteed and burstable jobs), taken off the assignments (from the
// first member on) and returned per member; the node then counts only
// what the members took of its unreserved capacity. The caller holds p.mu.
func (p *Placer) borrow(assigns []sched.Assignment, l amount) []amount {
	out := make([]amount, len(assigns))
	if l.zero() {
		return out
	}
	p.unlend(l)
	cpu, mem := l.cpu, l.mem
	for i := range assigns {
		a := &assigns[i]
		c, m := min(cpu, a.CPUMilli), min(mem, a.MemMiB)
		a.CPUMilli -= c
		a.MemMiB -= m
		p.node.CPUFreeMilli += c
		p.node.MemFreeMiB += m
		cpu, mem = cpu-c, mem-m
		out[i] = amount{cpu: c, mem: m}
	}
	p.node.Version++
	return out
}

// noteBorrowed records what each placed member borrowed and gives it back
// to its allocation, which names the whole request. The caller holds p.mu.
func (p *Placer) noteBorrowed(group []*api.Job, b []amount, out []api.Allocation) {
	for i, j := range group {
		if b[i].zero() {
			continue
		}
		p.borrowed[j.ID] = b[i]
		out[i].CPU += api.MilliCPU(b[i].cpu)
		out[i].Memory += api.BytesOfMiB(b[i].mem)
		out[i].ReclaimedCPU, out[i].ReclaimedMemory = api.MilliCPU(b[i].cpu), api.BytesOfMiB(b[i].mem)
		out[i].Explain = fmt.Sprintf("%s\non reclaimed capacity: %s CPU and %s memory of its request (evicted first when guaranteed and burstable jobs need it back)",
			out[i].Explain, api.MilliCPU(b[i].cpu), api.BytesOfMiB(b[i].mem).Human())
	}
}

// released forgets what a released job borrowed. A guaranteed or
// burstable job leaving takes its reclaimable share with it: nothing is
// lent until the reclaim loop accounts again. The caller holds p.mu.
func (p *Placer) released(id string, tier sched.Tier) {
	delete(p.borrowed, id)
	if tier != sched.TierBestEffort {
		p.reclaimable = amount{}
	}
}

// borrowReattached is borrow for a job re-attached after a restart
// (Reclaim): what its recorded allocation says it was placed on reclaimed
// capacity stays borrowed, taken off a. The caller holds p.mu.
func (p *Placer) borrowReattached(rec *api.Allocation, a *sched.Assignment) amount {
	b := amount{cpu: min(a.CPUMilli, max(0, int64(rec.ReclaimedCPU))), mem: min(a.MemMiB, max(0, rec.ReclaimedMemory.WholeMiB()))}
	a.CPUMilli -= b.cpu
	a.MemMiB -= b.mem
	return b
}

// reclaimedHeld is what jobs hold of reclaimed capacity in all. The caller
// holds p.mu.
func (p *Placer) reclaimedHeld() amount {
	var t amount
	for _, b := range p.borrowed {
		t.cpu += b.cpu
		t.mem += b.mem
	}
	return t
}

package peers

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/fusiond/fusiond/daemon/api"
)

// candidate is a peer that, by its gossiped load, could take a job.
type candidate struct {
	name, api string
	score     float64
	load      api.PeerLoad
}

// fits reports whether load has room for spec's resources, and why not.
func fits(spec api.JobSpec, l api.PeerLoad) (bool, string) {
	r := spec.Resources
	switch {
	case l.Health != "ok":
		return false, l.Health
	case r.CPU > l.CPU:
		return false, fmt.Sprintf("%dm CPU free", l.CPU)
	case r.Memory > l.Memory:
		return false, fmt.Sprintf("%s memory free", l.Memory)
	}
	if g := r.GPU; g != nil {
		switch {
		case g.MIG != "":
			if l.MIG[g.MIG] < 1 {
				return false, "no MIG " + g.MIG + " instance free"
			}
		case g.Share > 0:
			if l.GPUShareMilli < g.Share {
				return false, fmt.Sprintf("%d milli-GPU of share headroom", l.GPUShareMilli)
			}
		case g.Count > 0:
			if n := gpusOf(l, g.Model); n < g.Count {
				return false, fmt.Sprintf("%d matching GPUs free", n)
			}
		}
	}
	if f := r.FPGA; f != nil && l.FPGAFree == 0 {
		return false, "no FPGA region free"
	}
	return true, ""
}

// gpusOf counts free GPUs whose model contains model (the placer's own
// matching: "h200" matches "NVIDIA H200").
func gpusOf(l api.PeerLoad, model string) int {
	n := 0
	for m, c := range l.GPUs {
		if model == "" || strings.Contains(strings.ToLower(m), strings.ToLower(model)) {
			n += c
		}
	}
	return n
}

// score ranks a peer for spec from its gossiped load, higher first: the
// headroom left after the job on each dimension the job asks for (left
// over free, 0 to 1, averaged: the emptiest peer first, as the engine's
// spread), less 0.1 per queued job there, and less 0.1 per second its
// oldest queued job has waited. A job that already holds its bitstream
// there gains 0.5.
func score(spec api.JobSpec, l api.PeerLoad) float64 {
	r := spec.Resources
	var sum float64
	n := 0
	left := func(need, free float64) {
		if need <= 0 || free <= 0 {
			return
		}
		sum += (free - need) / free
		n++
	}
	left(float64(r.CPU), float64(l.CPU))
	left(float64(r.Memory), float64(l.Memory))
	if g := r.GPU; g != nil {
		switch {
		case g.MIG != "":
			left(1, float64(l.MIG[g.MIG]))
		case g.Share > 0:
			left(float64(g.Share), float64(l.GPUShareMilli))
		default:
			left(float64(g.Count), float64(gpusOf(l, g.Model)))
		}
	}
	s := 1.0
	if n > 0 {
		s = sum / float64(n)
	}
	if f := r.FPGA; f != nil && slices.Contains(l.Bitstreams, f.Bitstream) {
		s += 0.5
	}
	return s - 0.1*float64(l.Queue) - 0.1*float64(l.Wait)/1e9
}

// rank orders the peers that fit spec, best first (ties by name), and
// says of the others why they were left out.
func rank(spec api.JobSpec, peers []candidate) ([]candidate, []string) {
	var out []candidate
	var skipped []string
	for _, p := range peers {
		if ok, why := fits(spec, p.load); !ok {
			skipped = append(skipped, p.name+": "+why)
			continue
		}
		p.score = score(spec, p.load)
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b candidate) int {
		if c := cmp.Compare(b.score, a.score); c != 0 {
			return c
		}
		return cmp.Compare(a.name, b.name)
	})
	return out, skipped
}

package hostplacer

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/sched"
	"github.com/fusiond/fusiond/devices"
)

// Pods. Kubelet sees this host's devices as the extended resources of
// fusiond's device plugin, each device by an ID, and allocates IDs to a
// pod's containers. Each allocation becomes a pod hold: a job record that
// runs nothing and holds exactly those devices here, in the one ledger
// with fusiond's own jobs, so that no device is ever given to a pod and a
// job at once. The placer names the resources and their IDs
// (PodResources), says what a set of IDs amounts to (PodSpec), holds them
// (HoldPod) and lets the engine choose among the IDs kubelet offers
// (PreferPod). The resources, one per kind of device, so that a pod asks
// for what it needs (names are <prefix>/<name>, name at most 63 of
// [a-z0-9.-_], starting and ending with a letter or digit):
//
//   - gpu-<model> ("NVIDIA H200": gpu-h200): whole GPUs of one model, by
//     GPU UUID. A GPU in MIG mode is listed, unhealthy: kubelet's capacity
//     counts every GPU of the host, its allocatable the ones a pod can
//     have whole.
//   - mig-<profile> (mig-1g.18gb): one MIG instance of the profile, by
//     "<gpu uuid>:<profile>:<start>" for every slot such an instance may
//     start at (the driver's placements, else multiples of its slots).
//     Held where no instance exists yet, it is created on demand (the
//     driver's Prepare).
//   - gpu-<model>-shared, with PodOptions.ShareReplicas N > 0: N IDs per
//     GPU, "<gpu uuid>:share:<i>". k IDs of one GPU are a share of
//     k·1000/N milli-GPU capped at k/N of its memory; all N of one GPU
//     are the whole GPU. Those of a GPU in MIG mode are listed,
//     unhealthy, as under gpu-<model>.
//   - fpga-<bitstream>: a region holding the library bitstream (programmed
//     on demand), by region ID; only the regions that can hold it
//     (PodOptions.Accepts).
//
// A device is healthy (in kubelet's allocatable) when a pod could have it
// now: in service and free, or already a pod's (the pod holding it keeps
// it counted). A device a fusiond job holds, or out of service, is
// unhealthy.

// DefaultPodPrefix is the resources' prefix when PodOptions.Prefix is
// empty.
const DefaultPodPrefix = "fusiond.io"

// PodOptions say how the host's devices are offered to kubelet.
type PodOptions struct {
	// Prefix is the resources' prefix, a DNS subdomain (DefaultPodPrefix
	// when empty).
	Prefix string
	// ShareReplicas is how many device IDs each GPU has under its model's
	// share resource (at most 1000, counted as 1000 above); 0: no share
	// resources.
	ShareReplicas int
	// Bitstreams lists the FPGA bitstream library (the daemon's
	// bitstream.Library.List, by name and ID); nil: no FPGA resources. It
	// is called under the placer's lock and must not call the placer.
	Bitstreams func() []PodBitstream
	// Accepts reports whether FPGA region can hold the bitstream of a
	// library ID (its interface and kind match): a bitstream's resource
	// lists only the regions that can; nil: every region can. Called
	// under the placer's lock like Bitstreams.
	Accepts func(region, bitstream string) bool
}

// PodBitstream is one bitstream of the library: its name and library ID.
type PodBitstream struct{ Name, ID string }

// PodResource is one extended resource offered to kubelet.
type PodResource struct {
	// Name is the full resource name ("fusiond.io/gpu-h200").
	Name    string
	Devices []PodDevice
}

// PodDevice is one device ID of a resource.
type PodDevice struct {
	ID string
	// Healthy devices are those a pod could be allocated now, and those
	// pods hold.
	Healthy bool
	// NUMA is the device's NUMA node, -1 when unknown.
	NUMA int
}

// podKind is what a resource's IDs name.
type podKind int

const (
	podGPU podKind = iota
	podMIG
	podShare
	podFPGA
)

// podRes is one resource of the catalog: what each of its IDs names.
type podRes struct {
	kind      podKind
	profile   string // podMIG: the profile
	slots     int    // podMIG: the slots an instance takes (migSlots)
	bitstream string // podFPGA: the library ID
	devs      map[string]podDev
}

// podDev is what one device ID names.
type podDev struct {
	gpu     int // index into hw.GPUs; -1 for an FPGA region
	start   int // podMIG: the instance's first slot
	replica int // podShare: the replica's index
	region  int // podFPGA: index into hw.FPGAs; -1 otherwise
}

// maxPodName is the longest name part of an extended resource.
const maxPodName = 63

// clonePodHold copies a pod hold (nil: nil).
func clonePodHold(h *api.PodHold) *api.PodHold {
	if h == nil {
		return nil
	}
	return &api.PodHold{Resource: h.Resource, Devices: slices.Clone(h.Devices)}
}

// podSlug is s as part of a resource name: lower case, letters, digits and
// the characters of keep, every other run of characters one '-', no
// punctuation at either end.
func podSlug(s, keep string) string {
	var b strings.Builder
	gap := false
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || strings.ContainsRune(keep, r) {
			if gap && b.Len() > 0 {
				b.WriteByte('-')
			}
			gap = false
			b.WriteRune(r)
			continue
		}
		gap = true
	}
	return strings.Trim(b.String(), keep+"-")
}

// modelSlug is a GPU model's part of its resources' names: "NVIDIA H200"
// is "h200", "NVIDIA H100 80GB HBM3" "h100-80gb-hbm3".
func modelSlug(model string) string {
	s := podSlug(model, "")
	if t := strings.TrimPrefix(s, "nvidia-"); t != s {
		s = t
	}
	return cmpOr(s, "unknown")
}

// podName is kind+slug+suffix cut to maxPodName by shortening slug.
func podName(kind, slug, suffix string) string {
	if n := maxPodName - len(kind) - len(suffix); len(slug) > n {
		slug = strings.TrimRight(slug[:n], "-._")
	}
	return kind + slug + suffix
}

func shareID(gpu string, i int) string { return gpu + ":share:" + strconv.Itoa(i) }

func migID(gpu, profile string, start int) string {
	return gpu + ":" + profile + ":" + strconv.Itoa(start)
}

// shareReplicas is PodOptions.ShareReplicas as offered: 0..MilliPerGPU.
func (p *Placer) shareReplicas() int {
	if p.opts.Pods == nil {
		return 0
	}
	return min(max(p.opts.Pods.ShareReplicas, 0), sched.MilliPerGPU)
}

// shareMilli is the milli-GPU k of n share IDs of a GPU amount to
// (k == n: the whole GPU).
func shareMilli(k, n int) int64 { return int64(k) * sched.MilliPerGPU / int64(n) }

// shareOf is what k of n share IDs of GPU gi amount to: milli-GPU and
// memory (MiB); k == n is the whole GPU.
func (p *Placer) shareOf(gi, k, n int) (milli, memMiB int64) {
	return shareMilli(k, n), p.hw.GPUs[gi].MemoryMB * int64(k) / int64(n)
}

// podCatalog is every resource offered to kubelet, by full name, with
// what its IDs name (nil when the host serves no pods). The caller holds
// p.mu.
func (p *Placer) podCatalog() map[string]*podRes {
	o := p.opts.Pods
	if o == nil {
		return nil
	}
	prefix := cmpOr(o.Prefix, DefaultPodPrefix) + "/"
	cat := map[string]*podRes{}
	// add gives the resource name r would have, or nil where another
	// resource of another meaning took the name first.
	add := func(name string, r podRes) *podRes {
		name = prefix + name
		if c, ok := cat[name]; ok {
			if c.kind != r.kind || c.profile != r.profile || c.bitstream != r.bitstream {
				return nil
			}
			return c
		}
		r.devs = map[string]podDev{}
		cat[name] = &r
		return &r
	}
	n := p.shareReplicas()
	for gi, g := range p.hw.GPUs {
		slug := modelSlug(g.Model)
		if r := add(podName("gpu-", slug, ""), podRes{kind: podGPU}); r != nil {
			r.devs[g.ID] = podDev{gpu: gi, region: -1}
		}
		if n > 0 {
			if r := add(podName("gpu-", slug, "-shared"), podRes{kind: podShare}); r != nil {
				for i := range n {
					r.devs[shareID(g.ID, i)] = podDev{gpu: gi, replica: i, region: -1}
				}
			}
		}
		if m := g.MIG; m != nil {
			for _, profile := range slices.Sorted(maps.Keys(m.Profiles)) {
				slots := p.migSlots(profile)
				slug := podSlug(profile, ".")
				if slots <= 0 || slug == "" {
					continue
				}
				r := add(podName("mig-", slug, ""), podRes{kind: podMIG, profile: profile, slots: slots})
				if r == nil {
					continue
				}
				for _, start := range migStarts(m, profile, slots) {
					r.devs[migID(g.ID, profile, start)] = podDev{gpu: gi, start: start, region: -1}
				}
			}
		}
	}
	if o.Bitstreams != nil && len(p.hw.FPGAs) > 0 {
		bs := o.Bitstreams()
		names := map[string]int{}
		for _, b := range bs {
			names[podSlug(b.Name, "._")]++
		}
		for _, b := range bs {
			if b.ID == "" {
				continue
			}
			slug := podSlug(b.Name, "._")
			if slug == "" || names[slug] > 1 {
				// Two names of one slug: each told apart by its ID.
				slug = strings.Trim(slug+"-"+podSlug(b.ID[:min(12, len(b.ID))], ""), "-")
			}
			r := add(podName("fpga-", slug, ""), podRes{kind: podFPGA, bitstream: b.ID})
			if r == nil {
				continue
			}
			for ri, f := range p.hw.FPGAs {
				if o.Accepts == nil || o.Accepts(f.ID, b.ID) {
					r.devs[f.ID] = podDev{gpu: -1, region: ri}
				}
			}
		}
	}
	return cat
}

// podHeld maps each resource's device IDs that pod holds hold to the
// holding job's ID. The caller holds p.mu.
func (p *Placer) podHeld() map[string]map[string]string {
	out := map[string]map[string]string{}
	for id, h := range p.held {
		if h.pod == nil {
			continue
		}
		if out[h.pod.Resource] == nil {
			out[h.pod.Resource] = map[string]string{}
		}
		for _, d := range h.pod.Devices {
			out[h.pod.Resource][d] = id
		}
	}
	return out
}

// holder names who holds what match accepts: "held by job 12", "held by
// pod hold 13". The caller holds p.mu.
func (p *Placer) holder(match func(a *sched.Assignment) bool) string {
	for _, id := range slices.Sorted(maps.Keys(p.held)) {
		h := p.held[id]
		if !match(&h.assign) {
			continue
		}
		if h.pod != nil {
			return "held by pod hold " + id
		}
		return "held by job " + id
	}
	return "taken"
}

// gpuHolder names who holds (part of) GPU gi. The caller holds p.mu.
func (p *Placer) gpuHolder(gi int) string {
	return p.holder(func(a *sched.Assignment) bool {
		return slices.Contains(a.GPUs, gi) || a.MIG != nil && a.MIG.GPU == gi
	})
}

// PodResources lists the resources offered to kubelet, sorted by name,
// each one's devices sorted by ID, with their health now (nil when the
// host serves no pods).
func (p *Placer) PodResources() []PodResource {
	p.mu.Lock()
	defer p.mu.Unlock()
	cat := p.podCatalog()
	if cat == nil {
		return nil
	}
	held := p.podHeld()
	out := make([]PodResource, 0, len(cat))
	for _, name := range slices.Sorted(maps.Keys(cat)) {
		r := cat[name]
		healthy := p.podHealthy(r, held[name])
		res := PodResource{Name: name, Devices: make([]PodDevice, 0, len(r.devs))}
		for _, id := range slices.Sorted(maps.Keys(r.devs)) {
			d := r.devs[id]
			var numa int
			if d.gpu >= 0 {
				numa = p.hw.GPUs[d.gpu].NUMA
			} else {
				numa = p.hw.FPGAs[d.region].NUMA
			}
			res.Devices = append(res.Devices, PodDevice{ID: id, Healthy: healthy[id], NUMA: max(numa, -1)})
		}
		out = append(out, res)
	}
	return out
}

// podHealthy is the set of r's IDs a pod could be allocated now, or pods
// hold (held: ID → holding job). The caller holds p.mu.
func (p *Placer) podHealthy(r *podRes, held map[string]string) map[string]bool {
	ok := map[string]bool{}
	switch r.kind {
	case podGPU:
		for id, d := range r.devs {
			g, n := p.hw.GPUs[d.gpu], &p.node.GPUs[d.gpu]
			switch {
			case p.down[g.ID]:
			case held[id] != "":
				ok[id] = true
			default:
				ok[id] = g.MIG == nil && n.MIG == nil && n.MilliFree == sched.MilliPerGPU && (n.MemMiB == 0 || n.MemFreeMiB == n.MemMiB)
			}
		}
	case podMIG:
		for id, d := range r.devs {
			g := p.hw.GPUs[d.gpu]
			if held[id] != "" {
				in, exists := instanceAt(g.MIG, d.start)
				ok[id] = !p.down[g.ID] && !(exists && p.down[in.ID])
				continue
			}
			_, err := p.migTake(d.gpu, d.start, r.slots, r.profile)
			ok[id] = err == nil
		}
	case podShare:
		n := p.shareReplicas()
		owners := p.podOwners()
		byGPU := map[int][]int{} // GPU → its replicas pods hold
		gpus := map[int]bool{}
		for id, d := range r.devs {
			gpus[d.gpu] = true
			if held[id] != "" {
				byGPU[d.gpu] = append(byGPU[d.gpu], d.replica)
			}
		}
		for gi := range gpus {
			g, node := p.hw.GPUs[gi], &p.node.GPUs[gi]
			if p.down[g.ID] || g.MIG != nil || n == 0 {
				continue
			}
			mine := byGPU[gi]
			for _, i := range mine {
				ok[shareID(g.ID, i)] = true
			}
			more := 0
			if !node.MPS || node.ShareOwner == "" || owners[node.ShareOwner] {
				for k := n - len(mine); k > 0; k-- {
					milli, mem := p.shareOf(gi, k, n)
					if milli <= node.MilliFree && (node.MemMiB == 0 || mem <= node.MemFreeMiB) {
						more = k
						break
					}
				}
			}
			for i := 0; i < n && more > 0; i++ {
				if !slices.Contains(mine, i) {
					ok[shareID(g.ID, i)] = true
					more--
				}
			}
		}
	case podFPGA:
		for id, d := range r.devs {
			ok[id] = p.hw.FPGAs[d.region].Health.Healthy && (held[id] != "" || !p.node.FPGAs[d.region].Busy)
		}
	}
	return ok
}

// podOwners are the engine owners (Request.Owner) of the pod holds: an
// MPS GPU serving one of them may take more of pods' shares. The caller
// holds p.mu.
func (p *Placer) podOwners() map[string]bool {
	out := map[string]bool{}
	for _, h := range p.held {
		if h.pod != nil {
			out[h.req.Owner] = true
		}
	}
	return out
}

// migTake reports whether an instance of profile (slots slots) at slot
// start of GPU gi can be taken now, and whether it must be created there
// (no instance exists yet); else why not. The caller holds p.mu.
func (p *Placer) migTake(gi, start, slots int, profile string) (create bool, err error) {
	g := p.hw.GPUs[gi]
	m := p.node.GPUs[gi].MIG
	switch {
	case p.down[g.ID]:
		return false, fmt.Errorf("GPU %s is out of service", g.ID)
	case g.MIG == nil || m == nil:
		return false, fmt.Errorf("GPU %s is not in MIG mode", g.ID)
	case start < 0 || slots <= 0 || start+slots > m.TotalSlices:
		return false, fmt.Errorf("GPU %s has no %s", g.ID, slotRange(start, slots))
	}
	if in, ok := instanceAt(g.MIG, start); ok && p.down[in.ID] {
		return false, fmt.Errorf("MIG instance %s is out of service", in.ID)
	}
	for _, in := range m.Instances {
		if in.Start == start && in.Slices == slots && (in.Profile == "" || in.Profile == profile) {
			if in.InUse {
				return false, fmt.Errorf("the %s instance at slot %d of GPU %s is %s", profile, start, g.ID, p.migHolder(gi, in.Start, in.Slices))
			}
			return false, nil
		}
	}
	for _, in := range m.Instances {
		if in.Start < start+slots && start < in.Start+in.Slices {
			what := "an instance of another profile"
			if in.Profile != "" {
				what = "a " + in.Profile + " instance"
			}
			if in.InUse {
				what += " " + p.migHolder(gi, in.Start, in.Slices)
			}
			return false, fmt.Errorf("%s of GPU %s overlap %s at %s (instances are created on free slots only)",
				slotRange(start, slots), g.ID, what, slotRange(in.Start, in.Slices))
		}
	}
	return true, nil
}

// slotRange names n MIG slots from start: "slot 3", "slots 0-2".
func slotRange(start, n int) string {
	if n == 1 {
		return "slot " + strconv.Itoa(start)
	}
	return fmt.Sprintf("slots %d-%d", start, start+n-1)
}

// migHolder names who holds the instance at slots start..start+slices-1
// of GPU gi. The caller holds p.mu.
func (p *Placer) migHolder(gi, start, slices int) string {
	return p.holder(func(a *sched.Assignment) bool {
		m := a.MIG
		return m != nil && m.GPU == gi && m.Start < start+slices && start < m.Start+m.Slices
	})
}

// podError is a refused pod hold, naming the field.
func podError(code, field, format string, args ...any) *api.Error {
	return &api.Error{Code: code, Field: field, Message: fmt.Sprintf(format, args...)}
}

// PodSpec is what a hold of h's device IDs amounts to, as a spec's
// resources: whole GPUs (count and model), a MIG profile, a GPU share
// (milli-GPU and memory) or an FPGA bitstream (its library ID); CPU and
// memory are kubelet's, zero here. An unknown resource or device ID, or
// IDs that make no one hold (several MIG instances or FPGA regions, a
// share over two GPUs), is an *api.Error naming pod.resource or
// pod.devices. It says nothing of whether the devices are free.
func (p *Placer) PodSpec(h api.PodHold) (api.Resources, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, _, res, err := p.podSpec(h)
	return res, err
}

// podSpec is PodSpec with the resource and what each ID names, in h's
// order. The caller holds p.mu.
func (p *Placer) podSpec(h api.PodHold) (*podRes, []podDev, api.Resources, error) {
	cat := p.podCatalog()
	if cat == nil {
		return nil, nil, api.Resources{}, podError(api.CodeUnsatisfiable, "pod.resource", "this host offers no devices to kubelet (kubernetes is off)")
	}
	r := cat[h.Resource]
	if r == nil {
		return nil, nil, api.Resources{}, podError(api.CodeUnsatisfiable, "pod.resource", "this host has no resource %q (it offers: %s)",
			h.Resource, strings.Join(slices.Sorted(maps.Keys(cat)), ", "))
	}
	if len(h.Devices) == 0 {
		return nil, nil, api.Resources{}, podError(api.CodeInvalid, "pod.devices", "no device IDs of %s", h.Resource)
	}
	devs := make([]podDev, len(h.Devices))
	for i, id := range h.Devices {
		d, ok := r.devs[id]
		if !ok {
			return nil, nil, api.Resources{}, podError(api.CodeUnsatisfiable, "pod.devices", "%q is not a device of %s on this host", id, h.Resource)
		}
		if slices.Contains(h.Devices[:i], id) {
			return nil, nil, api.Resources{}, podError(api.CodeInvalid, "pod.devices", "device %q named twice", id)
		}
		devs[i] = d
	}
	one := func(what string) error {
		if len(devs) > 1 {
			return podError(api.CodeInvalid, "pod.devices", "a container holds one %s of %s, kubelet allocated %d: ask for 1 per container", what, h.Resource, len(devs))
		}
		return nil
	}
	var res api.Resources
	switch r.kind {
	case podGPU:
		res.GPU = &api.GPURequest{Count: len(devs), Model: p.hw.GPUs[devs[0].gpu].Model}
	case podMIG:
		if err := one("MIG instance"); err != nil {
			return nil, nil, api.Resources{}, err
		}
		res.GPU = &api.GPURequest{Count: 1, MIG: r.profile, Model: p.hw.GPUs[devs[0].gpu].Model}
	case podShare:
		gi := devs[0].gpu
		for i, d := range devs {
			if d.gpu != gi {
				return nil, nil, api.Resources{}, podError(api.CodeInvalid, "pod.devices", "a share is of one GPU: %s is of GPU %s, %s of GPU %s",
					h.Devices[0], p.hw.GPUs[gi].ID, h.Devices[i], p.hw.GPUs[d.gpu].ID)
			}
		}
		g := p.hw.GPUs[gi]
		n := p.shareReplicas()
		if len(devs) == n {
			// Every replica of the GPU: the whole GPU.
			res.GPU = &api.GPURequest{Count: 1, Model: g.Model}
			break
		}
		milli, mem := p.shareOf(gi, len(devs), n)
		res.GPU = &api.GPURequest{Count: 1, Share: int(milli), Memory: api.BytesOfMiB(mem), Model: g.Model}
	case podFPGA:
		if err := one("FPGA region"); err != nil {
			return nil, nil, api.Resources{}, err
		}
		res.FPGA = &api.FPGARequest{Bitstream: r.bitstream}
	}
	return r, devs, res, nil
}

// HoldPod reserves exactly the devices j.Spec.Pod names as j's hold, in
// the one ledger (the engine's Commit, as Reclaim does for a re-attached
// job: nothing another reservation holds is taken), and remembers j as a
// pod hold until Release. It refuses, with an *api.Error naming the
// device, a device out of service, held by a job or another pod, a GPU in
// MIG mode for a whole GPU, or a share larger than the GPU has free. The
// allocation returned is what j's record keeps: the devices for display,
// the GPUs and their PCI addresses, the share, the MIG instance (Instance
// set when it exists, else created by the driver's Prepare at Start) or
// the FPGA region (Program when it holds another bitstream), and the
// devices' NUMA node.
func (p *Placer) HoldPod(j *api.Job) (api.Allocation, error) {
	if j == nil || j.Spec.Pod == nil {
		return api.Allocation{}, podError(api.CodeInvalid, "pod", "not a pod's device hold")
	}
	h := *j.Spec.Pod
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.held[j.ID]; ok {
		return api.Allocation{}, podError(api.CodeConflict, "pod", "job %s already holds devices", j.ID)
	}
	r, devs, res, err := p.podSpec(h)
	if err != nil {
		return api.Allocation{}, err
	}
	spec := j.Spec
	spec.Resources = res
	req := p.request(j.ID, spec, j.Tier)
	req.Owner = OwnerKey(j.Owner)
	refuse := func(code, format string, args ...any) (api.Allocation, error) {
		return api.Allocation{}, podError(code, "pod.devices", format, args...)
	}
	as := sched.Assignment{Node: p.node.Name, FPGA: -1, Owner: req.Owner}
	switch r.kind {
	case podGPU, podShare:
		others := p.podHeld()[h.Resource]
		for i, d := range devs {
			g := p.hw.GPUs[d.gpu]
			switch {
			case p.down[g.ID]:
				return refuse(api.CodeUnavailable, "GPU %s is out of service", g.ID)
			case g.MIG != nil:
				return refuse(api.CodeConflict, "GPU %s is in MIG mode: it is offered as MIG instances (%s/mig-…), not whole or shared", g.ID, cmpOr(p.opts.Pods.Prefix, DefaultPodPrefix))
			case others[h.Devices[i]] != "":
				return refuse(api.CodeConflict, "%s is held by pod hold %s", h.Devices[i], others[h.Devices[i]])
			}
			if !slices.Contains(as.GPUs, d.gpu) {
				as.GPUs = append(as.GPUs, d.gpu)
			}
		}
		slices.Sort(as.GPUs)
		as.GPUMilli, as.GPUMemMiB, as.GPUModel = req.GPUMilli, req.GPUMemMiB, p.node.ModelOf(as.GPUs[0])
		for _, gi := range as.GPUs {
			n := &p.node.GPUs[gi]
			switch {
			case req.GPUMilli == sched.MilliPerGPU && n.MilliFree < sched.MilliPerGPU:
				return refuse(api.CodeConflict, "GPU %s is %s", p.hw.GPUs[gi].ID, p.gpuHolder(gi))
			case n.MilliFree < req.GPUMilli || n.MemMiB > 0 && n.MemFreeMiB < req.GPUMemMiB:
				return refuse(api.CodeConflict, "GPU %s has %d milli-GPU and %d MiB free, the share needs %d and %d MiB (the rest is %s)",
					p.hw.GPUs[gi].ID, n.MilliFree, n.MemFreeMiB, req.GPUMilli, req.GPUMemMiB, p.gpuHolder(gi))
			}
		}
	case podMIG:
		d := devs[0]
		create, err := p.migTake(d.gpu, d.start, r.slots, r.profile)
		if err != nil {
			return refuse(api.CodeConflict, "%s: %v", h.Devices[0], err)
		}
		as.MIG = &sched.MIGPick{GPU: d.gpu, Start: d.start, Slices: r.slots, Create: create}
		as.GPUModel = p.node.ModelOf(d.gpu)
	case podFPGA:
		d := devs[0]
		f := p.hw.FPGAs[d.region]
		switch {
		case !f.Health.Healthy:
			return refuse(api.CodeUnavailable, "FPGA region %s is out of service", f.ID)
		case p.node.FPGAs[d.region].Busy:
			return refuse(api.CodeConflict, "FPGA region %s is %s", f.ID, p.holder(func(a *sched.Assignment) bool { return a.FPGA == d.region }))
		}
		as.FPGA, as.Bitstream = d.region, r.bitstream
		as.Program = p.node.FPGAs[d.region].Bitstream != r.bitstream
	}
	// Commit refuses what another reservation holds: a device is never
	// booked twice.
	if err := p.eng.Commit(&req, &as, []*sched.Node{p.node}); err != nil {
		return api.Allocation{}, fmt.Errorf("holding %s of %s for job %s: %w", strings.Join(h.Devices, ", "), h.Resource, j.ID, err)
	}
	p.held[j.ID] = held{req: req, assign: as, pod: clonePodHold(&h)}
	alloc := p.allocation(&req, &as, fmt.Sprintf("kubelet allocated %s: %s", h.Resource, strings.Join(h.Devices, ", ")))
	if alloc.NUMANode < 0 {
		switch {
		case as.MIG != nil:
			alloc.NUMANode = max(p.hw.GPUs[as.MIG.GPU].NUMA, 0)
		case as.FPGA >= 0:
			alloc.NUMANode = max(p.hw.FPGAs[as.FPGA].NUMA, 0)
		}
	}
	return alloc, nil
}

// notOffered marks the slots of a MIG GPU PreferPod's engine may not
// take (kubelet did not offer them).
const notOffered = "(not offered)"

// PreferPod is the engine's choice of size device IDs of resource among
// available, every one of mustInclude kept, for kubelet's preferred
// allocation, and the engine's explanation of it. The engine scores the
// choices as it scores a pod hold's placement (class service): NVLink
// and NUMA locality for whole GPUs, the packing of MIG slots and shares,
// programming time for FPGA regions. The devices mustInclude names are
// kept as they are and the rest chosen beside them (their links to the
// rest are not scored). It changes nothing. IDs of available this host no
// longer has are left out; an unknown resource or mustInclude ID, size
// below 1 or above what is offered, or more than one MIG instance or FPGA
// region is an error.
func (p *Placer) PreferPod(resource string, available, mustInclude []string, size int) ([]string, string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cat := p.podCatalog()
	r := cat[resource]
	switch {
	case cat == nil:
		return nil, "", fmt.Errorf("this host offers no devices to kubelet")
	case r == nil:
		return nil, "", fmt.Errorf("this host has no resource %q", resource)
	case size < 1:
		return nil, "", fmt.Errorf("%s: a preferred allocation of %d devices", resource, size)
	case len(mustInclude) > size:
		return nil, "", fmt.Errorf("%s: %d devices must be included in an allocation of %d", resource, len(mustInclude), size)
	}
	pool := map[string]podDev{}
	for _, id := range mustInclude {
		d, ok := r.devs[id]
		if !ok {
			return nil, "", fmt.Errorf("%s: device %q that must be included is not a device of this host", resource, id)
		}
		pool[id] = d
	}
	for _, id := range available {
		if d, ok := r.devs[id]; ok {
			pool[id] = d
		}
	}
	if len(pool) < size {
		return nil, "", fmt.Errorf("%s: %d devices asked for, %d of this host offered", resource, size, len(pool))
	}
	for _, id := range mustInclude {
		if r.kind == podShare && pool[id].gpu != pool[mustInclude[0]].gpu {
			return nil, "", fmt.Errorf("%s: a share is of one GPU, the devices that must be included are of two (%s, %s)", resource, mustInclude[0], id)
		}
	}
	if (r.kind == podMIG || r.kind == podFPGA) && size > 1 {
		return nil, "", fmt.Errorf("%s: a container holds one device of it, %d asked for", resource, size)
	}
	if size == len(mustInclude) {
		return slices.Clone(mustInclude), "the devices kubelet must include are the whole allocation", nil
	}
	must := map[string]bool{}
	for _, id := range mustInclude {
		must[id] = true
	}
	req := sched.Request{ID: "kubelet preferred allocation of " + resource, Class: sched.ClassService, Tier: sched.TierGuaranteed}
	p.refreshLive()
	switch r.kind {
	case podGPU:
		req.GPUs, req.GPUMilli = size-len(mustInclude), sched.MilliPerGPU
	case podShare:
		// The share's memory is size/N of each GPU's own: preferNode
		// leaves out the GPUs without it free.
		req.GPUs, req.GPUMilli = 1, shareMilli(size, p.shareReplicas())
	case podMIG:
		req.MIGProfile, req.MIGSlices = r.profile, r.slots
	case podFPGA:
		req.Bitstream = r.bitstream
		p.estimateProgramming([]sched.Request{req})
	}
	node := p.preferNode(resource, r, pool, must, &req, size)
	d, err := p.eng.Place(&req, []*sched.Node{node})
	if err != nil {
		return nil, "", fmt.Errorf("%s: no preferred allocation of %d: %s", resource, size, waitReason(d, err))
	}
	out := slices.Clone(mustInclude)
	a := d.Assignment
	switch r.kind {
	case podGPU:
		for _, gi := range a.GPUs {
			out = append(out, p.hw.GPUs[gi].ID)
		}
	case podShare:
		gi := a.GPUs[0]
		var ids []podDev
		for id, pd := range pool {
			if pd.gpu == gi && !must[id] {
				ids = append(ids, pd)
			}
		}
		slices.SortFunc(ids, func(x, y podDev) int { return x.replica - y.replica })
		for _, pd := range ids[:size-len(mustInclude)] {
			out = append(out, shareID(p.hw.GPUs[gi].ID, pd.replica))
		}
	case podMIG:
		out = append(out, migID(p.hw.GPUs[a.MIG.GPU].ID, r.profile, a.MIG.Start))
	case podFPGA:
		out = append(out, p.hw.FPGAs[a.FPGA].ID)
	}
	return out, p.explain(&d), nil
}

// preferNode is the node as PreferPod's engine sees it: a copy of the live
// node where only the devices of pool may be taken, mustInclude's
// (must) counted as taken already. The caller holds p.mu.
func (p *Placer) preferNode(resource string, r *podRes, pool map[string]podDev, must map[string]bool, req *sched.Request, size int) *sched.Node {
	n := p.node.Clone()
	// A device kubelet offers that a pod's hold still holds was freed by
	// kubelet (its pod ended); the hold ends when kubelet allocates the
	// device again (jobs.Manager.AdmitPod supersedes it), so here it is
	// free.
	for _, id := range slices.Sorted(maps.Keys(p.held)) {
		h := p.held[id]
		if h.pod != nil && h.pod.Resource == resource && slices.ContainsFunc(h.pod.Devices, func(d string) bool { _, ok := pool[d]; return ok }) {
			p.eng.Release(&h.req, &h.assign, []*sched.Node{n})
		}
	}
	take := func(gi int) { n.GPUs[gi].MilliFree, n.GPUs[gi].MemFreeMiB = 0, 0 }
	switch r.kind {
	case podGPU:
		offered := map[int]bool{}
		for id, d := range pool {
			offered[d.gpu] = offered[d.gpu] || !must[id]
		}
		for gi := range n.GPUs {
			if !offered[gi] {
				take(gi)
			}
		}
	case podShare:
		count := map[int]int{}
		mustGPU := -1
		for id, d := range pool {
			count[d.gpu]++
			if must[id] {
				mustGPU = d.gpu
			}
		}
		owners := p.podOwners()
		for gi := range n.GPUs {
			g := &n.GPUs[gi]
			_, mem := p.shareOf(gi, size, p.shareReplicas())
			if count[gi] < size || mustGPU >= 0 && gi != mustGPU || req.GPUMilli < sched.MilliPerGPU && g.MemMiB > 0 && g.MemFreeMiB < mem {
				take(gi)
			}
			if owners[g.ShareOwner] {
				g.ShareOwner = "" // pods' shares meet pods' shares
			}
		}
	case podMIG:
		starts := map[int][]int{} // GPU → offered starts
		for _, d := range pool {
			starts[d.gpu] = append(starts[d.gpu], d.start)
		}
		for gi := range n.GPUs {
			m := n.GPUs[gi].MIG
			if m == nil {
				continue
			}
			ok := starts[gi]
			for i := range m.Instances {
				if in := &m.Instances[i]; !slices.Contains(ok, in.Start) || in.Slices != r.slots {
					in.InUse = true
				}
			}
			for s := 0; s+r.slots <= m.TotalSlices; s += r.slots {
				if slices.Contains(ok, s) {
					continue
				}
				free := true
				for k := s; k < s+r.slots; k++ {
					free = free && freeSlice(m.Instances, k)
				}
				if free {
					m.Instances = append(m.Instances, sched.MIGInstance{Profile: notOffered, Start: s, Slices: r.slots, InUse: true})
				}
			}
		}
	case podFPGA:
		offered := map[int]bool{}
		for _, d := range pool {
			offered[d.region] = true
		}
		for i := range n.FPGAs {
			n.FPGAs[i].Busy = n.FPGAs[i].Busy || !offered[i]
		}
	}
	return n
}

// PodFeatures are the host's devices as node features for
// node-feature-discovery, named as the resources are: gpu.count,
// gpu.model.<model>=<count> for each model (and gpu.model=<model> when
// there is one), gpu.mig.enabled=<GPUs in MIG mode>, fpga.regions and
// fpga.bitstream.<name>=<regions holding it> for the library's bitstreams
// that are loaded. Nil when the host serves no pods.
func (p *Placer) PodFeatures() map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	o := p.opts.Pods
	if o == nil {
		return nil
	}
	out := map[string]string{}
	models := map[string]int{}
	mig := 0
	for _, g := range p.hw.GPUs {
		models[modelSlug(g.Model)]++
		if g.MIG != nil {
			mig++
		}
	}
	if len(p.hw.GPUs) > 0 {
		out["gpu.count"] = strconv.Itoa(len(p.hw.GPUs))
		out["gpu.mig.enabled"] = strconv.Itoa(mig)
		for m, n := range models {
			out["gpu.model."+m] = strconv.Itoa(n)
			if len(models) == 1 {
				out["gpu.model"] = m
			}
		}
	}
	if len(p.hw.FPGAs) > 0 {
		out["fpga.regions"] = strconv.Itoa(len(p.hw.FPGAs))
		names := map[string]string{} // library ID → name
		if o.Bitstreams != nil {
			for _, b := range o.Bitstreams() {
				names[b.ID] = b.Name
			}
		}
		loaded := map[string]int{}
		for _, r := range p.hw.FPGAs {
			if name, ok := names[r.Bitstream]; ok && r.Bitstream != "" {
				loaded[podSlug(name, "._")]++
			}
		}
		for name, n := range loaded {
			if name != "" {
				out["fpga.bitstream."+name] = strconv.Itoa(n)
			}
		}
	}
	return out
}

// migStarts are the slots an instance of profile (slots wide) may start
// at on m: the driver's placements where it names them, else the
// engine's rule (sched migOptions), multiples of the instance's slots.
func migStarts(m *devices.MIG, profile string, slots int) []int {
	if starts, ok := m.Starts[profile]; ok {
		return slices.DeleteFunc(slices.Clone(starts), func(s int) bool { return s < 0 || s+slots > m.Slots })
	}
	var out []int
	for start := 0; start+slots <= m.Slots; start += slots {
		out = append(out, start)
	}
	return out
}

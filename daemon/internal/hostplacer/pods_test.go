package hostplacer

import (
	"errors"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/devices"
)

// podOptions offers the devices with 4 share replicas per GPU and the
// dgx() regions' bitstream library.
func podOptions() *PodOptions {
	return &PodOptions{ShareReplicas: 4, Bitstreams: func() []PodBitstream {
		return []PodBitstream{{Name: "gzip", ID: "gzip"}, {Name: "Regex:v2", ID: "5e1f00d"}}
	}}
}

// podJob is a pod's device hold of devs of resource, as the job manager
// admits it.
func podJob(id, resource string, devs ...string) *api.Job {
	return &api.Job{ID: id, Tier: api.TierGuaranteed, Owner: api.Owner{UID: 0},
		Spec: api.JobSpec{Name: "pod", Class: api.ClassService, Tier: api.TierGuaranteed, Pod: &api.PodHold{Resource: resource, Devices: devs}}}
}

// podHealth is PodResources as resource → device ID → healthy.
func podHealth(p *Placer) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	for _, r := range p.PodResources() {
		out[r.Name] = map[string]bool{}
		for _, d := range r.Devices {
			out[r.Name][d.ID] = d.Healthy
		}
	}
	return out
}

// healthyIDs are a resource's healthy device IDs, sorted.
func healthyIDs(p *Placer, resource string) []string {
	var out []string
	for id, ok := range podHealth(p)[resource] {
		if ok {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// wantPodError checks err is an *api.Error of code on field whose message
// names every one of words.
func wantPodError(t *testing.T, what string, err error, code, field string, words ...string) {
	t.Helper()
	var e *api.Error
	if !errors.As(err, &e) {
		t.Fatalf("%s: got %v, want an *api.Error %s on %s", what, err, code, field)
	}
	if e.Code != code || e.Field != field {
		t.Errorf("%s: got %s on %s (%s), want %s on %s", what, e.Code, e.Field, e.Message, code, field)
	}
	for _, w := range words {
		if !strings.Contains(e.Message, w) {
			t.Errorf("%s: %q does not name %q", what, e.Message, w)
		}
	}
}

const (
	gpuRes   = "fusiond.io/gpu-h200"
	shareRes = "fusiond.io/gpu-h200-shared"
	mig1g    = "fusiond.io/mig-1g.18gb"
	mig3g    = "fusiond.io/mig-3g.71gb"
)

var k8sName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$`)

func TestPodResourcesNamesAndIDs(t *testing.T) {
	if New(dgx(), Options{}).PodResources() != nil {
		t.Error("a host without PodOptions offers resources to kubelet")
	}
	p := New(migHost(), Options{Seed: 1, Pods: podOptions()})
	res := p.PodResources()
	var names []string
	for _, r := range res {
		names = append(names, r.Name)
		if !slices.IsSortedFunc(r.Devices, func(a, b PodDevice) int { return strings.Compare(a.ID, b.ID) }) {
			t.Errorf("%s: devices not sorted by ID", r.Name)
		}
	}
	want := []string{"fusiond.io/fpga-gzip", "fusiond.io/fpga-regex-v2", gpuRes, shareRes, mig1g, mig3g}
	if !slices.Equal(names, want) {
		t.Fatalf("resources %v, want %v", names, want)
	}
	h := podHealth(p)
	// Whole GPUs: every GPU by UUID; GPU-h, in MIG mode, listed unhealthy.
	if len(h[gpuRes]) != 8 || h[gpuRes]["GPU-h"] || !h[gpuRes]["GPU-a"] || !h[gpuRes]["GPU-g"] {
		t.Errorf("%s: %v", gpuRes, h[gpuRes])
	}
	// MIG: every start of the profile's slots (1g: 0..6; 3g: 0 and 3);
	// 0 and 1 are free instances of 1g, 3g at 0 overlaps them.
	wantMIG := map[string]map[string]bool{
		mig1g: {"GPU-h:1g.18gb:0": true, "GPU-h:1g.18gb:1": true, "GPU-h:1g.18gb:2": true, "GPU-h:1g.18gb:3": true, "GPU-h:1g.18gb:4": true, "GPU-h:1g.18gb:5": true, "GPU-h:1g.18gb:6": true},
		mig3g: {"GPU-h:3g.71gb:0": false, "GPU-h:3g.71gb:3": true},
	}
	for r, w := range wantMIG {
		if !maps.Equal(h[r], w) {
			t.Errorf("%s: %v, want %v", r, h[r], w)
		}
	}
	// Shares: 4 per GPU, none on the MIG GPU.
	if len(h[shareRes]) != 32 || !h[shareRes]["GPU-a:share:3"] || h[shareRes]["GPU-h:share:0"] {
		t.Errorf("%s: %v", shareRes, h[shareRes])
	}
	if got := h["fusiond.io/fpga-gzip"]; !maps.Equal(got, map[string]bool{"fpga-0": true, "fpga-1": true}) {
		t.Errorf("fpga-gzip: %v", got)
	}
	for _, r := range res {
		for _, d := range r.Devices {
			wantNUMA := 1
			if strings.HasPrefix(d.ID, "GPU-a") {
				wantNUMA = 0
			}
			if (strings.HasPrefix(d.ID, "GPU-a") || strings.HasPrefix(d.ID, "GPU-e") || strings.HasPrefix(d.ID, "fpga-")) && d.NUMA != wantNUMA {
				t.Errorf("%s %s: NUMA %d, want %d", r.Name, d.ID, d.NUMA, wantNUMA)
			}
		}
	}

	// Names are valid extended resource names whatever the models.
	for model, slug := range map[string]string{"NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "h100-80gb-hbm3", "NVIDIA A100-SXM4-80GB": "a100-sxm4-80gb",
		"NVIDIA L4": "l4", "": "unknown", "Tesla  V100 (SXM2)": "tesla-v100-sxm2"} {
		if got := modelSlug(model); got != slug {
			t.Errorf("modelSlug(%q) = %q, want %q", model, got, slug)
		}
	}
	if got := podSlug("1g.18gb+me", "."); got != "1g.18gb-me" {
		t.Errorf("podSlug(1g.18gb+me) = %q", got)
	}
	hw := dgx()
	hw.GPUs[0].Model = "NVIDIA " + strings.Repeat("Very Long Model Name ", 6)
	hw.GPUs[1].MIG = &devices.MIG{Slots: 7, Profiles: map[string]int{"1g.18gb+me": 1}}
	q := New(hw, Options{Pods: &PodOptions{Prefix: "example.com", ShareReplicas: 2, Bitstreams: func() []PodBitstream {
		return []PodBitstream{{Name: "Zip", ID: "aaaaaaaaaaaaaaaa"}, {Name: "zip", ID: "bbbbbbbbbbbbbbbb"}, {Name: "+++", ID: "cccccccccccccccc"}}
	}}})
	for _, r := range q.PodResources() {
		prefix, name, _ := strings.Cut(r.Name, "/")
		if prefix != "example.com" || len(name) > 63 || !k8sName.MatchString(name) {
			t.Errorf("%q is not a valid extended resource name of example.com", r.Name)
		}
		if strings.Contains(r.Name, "fpga-zip") && !strings.HasSuffix(r.Name, "aaaaaaaaaaaa") && !strings.HasSuffix(r.Name, "bbbbbbbbbbbb") {
			t.Errorf("%s: two bitstreams of one slug are not told apart by ID", r.Name)
		}
	}
	if _, ok := podHealth(q)["example.com/mig-1g.18gb-me"]; !ok {
		t.Errorf("MIG profile 1g.18gb+me not offered as mig-1g.18gb-me: %v", slices.Collect(maps.Keys(podHealth(q))))
	}
}

// A pod's hold and fusiond's jobs share one ledger: neither gets the
// other's GPU; a hold's GPU stays healthy for kubelet, a job's is not;
// refusals name the device and why; Release frees the GPU again.
func TestPodHoldWholeGPUs(t *testing.T) {
	p := New(dgx(), Options{Seed: 1, Pods: &PodOptions{}})
	allocs, why, ok := p.Place([]*api.Job{job("j1", api.TierBurstable, gpus(1))})
	if !ok {
		t.Fatal(why)
	}
	taken := allocs[0].GPUs[0]
	if h := podHealth(p)[gpuRes]; h[taken] || len(healthyIDs(p, gpuRes)) != 7 {
		t.Errorf("job j1's GPU %s healthy for pods: %v", taken, h)
	}
	_, err := p.HoldPod(podJob("p0", gpuRes, taken))
	wantPodError(t, "hold of a job's GPU", err, api.CodeConflict, "pod.devices", taken, "held by job j1")

	free := "GPU-f"
	if taken == free {
		free = "GPU-g"
	}
	pod := podJob("p1", gpuRes, free)
	a, err := p.HoldPod(pod)
	if err != nil {
		t.Fatalf("hold of free %s: %v", free, err)
	}
	if !slices.Equal(a.GPUs, []string{free}) || !slices.Equal(a.Devices, []string{free}) || a.NUMANode != 1 || a.CPU != 0 || a.Memory != 0 {
		t.Errorf("pod allocation %+v", a)
	}
	if !podHealth(p)[gpuRes][free] {
		t.Errorf("pod p1's GPU %s unhealthy for kubelet", free)
	}
	if p.Allocated().GPUs != 2 {
		t.Errorf("allocated %d GPUs, want the job's and the pod's", p.Allocated().GPUs)
	}
	_, err = p.HoldPod(podJob("p2", gpuRes, free))
	wantPodError(t, "hold of a pod's GPU", err, api.CodeConflict, "pod.devices", free, "held by pod hold p1")
	_, err = p.HoldPod(pod)
	wantPodError(t, "the same hold twice", err, api.CodeConflict, "pod", "already holds")

	// Six GPUs are left for jobs, none of them the pod's.
	allocs, why, ok = p.Place([]*api.Job{job("j6", api.TierBurstable, gpus(6))})
	if !ok {
		t.Fatalf("6 GPUs beside the job and the pod: %s", why)
	}
	if slices.Contains(allocs[0].GPUs, free) {
		t.Fatalf("job j6 got the pod's GPU %s", free)
	}
	if _, _, ok := p.Place([]*api.Job{job("j7", api.TierBurstable, gpus(1))}); ok {
		t.Fatal("a job was given a GPU the pod holds")
	}
	if got := healthyIDs(p, gpuRes); !slices.Equal(got, []string{free}) {
		t.Errorf("healthy for kubelet: %v, want only the pod's %s", got, free)
	}
	p.Release(job("j6", api.TierBurstable, gpus(6)))

	// Out of service: refused, and unhealthy for kubelet.
	down := "GPU-c"
	if taken == down {
		down = "GPU-d"
	}
	p.SetHealthy(down, false)
	_, err = p.HoldPod(podJob("p3", gpuRes, down))
	wantPodError(t, "hold of a GPU out of service", err, api.CodeUnavailable, "pod.devices", down, "out of service")
	if podHealth(p)[gpuRes][down] {
		t.Errorf("%s out of service but healthy for kubelet", down)
	}

	// Unknown resource or device ID.
	_, err = p.HoldPod(podJob("p4", gpuRes, "GPU-zz"))
	wantPodError(t, "unknown device", err, api.CodeUnsatisfiable, "pod.devices", "GPU-zz", gpuRes)
	_, err = p.PodSpec(api.PodHold{Resource: "fusiond.io/gpu-a100", Devices: []string{"GPU-a"}})
	wantPodError(t, "unknown resource", err, api.CodeUnsatisfiable, "pod.resource", "fusiond.io/gpu-a100", gpuRes)
	if _, err := New(dgx(), Options{}).PodSpec(api.PodHold{Resource: gpuRes, Devices: []string{"GPU-a"}}); err == nil {
		t.Error("a host serving no pods gave a pod spec")
	}

	// Released, the pod's GPU is free again: for another pod, or a job.
	p.Release(pod)
	p.Release(pod)
	if !podHealth(p)[gpuRes][free] {
		t.Errorf("released %s unhealthy", free)
	}
	if _, err := p.HoldPod(podJob("p5", gpuRes, free)); err != nil {
		t.Errorf("released %s refused: %v", free, err)
	}
	p.Release(podJob("p5", gpuRes, free))
	if _, why, ok := p.Place([]*api.Job{job("j8", api.TierBurstable, gpus(6))}); !ok {
		t.Errorf("6 GPUs after the pod left: %s", why)
	}
}

func TestPodSpec(t *testing.T) {
	p := New(migHost(), Options{Pods: podOptions()})
	cases := []struct {
		hold api.PodHold
		want api.Resources
	}{
		{api.PodHold{Resource: gpuRes, Devices: []string{"GPU-b", "GPU-a"}}, api.Resources{GPU: &api.GPURequest{Count: 2, Model: "NVIDIA H200"}}},
		{api.PodHold{Resource: mig3g, Devices: []string{"GPU-h:3g.71gb:3"}}, api.Resources{GPU: &api.GPURequest{Count: 1, MIG: "3g.71gb", Model: "NVIDIA H200"}}},
		{api.PodHold{Resource: shareRes, Devices: []string{"GPU-a:share:3", "GPU-a:share:0"}},
			api.Resources{GPU: &api.GPURequest{Count: 1, Share: 500, Memory: api.BytesOfMiB(143771 * 2 / 4), Model: "NVIDIA H200"}}},
		{api.PodHold{Resource: shareRes, Devices: []string{"GPU-a:share:0", "GPU-a:share:1", "GPU-a:share:2", "GPU-a:share:3"}},
			api.Resources{GPU: &api.GPURequest{Count: 1, Model: "NVIDIA H200"}}},
		{api.PodHold{Resource: "fusiond.io/fpga-regex-v2", Devices: []string{"fpga-1"}}, api.Resources{FPGA: &api.FPGARequest{Bitstream: "5e1f00d"}}},
	}
	for _, c := range cases {
		got, err := p.PodSpec(c.hold)
		if err != nil {
			t.Errorf("%v: %v", c.hold, err)
			continue
		}
		if (got.GPU == nil) != (c.want.GPU == nil) || got.GPU != nil && *got.GPU != *c.want.GPU ||
			(got.FPGA == nil) != (c.want.FPGA == nil) || got.FPGA != nil && *got.FPGA != *c.want.FPGA || got.CPU != 0 || got.Memory != 0 {
			t.Errorf("%v: got %+v %+v, want %+v %+v", c.hold, got.GPU, got.FPGA, c.want.GPU, c.want.FPGA)
		}
		// What the job manager records passes the spec's validation.
		spec := api.JobSpec{Name: "pod-x", Class: api.ClassService, Resources: got, Pod: &c.hold}
		if err := spec.Validate(); err != nil {
			t.Errorf("%v: recorded spec invalid: %v", c.hold, err)
		}
	}
	bad := []struct {
		hold  api.PodHold
		code  string
		words []string
	}{
		{api.PodHold{Resource: shareRes, Devices: []string{"GPU-a:share:0", "GPU-b:share:1"}}, api.CodeInvalid, []string{"one GPU", "GPU-a", "GPU-b"}},
		{api.PodHold{Resource: mig1g, Devices: []string{"GPU-h:1g.18gb:0", "GPU-h:1g.18gb:1"}}, api.CodeInvalid, []string{"one MIG instance"}},
		{api.PodHold{Resource: gpuRes, Devices: []string{"GPU-a", "GPU-a"}}, api.CodeInvalid, []string{"twice"}},
		{api.PodHold{Resource: gpuRes}, api.CodeInvalid, []string{"no device"}},
		{api.PodHold{Resource: mig1g, Devices: []string{"GPU-h:1g.18gb:7"}}, api.CodeUnsatisfiable, []string{"GPU-h:1g.18gb:7"}},
		{api.PodHold{Resource: gpuRes, Devices: []string{"GPU-a:share:0"}}, api.CodeUnsatisfiable, []string{"GPU-a:share:0"}},
	}
	for _, c := range bad {
		_, err := p.PodSpec(c.hold)
		wantPodError(t, strings.Join(c.hold.Devices, ","), err, c.code, "pod.devices", c.words...)
	}
}

// A MIG profile's pod gets an instance created on demand at a free start,
// which blocks the starts overlapping it; an existing instance is held as
// it is.
func TestPodHoldMIG(t *testing.T) {
	hw := migHost()
	p := New(hw, Options{Seed: 1, Pods: podOptions()})
	pod := podJob("p1", mig3g, "GPU-h:3g.71gb:3")
	a, err := p.HoldPod(pod)
	if err != nil {
		t.Fatal(err)
	}
	if m := a.MIG; m == nil || *m != (api.MIGAllocation{GPU: "GPU-h", Profile: "3g.71gb", Start: 3}) || len(a.Devices) != 1 || !strings.Contains(a.Devices[0], "to create") || a.NUMANode != 1 {
		t.Fatalf("allocation %+v (MIG %+v), want an instance of 3g.71gb to create at slot 3", a, a.MIG)
	}
	want := map[string]bool{"GPU-h:1g.18gb:0": true, "GPU-h:1g.18gb:1": true, "GPU-h:1g.18gb:2": true, "GPU-h:1g.18gb:3": false,
		"GPU-h:1g.18gb:4": false, "GPU-h:1g.18gb:5": false, "GPU-h:1g.18gb:6": true}
	if got := podHealth(p)[mig1g]; !maps.Equal(got, want) {
		t.Errorf("%s after the 3g hold: %v, want %v", mig1g, got, want)
	}
	if !podHealth(p)[mig3g]["GPU-h:3g.71gb:3"] {
		t.Error("the pod's MIG slot unhealthy for kubelet")
	}
	_, err = p.HoldPod(podJob("p2", mig1g, "GPU-h:1g.18gb:4"))
	wantPodError(t, "an overlapping start", err, api.CodeConflict, "pod.devices", "GPU-h:1g.18gb:4", "held by pod hold p1")
	_, err = p.HoldPod(podJob("p3", gpuRes, "GPU-h"))
	wantPodError(t, "a MIG GPU whole", err, api.CodeConflict, "pod.devices", "GPU-h", "MIG mode")

	// An existing instance is held as it is.
	b, err := p.HoldPod(podJob("p4", mig1g, "GPU-h:1g.18gb:0"))
	if err != nil {
		t.Fatal(err)
	}
	if b.MIG == nil || b.MIG.Instance != "MIG-h0" || !slices.Equal(b.Devices, []string{"MIG-h0"}) {
		t.Errorf("hold of the instance at 0: %+v (MIG %+v)", b, b.MIG)
	}
	// A job takes the other free instance; that one is then unhealthy.
	allocs, why, ok := p.Place([]*api.Job{job("j1", api.TierBurstable, migReq("1g.18gb"))})
	if !ok {
		t.Fatal(why)
	}
	if allocs[0].MIG.Instance != "MIG-h1" {
		t.Errorf("job j1 got %+v, want the free instance MIG-h1", allocs[0].MIG)
	}
	if podHealth(p)[mig1g]["GPU-h:1g.18gb:1"] {
		t.Error("the job's instance healthy for kubelet")
	}
	_, err = p.HoldPod(podJob("p5", mig1g, "GPU-h:1g.18gb:1"))
	wantPodError(t, "a job's instance", err, api.CodeConflict, "pod.devices", "held by job j1")
	// Slots 0-2 hold instances in use (p4's, j1's) and 3-5 the pod's: no
	// 3g for a job (idle instances alone would be destroyed for it).
	if _, _, ok := p.Place([]*api.Job{job("j3", api.TierBurstable, migReq("3g.71gb"))}); ok {
		t.Error("a job got a 3g instance over the pod's slots")
	}

	// The driver creates the pod's instance: the hold stays, healthy.
	hw.GPUs[7].MIG.Instances = append(hw.GPUs[7].MIG.Instances, devices.MIGInstance{ID: "MIG-h3", Profile: "3g.71gb", Start: 3, Slots: 3})
	p.UpdateHardware(hw)
	if !podHealth(p)[mig3g]["GPU-h:3g.71gb:3"] || podHealth(p)[mig1g]["GPU-h:1g.18gb:4"] {
		t.Errorf("after the instance was created: %v %v", podHealth(p)[mig3g], podHealth(p)[mig1g])
	}
	p.Release(pod)
	if !podHealth(p)[mig3g]["GPU-h:3g.71gb:3"] {
		t.Error("the released instance is not offered again")
	}
	if _, _, ok := p.Place([]*api.Job{job("j3", api.TierBurstable, migReq("3g.71gb"))}); !ok {
		t.Error("the pod's instance not free for a job once released")
	}
}

// k of N share IDs of one GPU are a share of k·1000/N milli-GPU with k/N
// of its memory; the GPU's free share decides how many further IDs are
// healthy; a share on a GPU makes it unhealthy as a whole GPU.
func TestPodHoldShares(t *testing.T) {
	hw := dgx()
	hw.GPUs, hw.NVLink = hw.GPUs[:1], nil
	p := New(hw, Options{Seed: 1, Pods: &PodOptions{ShareReplicas: 4}})
	a, err := p.HoldPod(podJob("p1", shareRes, "GPU-a:share:1", "GPU-a:share:0"))
	if err != nil {
		t.Fatal(err)
	}
	if s := a.GPUShare; s == nil || *s != (api.GPUShare{GPU: "GPU-a", Milli: 500, MemoryMB: 143771 / 2}) || len(a.GPUs) != 0 {
		t.Fatalf("share allocation %+v (share %+v)", a, a.GPUShare)
	}
	if got := healthyIDs(p, shareRes); !slices.Equal(got, []string{"GPU-a:share:0", "GPU-a:share:1", "GPU-a:share:2", "GPU-a:share:3"}) {
		t.Errorf("healthy shares %v: the pod's two and two more fit", got)
	}
	if podHealth(p)[gpuRes]["GPU-a"] {
		t.Error("a GPU a pod holds a share of is healthy as a whole GPU")
	}
	// A job's share of 300 leaves 200: not one more quarter.
	if _, why, ok := p.Place([]*api.Job{job("s1", api.TierBurstable, share(300))}); !ok {
		t.Fatal(why)
	}
	if got := healthyIDs(p, shareRes); !slices.Equal(got, []string{"GPU-a:share:0", "GPU-a:share:1"}) {
		t.Errorf("healthy shares %v, want the pod's only", got)
	}
	_, err = p.HoldPod(podJob("p2", shareRes, "GPU-a:share:2"))
	wantPodError(t, "a share beyond the free share", err, api.CodeConflict, "pod.devices", "GPU-a", "200 milli-GPU")
	_, err = p.HoldPod(podJob("p3", shareRes, "GPU-a:share:0"))
	wantPodError(t, "another pod's share ID", err, api.CodeConflict, "pod.devices", "held by pod hold p1")
	p.Release(job("s1", api.TierBurstable, share(300)))
	if _, err := p.HoldPod(podJob("p4", shareRes, "GPU-a:share:3")); err != nil {
		t.Errorf("a quarter beside the pod's half: %v", err)
	}

	// Mixed GPUs are refused; all N replicas are the whole GPU.
	q := New(dgx(), Options{Seed: 1, Pods: &PodOptions{ShareReplicas: 4}})
	_, err = q.HoldPod(podJob("m", shareRes, "GPU-a:share:0", "GPU-b:share:0"))
	wantPodError(t, "a share over two GPUs", err, api.CodeInvalid, "pod.devices", "one GPU")
	w, err := q.HoldPod(podJob("w", shareRes, "GPU-c:share:0", "GPU-c:share:1", "GPU-c:share:2", "GPU-c:share:3"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(w.GPUs, []string{"GPU-c"}) || w.GPUShare != nil {
		t.Errorf("all 4 replicas: %+v, want GPU-c whole", w)
	}
	if podHealth(q)[gpuRes]["GPU-c"] {
		t.Error("GPU-c held whole through its shares is healthy as a whole GPU")
	}
}

func TestPodHoldFPGA(t *testing.T) {
	p := New(dgx(), Options{Seed: 1, Pods: podOptions()})
	// gzip is loaded in fpga-1: the engine prefers it (no programming).
	ids, _, err := p.PreferPod("fusiond.io/fpga-gzip", []string{"fpga-0", "fpga-1"}, nil, 1)
	if err != nil || !slices.Equal(ids, []string{"fpga-1"}) {
		t.Errorf("preferred %v (%v), want fpga-1, which holds gzip", ids, err)
	}
	a, err := p.HoldPod(podJob("p1", "fusiond.io/fpga-gzip", "fpga-0"))
	if err != nil {
		t.Fatal(err)
	}
	if f := a.FPGA; f == nil || *f != (api.FPGAAllocation{Region: "fpga-0", Bitstream: "gzip", Program: true}) || a.NUMANode != 1 {
		t.Errorf("allocation %+v (FPGA %+v), want fpga-0 programmed with gzip", a, a.FPGA)
	}
	h := podHealth(p)
	if !h["fusiond.io/fpga-gzip"]["fpga-0"] || h["fusiond.io/fpga-regex-v2"]["fpga-0"] {
		t.Errorf("after the hold: %v", h)
	}
	_, err = p.HoldPod(podJob("p2", "fusiond.io/fpga-regex-v2", "fpga-0"))
	wantPodError(t, "a held region", err, api.CodeConflict, "pod.devices", "fpga-0", "held by pod hold p1")
}

// PreferPod lets the engine choose among kubelet's available IDs: NUMA-local
// and NVLink-connected GPUs for two, the mustInclude IDs kept, and nothing
// committed.
func TestPreferPod(t *testing.T) {
	p := New(dgx(), Options{Seed: 1, Pods: podOptions()})
	before, alloc := p.PodResources(), p.Allocated()
	// The dgx host's GPUs are all NVLink-connected (as the simulated
	// dgxh200's NVSwitch): NUMA decides. GPU-a is on node 0, e and f on 1.
	ids, explain, err := p.PreferPod(gpuRes, []string{"GPU-a", "GPU-e", "GPU-f"}, nil, 2)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Sort(ids); !slices.Equal(ids, []string{"GPU-e", "GPU-f"}) {
		t.Errorf("preferred %v, want the two on one NUMA node", ids)
	}
	if !strings.Contains(explain, "GPU-e") {
		t.Errorf("explanation names no chosen GPU: %q", explain)
	}
	ids, _, err = p.PreferPod(gpuRes, []string{"GPU-b", "GPU-c", "GPU-g"}, []string{"GPU-a"}, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 3 || ids[0] != "GPU-a" || !slices.Contains([]string{"GPU-b", "GPU-c", "GPU-g"}, ids[1]) || !slices.Contains([]string{"GPU-b", "GPU-c", "GPU-g"}, ids[2]) || ids[1] == ids[2] {
		t.Errorf("preferred %v: GPU-a kept and two of b, c, g", ids)
	}
	if ids, _, err := p.PreferPod(gpuRes, []string{"GPU-a", "GPU-b"}, []string{"GPU-b"}, 1); err != nil || !slices.Equal(ids, []string{"GPU-b"}) {
		t.Errorf("size of mustInclude: %v %v", ids, err)
	}
	if !slices.EqualFunc(before, p.PodResources(), func(a, b PodResource) bool { return a.Name == b.Name && slices.Equal(a.Devices, b.Devices) }) || p.Allocated() != alloc {
		t.Error("PreferPod changed what is held")
	}
	for _, c := range []struct {
		res        string
		avail, inc []string
		size       int
	}{
		{"fusiond.io/gpu-a100", []string{"GPU-a"}, nil, 1},
		{gpuRes, []string{"GPU-a"}, nil, 0},
		{gpuRes, []string{"GPU-a"}, nil, 2},
		{gpuRes, []string{"GPU-a", "GPU-b"}, []string{"GPU-zz"}, 2},
		{gpuRes, []string{"GPU-a", "GPU-b", "GPU-c"}, []string{"GPU-a", "GPU-b", "GPU-c"}, 2},
		{shareRes, []string{"GPU-a:share:0", "GPU-b:share:0", "GPU-b:share:1"}, []string{"GPU-a:share:0", "GPU-b:share:0"}, 3},
	} {
		if ids, _, err := p.PreferPod(c.res, c.avail, c.inc, c.size); err == nil {
			t.Errorf("PreferPod(%s, %v, %v, %d) = %v, want an error", c.res, c.avail, c.inc, c.size, ids)
		}
	}

	// NVLink in pairs, one NUMA node: the linked pair.
	hw := dgx()
	hw.GPUs = hw.GPUs[:4]
	for i := range hw.GPUs {
		hw.GPUs[i].NUMA = 0
	}
	hw.NVLink = [][2]int{{0, 1}, {2, 3}}
	q := New(hw, Options{Seed: 1, Pods: &PodOptions{}})
	ids, _, err = q.PreferPod(gpuRes, []string{"GPU-a", "GPU-c", "GPU-d"}, nil, 2)
	if slices.Sort(ids); err != nil || !slices.Equal(ids, []string{"GPU-c", "GPU-d"}) {
		t.Errorf("preferred %v (%v), want the NVLink pair c-d", ids, err)
	}

	// MIG: an existing free instance first, and only among the offered.
	m := New(migHost(), Options{Seed: 1, Pods: podOptions()})
	all := slices.Sorted(maps.Keys(podHealth(m)[mig1g]))
	ids, _, err = m.PreferPod(mig1g, all, nil, 1)
	if err != nil || len(ids) != 1 || ids[0] != "GPU-h:1g.18gb:0" && ids[0] != "GPU-h:1g.18gb:1" {
		t.Errorf("preferred %v (%v), want an existing instance", ids, err)
	}
	ids, _, err = m.PreferPod(mig1g, all[2:], nil, 1)
	if err != nil || len(ids) != 1 || !slices.Contains(all[2:], ids[0]) {
		t.Errorf("preferred %v (%v), want one of %v", ids, err, all[2:])
	}
	if _, _, err := m.PreferPod(mig1g, all, nil, 2); err == nil {
		t.Error("two MIG instances preferred for one container")
	}

	// Shares: the GPU a pod's share is on first (whole GPUs stay whole),
	// the IDs of one GPU.
	if _, err := p.HoldPod(podJob("p1", shareRes, "GPU-c:share:0", "GPU-c:share:1")); err != nil {
		t.Fatal(err)
	}
	var avail []string
	for _, id := range healthyIDs(p, shareRes) {
		if !strings.HasPrefix(id, "GPU-c:share:0") && !strings.HasPrefix(id, "GPU-c:share:1") {
			avail = append(avail, id)
		}
	}
	ids, _, err = p.PreferPod(shareRes, avail, nil, 2)
	if err != nil || !slices.Equal(ids, []string{"GPU-c:share:2", "GPU-c:share:3"}) {
		t.Errorf("preferred %v (%v), want the rest of GPU-c", ids, err)
	}
	ids, _, err = p.PreferPod(shareRes, avail, []string{"GPU-e:share:3"}, 2)
	if err != nil || len(ids) != 2 || ids[0] != "GPU-e:share:3" || !strings.HasPrefix(ids[1], "GPU-e:share:") {
		t.Errorf("preferred %v (%v), want GPU-e:share:3 and another of GPU-e", ids, err)
	}
}

// A pod's hold re-attached after a restart (Reclaim) is a pod hold again:
// its GPU healthy for kubelet, refused to others, free once released.
func TestReclaimPodHold(t *testing.T) {
	opts := Options{Seed: 1, Pods: &PodOptions{}}
	pod := podJob("p1", gpuRes, "GPU-b")
	a, err := New(dgx(), opts).HoldPod(pod)
	if err != nil {
		t.Fatal(err)
	}
	res, err := New(dgx(), opts).PodSpec(*pod.Spec.Pod)
	if err != nil {
		t.Fatal(err)
	}
	pod.Spec.Resources = res // as the job manager records it
	pod.Allocation = &a
	restarted := New(dgx(), opts)
	if err := restarted.Reclaim(pod); err != nil {
		t.Fatal(err)
	}
	if !podHealth(restarted)[gpuRes]["GPU-b"] {
		t.Error("the re-attached pod's GPU unhealthy for kubelet")
	}
	_, err = restarted.HoldPod(podJob("p2", gpuRes, "GPU-b"))
	wantPodError(t, "a re-attached pod's GPU", err, api.CodeConflict, "pod.devices", "held by pod hold p1")
	restarted.Release(pod)
	if _, err := restarted.HoldPod(podJob("p2", gpuRes, "GPU-b")); err != nil {
		t.Errorf("released: %v", err)
	}
}

// On MPS GPUs, pods' shares (one owner: kubelet's) pack together, and a
// GPU serving a fusiond user's shares offers pods none.
func TestPodSharesMPS(t *testing.T) {
	p := New(mpsHost(3), Options{Seed: 1, Pods: &PodOptions{ShareReplicas: 4}})
	res := "fusiond.io/gpu-h100-shared"
	if _, err := p.HoldPod(podJob("p1", res, "GPU-a:share:0")); err != nil {
		t.Fatal(err)
	}
	allocs, why, ok := p.Place([]*api.Job{shareJob("s1", 1000)})
	if !ok {
		t.Fatal(why)
	}
	if allocs[0].GPUShare.GPU == "GPU-a" {
		t.Fatal("user 1000's share placed on the MPS GPU serving the pod's")
	}
	other := allocs[0].GPUShare.GPU
	h := podHealth(p)[res]
	for i := range 4 {
		if h[shareID(other, i)] {
			t.Errorf("%s healthy for pods while %s serves user 1000", shareID(other, i), other)
		}
	}
	if !h["GPU-a:share:1"] {
		t.Error("a second quarter of the pods' MPS GPU unhealthy")
	}
	var avail []string
	for _, id := range healthyIDs(p, res) {
		if id != "GPU-a:share:0" {
			avail = append(avail, id)
		}
	}
	ids, _, err := p.PreferPod(res, avail, nil, 1)
	if err != nil || len(ids) != 1 || !strings.HasPrefix(ids[0], "GPU-a:") {
		t.Errorf("preferred %v (%v), want a share of GPU-a, beside the pod's", ids, err)
	}
}

func TestPodFeatures(t *testing.T) {
	if New(dgx(), Options{}).PodFeatures() != nil {
		t.Error("a host that serves no pods has pod features")
	}
	p := New(dgx(), Options{Pods: &PodOptions{Bitstreams: func() []PodBitstream {
		return []PodBitstream{{Name: "GZip v2", ID: "gzip"}, {Name: "matmul", ID: "mm"}}
	}}})
	got := p.PodFeatures()
	want := map[string]string{"gpu.count": "8", "gpu.model": "h200", "gpu.model.h200": "8", "gpu.mig.enabled": "0",
		"fpga.regions": "2", "fpga.bitstream.gzip-v2": "1"}
	if !maps.Equal(got, want) {
		t.Errorf("features %v, want %v", got, want)
	}
	hw := migHost()
	hw.GPUs = append(hw.GPUs, devices.Device{ID: "GPU-l4", Kind: devices.GPU, Model: "NVIDIA L4", MemoryMB: 23034, Health: devices.Health{Healthy: true}})
	got = New(hw, Options{Pods: &PodOptions{}}).PodFeatures()
	if got["gpu.model"] != "" || got["gpu.model.l4"] != "1" || got["gpu.mig.enabled"] == "0" {
		t.Errorf("a host of two models, some GPUs in MIG mode: %v", got)
	}
}

// MIG IDs follow the driver's placements where it names them: a 1g
// instance of an H200 starts at slots 0..6 of 8, never at 7.
func TestPodMIGStartsFollowTheDriver(t *testing.T) {
	hw := migHost()
	hw.GPUs[7].MIG.Slots = 8
	hw.GPUs[7].MIG.Starts = map[string][]int{"1g.18gb": {0, 1, 2, 3, 4, 5, 6}, "3g.71gb": {0, 4}}
	p := New(hw, Options{Pods: &PodOptions{}})
	var got []string
	for _, r := range p.PodResources() {
		if r.Name == "fusiond.io/mig-1g.18gb" {
			for _, d := range r.Devices {
				got = append(got, d.ID)
			}
		}
	}
	if len(got) != 7 || slices.Contains(got, "GPU-h:1g.18gb:7") {
		t.Errorf("1g.18gb IDs %v, want starts 0..6", got)
	}
	if _, err := p.PodSpec(api.PodHold{Resource: "fusiond.io/mig-1g.18gb", Devices: []string{"GPU-h:1g.18gb:7"}}); err == nil {
		t.Error("a 1g instance at slot 7 is offered")
	}
}

// Kubelet offers the devices of a pod that ended before fusiond's hold of
// them did (the hold ends when kubelet allocates them again): the engine
// chooses among them as free.
func TestPreferPodOffersWhatKubeletFreed(t *testing.T) {
	p := New(dgx(), Options{Seed: 1, Pods: &PodOptions{}})
	gpuRes := "fusiond.io/gpu-h200"
	old := podJob("p1", gpuRes, "GPU-a", "GPU-b")
	if _, err := p.HoldPod(old); err != nil {
		t.Fatal(err)
	}
	ids, _, err := p.PreferPod(gpuRes, []string{"GPU-a", "GPU-b"}, nil, 2)
	if err != nil || !slices.Equal(slices.Sorted(slices.Values(ids)), []string{"GPU-a", "GPU-b"}) {
		t.Fatalf("preferred %v, %v; want the freed GPU-a and GPU-b", ids, err)
	}
	// Still held: a job gets neither.
	if healthy := healthyIDs(p, gpuRes); !slices.Contains(healthy, "GPU-a") {
		t.Errorf("the pod's GPU is not counted for kubelet: %v", healthy)
	}
	j := job("j", api.TierBurstable, gpus(8))
	if _, why, ok := p.Place([]*api.Job{j}); ok {
		t.Errorf("a job got 8 GPUs while a pod's hold has two (%s)", why)
	}
}

// A bitstream's resource lists only the regions that can hold it.
func TestPodFPGAOnlyAcceptingRegions(t *testing.T) {
	o := podOptions()
	o.Accepts = func(region, bitstream string) bool { return region == "fpga-1" || bitstream == "gzip" }
	p := New(dgx(), Options{Seed: 1, Pods: o})
	h := podHealth(p)
	if _, ok := h["fusiond.io/fpga-regex-v2"]["fpga-0"]; ok || len(h["fusiond.io/fpga-regex-v2"]) != 1 {
		t.Errorf("regex:v2's regions %v, want fpga-1 alone", h["fusiond.io/fpga-regex-v2"])
	}
	if len(h["fusiond.io/fpga-gzip"]) != 2 {
		t.Errorf("gzip's regions %v, want both", h["fusiond.io/fpga-gzip"])
	}
	_, err := p.HoldPod(podJob("p1", "fusiond.io/fpga-regex-v2", "fpga-0"))
	wantPodError(t, "a region that cannot hold the bitstream", err, api.CodeUnsatisfiable, "pod.devices", "fpga-0")
}

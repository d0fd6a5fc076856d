//go:build kubelet

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/fusiond/fusiond/daemon/api"
)

// The resources fusiond offers on the simulated dgxh200 host.
const (
	h200Res   = "fusiond.io/gpu-h200-141gb-hbm3e"
	sharedRes = "fusiond.io/gpu-h200-141gb-hbm3e-shared"
	migRes    = "fusiond.io/mig-1g.18gb"
)

// pluginDaemon starts fusiond on the simulated dgxh200 host as kubelet's
// device plugin, with short reconcile and probation times and the release
// grace given, and waits until kubelet lists its eight GPUs as
// allocatable.
func pluginDaemon(t *testing.T, grace time.Duration) (*daemon, string) {
	t.Helper()
	dir := publicTempDir(t)
	features := filepath.Join(dir, "features.d", "fusiond")
	d := newDaemon(t, dir, fmt.Sprintf(`simulate: dgxh200
gpu: {health_probation: 2s, health_probe: 300ms}
kubernetes:
  device_plugin: true
  share_replicas: 4
  reconcile_interval: 300ms
  release_grace: %s
  features_file: %s
`, grace, features))
	d.start()
	t.Cleanup(func() { // before start's own cleanup stops it
		if t.Failed() {
			t.Logf("fusiond's log:\n%s", d.log)
		}
	})
	waitAllocatable(t, h200Res, func(ids []string) bool { return len(ids) == 8 }, "8 GPUs")
	return d, features
}

// allocatable is kubelet's allocatable devices of resource (its
// pod-resources GetAllocatableResources: the healthy devices of registered
// plugins).
func allocatable(t *testing.T, resource string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := podResources(t).GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
	if err != nil {
		return nil
	}
	var ids []string
	for _, d := range resp.GetDevices() {
		if d.GetResourceName() == resource {
			ids = append(ids, d.GetDeviceIds()...)
		}
	}
	sort.Strings(ids)
	return ids
}

// waitAllocatable waits until kubelet's allocatable devices of resource
// satisfy ok.
func waitAllocatable(t *testing.T, resource string, ok func([]string) bool, what string) []string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ids := allocatable(t, resource)
		if ok(ids) {
			return ids
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubelet's allocatable %s: %v, want %s", resource, ids, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// podDevices is what kubelet's pod-resources List says pod (manifest
// name) holds of resource.
func podDevices(t *testing.T, name, resource string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := podResources(t).List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatalf("pod-resources List: %v", err)
	}
	var ids []string
	for _, p := range resp.GetPodResources() {
		if p.GetName() != podName(name) {
			continue
		}
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if d.GetResourceName() == resource {
					ids = append(ids, d.GetDeviceIds()...)
				}
			}
		}
	}
	return ids
}

// visibleDevices waits for the NVIDIA_VISIBLE_DEVICES a pod printed.
func visibleDevices(t *testing.T, name string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, line := range strings.Split(podLog(t, "default", name, "main"), "\n") {
			if v, ok := strings.CutPrefix(line, "VISIBLE="); ok {
				return v
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s printed no VISIBLE= line:\n%s", name, podLog(t, "default", name, "main"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// gpuPod is a pod printing the devices it was given, then sleeping.
func gpuPod(name, resource string, n int) string {
	return busyboxPod(name, "echo VISIBLE=$NVIDIA_VISIBLE_DEVICES; echo CUDA=$CUDA_VISIBLE_DEVICES; exec sleep 3600",
		map[string]string{resource: strconv.Itoa(n)})
}

// holds are fusiond's running pods' holds by the devices they hold.
func holds(t *testing.T, c *api.Client) map[string]api.Job {
	t.Helper()
	js, err := c.List(context.Background(), api.ListOptions{State: []api.State{api.StateRunning}})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]api.Job{}
	for _, j := range js {
		if j.Spec.Pod != nil {
			ids := slices.Clone(j.Spec.Pod.Devices)
			sort.Strings(ids)
			out[strings.Join(ids, ",")] = j
		}
	}
	return out
}

// waitBound waits until the hold of devices names the pod (manifest name)
// with its UID.
func waitBound(t *testing.T, c *api.Client, devices, name, uid string) api.Job {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		j, ok := holds(t, c)[devices]
		if ok && j.Pod != nil && j.Pod.Name == podName(name) && j.Pod.Namespace == "default" && j.Pod.Container == "main" && j.Pod.UID == uid {
			return j
		}
		if time.Now().After(deadline) {
			t.Fatalf("no hold of %s bound to pod %s (uid %s): %+v", devices, podName(name), uid, holds(t, c))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestKubeletDevicePlugin runs fusiond as the device plugin of a real
// kubelet on the simulated dgxh200 host: pods get the GPUs fusiond chose,
// pods and fusiond's jobs never share one, a GPU in probation leaves
// kubelet's allocatable and comes back, a MIG pod gets an instance created
// on demand, an FPGA pod a region programmed with its bitstream, and
// neither a kubelet nor a fusiond restart leaks or loses a device.
func TestKubeletDevicePlugin(t *testing.T) {
	cd := startContainerd(t)
	k := startKubelet(t, cd, kubeletOptions{})
	d, features := pluginDaemon(t, 2*time.Second)
	c := d.client()
	ctx := context.Background()
	ok := d.mustCtl
	gpus, err := c.GPUs(ctx)
	if err != nil || len(gpus.GPUs) != 8 {
		t.Fatalf("gpus: %v %d", err, len(gpus.GPUs))
	}
	index := map[string]int{}
	for _, g := range gpus.GPUs {
		index[g.UUID] = g.Index
	}

	// GPU 7 in MIG mode, no instances: it leaves the whole GPUs and
	// offers MIG slots.
	layout := filepath.Join(t.TempDir(), "mig.yaml")
	if err := os.WriteFile(layout, []byte("version: v1\nmig-configs:\n  seven:\n    - devices: [7]\n      mig-enabled: true\n      mig-devices: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ok("mig", "apply", "-f", layout, "-c", "seven")
	whole := waitAllocatable(t, h200Res, func(ids []string) bool { return len(ids) == 7 }, "7 whole GPUs (GPU 7 in MIG mode)")
	if slices.Contains(whole, gpus.GPUs[7].UUID) {
		t.Fatalf("GPU 7 in MIG mode is allocatable whole: %v", whole)
	}
	waitAllocatable(t, migRes, func(ids []string) bool { return len(ids) == 7 }, "7 slots of 1g.18gb")

	// Pod a: one whole GPU, the one fusiond chose and kubelet allocated.
	writeStaticPod(t, k, "a", gpuPod("a", h200Res, 1))
	podA := waitPodRunning(t, k, "default", "a", time.Minute)
	devA := podDevices(t, "a", h200Res)
	if len(devA) != 1 {
		t.Fatalf("pod a holds %v of %s", devA, h200Res)
	}
	if got := visibleDevices(t, "a"); got != devA[0] {
		t.Errorf("pod a sees NVIDIA_VISIBLE_DEVICES=%q, kubelet allocated %s", got, devA[0])
	}
	holdA := waitBound(t, c, devA[0], "a", podA.Metadata.UID)
	if holdA.Allocation == nil || !slices.Equal(holdA.Allocation.GPUs, devA) || !strings.Contains(holdA.Allocation.Explain, "fusiond's preferred") {
		t.Errorf("pod a's hold: allocation %+v; want the GPU kubelet gave, chosen by fusiond", holdA.Allocation)
	}

	// Pod b and a fusiond job: three different GPUs.
	writeStaticPod(t, k, "b", gpuPod("b", h200Res, 1))
	podB := waitPodRunning(t, k, "default", "b", time.Minute)
	devB := podDevices(t, "b", h200Res)
	job, err := c.Submit(ctx, api.JobSpec{Name: "trainer", Class: api.ClassTraining, Command: []string{"sleep", "600"},
		Resources: api.Resources{CPU: 100, Memory: 16 << 20, GPU: &api.GPURequest{Count: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	job = waitFor(t, c, job.ID, api.StateRunning)
	used := []string{devA[0], devB[0], job.Allocation.GPUs[0]}
	if len(devB) != 1 || used[0] == used[1] || used[0] == used[2] || used[1] == used[2] {
		t.Fatalf("pod a %v, pod b %v and job %s share a GPU", devA, devB, job.Allocation.GPUs)
	}
	waitBound(t, c, devB[0], "b", podB.Metadata.UID)
	// The job's GPU leaves kubelet's allocatable; the pods' stay in it.
	waitAllocatable(t, h200Res, func(ids []string) bool {
		return len(ids) == 6 && !slices.Contains(ids, used[2]) && slices.Contains(ids, used[0]) && slices.Contains(ids, used[1])
	}, "6 GPUs: not the job's, the pods' still counted")

	// A GPU put into probation leaves kubelet's allocatable and comes
	// back after it.
	var free string
	for _, id := range whole {
		if !slices.Contains(used, id) {
			free = id
			break
		}
	}
	ok("gpu", "fault", strconv.Itoa(index[free]), "--xid", "79", "--lost")
	waitAllocatable(t, h200Res, func(ids []string) bool { return len(ids) == 5 && !slices.Contains(ids, free) }, "the faulty GPU gone")
	ok("gpu", "fault", strconv.Itoa(index[free]), "--reset")
	waitAllocatable(t, h200Res, func(ids []string) bool { return len(ids) == 6 && slices.Contains(ids, free) }, "the GPU back after probation")

	// A MIG pod: an instance created on demand on GPU 7.
	writeStaticPod(t, k, "m", gpuPod("m", migRes, 1))
	podM := waitPodRunning(t, k, "default", "m", time.Minute)
	devM := podDevices(t, "m", migRes)
	if len(devM) != 1 || !strings.HasPrefix(devM[0], gpus.GPUs[7].UUID+":1g.18gb:") {
		t.Fatalf("MIG pod holds %v", devM)
	}
	holdM := waitBound(t, c, devM[0], "m", podM.Metadata.UID)
	mig := holdM.Allocation.MIG
	if mig == nil || mig.Instance == "" || mig.GPU != gpus.GPUs[7].UUID {
		t.Fatalf("MIG pod's hold: %+v, want an instance created on GPU 7", holdM.Allocation)
	}
	if got := visibleDevices(t, "m"); got != mig.Instance {
		t.Errorf("MIG pod sees NVIDIA_VISIBLE_DEVICES=%q, want its instance %s", got, mig.Instance)
	}
	if l, err := c.GPUs(ctx); err != nil || !slices.ContainsFunc(l.GPUs[7].MIG, func(in api.MIGInstance) bool { return in.UUID == mig.Instance }) {
		t.Errorf("GPU 7's instances %+v lack the pod's %s (%v)", l.GPUs[7].MIG, mig.Instance, err)
	}

	// An FPGA pod: a region that can hold the library's dma bitstream,
	// programmed on demand.
	ok("fpga", "bitstream", "add", filepath.Join(d.dir, "state", "sim", "fpga-samples", "dma.gbs"))
	const fpgaRes = "fusiond.io/fpga-dma"
	waitAllocatable(t, fpgaRes, func(ids []string) bool { return len(ids) > 0 }, "regions for the dma bitstream")
	writeStaticPod(t, k, "f", busyboxPod("f", "exec sleep 3600", map[string]string{fpgaRes: "1"}))
	podF := waitPodRunning(t, k, "default", "f", time.Minute)
	devF := podDevices(t, "f", fpgaRes)
	if len(devF) != 1 {
		t.Fatalf("FPGA pod holds %v", devF)
	}
	holdF := waitBound(t, c, devF[0], "f", podF.Metadata.UID)
	if fa := holdF.Allocation.FPGA; fa == nil || fa.Region != devF[0] {
		t.Fatalf("FPGA pod's hold: %+v", holdF.Allocation)
	}
	regions, err := c.FPGARegions(ctx)
	if err != nil || !slices.ContainsFunc(regions, func(r api.FPGARegion) bool { return r.ID == devF[0] && r.LoadedName == "dma" }) {
		t.Errorf("region %s does not hold dma after the pod's allocation: %+v (%v)", devF[0], regions, err)
	}

	before := holds(t, c)
	if len(before) != 4 {
		t.Fatalf("%d holds, want 4 (pods a, b, m, f): %v", len(before), before)
	}
	node, err := c.Node(ctx)
	if err != nil || node.Kubernetes == nil {
		t.Fatalf("status: %v %+v", err, node.Kubernetes)
	}
	regs := node.Kubernetes.Registrations

	// Kubelet restarts: fusiond registers again, the pods keep their
	// devices, no hold is added or lost.
	k.Stop()
	k.Start()
	for _, p := range []string{"a", "b", "m", "f"} {
		waitPodRunning(t, k, "default", p, time.Minute)
	}
	waitAllocatable(t, h200Res, func(ids []string) bool { return len(ids) == 6 }, "6 GPUs again after kubelet's restart")
	if n, err := c.Node(ctx); err != nil || n.Kubernetes.Registrations <= regs {
		t.Errorf("registrations %d after kubelet's restart, %d before (%v)", n.Kubernetes.Registrations, regs, err)
	}
	time.Sleep(3 * time.Second) // past release_grace: a lost pod would be released now
	if after := holds(t, c); !sameHolds(before, after) {
		t.Errorf("holds after kubelet's restart %v, before %v", keys(after), keys(before))
	}

	var st api.NodeStatus
	if err := json.Unmarshal([]byte(ok("status", "-o", "json")), &st); err != nil || st.Kubernetes == nil {
		t.Fatalf("status: %v", err)
	}
	if k := st.Kubernetes; k.Allocate.Count < 4 || k.Holds != 4 || !k.PodResources || k.Registered != k.Resources {
		t.Errorf("status's device plugin: %+v", k)
	}
	t.Logf("device plugin: Allocate p50 %v p99 %v over %d; GetPreferredAllocation p50 %v p99 %v over %d",
		st.Kubernetes.Allocate.P50, st.Kubernetes.Allocate.P99, st.Kubernetes.Allocate.Count,
		st.Kubernetes.Preferred.P50, st.Kubernetes.Preferred.P99, st.Kubernetes.Preferred.Count)

	// fusiond restarts (stopping its job): the pods' devices are held
	// again before anything is placed, GPU 7 keeps its MIG instance, and
	// a job for the six GPUs that seem free waits: five are (two are the
	// pods', GPU 7 is in MIG mode).
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Fatalf("fusiond stop: %v\n%s", err, d.log)
	}
	d.start()
	c = d.client()
	if after := holds(t, c); !sameHolds(before, after) {
		t.Fatalf("holds after fusiond's restart %v, before %v", keys(after), keys(before))
	}
	big, err := c.Submit(ctx, api.JobSpec{Name: "big", Class: api.ClassTraining, Command: []string{"sleep", "600"},
		Resources: api.Resources{CPU: 100, Memory: 16 << 20, GPU: &api.GPURequest{Count: 6}}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if j, _ := c.Get(ctx, big.ID); j.State != api.StatePending {
		t.Fatalf("a job for 6 GPUs is %s after fusiond's restart: the pods' GPUs were given away", j.State)
	}
	if _, err := c.Cancel(ctx, big.ID); err != nil {
		t.Fatal(err)
	}
	waitAllocatable(t, h200Res, func(ids []string) bool { return len(ids) == 7 }, "7 GPUs after fusiond's restart (its job stopped)")
	if n, err := c.Node(ctx); err != nil || n.Allocated.GPUs < 3 {
		t.Errorf("after fusiond's restart %d GPUs allocated, want the pods' 3 (%v)", n.Allocated.GPUs, err)
	}

	// Pod a ends: kubelet frees its GPU, fusiond releases the hold, and
	// the GPU is allocatable again.
	removeStaticPod(t, k, "a")
	waitPodGone(t, k, "default", "a", time.Minute)
	deadline := time.Now().Add(20 * time.Second)
	for {
		j, err := c.Get(ctx, holdA.ID)
		if err != nil {
			t.Fatal(err)
		}
		if j.State == api.StateSucceeded {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod a's hold is %s (%s) after the pod ended", j.State, j.Reason)
		}
		time.Sleep(100 * time.Millisecond)
	}
	r := d.ctl(nil, "", "pods")
	if r.code != 0 || strings.Contains(r.stdout, podName("a")) || !strings.Contains(r.stdout, podName("b")) || !strings.Contains(r.stdout, podB.Metadata.UID) {
		t.Errorf("fusionctl pods:\n%s%s", r.stdout, r.stderr)
	}

	// A pod asking for two of a GPU's four shared IDs holds half of one
	// GPU, which then leaves the whole GPUs kubelet may allocate.
	wholeBefore := allocatable(t, h200Res)
	writeStaticPod(t, k, "s", gpuPod("s", sharedRes, 2))
	podS := waitPodRunning(t, k, "default", "s", time.Minute)
	devS := podDevices(t, "s", sharedRes)
	sort.Strings(devS)
	if len(devS) != 2 {
		t.Fatalf("shared pod holds %v", devS)
	}
	holdS := waitBound(t, c, strings.Join(devS, ","), "s", podS.Metadata.UID)
	share := holdS.Allocation.GPUShare
	if share == nil || share.Milli != 500 || !strings.HasPrefix(devS[0], share.GPU+":share:") || !strings.HasPrefix(devS[1], share.GPU+":share:") {
		t.Fatalf("shared pod's hold: %+v, want 500 milli-GPU of the GPU its IDs name (%v)", holdS.Allocation, devS)
	}
	if got := visibleDevices(t, "s"); got != share.GPU {
		t.Errorf("shared pod sees NVIDIA_VISIBLE_DEVICES=%q, want %s", got, share.GPU)
	}
	if slices.Contains(wholeBefore, share.GPU) {
		waitAllocatable(t, h200Res, func(ids []string) bool { return !slices.Contains(ids, share.GPU) && len(ids) == len(wholeBefore)-1 },
			"the shared GPU out of the whole GPUs")
	}

	// The node features for node-feature-discovery.
	data, err := os.ReadFile(features)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"fusiond.io/gpu.count=8\n", "fusiond.io/gpu.model=h200-141gb-hbm3e\n", "fusiond.io/gpu.mig.capable=true\n", "fusiond.io/gpu.mig.enabled=1\n"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("features file lacks %q:\n%s", want, data)
		}
	}

	// The audit log has every allocation as kubelet's.
	audit, err := os.ReadFile(filepath.Join(d.dir, "state", "audit.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(audit), `"action":"kubelet.allocate"`); n < 3 {
		t.Errorf("%d kubelet.allocate audit records, want 3 or more", n)
	}
}

func sameHolds(a, b map[string]api.Job) bool {
	if len(a) != len(b) {
		return false
	}
	for k, j := range a {
		if o, ok := b[k]; !ok || o.ID != j.ID {
			return false
		}
	}
	return true
}

func keys(m map[string]api.Job) []string {
	var out []string
	for k, j := range m {
		out = append(out, j.ID+"="+k)
	}
	sort.Strings(out)
	return out
}

// TestKubeletPodChurn starts every GPU's pod at once, round after round,
// each round's pods removed before the next: every round's pods get eight
// different GPUs, kubelet re-allocates the GPUs of ended pods at once
// (every round takes all eight, seconds after the last ended, well inside
// the release grace: their holds are superseded, not waited out), and no
// hold outlives its pod.
// It logs the figures docs/kubernetes.md quotes: pods started per minute
// (from writing the manifests to every pod running) and the plugin's
// Allocate and GetPreferredAllocation latencies.
func TestKubeletPodChurn(t *testing.T) {
	cd := startContainerd(t)
	k := startKubelet(t, cd, kubeletOptions{})
	d, _ := pluginDaemon(t, 15*time.Second)
	c := d.client()
	ctx := context.Background()
	const rounds, perRound = 4, 8
	var starting time.Duration
	for r := range rounds {
		names := make([]string, perRound)
		written := time.Now()
		for i := range names {
			names[i] = fmt.Sprintf("churn-%d-%d", r, i)
			writeStaticPod(t, k, names[i], gpuPod(names[i], h200Res, 1))
		}
		seen := map[string]string{}
		for _, n := range names {
			waitPodRunning(t, k, "default", n, 2*time.Minute)
		}
		starting += time.Since(written)
		for _, n := range names {
			ids := podDevices(t, n, h200Res)
			if len(ids) != 1 {
				t.Fatalf("round %d: pod %s holds %v", r, n, ids)
			}
			if other, dup := seen[ids[0]]; dup {
				t.Fatalf("round %d: pods %s and %s both hold %s", r, other, n, ids[0])
			}
			seen[ids[0]] = n
			if got := visibleDevices(t, n); got != ids[0] {
				t.Errorf("round %d: pod %s sees %q, holds %s", r, n, got, ids[0])
			}
		}
		if hs := holds(t, c); len(hs) != perRound {
			t.Fatalf("round %d: %d holds for %d pods: %v", r, len(hs), perRound, keys(hs))
		}
		for _, n := range names {
			removeStaticPod(t, k, n)
		}
		for _, n := range names {
			waitPodGone(t, k, "default", n, time.Minute)
		}
	}
	// Every hold ends: the last round's after the release grace.
	deadline := time.Now().Add(30 * time.Second)
	for len(holds(t, c)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("holds outlive their pods: %v", keys(holds(t, c)))
		}
		time.Sleep(100 * time.Millisecond)
	}
	js, err := c.List(ctx, api.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ended, superseded := 0, 0
	for _, j := range js {
		if j.Spec.Pod != nil && j.State == api.StateSucceeded {
			ended++
			if strings.Contains(j.Reason, "another container") {
				superseded++
			}
		}
	}
	if ended != rounds*perRound || superseded != (rounds-1)*perRound {
		t.Errorf("%d holds ended, %d of them superseded; want %d, %d (every round but the last superseded by the next)",
			ended, superseded, rounds*perRound, (rounds-1)*perRound)
	}
	n, err := c.Node(ctx)
	if err != nil || n.Kubernetes == nil {
		t.Fatalf("status: %v", err)
	}
	kst := n.Kubernetes
	t.Logf("%d pods in %d rounds of %d: %.0f pods started per minute (%v from the manifests to all running, on average a round)",
		rounds*perRound, rounds, perRound, float64(rounds*perRound)/starting.Minutes(), (starting / rounds).Round(time.Millisecond))
	t.Logf("Allocate: p50 %v p99 %v max %v over %d calls (%d refused); GetPreferredAllocation: p50 %v p99 %v max %v over %d",
		kst.Allocate.P50, kst.Allocate.P99, kst.Allocate.Max, kst.Allocate.Count, kst.Allocate.Errors,
		kst.Preferred.P50, kst.Preferred.P99, kst.Preferred.Max, kst.Preferred.Count)
}

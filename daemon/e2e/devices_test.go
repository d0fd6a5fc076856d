package e2e

import (
	"context"
	"encoding/json"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// wantMIGPlan is what `fusionctl mig plan` prints for the example layout's
// inference-split config on a fresh simulated dgxh200: stable across runs
// (GPU indices and slots, never the mock's random UUIDs).
const wantMIGPlan = `MIG config "inference-split": 10 actions, would take 42s:
   1. gpu 0: set MIG mode enabled=true
   2. gpu 1: set MIG mode enabled=true
   3. gpu 0: create 2g.35gb at slot 0
   4. gpu 0: create 1g.18gb at slot 2
   5. gpu 0: create 1g.18gb at slot 3
   6. gpu 0: create 3g.71gb at slot 4
   7. gpu 1: create 2g.35gb at slot 0
   8. gpu 1: create 1g.18gb at slot 2
   9. gpu 1: create 1g.18gb at slot 3
  10. gpu 1: create 3g.71gb at slot 4
Nothing was changed (mig apply carries it out).
`

// TestSimulatedHost runs fusiond --simulate dgxh200 and drives the device
// commands of fusionctl against it.
func TestSimulatedHost(t *testing.T) {
	dir := publicTempDir(t)
	d := newDaemon(t, dir, "")
	bad := osexec.Command(filepath.Join(binDir, "fusiond"), "--config", d.config, "--simulate", "dgxz900")
	if out, err := bad.CombinedOutput(); err == nil || !strings.Contains(string(out), "simulate") || !strings.Contains(string(out), "dgxh200") {
		t.Errorf("--simulate dgxz900: %v %s; want a refusal naming the valid hosts", err, out)
	}
	d.args = []string{"--simulate", "dgxh200"}
	d.start()
	ok := func(args ...string) string {
		t.Helper()
		r := d.ctl(nil, "", args...)
		if r.code != 0 {
			t.Fatalf("fusionctl %v: exit %d: %s%s", args, r.code, r.stdout, r.stderr)
		}
		return r.stdout
	}

	// Status: 8 simulated H200s and the 4 FPGA regions, said plainly.
	var n api.NodeStatus
	if err := json.Unmarshal([]byte(ok("status", "-o", "json")), &n); err != nil {
		t.Fatal(err)
	}
	var gpus, fpgas int
	for _, dev := range n.Devices {
		switch dev.Kind {
		case "gpu":
			gpus++
			if !strings.Contains(dev.Model, "H200") || !dev.Healthy {
				t.Errorf("GPU %+v: want a healthy H200", dev)
			}
		case "fpga":
			fpgas++
		}
	}
	if !n.Simulated || n.Capacity.GPUs != 8 || n.Capacity.FPGAs != 4 || gpus != 8 || fpgas != 4 {
		t.Errorf("status: simulated=%t capacity %+v, %d GPU and %d FPGA devices; want 8 and 4", n.Simulated, n.Capacity, gpus, fpgas)
	}
	// As root with cgroups every job is isolated, and status says so.
	if !n.Isolation.Isolated || n.Isolation.Mode == "" || n.Isolation.JobsRefused {
		t.Errorf("status isolation %+v: want isolated with a cgroup mode", n.Isolation)
	}
	status := ok("status")
	for _, want := range []string{"Isolation:   cgroups v", "SIMULATED", "GPUs:        0 of 8", "FPGAs:       0 of 4", "dfl/0000:3b:00.0/0", "Note: devices are SIMULATED (dgxh200)"} {
		if !strings.Contains(status, want) {
			t.Errorf("status lacks %q:\n%s", want, status)
		}
	}

	// Topology: the 8-GPU layout, two GPUs and a NIC per switch.
	topo := ok("topology")
	if !strings.Contains(topo, "Host sim-dgx-h200: 2 sockets, 2 NUMA nodes") || strings.Count(topo, "[GPU]") != 8 || strings.Count(topo, "[NIC]") != 4 {
		t.Errorf("topology tree:\n%s", topo)
	}
	matrix := ok("topology", "--matrix")
	if !strings.Contains(matrix, "GPU7") || !strings.Contains(matrix, "NV2") || !strings.Contains(matrix, "PIX") {
		t.Errorf("matrix:\n%s", matrix)
	}
	var m api.TopologyMatrix
	if err := json.Unmarshal([]byte(ok("topology", "--matrix", "-o", "json")), &m); err != nil || len(m.Devices) != 12 {
		t.Errorf("matrix JSON: %v, %d devices", err, len(m.Devices))
	}

	// GPU list.
	list := ok("gpu", "list")
	if rows := strings.Count(list, "NVIDIA H200"); rows != 8 || !strings.Contains(list, "SIMULATED") {
		t.Errorf("gpu list (%d H200 rows):\n%s", rows, list)
	}

	// MIG plan: stable output; nothing applied (a second plan is the same).
	layout, err := filepath.Abs(filepath.Join("..", "..", "examples", "mig-layouts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if got := ok("mig", "plan", "-f", layout, "-c", "inference-split"); got != wantMIGPlan {
			t.Errorf("mig plan printed\n%s\nwant\n%s", got, wantMIGPlan)
		}
	}
	if r := d.ctl(nil, "", "mig", "plan", "-f", layout, "-c", "nope"); r.code == 0 || !strings.Contains(r.stderr, "inference-split") {
		t.Errorf("plan of an unknown config: %d %s", r.code, r.stderr)
	}

	// FPGA: a sample bitstream added and programmed; a user cannot.
	sample := filepath.Join(dir, "state", "sim", "fpga-samples", "dma.gbs")
	nobodyCred := &syscall.Credential{Uid: nobody, Gid: nobody}
	if r := d.ctl(nobodyCred, "", "fpga", "bitstream", "add", "/proc/self/exe"); r.code == 0 || !strings.Contains(r.stderr, "admin") {
		t.Errorf("nobody could upload a bitstream: %d %s", r.code, r.stderr)
	}
	if out := ok("fpga", "bitstream", "add", sample); !strings.Contains(out, "added dma: gbs") {
		t.Errorf("bitstream add: %s", out)
	}
	if r := d.ctl(nobodyCred, "", "fpga", "program", "dfl/0000:af:00.0/0", "dma"); r.code == 0 || !strings.Contains(r.stderr, "admin") {
		t.Errorf("nobody could program a region: %d %s", r.code, r.stderr)
	}
	if out := ok("fpga", "program", "dfl/0000:af:00.0/0", "dma"); !strings.Contains(out, "now holds dma") {
		t.Errorf("program: %s", out)
	}
	regions := ok("fpga", "list")
	if !strings.Contains(regions, "dfl/0000:af:00.0/0") || !strings.Contains(regions, "dma") {
		t.Errorf("fpga list:\n%s", regions)
	}
	if out := ok("fpga", "bitstream", "list"); !strings.Contains(out, "dma_afu") {
		t.Errorf("bitstream list:\n%s", out)
	}
}

// TestSimulatedMixedHost runs fusiond --simulate mixed (one H100 and two
// L4s, through the production NVML and topology paths) and places by
// per-device model: an L4 job on an L4, an H100 job on the H100, a job
// that fits either where its class's profile says (training on the H100
// for compute; an inference share on an L4 for performance per watt),
// with both models in `fusionctl show`'s explanation; a second H100 job
// waits rather than taking an L4, and three GPUs of one model are refused
// as something this host could never run.
func TestSimulatedMixedHost(t *testing.T) {
	dir := publicTempDir(t)
	d := newDaemon(t, dir, "")
	d.args = []string{"--simulate", "mixed"}
	d.start()
	c := d.client()
	ctx := context.Background()
	gl, err := c.GPUs(ctx)
	if err != nil || len(gl.GPUs) != 3 {
		t.Fatalf("gpus: %v %d", err, len(gl.GPUs))
	}
	model := map[string]string{}
	for _, g := range gl.GPUs {
		model[g.UUID] = g.Model
	}
	if gl.GPUs[0].Model != "NVIDIA H100 80GB HBM3" || gl.GPUs[1].Model != "NVIDIA L4" || gl.GPUs[2].Model != "NVIDIA L4" {
		t.Fatalf("models %v", model)
	}
	if topo := d.ctl(nil, "", "topology"); topo.code != 0 || strings.Count(topo.stdout, "[GPU]") != 3 {
		t.Errorf("topology shows %d GPUs, want 3:\n%s", strings.Count(topo.stdout, "[GPU]"), topo.stdout)
	}
	submit := func(class api.Class, g api.GPURequest) api.Job {
		t.Helper()
		j, err := c.Submit(ctx, api.JobSpec{Class: class, Command: []string{"sleep", "600"},
			Resources: api.Resources{CPU: 100, Memory: 16 << 20, GPU: &g}})
		if err != nil {
			t.Fatalf("submit %s %+v: %v", class, g, err)
		}
		return j
	}
	gpuOf := func(j api.Job) string {
		t.Helper()
		j = waitFor(t, c, j.ID, api.StateRunning)
		switch a := j.Allocation; {
		case a == nil:
		case len(a.GPUs) == 1:
			return model[a.GPUs[0]]
		case a.GPUShare != nil:
			return model[a.GPUShare.GPU]
		}
		t.Fatalf("job %s allocation %+v", j.ID, j.Allocation)
		return ""
	}
	share := submit(api.ClassInference, api.GPURequest{Share: 250})
	if m := gpuOf(share); m != "NVIDIA L4" {
		t.Errorf("an inference share went to %s, want an L4 (performance per watt)", m)
	}
	train := submit(api.ClassTraining, api.GPURequest{Count: 1})
	if m := gpuOf(train); m != "NVIDIA H100 80GB HBM3" {
		t.Errorf("a training GPU went to %s, want the H100 (compute)", m)
	}
	show := d.ctl(nil, "", "show", train.ID)
	if show.code != 0 || !strings.Contains(show.stdout, "NVIDIA H100") || !strings.Contains(show.stdout, "NVIDIA L4") || !strings.Contains(show.stdout, "compute=") {
		t.Errorf("show %s does not explain the choice between the models:\n%s%s", train.ID, show.stdout, show.stderr)
	}
	l4 := submit(api.ClassBatch, api.GPURequest{Count: 1, Model: "L4"})
	if m := gpuOf(l4); m != "NVIDIA L4" {
		t.Errorf("an L4 job went to %s", m)
	}
	// The H100 is taken: a second H100 job waits, never on the free
	// share left on an L4.
	h100 := submit(api.ClassBatch, api.GPURequest{Count: 1, Model: "h100"})
	time.Sleep(time.Second)
	if j, err := c.Get(ctx, h100.ID); err != nil || j.State != api.StatePending || j.Allocation != nil {
		t.Errorf("a second H100 job: %v state %s allocation %+v, want pending", err, j.State, j.Allocation)
	}
	if _, err := c.Cancel(ctx, train.ID); err != nil {
		t.Fatal(err)
	}
	if m := gpuOf(h100); m != "NVIDIA H100 80GB HBM3" {
		t.Errorf("the waiting H100 job went to %s once the H100 was free", m)
	}
	// Three GPUs of one model: this host can never run it.
	if _, err := c.Submit(ctx, api.JobSpec{Command: []string{"true"}, Resources: api.Resources{CPU: 100, Memory: 16 << 20, GPU: &api.GPURequest{Count: 3}}}); err == nil ||
		!strings.Contains(err.Error(), "resources.gpu") {
		t.Errorf("three GPUs of one model admitted: %v", err)
	}
}

package daemon

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/hardware"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
	fpgasim "github.com/fusiond/fusiond/devices/fpga/simhost"
)

// TestInventoryFollowsDevices runs the simulated DGX H200 with the placer
// connected to its drivers' updates: a MIG layout applied through the API
// makes its instance placeable without a restart, and an FPGA region
// programmed through the API holds, for the placer, the new bitstream.
func TestInventoryFollowsDevices(t *testing.T) {
	ctx := context.Background()
	h, err := hardware.Open(ctx, hardware.Config{StateDir: t.TempDir(), Simulate: "dgxh200"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	inventory := func() hostplacer.Hardware {
		return hardwareOf(ctx, h, api.NodeResources{CPU: 64000, Memory: 256 << 30}, slog.New(slog.DiscardHandler))
	}
	p := hostplacer.New(inventory(), placementOptions(h))
	defer connectDevices(h, p, &recordingPublisher{}, inventory)()
	backend := hardware.NewBackend(h, nil)

	migJob := &api.Job{ID: "mig", Tier: api.TierBurstable, Spec: api.JobSpec{Command: []string{"x"},
		Resources: api.Resources{CPU: 100, Memory: 1 << 20, GPU: &api.GPURequest{MIG: "1g.18gb"}}}}
	if err := p.Admit(migJob.Spec); err == nil {
		t.Fatal("a MIG job admitted before any GPU is in MIG mode")
	}
	gpu0 := h.GPUs().GPUs()[0].UUID
	layout := "version: v1\nmig-configs:\n  one:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices: {\"1g.18gb\": 1}\n"
	if _, err := backend.ApplyMIG(ctx, api.MIGRequest{Layout: layout, Config: "one"}); err != nil {
		t.Fatalf("mig apply: %v", err)
	}
	g := p.Hardware().GPUs[0]
	if g.ID != gpu0 || g.MIG == nil || len(g.MIG.Instances) != 1 || g.MIG.Instances[0].ID == "" {
		t.Fatalf("placer's GPU 0 after mig apply: %+v (MIG %+v)", g, g.MIG)
	}
	if err := p.Admit(migJob.Spec); err != nil {
		t.Fatalf("MIG job refused after mig apply: %v", err)
	}
	allocs, why, ok := p.Place([]*api.Job{migJob})
	if !ok {
		t.Fatalf("MIG job not placed after mig apply: %s", why)
	}
	if m := allocs[0].MIG; m == nil || m.GPU != gpu0 || m.Instance != g.MIG.Instances[0].ID {
		t.Fatalf("MIG allocation %+v, want the applied instance %s", allocs[0].MIG, g.MIG.Instances[0].ID)
	}

	f, err := os.Open(filepath.Join(h.SampleBitstreams(), "matmul.xclbin"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bs, err := h.Library().Add(f, "matmul", "matmul.xclbin")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := backend.ProgramFPGA(ctx, fpgasim.XRT0, api.FPGAProgramRequest{Bitstream: "matmul"}); err != nil {
		t.Fatalf("fpga program: %v", err)
	}
	var seen string
	for _, r := range p.Hardware().FPGAs {
		if r.ID == fpgasim.XRT0 {
			seen = r.Bitstream
		}
	}
	if seen != bs.ID {
		t.Fatalf("placer sees region %s holding %q, want %q", fpgasim.XRT0, seen, bs.ID)
	}
	fpgaJob := &api.Job{ID: "fpga", Tier: api.TierBurstable, Spec: api.JobSpec{Command: []string{"x"},
		Resources: api.Resources{CPU: 100, Memory: 1 << 20, FPGA: &api.FPGARequest{Bitstream: "matmul"}}}}
	allocs, why, ok = p.Place([]*api.Job{fpgaJob})
	if !ok {
		t.Fatalf("FPGA job not placed: %s", why)
	}
	if a := allocs[0].FPGA; a == nil || a.Region != fpgasim.XRT0 || a.Program {
		t.Errorf("FPGA allocation %+v, want %s without reprogramming", a, fpgasim.XRT0)
	}
	// The MIG job's reservation survived both inventory updates.
	if got := p.Allocated(); got.GPUs != 1 || got.FPGAs != 1 {
		t.Errorf("allocated %+v, want the MIG job's GPU and the FPGA job's region", got)
	}
}

// TestInventorySyncReruns: an update asked for while one runs (here from
// inside it, as a driver publishing while its inventory is read) does not
// deadlock or run concurrently, and makes the running one go again.
func TestInventorySyncReruns(t *testing.T) {
	var s inventorySync
	runs := 0
	var update func()
	update = func() {
		runs++
		if runs == 1 {
			s.run(update)
		}
	}
	s.run(update)
	if runs != 2 {
		t.Fatalf("%d runs, want 2", runs)
	}
}

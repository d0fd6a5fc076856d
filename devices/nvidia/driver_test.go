package nvidia

import (
	"context"
	"sync"
	"testing"

	"github.com/fusiond/fusiond/devices"
)

// TestDriverPrepareCreatesMIG drives the GPU driver through the
// devices.Driver interface: Prepare creates the job's MIG instance on
// demand, records it in the allocation, grants it and tells subscribers;
// the next inventory lists the instance.
func TestDriverPrepareCreatesMIG(t *testing.T) {
	ctx := context.Background()
	m, _ := openSim(t, "dgxh200")
	g := m.GPUs()[0]
	if err := m.Apply(ctx, []Action{{Kind: SetMIGMode, GPU: 0, GPUUUID: g.UUID, Enable: true}}, nil); err != nil {
		t.Fatal(err)
	}
	var d devices.Driver = NewDriver(m, nil, DriverOptions{})
	var mu sync.Mutex
	var changed []string
	cancel := d.Subscribe(func(u devices.Update) {
		if u.Kind == devices.DeviceChanged {
			mu.Lock()
			changed = append(changed, u.Device)
			mu.Unlock()
		}
	})
	defer cancel()
	a := &devices.Allocation{MIG: &devices.MIGAllocation{GPU: g.UUID, Profile: "1g.18gb", Start: 0}}
	grant, err := d.Prepare(ctx, "job", a)
	if err != nil {
		t.Fatal(err)
	}
	if a.MIG.Instance == "" || grant.Env["NVIDIA_VISIBLE_DEVICES"] != a.MIG.Instance {
		t.Fatalf("prepared %+v, grant %+v", a.MIG, grant)
	}
	mu.Lock()
	if len(changed) == 0 || changed[0] != g.UUID {
		t.Errorf("device changes %v, want one for %s", changed, g.UUID)
	}
	mu.Unlock()
	inv, err := d.Inventory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dev := inv.Devices[0]
	if dev.ID != g.UUID || dev.Kind != devices.GPU || dev.MIG == nil || len(dev.MIG.Instances) != 1 ||
		dev.MIG.Instances[0].ID != a.MIG.Instance || dev.MIG.Instances[0].Start != a.MIG.Start {
		t.Fatalf("inventory GPU 0 %+v (MIG %+v), want the instance %s", dev, dev.MIG, a.MIG.Instance)
	}
	if dev.MIG.Profiles["1g.18gb"] == 0 || dev.ReconfigMs == 0 || len(inv.Devices) != 8 || len(inv.Links) == 0 {
		t.Errorf("inventory %d GPUs, %d links, GPU 0 profiles %v", len(inv.Devices), len(inv.Links), dev.MIG.Profiles)
	}
	if err := d.Release(ctx, "job"); err != nil {
		t.Errorf("release: %v", err)
	}
	if err := d.Release(ctx, "never-prepared"); err != nil {
		t.Errorf("release of an unknown job: %v", err)
	}
	// The held GPU's instances are never touched: the whole GPU held by
	// another job makes on-demand creation fail.
	b := &devices.Allocation{MIG: &devices.MIGAllocation{GPU: g.UUID, Profile: "3g.71gb", Start: 0}, Held: map[string]bool{a.MIG.Instance: true}}
	if _, err := d.Prepare(ctx, "other", b); err == nil && b.MIG.Start == 0 {
		t.Errorf("3g instance created over the held 1g instance at slot 0: %+v", b.MIG)
	}
}

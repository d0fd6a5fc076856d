package nvidia

import (
	"context"
	"errors"
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

// TestDriverCreatesMIGOverIdleInstances: the engine may place a new
// instance on slots that idle instances hold. The driver destroys exactly
// those and creates at the engine's slot (PlanOnDemand alone would pick
// the cheapest start, here slot 0); when the engine's slot holds a busy
// instance, it falls back to another start and reports it.
func TestDriverCreatesMIGOverIdleInstances(t *testing.T) {
	ctx := context.Background()
	m, _ := openSim(t, "dgxh200")
	g := m.GPUs()[0]
	setup := []Action{{Kind: SetMIGMode, GPU: 0, GPUUUID: g.UUID, Enable: true}}
	for _, s := range []int{1, 5} {
		setup = append(setup, Action{Kind: CreateInstance, GPU: 0, GPUUUID: g.UUID, Profile: "1g.18gb", Start: s})
	}
	if err := m.Apply(ctx, setup, nil); err != nil {
		t.Fatal(err)
	}
	at := func() map[int]string {
		out := map[int]string{}
		for _, in := range mustState(t, m, nil).GPUs[0].Instances {
			out[in.Start] = in.UUID
		}
		return out
	}
	before := at()
	d := NewDriver(m, nil, DriverOptions{})
	a := &devices.Allocation{MIG: &devices.MIGAllocation{GPU: g.UUID, Profile: "3g.71gb", Start: 4}}
	if _, err := d.Prepare(ctx, "big", a); err != nil {
		t.Fatal(err)
	}
	after := at()
	if a.MIG.Start != 4 || after[4] != a.MIG.Instance || after[1] != before[1] || after[5] != "" {
		t.Fatalf("prepared %+v; instances by start %v (before %v): want the 3g at 4, the 1g at 1 kept, the one at 5 destroyed", a.MIG, after, before)
	}
	if err := d.Release(ctx, "big"); err != nil {
		t.Fatal(err)
	}
	// The engine's slot 4 now holds an instance in use (held by another
	// job): the driver creates elsewhere, destroying only idle instances,
	// and reports where.
	b := &devices.Allocation{MIG: &devices.MIGAllocation{GPU: g.UUID, Profile: "3g.71gb", Start: 4}, Held: map[string]bool{after[4]: true}}
	if _, err := d.Prepare(ctx, "other", b); err != nil {
		t.Fatal(err)
	}
	last := at()
	if b.MIG.Start != 0 || last[0] != b.MIG.Instance || last[4] != after[4] || last[1] != "" {
		t.Fatalf("prepared %+v; instances by start %v: want a 3g at 0 over the idle 1g, the held 3g at 4 kept", b.MIG, last)
	}
}

// PlanOnDemandAt refuses what it cannot do at exactly that slot.
func TestPlanOnDemandAtRefuses(t *testing.T) {
	ctx := context.Background()
	m, _ := openSim(t, "dgxh200")
	g := m.GPUs()[0]
	if err := m.Apply(ctx, []Action{{Kind: SetMIGMode, GPU: 0, GPUUUID: g.UUID, Enable: true},
		{Kind: CreateInstance, GPU: 0, GPUUUID: g.UUID, Profile: "1g.18gb", Start: 2}}, nil); err != nil {
		t.Fatal(err)
	}
	st := mustState(t, m, nil)
	busy := Busy{st.GPUs[0].Instances[0].UUID: true}
	for _, tc := range []struct {
		name, gpu, profile string
		start              int
		busy               Busy
	}{
		{"unknown GPU", "GPU-none", "3g.71gb", 0, nil},
		{"not in MIG mode", m.GPUs()[1].UUID, "3g.71gb", 0, nil},
		{"unknown profile", g.UUID, "9g.1gb", 0, nil},
		{"start NVIDIA does not allow", g.UUID, "3g.71gb", 2, nil},
		{"busy instance on the slots", g.UUID, "3g.71gb", 0, busy},
	} {
		if c, err := PlanOnDemandAt(mustState(t, m, tc.busy), tc.gpu, tc.profile, tc.start); !errors.Is(err, ErrNoCapacity) {
			t.Errorf("%s: %+v, %v; want ErrNoCapacity", tc.name, c, err)
		}
	}
	c, err := PlanOnDemandAt(st, g.UUID, "3g.71gb", 0)
	if err != nil || len(c.Actions) != 2 || c.Actions[0].Kind != DestroyInstance || c.Actions[0].Start != 2 || c.Cost != CostDestroy+CostCreate {
		t.Fatalf("idle instance at 2: %+v, %v; want it destroyed, then the create", c, err)
	}
}

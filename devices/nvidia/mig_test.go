package nvidia

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// names of each simulated host's profiles by role.
var hostProfiles = map[string]struct{ one, oneDouble, two, three, four, seven string }{
	"dgxa100": {"1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"},
	"dgxh100": {"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
	"dgxh200": {"1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"},
	"dgxb200": {"1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"},
}

func layoutFor(host string) string {
	p := hostProfiles[host]
	return fmt.Sprintf(`version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g:
    - devices: all
      mig-enabled: true
      mig-devices:
        %q: 7
  mixed:
    - devices: [0, 1, 2, 3]
      mig-enabled: true
      mig-devices:
        %q: 1
        %q: 1
        %q: 1
    - devices: [4, 5, 6, 7]
      mig-enabled: true
      mig-devices:
        %q: 2
  too-many:
    - devices: all
      mig-enabled: true
      mig-devices:
        %q: 8
  overfull:
    - devices: [0]
      mig-enabled: true
      mig-devices:
        %q: 1
        %q: 1
`, p.one, p.four, p.two, p.one, p.three, p.one, p.four, p.seven)
}

func planApply(t *testing.T, m *Manager, lf *LayoutFile, name string, busy Busy) []Action {
	t.Helper()
	tgt, err := lf.Resolve(name, m.GPUs())
	if err != nil {
		t.Fatal(err)
	}
	acts, err := Plan(mustState(t, m, busy), tgt)
	if err != nil {
		t.Fatalf("plan %s: %v", name, err)
	}
	if err := m.Apply(context.Background(), acts, busy); err != nil {
		t.Fatalf("apply %s: %v", name, err)
	}
	return acts
}

func countProfiles(g GPUState) map[string]int {
	out := map[string]int{}
	for _, in := range g.Instances {
		out[in.Profile]++
	}
	return out
}

// dgxHosts are the simulated 8-GPU DGX hosts, every GPU MIG-capable
// (the mixed host's L4s are not; TestSimulatedMixedHost covers it).
func dgxHosts() []string {
	var out []string
	for _, h := range SimulatedHosts() {
		if h != "mixed" {
			out = append(out, h)
		}
	}
	return out
}

func TestPlanApplyAllMocks(t *testing.T) {
	for _, host := range dgxHosts() {
		t.Run(host, func(t *testing.T) {
			p := hostProfiles[host]
			m, _ := openSim(t, host)
			lf, err := ParseLayout([]byte(layoutFor(host)))
			if err != nil {
				t.Fatal(err)
			}
			acts := planApply(t, m, lf, "all-1g", nil)
			if len(acts) != 8*(1+7) {
				t.Fatalf("%d actions, want 64: %v", len(acts), acts)
			}
			if acts[0].Kind != SetMIGMode || acts[len(acts)-1].Kind != CreateInstance {
				t.Fatalf("order: first %v last %v", acts[0], acts[len(acts)-1])
			}
			st := mustState(t, m, nil)
			for _, g := range st.GPUs {
				if !g.MIGEnabled || countProfiles(g)[p.one] != 7 {
					t.Fatalf("gpu %d after all-1g: %+v", g.Index, g)
				}
				for _, in := range g.Instances {
					if !strings.HasPrefix(in.UUID, "MIG-") {
						t.Fatalf("instance without MIG UUID: %+v", in)
					}
				}
			}
			// Idempotent: applying the same plan again changes nothing, and
			// planning again yields no actions.
			if err := m.Apply(context.Background(), acts, nil); err != nil {
				t.Fatal(err)
			}
			if again := mustState(t, m, nil); countProfiles(again.GPUs[3])[p.one] != 7 {
				t.Fatalf("re-apply changed state: %+v", again.GPUs[3])
			}
			tgt, _ := lf.Resolve("all-1g", m.GPUs())
			if more, err := Plan(mustState(t, m, nil), tgt); err != nil || len(more) != 0 {
				t.Fatalf("second plan: %v %v", more, err)
			}

			// Switch to mixed; a busy instance on GPU 0 that the target keeps
			// (a 1g) must survive untouched.
			busyUUID := st.GPUs[0].Instances[6].UUID
			busyStart := st.GPUs[0].Instances[6].Start
			busy := Busy{busyUUID: true}
			planApply(t, m, lf, "mixed", busy)
			st2 := mustState(t, m, busy)
			want0 := map[string]int{p.one: 1, p.four: 1, p.two: 1}
			for k, v := range want0 {
				if countProfiles(st2.GPUs[0])[k] != v {
					t.Fatalf("gpu 0 after mixed: %v", countProfiles(st2.GPUs[0]))
				}
			}
			found := false
			for _, in := range st2.GPUs[0].Instances {
				if in.UUID == busyUUID && in.Start == busyStart && in.Busy {
					found = true
				}
			}
			if !found {
				t.Fatalf("busy instance %s was touched: %+v", busyUUID, st2.GPUs[0].Instances)
			}
			if countProfiles(st2.GPUs[5])[p.three] != 2 {
				t.Fatalf("gpu 5 after mixed: %v", countProfiles(st2.GPUs[5]))
			}

			// Disabling MIG everywhere must refuse while the instance is busy.
			tgt, _ = lf.Resolve("all-disabled", m.GPUs())
			if _, err := Plan(st2, tgt); !errors.Is(err, ErrBusy) {
				t.Fatalf("disable with busy instance: %v, want ErrBusy", err)
			}
			planApply(t, m, lf, "all-disabled", nil)
			for _, g := range mustState(t, m, nil).GPUs {
				if g.MIGEnabled || len(g.Instances) != 0 {
					t.Fatalf("gpu %d still MIG: %+v", g.Index, g)
				}
			}
		})
	}
}

func TestCapacityLimits(t *testing.T) {
	for _, host := range dgxHosts() {
		t.Run(host, func(t *testing.T) {
			m, _ := openSim(t, host)
			lf, err := ParseLayout([]byte(layoutFor(host)))
			if err != nil {
				t.Fatal(err)
			}
			st := mustState(t, m, nil)
			for _, name := range []string{"too-many", "overfull"} {
				tgt, err := lf.Resolve(name, m.GPUs())
				if err != nil {
					t.Fatal(err)
				}
				if acts, err := Plan(st, tgt); !errors.Is(err, ErrNoCapacity) {
					t.Errorf("%s: %v %v, want ErrNoCapacity", name, acts, err)
				}
			}
			p := hostProfiles[host]
			// Valid full combinations per NVIDIA's placement rules.
			for _, counts := range []map[string]int{
				{p.four: 1, p.three: 1},
				{p.three: 2},
				{p.two: 3, p.one: 1},
				{p.oneDouble: 4},
				{p.four: 1, p.two: 1, p.one: 1},
				{p.seven: 1},
			} {
				acts, err := Plan(st, Target{0: {MIGEnabled: true, Counts: counts}})
				if err != nil {
					t.Errorf("%v: %v", counts, err)
				}
				if PlanCost(acts) <= 0 {
					t.Errorf("%v: zero cost", counts)
				}
			}
			// Invalid: too many compute slices, or overlapping slots.
			for _, counts := range []map[string]int{
				{p.four: 1, p.three: 1, p.one: 1},
				{p.three: 2, p.one: 2},
				{p.oneDouble: 4, p.one: 1},
				{p.two: 3, p.one: 2},
			} {
				if _, err := Plan(st, Target{0: {MIGEnabled: true, Counts: counts}}); !errors.Is(err, ErrNoCapacity) {
					t.Errorf("%v: %v, want ErrNoCapacity", counts, err)
				}
			}
			if _, err := Plan(st, Target{0: {MIGEnabled: true, Counts: map[string]int{"5g.1gb": 1}}}); !errors.Is(err, ErrUnknownProfile) {
				t.Errorf("unknown profile: %v", err)
			}
		})
	}
}

// The applier enforces capacity itself, even given a hand-made plan that
// the mock would accept.
func TestApplyRefusesOverlap(t *testing.T) {
	m, _ := openSim(t, "dgxh200")
	g := m.GPUs()[0]
	acts := []Action{
		{Kind: SetMIGMode, GPU: 0, GPUUUID: g.UUID, Enable: true},
		{Kind: CreateInstance, GPU: 0, GPUUUID: g.UUID, Profile: "3g.71gb", Start: 0},
		{Kind: CreateInstance, GPU: 0, GPUUUID: g.UUID, Profile: "2g.35gb", Start: 2},
	}
	if err := m.Apply(context.Background(), acts, nil); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("overlap: %v, want ErrNoCapacity", err)
	}
	bad := []Action{{Kind: CreateInstance, GPU: 0, GPUUUID: g.UUID, Profile: "1g.18gb", Start: 7}}
	if err := m.Apply(context.Background(), bad, nil); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("slot 7: %v, want ErrNoCapacity", err)
	}
}

func TestBusyGPURefusesMIGModeChange(t *testing.T) {
	m, _ := openSim(t, "dgxa100")
	g := m.GPUs()[2]
	busy := Busy{g.UUID: true}
	tgt := Target{2: {MIGEnabled: true, Counts: map[string]int{"7g.40gb": 1}}}
	if _, err := Plan(mustState(t, m, busy), tgt); !errors.Is(err, ErrBusy) {
		t.Fatalf("plan on busy GPU: %v", err)
	}
	acts, err := Plan(mustState(t, m, nil), tgt)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Apply(context.Background(), acts, busy); !errors.Is(err, ErrBusy) {
		t.Fatalf("apply on busy GPU: %v", err)
	}
}

func TestOnDemandRepartition(t *testing.T) {
	for _, host := range dgxHosts() {
		t.Run(host, func(t *testing.T) {
			p := hostProfiles[host]
			m, _ := openSim(t, host)
			// GPU 0: three 2g instances (slots 0-5) and one 1g (slot 6); two
			// 2g are running work.
			tgt := Target{0: {MIGEnabled: true, Counts: map[string]int{p.two: 3, p.one: 1}}}
			acts, err := Plan(mustState(t, m, nil), tgt)
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Apply(context.Background(), acts, nil); err != nil {
				t.Fatal(err)
			}
			st := mustState(t, m, nil)
			busy := Busy{}
			var running []Instance
			for _, in := range st.GPUs[0].Instances {
				if in.Profile == p.two && in.Start < 4 {
					busy[in.UUID] = true
					running = append(running, in)
				}
			}
			if len(running) != 2 {
				t.Fatalf("setup: %+v", st.GPUs[0].Instances)
			}
			st = mustState(t, m, busy)
			// A 3g needs slots 4-7: the idle 2g at 4 and 1g at 6 go; the
			// running ones stay.
			cands, err := PlanOnDemand(st, p.three)
			if err != nil {
				t.Fatal(err)
			}
			c := cands[0]
			if c.GPU != 0 || len(c.Actions) != 3 || c.Cost != 2*CostDestroy+CostCreate {
				t.Fatalf("candidate %+v", c)
			}
			for _, a := range c.Actions {
				for _, r := range running {
					if a.Kind == DestroyInstance && a.GIID == r.GIID {
						t.Fatalf("plan destroys running instance %+v", r)
					}
				}
			}
			created, err := m.ApplyOnDemand(context.Background(), c, busy)
			if err != nil {
				t.Fatal(err)
			}
			if created.Profile != p.three || created.Start != 4 || !strings.HasPrefix(created.UUID, "MIG-") {
				t.Fatalf("created %+v", created)
			}
			after := mustState(t, m, busy)
			for _, r := range running {
				ok := false
				for _, in := range after.GPUs[0].Instances {
					ok = ok || (in.UUID == r.UUID && in.Start == r.Start && in.GIID == r.GIID)
				}
				if !ok {
					t.Fatalf("running instance %+v gone: %+v", r, after.GPUs[0].Instances)
				}
			}
			if countProfiles(after.GPUs[0])[p.three] != 1 {
				t.Fatalf("no %s after on-demand: %v", p.three, countProfiles(after.GPUs[0]))
			}
			// With every slot running, no candidate on GPU 0.
			all := Busy{}
			for _, in := range after.GPUs[0].Instances {
				all[in.UUID] = true
			}
			full := mustState(t, m, all)
			full.GPUs = full.GPUs[:1]
			if _, err := PlanOnDemand(full, p.one); !errors.Is(err, ErrNoCapacity) {
				t.Fatalf("full GPU: %v", err)
			}
			// An unhealthy GPU offers nothing on demand.
			m.MarkUnhealthy(st.GPUs[0].UUID, st.GPUs[0].UUID, 79, "Xid 79")
			sick := mustState(t, m, nil)
			sick.GPUs = sick.GPUs[:1]
			if !sick.GPUs[0].Unhealthy {
				t.Fatal("state does not carry health")
			}
			if _, err := PlanOnDemand(sick, p.one); !errors.Is(err, ErrNoCapacity) {
				t.Fatalf("unhealthy GPU: %v", err)
			}
			// A free-slot candidate costs only a create.
			empty := State{GPUs: []GPUState{{Index: 1, UUID: "x", Profiles: st.GPUs[1].Profiles, MIGEnabled: true}}}
			if cs, err := PlanOnDemand(empty, p.one); err != nil || cs[0].Cost != CostCreate {
				t.Fatalf("empty GPU: %+v %v", cs, err)
			}
		})
	}
}

func TestParseLayoutErrors(t *testing.T) {
	cases := map[string]string{
		"version":        "version: v2\nmig-configs: {a: [{devices: all, mig-enabled: false}]}",
		"mig-devics":     "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, mig-devics: {1g.10gb: 1}}]}",
		"devices":        "version: v1\nmig-configs: {a: [{devices: some, mig-enabled: true}]}",
		"1g.10g":         "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, mig-devices: {1g.10g: 1}}]}",
		"count":          "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, mig-devices: {1g.10gb: -1}}]}",
		"mig-configs":    "version: v1\n",
		"a[0].devices":   "version: v1\nmig-configs: {a: [{mig-enabled: true}]}",
		"mig-enabled is": "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, mig-devices: {1g.10gb: 1}}]}",
	}
	for field, doc := range cases {
		_, err := ParseLayout([]byte(doc))
		if !errors.Is(err, ErrLayout) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: error %v does not name the field", field, err)
		}
	}
	lf, err := ParseLayout([]byte("version: v1\nmig-configs:\n  a:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices: {\"1g.10gb\": 7}\n    - devices: [0]\n      mig-enabled: false\n"))
	if err != nil {
		t.Fatal(err)
	}
	gpus := []GPU{{Index: 0}, {Index: 1}}
	if _, err := lf.Resolve("a", gpus); err == nil || !strings.Contains(err.Error(), "already selected") {
		t.Errorf("double selection: %v", err)
	}
	if _, err := lf.Resolve("b", gpus); err == nil {
		t.Error("missing config resolved")
	}
}

// Plans are minimal: instances that the target keeps are not recreated.
func TestPlanMinimal(t *testing.T) {
	for _, host := range dgxHosts() {
		t.Run(host, func(t *testing.T) {
			p := hostProfiles[host]
			m, _ := openSim(t, host)
			first, err := Plan(mustState(t, m, nil), Target{0: {MIGEnabled: true, Counts: map[string]int{p.three: 2}}})
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Apply(context.Background(), first, nil); err != nil {
				t.Fatal(err)
			}
			st := mustState(t, m, nil)
			acts, err := Plan(st, Target{0: {MIGEnabled: true, Counts: map[string]int{p.three: 1, p.one: 3}}})
			if err != nil {
				t.Fatal(err)
			}
			if len(acts) != 4 || acts[0].Kind != DestroyInstance || acts[0].Start != 4 {
				t.Fatalf("plan %v", acts)
			}
			for _, a := range acts[1:] {
				if a.Kind != CreateInstance || a.Profile != p.one || a.Start < 4 {
					t.Fatalf("plan %v", acts)
				}
			}
			// Destroying a busy instance through a hand-made plan is refused.
			busy := Busy{st.GPUs[0].Instances[1].UUID: true}
			if err := m.Apply(context.Background(), acts[:1], busy); !errors.Is(err, ErrBusy) {
				t.Fatalf("destroy busy: %v", err)
			}
			if n := len(mustState(t, m, nil).GPUs[0].Instances); n != 2 {
				t.Fatalf("%d instances after refused destroy", n)
			}
		})
	}
}

// A driver that defers the MIG mode change to a reset stops the plan with
// ErrMIGPending instead of creating instances on a non-MIG GPU.
func TestApplyMIGPending(t *testing.T) {
	m, h := openSim(t, "dgxa100")
	d := h.devs[1].Device
	d.SetMigModeFunc = func(int) (nvml.Return, nvml.Return) { return nvml.SUCCESS, nvml.SUCCESS } // pending only
	acts, err := Plan(mustState(t, m, nil), Target{1: {MIGEnabled: true, Counts: map[string]int{"7g.40gb": 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Apply(context.Background(), acts, nil); !errors.Is(err, ErrMIGPending) {
		t.Fatalf("apply: %v, want ErrMIGPending", err)
	}
	if n := len(d.GpuInstances); n != 0 {
		t.Fatalf("%d instances created on a non-MIG GPU", n)
	}
}

package cgroups

import (
	"errors"
	"slices"
	"testing"

	"github.com/fusiond/fusiond/devices"
)

const gib = int64(1) << 30

func TestPlanTiers(t *testing.T) {
	gpu := devices.DeviceNode{Path: "/dev/nvidia0", Type: devices.CharDevice, Major: 195, Minor: 0, Access: "wr"}
	g, err := Plan(Placement{Tier: Guaranteed, CPURequestMilli: 2000, ExclusiveCPUs: []int{3, 2}, MemNodes: []int{1}, MemoryRequest: 4 * gib, Devices: []devices.DeviceNode{gpu}})
	if err != nil {
		t.Fatal(err)
	}
	if g.Cpus != "2-3" || g.Mems != "1" || g.CPUWeight != MaxWeight || g.CPUQuota != 0 || g.MemoryMax != 4*gib || g.MemoryLow != 4*gib || g.PidsMax != DefaultPidsLimit {
		t.Errorf("guaranteed limits = %+v", g)
	}
	if last := g.Devices[len(g.Devices)-1]; last.Major != 195 || last.Minor != 0 || last.Type != 'c' || last.Access != "rw" {
		t.Errorf("granted device rule = %+v", last)
	}

	b, err := Plan(Placement{Tier: Burstable, CPURequestMilli: 500, CPULimitMilli: 1500, SharedCPUs: []int{0, 1, 4}, MemoryRequest: gib, MemoryLimit: 2 * gib, PidsLimit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if b.Cpus != "0-1,4" || b.CPUQuota != 150_000 || b.CPUPeriod != 100_000 || b.MemoryLow != gib || b.MemoryMax != 2*gib || b.PidsMax != 100 {
		t.Errorf("burstable limits = %+v", b)
	}
	if b.MemoryHigh <= gib || b.MemoryHigh >= 2*gib || b.MemoryHigh%4096 != 0 {
		t.Errorf("burstable memory.high %d not a page-aligned value between request and limit", b.MemoryHigh)
	}
	if b.CPUWeight <= MinWeight || b.CPUWeight >= MaxWeight {
		t.Errorf("burstable weight %d not between tiers", b.CPUWeight)
	}
	b2, _ := Plan(Placement{Tier: Burstable, CPURequestMilli: 4000, SharedCPUs: []int{0}})
	if b2.CPUWeight <= b.CPUWeight {
		t.Errorf("weight not increasing with request: 500m→%d, 4000m→%d", b.CPUWeight, b2.CPUWeight)
	}

	e, err := Plan(Placement{Tier: BestEffort, CPULimitMilli: 200, SharedCPUs: []int{0, 1}, MemoryLimit: gib})
	if err != nil {
		t.Fatal(err)
	}
	if e.CPUWeight != MinWeight || e.CPUQuota != 20_000 || e.MemoryMax != gib || e.MemoryLow != 0 {
		t.Errorf("besteffort limits = %+v", e)
	}
	if len(e.Devices) != len(DefaultDevices()) {
		t.Errorf("besteffort devices = %v, want only defaults", e.Devices)
	}
}

func TestPlanRejects(t *testing.T) {
	for name, p := range map[string]Placement{
		"tier":                {Tier: "gold"},
		"guaranteed no cpus":  {Tier: Guaranteed, MemoryRequest: gib},
		"guaranteed no mem":   {Tier: Guaranteed, ExclusiveCPUs: []int{1}},
		"guaranteed lim!=req": {Tier: Guaranteed, ExclusiveCPUs: []int{1}, MemoryRequest: gib, MemoryLimit: 2 * gib},
		"burstable no pool":   {Tier: Burstable},
		"request > limit":     {Tier: Burstable, SharedCPUs: []int{0}, CPURequestMilli: 2000, CPULimitMilli: 1000},
		"mem request > limit": {Tier: Burstable, SharedCPUs: []int{0}, MemoryRequest: 2 * gib, MemoryLimit: gib},
		"negative":            {Tier: BestEffort, SharedCPUs: []int{0}, PidsLimit: -1},
		"bad device":          {Tier: BestEffort, SharedCPUs: []int{0}, Devices: []devices.DeviceNode{{Path: "/dev/x", Type: 'x'}}},
		"bad access":          {Tier: BestEffort, SharedCPUs: []int{0}, Devices: []devices.DeviceNode{{Path: "/dev/x", Type: 'c', Access: "rx"}}},
	} {
		if _, err := Plan(p); !errors.Is(err, ErrInvalidPlacement) {
			t.Errorf("%s: err = %v, want ErrInvalidPlacement", name, err)
		}
	}
}

func TestSharesFromWeight(t *testing.T) {
	if SharesFromWeight(MaxWeight) != 262_144 || SharesFromWeight(MinWeight) != 2 {
		t.Errorf("ends: %d %d", SharesFromWeight(MaxWeight), SharesFromWeight(MinWeight))
	}
	if s := SharesFromWeight(weightFromRequest(1000)); s < 900 || s > 1100 {
		t.Errorf("1 cpu request → %d shares, want about 1024", s)
	}
}

func TestCPUList(t *testing.T) {
	for in, want := range map[string][]int{"": nil, "0": {0}, "0-3,8": {0, 1, 2, 3, 8}, "5,1-2,2": {1, 2, 5}, "0-1\n": {0, 1}} {
		got, err := ParseCPUList(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("ParseCPUList(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"a", "3-1", "-1", "1,,2", "0-99999999"} {
		if _, err := ParseCPUList(bad); !errors.Is(err, ErrInvalidCPUList) {
			t.Errorf("ParseCPUList(%q) err = %v", bad, err)
		}
	}
	if s := FormatCPUList([]int{8, 0, 1, 2, 3, 3, 10}); s != "0-3,8,10" {
		t.Errorf("FormatCPUList = %q", s)
	}
}

func FuzzCPUList(f *testing.F) {
	for _, s := range []string{"", "0", "0-3,8", "1,3,5-7", "2-2", "9-3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		cpus, err := ParseCPUList(s)
		if err != nil {
			return
		}
		again, err := ParseCPUList(FormatCPUList(cpus))
		if err != nil || !slices.Equal(again, cpus) {
			t.Fatalf("round trip of %q: %v → %q → %v, %v", s, cpus, FormatCPUList(cpus), again, err)
		}
	})
}

func TestParsePressure(t *testing.T) {
	p, err := ParsePressure("some avg10=1.50 avg60=0.25 avg300=0.00 total=12345\nfull avg10=0.10 avg60=0.00 avg300=0.00 total=7\n")
	if err != nil {
		t.Fatal(err)
	}
	if p.Some.Avg10 != 1.5 || p.Some.Avg60 != 0.25 || p.Some.Total.Microseconds() != 12345 || p.Full.Total.Microseconds() != 7 {
		t.Errorf("pressure = %+v", p)
	}
	if _, err := ParsePressure("weird avg10=1"); err == nil {
		t.Error("accepted an unknown line")
	}
}

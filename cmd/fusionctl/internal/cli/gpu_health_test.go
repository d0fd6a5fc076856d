package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/devices"
)

func TestGPUTableHealthAndEvents(t *testing.T) {
	ends := time.Date(2026, 1, 2, 3, 4, 5, 0, time.Local)
	no, yes := false, true
	l := api.GPUList{GPUs: []api.GPU{
		{Index: 0, Model: "H200", Health: devices.Health{Reason: "Xid 79: GPU has fallen off the bus"}, Xid: 79, XidMeaning: "GPU has fallen off the bus", ProbationEnds: &ends},
		{Index: 1, Model: "H200", Health: devices.Health{Reason: "double-bit ECC error"}},
	}}
	for i := range 7 {
		l.Events = append(l.Events, api.Event{Kind: api.EventDevice, Device: "GPU-" + string(rune('a'+i)), Healthy: &no, Reason: "Xid 79"})
	}
	l.Events[6].Healthy = &yes
	var b bytes.Buffer
	if err := gpuTable(&b, l); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"UNHEALTHY: Xid 79 (GPU has fallen off the bus), probation until 03:04:05",
		"UNHEALTHY: double-bit ECC error, still failing", "Recent device events:", "GPU-g", "→ healthy"} {
		if !strings.Contains(out, want) {
			t.Errorf("gpu list lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "GPU-b ") {
		t.Errorf("more than %d events shown:\n%s", maxGPUEvents, out)
	}
}

func TestShareTable(t *testing.T) {
	l := api.GPUList{GPUs: []api.GPU{
		{Index: 0, ShareMode: "mps", Sharing: &api.GPUSharing{Mode: "mps", Replicas: 4, UsedMilli: 750, UsedMemory: 30 << 30,
			Shares: []api.GPUShareStatus{{Job: "j1", Milli: 500, Memory: 20 << 30}, {Job: "j2", Milli: 250, Memory: 10 << 30}}}},
		{Index: 1, ShareMode: "time-slicing"},
	}}
	var b bytes.Buffer
	if err := shareTable(&b, l); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("want header, two shares and one idle GPU:\n%s", b.String())
	}
	for i, want := range [][]string{{"MODE", "MEMORY CAP"}, {"mps", "4", "750/1000", "j1", "500 milli", "20Gi"}, {"j2", "250 milli", "10Gi"}, {"1", "time-slicing", "0/1000"}} {
		for _, w := range want {
			if !strings.Contains(lines[i], w) {
				t.Errorf("line %d %q lacks %q", i, lines[i], w)
			}
		}
	}
}

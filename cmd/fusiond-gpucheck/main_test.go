package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestRunSimulated(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), []string{"-simulate", "dgxh200", "-telemetry", "300ms", "-health", "200ms"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"SIMULATED host dgxh200", "8 GPU(s)", "1g.18gb(", "7g.141gb(", "NVLink pairs: 28", "unhealthy GPUs now: 0", "OK: read-only"} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q:\n%s", want, s)
		}
	}
}

// This machine has no NVIDIA driver: the check must fail with one clear line.
func TestRunNoDriver(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), nil, &out)
	if err == nil || !strings.Contains(err.Error(), "no NVIDIA driver") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("err %v", err)
	}
}

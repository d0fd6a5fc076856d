package nvidia

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestTelemetryAllMocks(t *testing.T) {
	for _, host := range SimulatedHosts() {
		t.Run(host, func(t *testing.T) {
			m, h := openSim(t, host)
			gs := m.GPUs()
			ss, err := m.SampleAll(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range ss {
				if s.UUID != gs[i].UUID || len(s.Missing) != 0 || s.PowerLimitW != gs[i].PowerLimitW ||
					s.PowerW <= 0 || s.TempC == 0 || s.SMClockMHz == 0 || s.MemTotalMB != gs[i].MemoryMB {
					t.Fatalf("sample %d: %+v", i, s)
				}
			}
			// A lost GPU reports the fields it cannot read as missing.
			_ = h.InjectXid(2, 79, true)
			ss, _ = m.SampleAll(context.Background())
			if len(ss[2].Missing) == 0 || len(ss[1].Missing) != 0 {
				t.Fatalf("lost GPU sample %+v", ss[2])
			}
		})
	}
}

// A simulated GPU reports the SM utilisation it is given, and refuses
// one above 100 % or a GPU it does not have.
func TestSimUtilization(t *testing.T) {
	m, h := openSim(t, "dgxh100")
	if err := h.SetUtilization(3, 65); err != nil {
		t.Fatal(err)
	}
	ss, err := m.SampleAll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ss[3].SMUtil != 65 || ss[2].SMUtil != 0 {
		t.Fatalf("SM utilisation %d and %d, want 65 and 0", ss[3].SMUtil, ss[2].SMUtil)
	}
	if err := h.SetUtilization(3, 101); err == nil {
		t.Error("101 % accepted")
	}
	if err := h.SetUtilization(8, 10); !errors.Is(err, ErrUnknownDevice) {
		t.Errorf("GPU 8 of 8: %v", err)
	}
}

func TestSamplerRate(t *testing.T) {
	m, _ := openSim(t, "dgxb200")
	s := m.NewSampler(0)
	ctx, cancel := context.WithTimeout(context.Background(), 350*time.Millisecond)
	defer cancel()
	sweeps := 0
	if err := s.Run(ctx, func(ss []Sample) { sweeps++ }); err != nil {
		t.Fatal(err)
	}
	// Default interval is 100 ms: at least 3 sweeps in 350 ms (≥ 10 Hz).
	if sweeps < 3 || len(s.Latest()) != 8 {
		t.Fatalf("%d sweeps, latest %d", sweeps, len(s.Latest()))
	}
}

func TestPowerPolicy(t *testing.T) {
	m, _ := openSim(t, "dgxh100")
	gs := m.GPUs()
	be := map[string]bool{gs[0].UUID: true}
	if err := m.ApplyPowerPolicy(PowerPolicy{Enabled: false, BestEffortCapW: 400}, be); err != nil {
		t.Fatal(err)
	}
	if m.GPUs()[0].PowerLimitW != gs[0].PowerLimitW {
		t.Fatal("disabled policy changed a limit")
	}
	if err := m.ApplyPowerPolicy(PowerPolicy{Enabled: true, BestEffortCapW: 400}, be); err != nil {
		t.Fatal(err)
	}
	after := m.GPUs()
	if after[0].PowerLimitW != 400 || after[1].PowerLimitW != gs[1].PowerMaxLimitW {
		t.Fatalf("limits %v %v", after[0].PowerLimitW, after[1].PowerLimitW)
	}
	if err := m.SetPowerLimit(gs[2].UUID, 10); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("out-of-range cap: %v", err)
	}
}

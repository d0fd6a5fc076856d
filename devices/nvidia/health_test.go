package nvidia

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
)

func waitEvent(t *testing.T, ch <-chan HealthEvent) HealthEvent {
	t.Helper()
	select {
	case ev := <-ch:
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no health event")
	}
	return HealthEvent{}
}

func TestHealthXidProbationRecovery(t *testing.T) {
	for _, host := range SimulatedHosts() {
		t.Run(host, func(t *testing.T) {
			clk := &fakeClock{now: time.Unix(1_800_000_000, 0)}
			m, h := openSim(t, host, WithClock(clk), WithProbation(time.Minute), WithMPS(&fakeMPS{}))
			g := m.GPUs()[1]
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			events := make(chan HealthEvent, 16)
			done := make(chan error, 1)
			// Probing is driven by the test through CheckRecovery.
			go func() { done <- m.WatchHealth(ctx, time.Hour, func(e HealthEvent) { events <- e }) }()

			// An application Xid does not take the GPU out of service.
			if err := h.InjectXid(1, 13, false); err != nil {
				t.Fatal(err)
			}
			if err := h.InjectXid(1, 79, true); err != nil {
				t.Fatal(err)
			}
			ev := waitEvent(t, events)
			if ev.UUID != g.UUID || ev.Healthy || ev.Xid != 79 || !strings.Contains(ev.Reason, "fallen off the bus") {
				t.Fatalf("event %+v", ev)
			}
			if m.Healthy(g.UUID) || m.Health(g.UUID).Healthy || !m.Healthy(m.GPUs()[0].UUID) {
				t.Fatal("health not recorded per GPU")
			}
			if err := m.AdmitShare(ctx, Share{ID: "x", GPU: g.UUID, Milli: 100}); !errors.Is(err, ErrUnhealthy) {
				t.Fatalf("share on unhealthy GPU: %v", err)
			}
			// Still lost: no probation however long we wait.
			clk.Advance(time.Hour)
			if rec := m.CheckRecovery(); len(rec) != 0 {
				t.Fatalf("recovered while lost: %+v", rec)
			}
			// The operator resets the GPU: probation starts, and only after
			// it the GPU returns.
			if err := h.ResetGPU(1); err != nil {
				t.Fatal(err)
			}
			if rec := m.CheckRecovery(); len(rec) != 0 {
				t.Fatalf("recovered without probation: %+v", rec)
			}
			clk.Advance(59 * time.Second)
			if rec := m.CheckRecovery(); len(rec) != 0 || m.Healthy(g.UUID) {
				t.Fatalf("recovered before probation ended: %+v", rec)
			}
			clk.Advance(time.Second)
			rec := m.CheckRecovery()
			if len(rec) != 1 || !rec[0].Healthy || rec[0].UUID != g.UUID || !m.Healthy(g.UUID) {
				t.Fatalf("recovery %+v healthy=%v", rec, m.Healthy(g.UUID))
			}

			// Double-bit ECC: unhealthy until the volatile count is cleared;
			// a new fault during probation restarts it.
			if err := h.InjectDoubleBitECC(1); err != nil {
				t.Fatal(err)
			}
			if ev := waitEvent(t, events); ev.Healthy || ev.Xid != 48 {
				t.Fatalf("DBE event %+v", ev)
			}
			clk.Advance(time.Hour)
			if rec := m.CheckRecovery(); len(rec) != 0 {
				t.Fatal("recovered with outstanding DBE")
			}
			_ = h.ResetGPU(1)
			m.CheckRecovery()
			clk.Advance(30 * time.Second)
			if err := h.InjectXid(1, 94, false); err != nil {
				t.Fatal(err)
			}
			if ev := waitEvent(t, events); ev.Xid != 94 {
				t.Fatalf("event %+v", ev)
			}
			m.CheckRecovery() // restarts probation now
			clk.Advance(45 * time.Second)
			if rec := m.CheckRecovery(); len(rec) != 0 {
				t.Fatal("probation not restarted by new fault")
			}
			clk.Advance(15 * time.Second)
			if rec := m.CheckRecovery(); len(rec) != 1 {
				t.Fatalf("no recovery after restarted probation: %+v", rec)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestHealthMIGInstance(t *testing.T) {
	m, h := openSim(t, "dgxh200")
	acts, err := Plan(mustState(t, m, nil), Target{0: {MIGEnabled: true, Counts: map[string]int{"3g.71gb": 2}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Apply(context.Background(), acts, nil); err != nil {
		t.Fatal(err)
	}
	inst := mustState(t, m, nil).GPUs[0].Instances[0]
	ev, ok := m.handleEvent(nvml.EventData{Device: h.Server.Devices[0], EventType: nvml.EventTypeXidCriticalError,
		EventData: 94, GpuInstanceId: uint32(inst.GIID), ComputeInstanceId: 0})
	if !ok || ev.UUID != inst.UUID {
		t.Fatalf("MIG event %+v %v", ev, ok)
	}
	gpu := m.GPUs()[0].UUID
	if m.Healthy(inst.UUID) || !m.Healthy(gpu) {
		t.Fatal("MIG fault must mark only the instance")
	}
	if _, ok := m.MarkUnhealthy(gpu, gpu, 79, "lost"); !ok {
		t.Fatal("mark GPU")
	}
	other := mustState(t, m, nil).GPUs[0].Instances[1]
	if m.Healthy(other.UUID) {
		t.Fatal("instance of an unhealthy GPU must be unhealthy")
	}
}

func TestXidMeaning(t *testing.T) {
	if XidMeaning(48) != "double-bit ECC error" || XidMeaning(12345) != "unknown Xid" {
		t.Fatal("meanings")
	}
	if CriticalXid(13) || !CriticalXid(79) || !CriticalXid(12345) {
		t.Fatal("critical classification")
	}
}

// A bare go-nvml mock has no event sets: the watch falls back to probing
// and still returns a recovered GPU to service.
func TestWatchHealthBareMockProbes(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1_800_000_000, 0)}
	m, err := Open(WithNVML(dgxh100.New()), WithClock(clk), WithProbation(0))
	if err != nil {
		t.Fatal(err)
	}
	u := m.GPUs()[4].UUID
	m.MarkUnhealthy(u, u, 79, "Xid 79")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := make(chan HealthEvent, 4)
	go func() { _ = m.WatchHealth(ctx, 10*time.Millisecond, func(e HealthEvent) { events <- e }) }()
	if ev := waitEvent(t, events); !ev.Healthy || ev.UUID != u {
		t.Fatalf("event %+v", ev)
	}
}

// TestCheckEvents: the subscription fusiond-gpucheck makes registers on
// every GPU of the simulated host and receives an injected Xid; on the
// bare mock (no event sets) it reports the error.
func TestCheckEvents(t *testing.T) {
	m, h := openSim(t, "dgxh200")
	n, got, err := m.CheckEvents(10 * time.Millisecond)
	if err != nil || n != 8 || got {
		t.Fatalf("quiet host: %d registered, event %v, err %v", n, got, err)
	}
	if err := h.InjectXid(2, 79, false); err != nil {
		t.Fatal(err)
	}
	if n, got, err = m.CheckEvents(time.Second); err != nil || n != 8 || !got {
		t.Fatalf("after an Xid: %d registered, event %v, err %v", n, got, err)
	}
	if err := h.InjectMIGXid(0, 3, 94); !errors.Is(err, ErrUnknownDevice) {
		t.Errorf("Xid into a GPU instance that does not exist: %v", err)
	}
	bare, err := Open(WithNVML(dgxh100.New()))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := bare.CheckEvents(time.Millisecond); !errors.Is(err, ErrNotSupported) {
		t.Errorf("bare mock: %v, want ErrNotSupported", err)
	}
}

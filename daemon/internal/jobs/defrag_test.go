package jobs_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/jobs/jobstest"
	"github.com/fusiond/fusiond/daemon/internal/store"
	"github.com/fusiond/fusiond/devices"
)

// gpuHost is the daemon's placer for a host of n H200s.
func gpuHost(n int) *hostplacer.Placer {
	ok := devices.Health{Healthy: true}
	hw := hostplacer.Hardware{Name: "gpus", CPU: 8000, Memory: 8 << 30}
	for i := range n {
		hw.GPUs = append(hw.GPUs, devices.Device{ID: fmt.Sprintf("GPU-%c", 'a'+i), Kind: devices.GPU, Model: "NVIDIA H200", MemoryMB: 143771, Health: ok})
	}
	return hostplacer.New(hw, hostplacer.Options{Seed: 1})
}

// gpuManager is a manager over placer, the store st and dir's logs, with
// the daemon's executor; not started.
func gpuManager(t *testing.T, st *store.Store, dir string, placer *hostplacer.Placer, cfg jobs.Config) *jobs.Manager {
	t.Helper()
	cfg.LogDir, cfg.CancelGrace = filepath.Join(dir, "logs"), time.Second
	return jobs.New(cfg, st, jobstest.Runner(t, cfg.LogDir, time.Second), placer, slog.New(slog.DiscardHandler))
}

func shareJob(milli int, movable bool) api.JobSpec {
	return api.JobSpec{Tier: api.TierBurstable, Movable: movable, Command: []string{"sleep", "600"},
		Resources: api.Resources{CPU: 100, Memory: 16 << 20, GPU: &api.GPURequest{Share: milli}}}
}

func hasEvent(j api.Job, part string) bool {
	return slices.ContainsFunc(j.Events, func(e api.Event) bool { return strings.Contains(e.Reason, part) })
}

// Two GPUs: one holds a movable 300 milli-GPU share, the other a 600
// share that is not movable. A whole-GPU job of the same tier (preemption
// does not apply) fits only if the movable share moves beside the other.
// With defragmentation on it does: the share is stopped, queued again
// (not a retry, its moves counted) and runs its second attempt on the
// other GPU, and the whole-GPU job runs on the GPU it left, saying so;
// the share that is not movable is never touched. With defragmentation
// off the whole-GPU job waits and nothing moves.
func TestDefragMovesAMovableJob(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("enabled=%v", on), func(t *testing.T) {
			dir := t.TempDir()
			m := gpuManager(t, podStore(t, dir), dir, gpuHost(2), jobs.Config{Queue: jobs.QueueConfig{
				Defrag: jobs.DefragConfig{Enabled: on, MaxMoves: 1, Window: time.Hour, MinInterval: time.Hour}}})
			jobstest.Run(t, m)
			ctx := context.Background()
			a := waitFor(t, m, submit(t, m, shareJob(600, false)).ID, state(api.StateRunning))
			b := waitFor(t, m, submit(t, m, shareJob(600, false)).ID, state(api.StateRunning))
			c := waitFor(t, m, submit(t, m, shareJob(300, true)).ID, state(api.StateRunning))
			if a.Allocation.GPUShare.GPU == b.Allocation.GPUShare.GPU {
				t.Fatalf("two 600 milli-GPU shares on one GPU %s", a.Allocation.GPUShare.GPU)
			}
			// Leave the movable share alone on its GPU.
			stays, gone := a, b
			if b.Allocation.GPUShare.GPU != c.Allocation.GPUShare.GPU {
				stays, gone = b, a
			}
			if _, err := m.Cancel(ctx, root, gone.ID); err != nil {
				t.Fatal(err)
			}
			waitFor(t, m, gone.ID, state(api.StateCancelled))

			head := submit(t, m, api.JobSpec{Tier: api.TierBurstable, Command: []string{"sleep", "600"},
				Resources: api.Resources{CPU: 100, Memory: 16 << 20, GPU: &api.GPURequest{Count: 1}}})
			if !on {
				waitFor(t, m, head.ID, func(j api.Job) bool { return strings.Contains(j.Reason, "reserved for it") })
				time.Sleep(2500 * time.Millisecond) // more passes
				h, _ := m.Get(ctx, root, head.ID)
				cj, _ := m.Get(ctx, root, c.ID)
				if h.State != api.StatePending || strings.Contains(h.Reason, "moving") || cj.Moves != 0 || cj.Attempt != 1 || cj.State != api.StateRunning {
					t.Fatalf("defragmentation off: whole-GPU job %s (%s), movable share %s attempt %d moves %d", h.State, h.Reason, cj.State, cj.Attempt, cj.Moves)
				}
				return
			}
			h := waitFor(t, m, head.ID, state(api.StateRunning))
			if !slices.Equal(h.Allocation.GPUs, []string{c.Allocation.GPUShare.GPU}) || !hasEvent(h, "room made by moving "+c.ID) {
				t.Errorf("whole-GPU job on %v, events %+v; want the GPU %s the share left, room made by moving %s", h.Allocation.GPUs, h.Events, c.Allocation.GPUShare.GPU, c.ID)
			}
			moved := waitFor(t, m, c.ID, func(j api.Job) bool { return j.State == api.StateRunning && j.Attempt == 2 })
			if moved.Moves != 1 || moved.MovingFor != "" || moved.Allocation.GPUShare.GPU != stays.Allocation.GPUShare.GPU ||
				!hasEvent(moved, "moving: to make room for job "+head.ID) || !hasEvent(moved, "moved: stopped to make room for job "+head.ID) {
				t.Errorf("moved share: moves %d, moving_for %q, on %s, events %+v; want moved once beside %s, with its reasons",
					moved.Moves, moved.MovingFor, moved.Allocation.GPUShare.GPU, moved.Events, stays.ID)
			}
			if s, _ := m.Get(ctx, root, stays.ID); s.Moves != 0 || s.Attempt != 1 || s.State != api.StateRunning {
				t.Errorf("the share that is not movable: %s, attempt %d, moves %d", s.State, s.Attempt, s.Moves)
			}
		})
	}
}

// A daemon that stops (or crashes) after marking a job for a move finds
// the mark in the store: the next one stops the job again and queues it,
// so the move completes and the job runs again rather than being recorded
// failed for the SIGTERM.
func TestMoveSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m1 := gpuManager(t, st, dir, gpuHost(1), jobs.Config{LeaveJobsRunning: true})
	if err := m1.Recover(); err != nil {
		t.Fatal(err)
	}
	m1.Start()
	j := waitFor(t, m1, submit(t, m1, shareJob(300, true)).ID, state(api.StateRunning))
	stopCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	m1.Stop(stopCtx)
	cancel()
	// The mark as the move stored it before signalling the job.
	rec, err := st.GetJob(j.ID)
	if err != nil {
		t.Fatal(err)
	}
	rec.MovingFor = "99"
	rec.Version++
	if err := st.PutJob(rec); err != nil {
		t.Fatal(err)
	}
	st.Close()

	m2 := gpuManager(t, podStore(t, dir), dir, gpuHost(1), jobs.Config{})
	jobstest.Run(t, m2)
	got := waitFor(t, m2, j.ID, func(j api.Job) bool { return j.State == api.StateRunning && j.Attempt == 2 })
	if got.Moves != 1 || got.MovingFor != "" || got.PID == j.PID || !hasEvent(got, "moved: stopped to make room for job 99") {
		t.Errorf("after a restart mid-move: moves %d, moving_for %q, pid %d (was %d), events %+v; want the move completed", got.Moves, got.MovingFor, got.PID, j.PID, got.Events)
	}
}

// migHost is the daemon's placer for a host of two H200s in MIG mode (8
// memory slots, NVIDIA's starts); GPU-a holds an idle 1g instance at
// slot 2.
func migHost() *hostplacer.Placer {
	ok := devices.Health{Healthy: true}
	hw := hostplacer.Hardware{Name: "mig", CPU: 8000, Memory: 8 << 30}
	for i := range 2 {
		g := devices.Device{ID: fmt.Sprintf("GPU-%c", 'a'+i), Kind: devices.GPU, Model: "NVIDIA H200", MemoryMB: 143771, Health: ok, ReconfigMs: 1500,
			MIG: &devices.MIG{Slots: 8, Profiles: map[string]int{"1g.18gb": 1, "4g.71gb": 4},
				Starts: map[string][]int{"1g.18gb": {0, 1, 2, 3, 4, 5, 6}, "4g.71gb": {0}}}}
		if i == 0 {
			g.MIG.Instances = []devices.MIGInstance{{ID: "MIG-a2", Profile: "1g.18gb", Start: 2, Slots: 1}}
		}
		hw.GPUs = append(hw.GPUs, g)
	}
	return hostplacer.New(hw, hostplacer.Options{Seed: 1})
}

func migJob(profile string, movable bool) api.JobSpec {
	return api.JobSpec{Tier: api.TierBurstable, Movable: movable, Command: []string{"sleep", "600"},
		Resources: api.Resources{CPU: 100, Memory: 16 << 20, GPU: &api.GPURequest{MIG: profile}}}
}

// Two MIG GPUs: a movable 1g job runs on GPU-a's instance at slot 2, a 4g
// job that is not movable holds GPU-b's slots 0-3. Another 4g job (NVIDIA
// starts a 4g only at slot 0) fits only if the 1g job leaves slot 2: with
// defragmentation on it moves (its instance goes idle) and the 4g job runs
// on GPU-a at slot 0, over the idle instance, which is destroyed for it.
func TestDefragMovesAMovableMIGJob(t *testing.T) {
	dir := t.TempDir()
	m := gpuManager(t, podStore(t, dir), dir, migHost(), jobs.Config{Queue: jobs.QueueConfig{
		Defrag: jobs.DefragConfig{Enabled: true, MaxMoves: 1, Window: time.Hour, MinInterval: time.Hour}}})
	jobstest.Run(t, m)
	small := waitFor(t, m, submit(t, m, migJob("1g.18gb", true)).ID, state(api.StateRunning))
	if a := small.Allocation.MIG; a == nil || a.Instance != "MIG-a2" {
		t.Fatalf("setup: the 1g job got %+v, want the idle instance MIG-a2", a)
	}
	fixed := waitFor(t, m, submit(t, m, migJob("4g.71gb", false)).ID, state(api.StateRunning))
	if a := fixed.Allocation.MIG; a == nil || a.GPU != "GPU-b" || a.Start != 0 {
		t.Fatalf("setup: the first 4g job got %+v, want GPU-b slot 0", a)
	}
	head := waitFor(t, m, submit(t, m, migJob("4g.71gb", false)).ID, state(api.StateRunning))
	if a := head.Allocation.MIG; a == nil || a.GPU != "GPU-a" || a.Start != 0 || !hasEvent(head, "room made by moving "+small.ID) {
		t.Fatalf("4g job on %+v, events %+v; want GPU-a slot 0, room made by moving %s", a, head.Events, small.ID)
	}
	moved := waitFor(t, m, small.ID, func(j api.Job) bool { return j.State == api.StateRunning && j.Attempt == 2 })
	if a := moved.Allocation.MIG; moved.Moves != 1 || a == nil || (a.GPU == "GPU-a" && a.Start < 4) {
		t.Errorf("moved 1g job: moves %d, on %+v; want moved once, off GPU-a's slots 0-3", moved.Moves, a)
	}
	if f, _ := m.Get(context.Background(), root, fixed.ID); f.Moves != 0 || f.Attempt != 1 || f.State != api.StateRunning {
		t.Errorf("the 4g job that is not movable: %s, attempt %d, moves %d", f.State, f.Attempt, f.Moves)
	}
}

// The movable share of TestDefragMovesAMovableJob ignores SIGTERM, so it
// stops only at SIGKILL, CancelGrace after its mark. Cancelled meanwhile,
// it ends cancelled with its mark cleared. If instead the whole-GPU job it
// is moved for is cancelled meanwhile, the share is queued again as any
// job: placed where the engine chooses, not at the plan's pin.
func TestDefragMoveInterrupted(t *testing.T) {
	for _, cancelled := range []string{"moved", "head"} {
		t.Run("cancel "+cancelled, func(t *testing.T) {
			dir := t.TempDir()
			m := gpuManager(t, podStore(t, dir), dir, gpuHost(2), jobs.Config{Queue: jobs.QueueConfig{
				Defrag: jobs.DefragConfig{Enabled: true, MaxMoves: 1, Window: time.Hour, MinInterval: time.Hour}}})
			jobstest.Run(t, m)
			ctx := context.Background()
			a := waitFor(t, m, submit(t, m, shareJob(600, false)).ID, state(api.StateRunning))
			b := waitFor(t, m, submit(t, m, shareJob(600, false)).ID, state(api.StateRunning))
			spec := shareJob(300, true)
			spec.Command = []string{"sh", "-c", `trap "" TERM; sleep 600`}
			c := waitFor(t, m, submit(t, m, spec).ID, state(api.StateRunning))
			gone := b
			if b.Allocation.GPUShare.GPU != c.Allocation.GPUShare.GPU {
				gone = a
			}
			if _, err := m.Cancel(ctx, root, gone.ID); err != nil {
				t.Fatal(err)
			}
			waitFor(t, m, gone.ID, state(api.StateCancelled))
			head := submit(t, m, api.JobSpec{Tier: api.TierBurstable, Command: []string{"sleep", "600"},
				Resources: api.Resources{CPU: 100, Memory: 16 << 20, GPU: &api.GPURequest{Count: 1}}})
			waitFor(t, m, c.ID, func(j api.Job) bool { return j.MovingFor == head.ID })
			if cancelled == "moved" {
				if _, err := m.Cancel(ctx, root, c.ID); err != nil {
					t.Fatal(err)
				}
				got := waitFor(t, m, c.ID, state(api.StateCancelled))
				if got.MovingFor != "" || got.Moves != 0 {
					t.Errorf("share cancelled mid-move: moving_for %q, moves %d; want the mark cleared, not counted a move", got.MovingFor, got.Moves)
				}
				return
			}
			if _, err := m.Cancel(ctx, root, head.ID); err != nil {
				t.Fatal(err)
			}
			got := waitFor(t, m, c.ID, func(j api.Job) bool { return j.State == api.StateRunning && j.Attempt == 2 })
			if got.Moves != 1 || hasEvent(got, "defragmentation plan") {
				t.Errorf("share after its head was cancelled: moves %d, events %+v; want moved once and placed without the plan's pin", got.Moves, got.Events)
			}
		})
	}
}

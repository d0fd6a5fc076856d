package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// TestDefragDGXH200 runs fusiond --simulate dgxh200 with defragmentation
// on and a budget of 2 moves per window. Movable shares of 300 milli-GPU
// fill the 8 GPUs (3 on each as the engine packs them); one share on each
// GPU is then cancelled, so every GPU holds two shares and none is whole.
// A whole-GPU job of the same tier (so preemption does not apply) cannot
// fit until two shares of one GPU move to the room left on two others: it
// runs, at most 2 jobs were moved, each moved job ran again (its second
// attempt, a new process) and says why it was moved, and the metrics
// count the moves. A second whole-GPU job, which needs 2 more moves, waits:
// the budget is spent.
func TestDefragDGXH200(t *testing.T) {
	const budget = 2
	dir := publicTempDir(t)
	msock := filepath.Join(dir, "metrics.sock")
	d := newDaemon(t, dir, fmt.Sprintf("scheduling: {defrag: {enabled: true, max_moves: %d, window: 10m, min_interval_per_job: 30m}}\nmetrics: {listen: \"unix:%s\"}\n", budget, msock))
	d.args = []string{"--simulate", "dgxh200"}
	d.start()
	c := d.client()
	ctx := context.Background()
	get := func(id string) api.Job {
		t.Helper()
		j, err := c.Get(ctx, id)
		if err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		return j
	}

	var shares []api.Job
	for i := range 24 {
		j, err := c.Submit(ctx, api.JobSpec{Name: fmt.Sprint("share", i), Tier: api.TierBurstable, Movable: true, Command: []string{"sleep", "600"},
			Resources: api.Resources{CPU: 20, Memory: 16 << 20, GPU: &api.GPURequest{Share: 300, Memory: 8 << 30}}})
		if err != nil {
			t.Fatal(err)
		}
		shares = append(shares, j)
	}
	byGPU := map[string][]api.Job{}
	for i, s := range shares {
		shares[i] = waitFor(t, c, s.ID, api.StateRunning)
		a := shares[i].Allocation
		if a == nil || a.GPUShare == nil {
			t.Fatalf("share %s: allocation %+v, want a GPU share", s.ID, a)
		}
		byGPU[a.GPUShare.GPU] = append(byGPU[a.GPUShare.GPU], shares[i])
	}
	if len(byGPU) != 8 {
		t.Fatalf("24 shares of 300 milli-GPU on %d GPUs, want all 8 (3 each): %v", len(byGPU), layout(byGPU))
	}
	// Leave two shares on every GPU: 600 milli used, 400 free, none whole.
	kept := map[string]api.Job{}
	for _, gpu := range slices.Sorted(maps.Keys(byGPU)) {
		on := byGPU[gpu]
		if len(on) < 2 {
			t.Fatalf("GPU %s holds %d shares, want at least 2: %v", gpu, len(on), layout(byGPU))
		}
		for _, j := range on[2:] {
			if _, err := c.Cancel(ctx, j.ID); err != nil {
				t.Fatal(err)
			}
			waitFor(t, c, j.ID, api.StateCancelled)
		}
		for _, j := range on[:2] {
			kept[j.ID] = j
		}
	}

	whole := func(name string) api.Job {
		j, err := c.Submit(ctx, api.JobSpec{Name: name, Tier: api.TierBurstable, Command: []string{"sleep", "600"},
			Resources: api.Resources{CPU: 20, Memory: 16 << 20, GPU: &api.GPURequest{Count: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	head := waitFor(t, c, whole("whole").ID, api.StateRunning)
	if a := head.Allocation; a == nil || len(a.GPUs) != 1 {
		t.Fatalf("whole-GPU job's allocation %+v: want one whole GPU", a)
	}
	if !slices.ContainsFunc(head.Events, func(e api.Event) bool {
		return e.To == api.StatePlaced && strings.Contains(e.Reason, "room made by moving")
	}) {
		t.Errorf("whole-GPU job %s: no placement event saying room was made by moving jobs: %+v", head.ID, head.Events)
	}

	var moved []api.Job
	for id, before := range kept {
		j := get(id)
		if j.Moves == 0 {
			if j.State != api.StateRunning || j.Attempt != 1 {
				t.Errorf("share %s was not moved but is %s, attempt %d", id, j.State, j.Attempt)
			}
			continue
		}
		// A moved job is placed again and runs its second attempt.
		deadline := time.Now().Add(20 * time.Second)
		for j.State != api.StateRunning && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			j = get(id)
		}
		moved = append(moved, j)
		if j.State != api.StateRunning || j.Attempt != 2 || j.PID == before.PID || j.Moves != 1 || j.MovingFor != "" {
			t.Errorf("moved share %s: state %s, attempt %d, pid %d (was %d), moves %d, moving_for %q; want running its second attempt in a new process, moved once",
				id, j.State, j.Attempt, j.PID, before.PID, j.Moves, j.MovingFor)
		}
		if j.Allocation == nil || j.Allocation.GPUShare == nil || j.Allocation.GPUShare.GPU == before.Allocation.GPUShare.GPU {
			t.Errorf("moved share %s: allocation %+v, want a share of another GPU than %s", id, j.Allocation, before.Allocation.GPUShare.GPU)
		}
		for _, want := range []string{"moving: to make room for job " + head.ID, "moved: stopped to make room for job " + head.ID} {
			if !slices.ContainsFunc(j.Events, func(e api.Event) bool { return strings.Contains(e.Reason, want) }) {
				t.Errorf("moved share %s: no event %q in %+v", id, want, j.Events)
			}
		}
	}
	if len(moved) == 0 || len(moved) > budget {
		t.Fatalf("%d jobs moved for the whole-GPU job, want 1 to %d (the budget)", len(moved), budget)
	}
	for _, j := range moved {
		for _, e := range j.Events {
			if strings.HasPrefix(e.Reason, "moving: ") {
				t.Logf("job %s: %s", j.ID, e.Reason)
			}
		}
	}
	t.Logf("whole-GPU job %s ran %s after its submission, %d jobs moved for it", head.ID, head.StartedAt.Sub(head.CreatedAt).Round(time.Millisecond), len(moved))
	show := d.ctl(nil, "", "show", moved[0].ID)
	if show.code != 0 || !strings.Contains(show.stdout, "yes; moved 1 times") {
		t.Errorf("fusionctl show %s (exit %d):\n%s%s\nwant it to say the job was moved once", moved[0].ID, show.code, show.stdout, show.stderr)
	}
	want := fmt.Sprintf("\nfusiond_defrag_moves_total{tier=\"burstable\"} %d\n", len(moved))
	if text := scrape(t, metricsClient(msock)); !strings.Contains(text, want) {
		t.Errorf("metrics lack %q:\n%s", strings.TrimSpace(want), text)
	}

	// Another whole GPU needs two more moves: over the budget, it waits.
	second := whole("whole2")
	deadline := time.Now().Add(20 * time.Second)
	for j := get(second.ID); !strings.Contains(j.Reason, "defragmentation budget spent (2 moves per 10m0s)"); j = get(second.ID) {
		if j.State != api.StatePending || time.Now().After(deadline) {
			t.Fatalf("second whole-GPU job %s is %s (%s), want pending with the defragmentation budget spent", j.ID, j.State, j.Reason)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // more passes
	if j := get(second.ID); j.State != api.StatePending {
		t.Errorf("second whole-GPU job %s is %s (%s), want pending: the budget is spent", j.ID, j.State, j.Reason)
	}
	n := 0
	for id := range kept {
		n += get(id).Moves
	}
	if n != len(moved) {
		t.Errorf("%d moves in all after the second job waited, want the first job's %d", n, len(moved))
	}

	for _, id := range append(slices.Collect(maps.Keys(kept)), head.ID, second.ID) {
		c.Cancel(ctx, id)
	}
	for _, id := range append(slices.Collect(maps.Keys(kept)), head.ID, second.ID) {
		waitFor(t, c, id, api.StateCancelled)
	}
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// layout names the shares on each GPU, for a failure message.
func layout(byGPU map[string][]api.Job) string {
	var b strings.Builder
	for _, gpu := range slices.Sorted(maps.Keys(byGPU)) {
		var ids []string
		for _, j := range byGPU[gpu] {
			ids = append(ids, j.ID)
		}
		fmt.Fprintf(&b, "%s: %s; ", gpu, strings.Join(ids, ","))
	}
	return b.String()
}

// TestDefragMIGDGXH200 runs fusiond --simulate dgxh200 with GPUs 6 and 7
// in MIG mode (no instances) and defragmentation on. A movable 1g job gets
// a new instance at slot 0 of one GPU and a 4g job that is not movable
// slot 0 of the other (NVIDIA starts a 4g only at slot 0). A second 4g job
// fits only if the 1g job leaves: it is moved, its instance goes idle, and
// the 4g job's instance is created at slot 0 over it (the driver destroys
// the idle instance first).
func TestDefragMIGDGXH200(t *testing.T) {
	dir := publicTempDir(t)
	d := newDaemon(t, dir, "scheduling: {defrag: {enabled: true, max_moves: 1, window: 10m, min_interval_per_job: 30m}}\n")
	d.args = []string{"--simulate", "dgxh200"}
	d.start()
	c := d.client()
	ctx := context.Background()
	layout := filepath.Join(t.TempDir(), "mig.yaml")
	if err := os.WriteFile(layout, []byte("version: v1\nmig-configs:\n  two:\n    - devices: [6, 7]\n      mig-enabled: true\n      mig-devices: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := d.ctl(nil, "", "mig", "apply", "-f", layout, "-c", "two"); r.code != 0 {
		t.Fatalf("mig apply: exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	mig := func(name, profile string, movable bool) api.Job {
		t.Helper()
		j, err := c.Submit(ctx, api.JobSpec{Name: name, Tier: api.TierBurstable, Movable: movable, Command: []string{"sleep", "600"},
			Resources: api.Resources{CPU: 20, Memory: 16 << 20, GPU: &api.GPURequest{MIG: profile}}})
		if err != nil {
			t.Fatal(err)
		}
		return waitFor(t, c, j.ID, api.StateRunning)
	}
	small := mig("small", "1g.18gb", true)
	fixed := mig("fixed", "4g.71gb", false)
	sa, fa := small.Allocation.MIG, fixed.Allocation.MIG
	if sa == nil || fa == nil || sa.Start != 0 || fa.Start != 0 || sa.GPU == fa.GPU {
		t.Fatalf("setup: 1g job at %+v, 4g job at %+v; want slot 0 of each MIG GPU", sa, fa)
	}
	head := mig("head", "4g.71gb", false)
	ha := head.Allocation.MIG
	if ha == nil || ha.GPU != sa.GPU || ha.Start != 0 || ha.Instance == "" {
		t.Fatalf("second 4g job at %+v; want slot 0 of %s, where the 1g job was", ha, sa.GPU)
	}
	if !slices.ContainsFunc(head.Events, func(e api.Event) bool { return strings.Contains(e.Reason, "room made by moving "+small.ID) }) {
		t.Errorf("second 4g job: no event saying room was made by moving %s: %+v", small.ID, head.Events)
	}
	var moved api.Job
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		var err error
		if moved, err = c.Get(ctx, small.ID); err != nil {
			t.Fatal(err)
		}
		if moved.State == api.StateRunning && moved.Attempt == 2 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	ma := moved.Allocation
	if moved.State != api.StateRunning || moved.Attempt != 2 || moved.Moves != 1 || ma == nil || ma.MIG == nil || ma.MIG.Instance == sa.Instance {
		t.Fatalf("moved 1g job: %s, attempt %d, moves %d, allocation %+v; want running again on another instance", moved.State, moved.Attempt, moved.Moves, ma)
	}
	t.Logf("4g job %s ran %s after its submission, after moving job %s from slot %d of %s to slot %d of %s", head.ID, head.StartedAt.Sub(head.CreatedAt).Round(time.Millisecond),
		small.ID, sa.Start, sa.GPU, ma.MIG.Start, ma.MIG.GPU)
	// The GPU's instances: the head's 4g at 0, the 1g job's old instance
	// gone.
	l, err := c.GPUs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range l.GPUs {
		if g.UUID != sa.GPU {
			continue
		}
		for _, in := range g.MIG {
			if in.UUID == sa.Instance {
				t.Errorf("the moved job's old instance %s still exists on %s: %+v", sa.Instance, sa.GPU, g.MIG)
			}
		}
		if !slices.ContainsFunc(g.MIG, func(in api.MIGInstance) bool {
			return in.UUID == ha.Instance && in.Start == 0 && in.Profile == "4g.71gb"
		}) {
			t.Errorf("GPU %s's instances %+v lack the 4g job's %s at slot 0", sa.GPU, g.MIG, ha.Instance)
		}
	}
}

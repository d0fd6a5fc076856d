package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
)

// TestExclusiveCores runs fusiond --simulate dgxh200 as root: a guaranteed
// job gets a whole core of this machine (the simulated host's cores are
// not the ones jobs run on) chosen by the placer, the best-effort tier's
// cpuset shrinks to the rest and grows back when it ends, one core always
// stays shared, and after a graceful restart the re-attached job keeps its
// core.
func TestExclusiveCores(t *testing.T) {
	dir := publicTempDir(t)
	d := newDaemon(t, dir, "leave_jobs_on_shutdown: true\n")
	d.args = []string{"--simulate", "dgxh200"}
	d.start()
	c := d.client()
	ctx := context.Background()
	online := onlineCPUs(t)
	if len(online) < 2 {
		t.Fatalf("need 2 CPUs for an exclusive core beside the shared one, have %v", online)
	}
	env := map[string]string{"E2E_FUSIOND_RUN": dir}
	affinity := func() []int {
		t.Helper()
		j, err := c.Submit(ctx, api.JobSpec{Command: []string{"grep", "Cpus_allowed_list", "/proc/self/status"}, Env: env,
			Tier: api.TierBestEffort, Resources: api.Resources{CPU: 100, Memory: 32 << 20}})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, c, j.ID, api.StateSucceeded)
		var out bytes.Buffer
		if err := c.Logs(ctx, j.ID, false, &out); err != nil {
			t.Fatal(err)
		}
		_, list, _ := strings.Cut(strings.TrimSpace(out.String()), ":")
		cpus, err := cgroups.ParseCPUList(strings.TrimSpace(list))
		if err != nil {
			t.Fatalf("best-effort job printed %q: %v", out.String(), err)
		}
		return cpus
	}

	g, err := c.Submit(ctx, api.JobSpec{Command: []string{"sleep", "300"}, Env: env,
		Tier: api.TierGuaranteed, Resources: api.Resources{CPU: 500, Memory: 32 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	g = waitFor(t, c, g.ID, api.StateRunning)
	mine, err := cgroups.ParseCPUList(g.Allocation.CPUSet)
	if err != nil || len(mine) == 0 || g.Allocation.CPU != 1000 {
		t.Fatalf("guaranteed cpu 500m: allocation %+v (%v); want one whole core, counted 1000m", g.Allocation, err)
	}
	var rest []int
	for _, cpu := range online {
		if !slices.Contains(mine, cpu) {
			rest = append(rest, cpu)
		}
	}
	for _, cpu := range mine {
		if !slices.Contains(online, cpu) {
			t.Fatalf("exclusive cpus %v are not this machine's (online %v)", mine, online)
		}
	}
	if got := affinity(); !slices.Equal(got, rest) {
		t.Errorf("best-effort job beside the guaranteed one runs on %v, want the shared pool %v", got, rest)
	}
	// The QoS loop cuts the best-effort quota from that pool, not from
	// the host's CPUs (its status follows it within a window or two).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		n, err := c.Node(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n.QoS == nil || !n.QoS.Enabled {
			t.Fatalf("QoS loop not running: %+v", n.QoS)
		}
		if n.QoS.SharedPool == api.MilliCPU(len(rest))*1000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("QoS shared pool %v beside the guaranteed job, want %d CPUs (%v)", n.QoS.SharedPool, len(rest), rest)
		}
	}
	// Every core but one: refused at submit, the field named.
	_, err = c.Submit(ctx, api.JobSpec{Command: []string{"true"}, Tier: api.TierGuaranteed,
		Resources: api.Resources{CPU: api.MilliCPU(len(online)) * 1000, Memory: 32 << 20}})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeUnsatisfiable || ae.Field != "resources.cpu" {
		t.Errorf("guaranteed job asking for every CPU: %v, want unsatisfiable on resources.cpu", err)
	}

	// Graceful restart: the job runs on and gets its core back.
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	d.start()
	if j, err := c.Get(ctx, g.ID); err != nil || j.State != api.StateRunning || j.Allocation.CPUSet != g.Allocation.CPUSet {
		t.Fatalf("after restart: %+v, %v", j, err)
	}
	if got := affinity(); !slices.Equal(got, rest) {
		t.Errorf("after restart a best-effort job runs on %v, want %v (the re-attached job's core reclaimed)", got, rest)
	}
	if _, err := c.Cancel(ctx, g.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, c, g.ID, api.StateCancelled)
	deadline := time.Now().Add(10 * time.Second)
	for got := affinity(); !slices.Equal(got, online); got = affinity() {
		if time.Now().After(deadline) {
			t.Fatalf("after the guaranteed job ended a best-effort job runs on %v, want all of %v", got, online)
		}
	}
}

func onlineCPUs(t *testing.T) []int {
	t.Helper()
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		t.Fatal(err)
	}
	cpus, err := cgroups.ParseCPUList(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return cpus
}

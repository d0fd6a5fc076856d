package daemon

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/cgroups"
)

// cgJobCPU is mgrJobCPU without a job manager: fixed best-effort jobs.
type cgJobCPU struct {
	m   *cgroups.Manager
	req map[string]int64
}

func (c cgJobCPU) bestEffort() map[string]int64 { return c.req }

func (c cgJobCPU) setJobCPUQuota(id string, milli int64) error {
	return mgrJobCPU{cg: c.m}.setJobCPUQuota(id, milli)
}

// On the real kernel (cgroup v1 here, v2 under make test-vm): a
// best-effort job of 500m lent 1000m more, then its tier throttled to
// 300m, then the limits lifted. cgroup v1 refuses the tier's quota under
// the job's 1500m; beKnobs brings the job's under it first.
func TestKernelTierQuotaUnderLentJob(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("real-kernel cgroup tests need root")
	}
	root := os.Getenv("FUSIOND_CGROUP_ROOT")
	if root == "" {
		root = cgroups.DefaultRoot
	}
	m, err := cgroups.NewManager(cgroups.WithRoot(root), cgroups.WithParent(fmt.Sprintf("fusiond-test-knobs-%d", os.Getpid())),
		cgroups.WithKillTimeout(5*time.Second), cgroups.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatalf("cgroups unusable at %s: %v", root, err)
	}
	l, err := cgroups.Plan(cgroups.Placement{Tier: cgroups.BestEffort, SharedCPUs: []int{0}, CPURequestMilli: 500, CPULimitMilli: 500})
	if err != nil {
		t.Fatal(err)
	}
	cg, err := m.Create("be1", cgroups.BestEffort, l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cg.Delete(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		if err := m.RemoveHierarchy(); err != nil {
			t.Errorf("cleanup hierarchy: %v", err)
		}
	})
	quota := func(rel string) string { // in µs per 100 ms period; -1 or max: none
		file := filepath.Join(root, rel, "cpu.max")
		if m.Mode() != cgroups.ModeV2 {
			file = filepath.Join(root, "cpu", rel, "cpu.cfs_quota_us")
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Fields(string(b))[0]
	}
	k := &beKnobs{cg: m, jobs: cgJobCPU{m: m, req: map[string]int64{"be1": 500}}}
	for _, s := range []struct {
		name      string
		do        func() error
		tier, job string
	}{
		{"lend 1000m", func() error { return k.setLend(1000) }, "", "150000"},
		{"budget 300m", func() error { return k.setReclaim(300, 0) }, "30000", "30000"},
		{"budget 1200m", func() error { return k.setReclaim(1200, 0) }, "120000", "120000"},
		{"lifted", func() error {
			if err := k.setLend(0); err != nil {
				return err
			}
			return k.setReclaim(0, 0)
		}, "", "50000"},
	} {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		tier, job := quota(filepath.Dir(cg.Path())), quota(cg.Path())
		if tier == "-1" || tier == "max" {
			tier = ""
		}
		if tier != s.tier || job != s.job {
			t.Errorf("%s: tier quota %q, job %q; want %q, %q", s.name, tier, job, s.tier, s.job)
		}
	}
}

package sim

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/daemon/sched"
)

// --tune runs through the command on the tiny trace: it reports the test
// seeds only, with the chosen parameters, and refuses a seed that is both
// train and test.
func TestTuneCommand(t *testing.T) {
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--tune", "--nodes", "testdata/nodes.csv", "--pods", "testdata/pods.csv,testdata/pods.csv", "--seeds", "1-2", "--test-seeds", "3"})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"train seeds [1 2], traces 2", "test seeds [3] only", "chosen: reserve_steps=", "| pods | "} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	if strings.Count(s, "| pods | ") != 2 {
		t.Errorf("want one test row per trace:\n%s", s)
	}
	err := Tune(context.Background(), TuneOptions{NodesPath: "testdata/nodes.csv", PodsPaths: []string{"testdata/pods.csv"}, TrainSeeds: []uint64{1, 2}, TestSeeds: []uint64{2}}, &out)
	if !errors.Is(err, ErrBadOption) {
		t.Errorf("overlapping seeds: %v, want ErrBadOption", err)
	}
}

// --frag parses over the defaults and refuses what it does not know.
func TestParseFragParams(t *testing.T) {
	p, err := ParseFragParams("reserve_steps=20,tail=strand-gpu,sliver_mass=0.2,full_nodes_as_fgd=true,cpu_only_tail_max=0.25,cpu_only_full_max=0.5")
	if err != nil {
		t.Fatal(err)
	}
	if p.ReserveSteps != 20 || p.Tail.String() != "strand-gpu" || p.SliverMass != 0.2 || !p.FullNodesAsFGD || p.CPUOnlyTailMax != 0.25 || p.CPUOnlyFullMax != 0.5 {
		t.Errorf("parsed %+v", *p)
	}
	for _, bad := range []string{"reserve_steps=0", "tail=sideways", "nope=1", "reserve_frac", "reserve_max_share=2", "sliver_mass=-1", "cpu_only_tail_max=0", "cpu_only_full_max=1.5"} {
		if _, err := ParseFragParams(bad); !errors.Is(err, ErrBadOption) {
			t.Errorf("%q: %v, want ErrBadOption", bad, err)
		}
	}
}

// --tune-only searches the named parameters alone and refuses a name
// --tune does not search.
func TestTuneOnly(t *testing.T) {
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--tune", "--tune-only", "cpu_only_tail_max", "--nodes", "testdata/nodes.csv", "--pods", "testdata/pods.csv", "--seeds", "1-2", "--test-seeds", "3"})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if !strings.Contains(s, "pass 1 cpu_only_tail_max=") || strings.Contains(s, "reserve_steps=3 ") || strings.Contains(s, "pass 1 tail=") {
		t.Errorf("want only cpu_only_tail_max variants:\n%s", s)
	}
	err := Tune(context.Background(), TuneOptions{NodesPath: "testdata/nodes.csv", PodsPaths: []string{"testdata/pods.csv"}, TrainSeeds: []uint64{1}, TestSeeds: []uint64{2}, Only: []string{"nope"}}, &out)
	if !errors.Is(err, ErrBadOption) {
		t.Errorf("unknown --tune-only name: %v, want ErrBadOption", err)
	}
}

// The shipped CPU-only rule acts on the shapes learned from each seed's
// workload: on the openb pod lists it turns the CPU-only capacity tail off
// from cpu200 up and scores full nodes as FGD on cpu300 alone, makes both
// FGD's where the reserve is off (multigpu30 and up), and leaves the default pod
// list as it was.
func TestCPUOnlyRuleOnOpenB(t *testing.T) {
	for _, c := range []struct {
		trace string
		tail  sched.TailKey
		full  bool
	}{
		{"default", sched.TailCapacityCPUOnly, false},
		{"gpuspec05", sched.TailCapacityCPUOnly, false},
		{"cpu200", sched.TailNone, false},
		{"cpu250", sched.TailNone, false},
		{"cpu300", sched.TailNone, true},
		{"multigpu20", sched.TailCapacityCPUOnly, false},
		{"multigpu30", sched.TailNone, true}, // the reserve is off there
		{"multigpu40", sched.TailNone, true},
	} {
		o := Options{Trace: c.trace}
		specs, pods, err := load(&o)
		if err != nil {
			t.Fatal(err)
		}
		var capMilli int64
		for _, s := range specs {
			capMilli += int64(s.GPUs) * sched.MilliPerGPU
		}
		m := ShapeModel(Workload(pods, 42, 130, capMilli), 0.95)
		e := sched.DefaultFragParams().Effective(m)
		if e.Tail != c.tail || e.FullNodesAsFGD != c.full {
			t.Errorf("%s (CPU-only share %.3f): tail %v, full nodes as FGD %v; want %v, %v", c.trace, m.CPUOnlyShare(), e.Tail, e.FullNodesAsFGD, c.tail, c.full)
		}
	}
}

package resctrl

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakeRoot lays out a resctrl root as the kernel shows it on a two-socket
// Intel server with L3 allocation (20 ways) and memory bandwidth
// allocation (steps of 10%), or what files says instead.
func fakeRoot(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	all := map[string]string{
		"info/L3/cbm_mask":       "fffff\n",
		"info/L3/min_cbm_bits":   "1\n",
		"info/L3/num_closids":    "16\n",
		"info/MB/bandwidth_gran": "10\n",
		"info/MB/min_bandwidth":  "10\n",
		"info/last_cmd_status":   "ok\n",
		"schemata":               "    L3:0=fffff;1=fffff\n    MB:0=100;1=100\n",
	}
	for k, v := range files {
		all[k] = v
	}
	for name, body := range all {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if body == "" {
			continue
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestSchemataShares(t *testing.T) {
	f, err := Open(fakeRoot(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Resources(); got != "L3 (2 domains), MB (2 domains)" {
		t.Errorf("resources %q", got)
	}
	for share, want := range map[float64]string{
		1:     "L3:0=fffff;1=fffff\nMB:0=100;1=100\n",
		0.5:   "L3:0=3ff;1=3ff\nMB:0=50;1=50\n",
		0.21:  "L3:0=1f;1=1f\nMB:0=30;1=30\n", // 4.2 ways → 5; 21% → 30
		0.001: "L3:0=1;1=1\nMB:0=10;1=10\n",   // the floors
	} {
		got, err := f.Schemata(share)
		if err != nil || got != want {
			t.Errorf("share %g: %q, %v; want %q", share, got, err, want)
		}
	}
	for _, bad := range []float64{0, -1, 1.5} {
		if _, err := f.Schemata(bad); err == nil {
			t.Errorf("share %g accepted", bad)
		}
	}
}

// Code/data prioritisation splits L3 in two lines, described in
// info/L3CODE and info/L3DATA (info/L3 has no cbm_mask here); mba_MBps gives
// bandwidth in MBps; a mask need not start at way 0; resources fusiond
// does not drive are left out.
func TestSchemataVariants(t *testing.T) {
	f, err := Open(fakeRoot(t, map[string]string{
		"info/L3/cbm_mask":         "",
		"info/L3/min_cbm_bits":     "",
		"info/L3CODE/cbm_mask":     "ff0\n",
		"info/L3CODE/min_cbm_bits": "2\n",
		"info/L3DATA/cbm_mask":     "ff0\n",
		"info/L3DATA/min_cbm_bits": "2\n",
		"schemata":                 "L3CODE:0=ff0\nL3DATA:0=ff0\nMB:0=20000\nSMBA:0=100\n",
	}))
	if err != nil {
		t.Fatal(err)
	}
	got, err := f.Schemata(0.1)
	if want := "L3CODE:0=30\nL3DATA:0=30\nMB:0=2000\n"; err != nil || got != want {
		t.Errorf("share 0.1: %q, %v; want %q", got, err, want)
	}
}

func TestOpenWithoutResctrl(t *testing.T) {
	_, err := Open(filepath.Join(t.TempDir(), "none"))
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "none") {
		t.Errorf("no root: %v, want ErrUnavailable naming it", err)
	}
	if _, err := Open(fakeRoot(t, map[string]string{"schemata": "SMBA:0=100\n"})); !errors.Is(err, ErrUnavailable) {
		t.Errorf("nothing to allocate: %v", err)
	}
	if _, err := Open(fakeRoot(t, map[string]string{"schemata": "L3:0=zz\n"})); err == nil || errors.Is(err, ErrUnavailable) {
		t.Errorf("a bad schemata: %v, want a parse error", err)
	}
}

func TestGroupWritesAndMoves(t *testing.T) {
	root := fakeRoot(t, nil)
	f, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "info", "a/b", "..", "mon_groups"} {
		if _, err := f.Group(bad); err == nil {
			t.Errorf("group name %q accepted", bad)
		}
	}
	g, err := f.Group("fusiond-besteffort")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.SetShare(0.25); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "fusiond-besteffort", "schemata"))
	if err != nil || string(b) != "L3:0=1f;1=1f\nMB:0=30;1=30\n" || g.Share() != 0.25 {
		t.Errorf("schemata %q, %v, share %g", b, err, g.Share())
	}
	if n, err := g.Add([]int{10, 11}); n != 2 || err != nil {
		t.Fatalf("add: %d, %v", n, err)
	}
	if n, err := g.Add([]int{12}); n != 1 || err != nil {
		t.Fatalf("add: %d, %v", n, err)
	}
	if tids, err := g.Tasks(); err != nil || !slices.Equal(tids, []int{10, 11, 12}) {
		t.Errorf("tasks %v, %v", tids, err)
	}
	// Taking the group again keeps it.
	if _, err := f.Group("fusiond-besteffort"); err != nil {
		t.Errorf("group again: %v", err)
	}
}

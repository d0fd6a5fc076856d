package rapl

import (
	"bufio"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// tree expands a testdata/*.tree fixture (path=contents per line) into a
// temporary directory and returns it.
func tree(t *testing.T, name string) string {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	root := t.TempDir()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		p, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: bad line %q", name, line)
		}
		file := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return root
}

func setEnergy(t *testing.T, root, zone string, uj uint64) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(root, zone, "energy_uj"), []byte(strconv.FormatUint(uj, 10)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestOpenFindsPackageZonesOnly(t *testing.T) {
	m, err := Open(tree(t, "two-packages.tree"))
	if err != nil {
		t.Fatal(err)
	}
	z := m.Zones()
	if len(z) != 2 || z[0].Name != "package-0" || z[1].Name != "package-1" || z[0].Dir != "intel-rapl:0" {
		t.Fatalf("zones = %+v, want package-0 and package-1 (no dram sub-zones, no mmio zone)", z)
	}
	if z[0].MaxEnergyUJ != 262143328850 {
		t.Fatalf("max range = %d", z[0].MaxEnergyUJ)
	}
}

func TestReadPowerAndWrapAround(t *testing.T) {
	root := tree(t, "two-packages.tree")
	m, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	first, err := m.Read(t0)
	if err != nil {
		t.Fatal(err)
	}
	if first[0].Valid || first[1].Valid {
		t.Fatalf("first read has no interval, yet says valid: %+v", first)
	}
	// Package 0 sits 328850 µJ below its wrap point: 1 s later it reads
	// 171150, so it used 500000 µJ (0.5 J in 1 s = 0.5 W) across the wrap.
	// Package 1 uses 120 J in that second.
	setEnergy(t, root, "intel-rapl:0", 171150)
	setEnergy(t, root, "intel-rapl:1", 125000000)
	r, err := m.Read(t0.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if !r[0].Valid || math.Abs(r[0].PowerW-0.5) > 1e-9 {
		t.Errorf("package-0 across the wrap: %+v, want 0.5 W", r[0])
	}
	if !r[1].Valid || math.Abs(r[1].PowerW-120) > 1e-9 {
		t.Errorf("package-1: %+v, want 120 W", r[1])
	}
	// 100 ms later package 1 used 15 J: 150 W.
	setEnergy(t, root, "intel-rapl:1", 140000000)
	r, err = m.Read(t0.Add(1100 * time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(r[1].PowerW-150) > 1e-6 || r[0].PowerW != 0 {
		t.Errorf("after 100 ms: %+v, want package-0 0 W, package-1 150 W", r)
	}
}

func TestDelta(t *testing.T) {
	for _, c := range []struct{ prev, cur, max, want uint64 }{
		{10, 30, 100, 20},
		{90, 5, 100, 15},
		{100, 0, 100, 0},
		{0, 0, 100, 0},
	} {
		if got := Delta(c.prev, c.cur, c.max); got != c.want {
			t.Errorf("Delta(%d, %d, %d) = %d, want %d", c.prev, c.cur, c.max, got, c.want)
		}
	}
}

func TestOpenWithoutRAPL(t *testing.T) {
	if _, err := Open(tree(t, "no-rapl.tree")); !errors.Is(err, ErrNoZones) {
		t.Fatalf("no package zones: err = %v, want ErrNoZones", err)
	}
	if _, err := Open(filepath.Join(t.TempDir(), "absent")); !errors.Is(err, ErrNoZones) {
		t.Fatalf("missing root: err = %v, want ErrNoZones", err)
	}
	if _, err := Open(tree(t, "bad-max.tree")); err == nil || errors.Is(err, ErrNoZones) || !strings.Contains(err.Error(), "max_energy_range_uj") {
		t.Fatalf("bad max_energy_range_uj: err = %v", err)
	}
}

func TestReadFailsWhenCounterUnreadable(t *testing.T) {
	root := tree(t, "two-packages.tree")
	m, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(root, "intel-rapl:1", "energy_uj")); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Read(time.Now()); err == nil || !strings.Contains(err.Error(), "intel-rapl:1") {
		t.Fatalf("err = %v, want one naming the zone", err)
	}
}

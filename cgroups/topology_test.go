package cgroups

import (
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
)

// writeCPU makes cpuN in a fixture sysfs with its sibling list and node.
func writeCPU(t *testing.T, root string, cpu int, siblings string, node int) {
	t.Helper()
	dir := filepath.Join(root, "devices", "system", "cpu", "cpu"+strconv.Itoa(cpu))
	if err := os.MkdirAll(filepath.Join(dir, "topology"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "topology", "core_cpus_list"), []byte(siblings+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if node >= 0 {
		if err := os.Mkdir(filepath.Join(dir, "node"+strconv.Itoa(node)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func TestHostCoresFixture(t *testing.T) {
	root := t.TempDir()
	// Two nodes, two SMT cores each: node 0 has cpus 0,4 and 1,5; node 1
	// has 2,6 and 3,7. cpu 7 is offline.
	sib := map[int]string{0: "0,4", 4: "0,4", 1: "1,5", 5: "1,5", 2: "2,6", 6: "2,6", 3: "3,7"}
	for cpu, s := range sib {
		writeCPU(t, root, cpu, s, map[bool]int{true: 0, false: 1}[cpu%4 < 2])
	}
	if err := os.WriteFile(filepath.Join(root, "devices", "system", "cpu", "online"), []byte("0-6\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := HostCores(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []Core{{Node: 0, CPUs: []int{0, 4}}, {Node: 0, CPUs: []int{1, 5}}, {Node: 1, CPUs: []int{2, 6}}, {Node: 1, CPUs: []int{3}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("HostCores = %v, want %v", got, want)
	}
	if _, err := NewCPUAllocator(got, 1); err != nil {
		t.Fatalf("allocator refuses the cores: %v", err)
	}
}

func TestHostCoresMissing(t *testing.T) {
	if _, err := HostCores(t.TempDir()); err == nil {
		t.Fatal("no error for a sysfs without cpus")
	}
}

func TestHostCoresThisHost(t *testing.T) {
	cores, err := HostCores("/sys")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range cores {
		n += len(c.CPUs)
	}
	if online := len(onlineFromSys(t)); n != online {
		t.Fatalf("cores cover %d cpus, %d online", n, online)
	}
}

func onlineFromSys(t *testing.T) []int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		t.Fatal(err)
	}
	cpus, err := ParseCPUList(string(b[:len(b)-1]))
	if err != nil {
		t.Fatal(err)
	}
	return cpus
}

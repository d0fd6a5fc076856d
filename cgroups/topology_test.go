package cgroups

import (
	"context"
	"os"
	"reflect"
	"testing"

	"github.com/fusiond/fusiond/topology"
)

func TestCoresOfModel(t *testing.T) {
	// Two nodes, two SMT cores each: node 0 has cpus 0,4 and 1,5; node 1
	// has 2,6 and 3,7. cpu 7 is offline (topology leaves it out of its
	// core), and a core of the model may list its CPUs in any order.
	h := &topology.Host{Cores: []topology.Core{
		{Node: 1, ID: 3, CPUs: topology.NewCPUSet(3)},
		{Node: 0, ID: 0, CPUs: topology.NewCPUSet(4, 0)},
		{Node: 0, ID: 1, CPUs: topology.NewCPUSet(1, 5)},
		{Node: 1, ID: 2, CPUs: topology.NewCPUSet(2, 6)},
		{Node: 1, ID: 4, CPUs: topology.NewCPUSet()},
	}}
	got := CoresOf(h)
	want := []Core{{Node: 0, CPUs: []int{0, 4}}, {Node: 0, CPUs: []int{1, 5}}, {Node: 1, CPUs: []int{2, 6}}, {Node: 1, CPUs: []int{3}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("CoresOf = %v, want %v", got, want)
	}
	// A core on no known node counts as node 0.
	if got := CoresOf(&topology.Host{Cores: []topology.Core{{Node: topology.NoNode, CPUs: topology.NewCPUSet(0)}}}); !reflect.DeepEqual(got, []Core{{Node: 0, CPUs: []int{0}}}) {
		t.Fatalf("CoresOf(no node) = %v", got)
	}
}

func TestHostCoresMissing(t *testing.T) {
	if _, err := topology.Discover(context.Background(), topology.WithRoot(t.TempDir())); err == nil {
		t.Fatal("no error for a sysfs without cpus")
	}
}

func TestHostCoresThisHost(t *testing.T) {
	h, err := topology.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cores := CoresOf(h)
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

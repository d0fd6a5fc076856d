package topology

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fusiond/fusiond/devices"
	"github.com/fusiond/fusiond/topology/simhost"
)

func baseHost() *Host {
	return &Host{
		OnlineCPUs: NewCPUSet(0, 1, 2, 3),
		Nodes: []Node{
			{ID: 0, CPUs: NewCPUSet(0, 1), MemoryBytes: 100, Distances: []int{10, 21}},
			{ID: 1, CPUs: NewCPUSet(2, 3), MemoryBytes: 100, Distances: []int{21, 10}},
		},
		Devices: []PCIDevice{
			{Addr: "0000:00:00.0", Kind: KindGPU, Node: 0, LinkWidth: 16},
			{Addr: "0000:01:00.0", Kind: KindGPU, Node: 1, LinkWidth: 16},
		},
		Links: []devices.Link{{A: "0000:00:00.0", B: "0000:01:00.0", Type: devices.NVLink, Lanes: 18}},
	}
}

func TestDiff(t *testing.T) {
	tests := []struct {
		name   string
		change func(h *Host)
		want   []string
	}{
		{name: "no change", change: func(*Host) {}, want: nil},
		{
			name:   "device gone",
			change: func(h *Host) { h.Devices = h.Devices[:1] },
			want:   []string{"device-removed 0000:01:00.0: gpu"},
		},
		{
			name:   "device added",
			change: func(h *Host) { h.Devices = append(h.Devices, PCIDevice{Addr: "0000:02:00.0", Kind: KindNIC}) },
			want:   []string{"device-added 0000:02:00.0: nic"},
		},
		{
			name:   "link degraded",
			change: func(h *Host) { h.Devices[1].LinkWidth = 8 },
			want:   []string{"device-changed 0000:01:00.0: link_width 16 -> 8"},
		},
		{
			name: "cpu offlined",
			change: func(h *Host) {
				h.OnlineCPUs = NewCPUSet(0, 1, 2)
				h.Nodes[1].CPUs = NewCPUSet(2)
			},
			want: []string{"cpus-offline cpus 3", `node-changed node1: cpus "2-3" -> "2"`},
		},
		{
			name:   "cpu onlined",
			change: func(h *Host) { h.OnlineCPUs = NewCPUSet(0, 1, 2, 3, 4) },
			want:   []string{"cpus-online cpus 4"},
		},
		{
			name:   "memory hot-added",
			change: func(h *Host) { h.Nodes[0].MemoryBytes, h.Nodes[0].BlockMemoryBytes = 200, 256 },
			want:   []string{"node-changed node0: memory_bytes 100 -> 200, block_memory_bytes 0 -> 256"},
		},
		{
			name:   "node gone",
			change: func(h *Host) { h.Nodes = h.Nodes[:1] },
			want:   []string{"node-removed node1 cpus 2-3"},
		},
		{
			name:   "nvlink lanes down",
			change: func(h *Host) { h.Links[0].Lanes = 12 },
			want:   []string{"link-changed 0000:00:00.0: NVLink 0000:01:00.0 lanes 18 -> 12"},
		},
		{
			name:   "nvlink gone",
			change: func(h *Host) { h.Links = nil },
			want:   []string{"link-removed 0000:00:00.0: NVLink 0000:01:00.0 lanes 18 -> 0"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			old, new := baseHost(), baseHost()
			tt.change(new)
			var got []string
			for _, e := range Diff(old, new) {
				got = append(got, e.String())
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Diff = %q, want %q", got, tt.want)
			}
		})
	}
	if n := len(Diff(nil, baseHost())); n != 2+2+1+1 { // cpus, 2 nodes, 2 devices, 1 link
		t.Errorf("Diff(nil, h) has %d events", n)
	}
}

// sequence returns a Discover func that yields the hosts in turn.
func sequence(hosts ...*Host) func(context.Context) (*Host, error) {
	var mu sync.Mutex
	i := 0
	return func(context.Context) (*Host, error) {
		mu.Lock()
		defer mu.Unlock()
		if i >= len(hosts) {
			return hosts[len(hosts)-1], nil
		}
		i++
		if hosts[i-1] == nil {
			return nil, errors.New("discovery failed")
		}
		return hosts[i-1], nil
	}
}

func TestWatcherRefresh(t *testing.T) {
	gone := baseHost()
	gone.Devices = gone.Devices[:1]
	w := NewWatcher(WatcherConfig{Discover: sequence(baseHost(), nil, gone)})
	ch, cancel := w.Subscribe()
	defer cancel()
	ctx := context.Background()
	if ev, err := w.Refresh(ctx); err != nil || ev != nil || w.Current() == nil {
		t.Fatalf("first refresh: %v, %v", ev, err)
	}
	if _, err := w.Refresh(ctx); err == nil || len(w.Current().Devices) != 2 {
		t.Fatalf("failed refresh must keep Current: err=%v", err)
	}
	ev, err := w.Refresh(ctx)
	if err != nil || len(ev) != 1 || ev[0].Kind != DeviceRemoved {
		t.Fatalf("third refresh: %v, %v", ev, err)
	}
	select {
	case e := <-ch:
		if e.Kind != DeviceRemoved || e.Device != "0000:01:00.0" {
			t.Fatalf("published %v", e)
		}
	default:
		t.Fatal("nothing published")
	}
	cancel()
	cancel() // idempotent
	if _, ok := <-ch; ok {
		t.Fatal("channel open after cancel")
	}
}

func TestWatcherPeriodic(t *testing.T) {
	off := baseHost()
	off.OnlineCPUs = NewCPUSet(0, 1, 2)
	w := NewWatcher(WatcherConfig{Period: 5 * time.Millisecond, Discover: sequence(baseHost(), off)})
	ch, cancel := w.Subscribe()
	defer cancel()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	select {
	case e := <-ch:
		if e.Kind != CPUsOffline || !e.CPUs.Equal(NewCPUSet(3)) {
			t.Errorf("event %v", e)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no event from periodic refresh")
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestWatcherOnTree runs the Watcher over a real simhost tree: a GPU
// disappears from sysfs and a CPU goes offline.
func TestWatcherOnTree(t *testing.T) {
	root := writeSimhost(t)
	w := NewWatcher(WatcherConfig{Options: []Option{WithRoot(root), WithoutNames()}})
	ctx := context.Background()
	if _, err := w.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	gpu := simhost.GPUAddrs()[3]
	remove("/sys/bus/pci/devices/"+gpu)(t, root)
	offlineCPU(t, root, 5, "0-4,6-7\n", "0-1,4\n")
	ev, err := w.Refresh(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []EventKind
	for _, e := range ev {
		kinds = append(kinds, e.Kind)
		if e.Kind == DeviceRemoved && e.Device != PCIAddr(gpu) {
			t.Errorf("removed %s, want %s", e.Device, gpu)
		}
	}
	if !slices.Contains(kinds, DeviceRemoved) || !slices.Contains(kinds, CPUsOffline) {
		t.Fatalf("events %v", ev)
	}
}

func TestDiffDies(t *testing.T) {
	old, new := baseHost(), baseHost()
	old.Dies = []Die{{Socket: 0, ID: 0, CPUs: NewCPUSet(0, 1)}, {Socket: 1, ID: 0, CPUs: NewCPUSet(2, 3)}, {Socket: 1, ID: -1, CPUs: NewCPUSet(4)}}
	new.Dies = []Die{{Socket: 0, ID: 0, CPUs: NewCPUSet(0)}, {Socket: 0, ID: 1, CPUs: NewCPUSet(1)}}
	var got []string
	for _, e := range Diff(old, new) {
		got = append(got, e.String())
	}
	want := []string{
		`die-changed cpus 0: socket 0 die 0: cpus "0-1" -> "0"`,
		"die-added cpus 1: socket 0 die 1",
		"die-removed cpus 2-3: socket 1 die 0",
		"die-removed cpus 4: socket 1 die cpus 4",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Diff = %q, want %q", got, want)
	}
	if ev := Diff(new, new); len(ev) != 0 {
		t.Fatalf("no change: %v", ev)
	}
}

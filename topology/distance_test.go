package topology

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/fusiond/fusiond/devices"
	"github.com/fusiond/fusiond/topology/simhost"
)

func TestDistanceOnSimhost(t *testing.T) {
	h := discoverAt(t, writeSimhost(t))
	gpu := simhost.GPUAddrs()
	nic := simhost.NICAddrs()
	l := NewLocality(h)
	tests := []struct {
		a, b string
		want string
	}{
		{gpu[0], gpu[0], "X"},
		{gpu[0], gpu[1], "PIX"},  // same switch
		{gpu[0], nic[0], "PIX"},  // GPU and its NIC
		{gpu[0], gpu[2], "NODE"}, // other host bridge, same socket
		{gpu[1], nic[1], "NODE"},
		{gpu[0], gpu[4], "SYS"}, // other socket
		{gpu[7], nic[0], "SYS"},
		{gpu[2], "0000:24:00.0", "PHB"}, // NVMe on another root port of the same host bridge
		{gpu[2], "0000:20:01.0", "PXB"}, // GPU to its own root port: switch plus downstream port
		{"0000:31:00.0", "0000:32:00.0", "PIX"},
	}
	for _, tt := range tests {
		for _, pair := range [][2]string{{tt.a, tt.b}, {tt.b, tt.a}} {
			d, err := l.Between(PCIAddr(pair[0]), PCIAddr(pair[1]))
			if err != nil {
				t.Fatal(err)
			}
			if d.String() != tt.want {
				t.Errorf("Between(%s, %s) = %s, want %s", pair[0], pair[1], d, tt.want)
			}
		}
	}
	if _, err := l.Between("0000:ff:00.0", PCIAddr(gpu[0])); !errors.Is(err, ErrUnknownDevice) {
		t.Errorf("unknown device error = %v", err)
	}
}

// synthHost builds a Host by hand: two sockets, socket 0 split into two
// NUMA nodes (sub-NUMA clustering), node 3 memory-only.
func synthHost() *Host {
	dev := func(addr string, hb string, node NodeID, up ...PCIAddr) PCIDevice {
		return PCIDevice{Addr: PCIAddr(addr), HostBridge: hb, Node: node, Upstream: up, Kind: KindGPU}
	}
	h := &Host{
		Nodes: []Node{
			{ID: 0, Socket: 0, CPUs: NewCPUSet(0, 1)},
			{ID: 1, Socket: 0, CPUs: NewCPUSet(2, 3)},
			{ID: 2, Socket: 1, CPUs: NewCPUSet(4, 5)},
			{ID: 3, Socket: NoSocket},
		},
		Devices: []PCIDevice{
			dev("0000:01:00.0", "pci0000:00", 0, "0000:00:01.0", "0000:02:00.0", "0000:03:00.0", "0000:04:00.0", "0000:05:00.0"),
			dev("0000:02:00.0", "pci0000:00", 0, "0000:00:01.0", "0000:02:00.0", "0000:03:01.0", "0000:06:00.0", "0000:07:00.0"),
			dev("0000:03:00.0", "pci0000:00", 0, "0000:00:01.0", "0000:02:00.0", "0000:03:00.0", "0000:04:00.0", "0000:05:01.0"),
			dev("0000:40:00.0", "pci0000:40", 1),
			dev("0000:80:00.0", "pci0000:80", 2),
			dev("0000:90:00.0", "pci0000:90", NoNode),
			dev("0000:90:00.1", "pci0000:90", NoNode),
		},
		Links: []devices.Link{
			{A: "0000:40:00.0", B: "0000:80:00.0", Type: devices.NVLink, Lanes: 6},
			{A: "0000:80:00.0", B: "0000:40:00.0", Type: devices.NVLink, Lanes: 12},
		},
	}
	return h
}

func TestDistanceSynthetic(t *testing.T) {
	l := NewLocality(synthHost())
	tests := []struct {
		a, b string
		want string
	}{
		{"0000:01:00.0", "0000:03:00.0", "PIX"},  // below one switch (common 0000:04:00.0)
		{"0000:01:00.0", "0000:02:00.0", "PXB"},  // two switches under a parent switch
		{"0000:01:00.0", "0000:40:00.0", "NODE"}, // SNC nodes on one socket
		{"0000:40:00.0", "0000:80:00.0", "NV18"}, // NVLink beats PCIe; lanes add up
		{"0000:01:00.0", "0000:80:00.0", "SYS"},
		{"0000:01:00.0", "0000:90:00.0", "SYS"}, // unknown node is conservatively SYS
		{"0000:90:00.0", "0000:90:00.1", "PHB"}, // both on the root bus
	}
	for _, tt := range tests {
		d, err := l.Between(PCIAddr(tt.a), PCIAddr(tt.b))
		if err != nil {
			t.Fatal(err)
		}
		if d.String() != tt.want {
			t.Errorf("Between(%s, %s) = %s, want %s", tt.a, tt.b, d, tt.want)
		}
	}
}

func TestDistanceToCPUs(t *testing.T) {
	l := NewLocality(synthHost())
	tests := []struct {
		dev     string
		cpus    CPUSet
		want    string
		wantErr error
	}{
		{"0000:01:00.0", NewCPUSet(0, 1), "PHB", nil},
		{"0000:01:00.0", NewCPUSet(1, 2), "NODE", nil},
		{"0000:01:00.0", NewCPUSet(0, 4), "SYS", nil},
		{"0000:80:00.0", NewCPUSet(5), "PHB", nil},
		{"0000:01:00.0", NewCPUSet(0, 9), "SYS", nil}, // CPU 9 is in no node
		{"0000:90:00.0", NewCPUSet(0), "SYS", nil},    // device node unknown
		{"0000:01:00.0", CPUSet{}, "", ErrEmptyCPUSet},
		{"0000:aa:00.0", NewCPUSet(0), "", ErrUnknownDevice},
	}
	for _, tt := range tests {
		d, err := l.ToCPUs(PCIAddr(tt.dev), tt.cpus)
		if !errors.Is(err, tt.wantErr) {
			t.Errorf("ToCPUs(%s, %s) error = %v, want %v", tt.dev, tt.cpus, err, tt.wantErr)
			continue
		}
		if err == nil && d.String() != tt.want {
			t.Errorf("ToCPUs(%s, %s) = %s, want %s", tt.dev, tt.cpus, d, tt.want)
		}
	}
}

func TestDistanceText(t *testing.T) {
	for _, d := range []Distance{{Class: Self}, {Class: NV, Lanes: 18}, {Class: PIX}, {Class: PXB}, {Class: PHB}, {Class: NODE}, {Class: SYS}} {
		b, _ := d.MarshalText()
		var back Distance
		if err := back.UnmarshalText(b); err != nil || back != d {
			t.Errorf("round trip %v: %v, %v", d, back, err)
		}
	}
	for _, bad := range []string{"NV", "NV0", "NVx", "QPI", ""} {
		var d Distance
		if err := d.UnmarshalText([]byte(bad)); !errors.Is(err, ErrSyntax) {
			t.Errorf("UnmarshalText(%q) error = %v", bad, err)
		}
	}
}

type fakeLinks struct {
	links []devices.Link
	err   error
}

func (f fakeLinks) DeviceLinks(context.Context) ([]devices.Link, error) { return f.links, f.err }

var _ LinkSource = fakeLinks{}

func TestDiscoverWithLinks(t *testing.T) {
	root := writeSimhost(t)
	gpu := simhost.GPUAddrs()
	var links []devices.Link
	for i := 0; i < len(gpu); i++ { // NVSwitch: every pair 18 links
		for j := i + 1; j < len(gpu); j++ {
			links = append(links, devices.Link{A: gpu[i], B: gpu[j], Type: devices.NVLink, Lanes: 18})
		}
	}
	links = append(links, devices.Link{A: "0000:ee:00.0", B: gpu[0], Type: devices.NVLink, Lanes: 1})
	h := discoverAt(t, root, WithLinkSource(fakeLinks{links: links}))
	if len(h.Links) != len(links)-1 {
		t.Fatalf("kept %d links, want %d (one names an absent device)", len(h.Links), len(links)-1)
	}
	d, err := NewLocality(h).Between(PCIAddr(gpu[0]), PCIAddr(gpu[7]))
	if err != nil || d.String() != "NV18" {
		t.Fatalf("GPU0-GPU7 = %v, %v; want NV18", d, err)
	}
	h = discoverAt(t, root, WithLinkSource(fakeLinks{err: fmt.Errorf("nvml: %w", errors.New("driver gone"))}))
	if len(h.Links) != 0 || !hasWarning(h, "driver gone") {
		t.Fatalf("link source error not explained: links=%v warnings=%v", h.Links, h.Warnings)
	}
}

func BenchmarkDistanceBetween(b *testing.B) {
	h := discoverAt(b, writeSimhost(b, simhost.WithCoresPerSocket(simhost.CoresPerSocket)))
	l := NewLocality(h)
	gpu := simhost.GPUAddrs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, err := l.Between(PCIAddr(gpu[i%8]), PCIAddr(gpu[(i+3)%8])); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDistanceToCPUs(b *testing.B) {
	h := discoverAt(b, writeSimhost(b, simhost.WithCoresPerSocket(simhost.CoresPerSocket)))
	l := NewLocality(h)
	gpu := simhost.GPUAddrs()
	cpus := h.Nodes[0].CPUs
	for i := 0; b.Loop(); i++ {
		if _, err := l.ToCPUs(PCIAddr(gpu[i%8]), cpus); err != nil {
			b.Fatal(err)
		}
	}
}

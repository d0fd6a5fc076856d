package topology

import (
	"errors"
	"slices"
	"testing"
)

func TestParseMeminfoTotal(t *testing.T) {
	tests := []struct {
		in      string
		want    uint64
		wantErr bool
	}{
		{in: "MemTotal:       24000000 kB\nMemFree: 1 kB\n", want: 24000000 * 1024},
		{in: "Node 1 MemTotal:       4415916 kB\nNode 1 MemFree: 3 kB", want: 4415916 * 1024},
		{in: "MemFree: 1 kB\nMemTotal: 2 kB", want: 2048},
		{in: "MemTotal: 512", want: 512},
		{in: "MemFree: 1 kB", wantErr: true},
		{in: "MemTotal: x kB", wantErr: true},
		{in: "MemTotal: 1 MB", wantErr: true},
		{in: "MemTotal:", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseMeminfoTotal(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseMeminfoTotal(%q) = %d, %v; want %d, err=%v", tt.in, got, err, tt.want, tt.wantErr)
		}
		if err != nil && !errors.Is(err, ErrSyntax) {
			t.Errorf("error %v does not wrap ErrSyntax", err)
		}
	}
}

func TestParseDistances(t *testing.T) {
	tests := []struct {
		in      string
		want    []int
		wantErr bool
	}{
		{in: "10 21\n", want: []int{10, 21}},
		{in: "10", want: []int{10}},
		{in: "10  12 20 22", want: []int{10, 12, 20, 22}},
		{in: "", wantErr: true},
		{in: "10 x", wantErr: true},
		{in: "10 -1", wantErr: true},
		{in: "10 256", wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseDistances(tt.in)
		if (err != nil) != tt.wantErr || !slices.Equal(got, tt.want) {
			t.Errorf("ParseDistances(%q) = %v, %v; want %v, err=%v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParsePCIAddr(t *testing.T) {
	tests := []struct {
		in      string
		want    PCIAddr
		wantErr bool
	}{
		{in: "0000:3b:00.0", want: "0000:3b:00.0"},
		{in: "0000:3B:1F.7", want: "0000:3b:1f.7"},
		{in: "10000:e0:17.0", want: "10000:e0:17.0"},
		{in: "0000:3b:20.0", wantErr: true},
		{in: "0000:3b:00.8", wantErr: true},
		{in: "000:3b:00.0", wantErr: true},
		{in: "0000:3b:00", wantErr: true},
		{in: "0000:3g:00.0", wantErr: true},
		{in: "pci0000:00", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParsePCIAddr(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParsePCIAddr(%q) = %q, %v; want %q, err=%v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseDevicePath(t *testing.T) {
	tests := []struct {
		in        string
		wantHB    string
		wantChain []PCIAddr
		wantErr   bool
	}{
		{
			in:     "/sys/devices/pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:00.0/0000:00:00.0",
			wantHB: "pci0000:10", wantChain: []PCIAddr{"0000:10:01.0", "0000:11:00.0", "0000:12:00.0", "0000:00:00.0"},
		},
		{in: "/sys/devices/pci0000:00/0000:00:03.0", wantHB: "pci0000:00", wantChain: []PCIAddr{"0000:00:03.0"}},
		{
			in:     "/sys/devices/pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:17.0",
			wantHB: "pci0000:00", wantChain: []PCIAddr{"0000:00:0e.0", "10000:e0:17.0"},
		},
		{in: "/sys/devices/platform/foo", wantErr: true},
		{in: "/sys/devices/pci0000:00", wantErr: true},
	}
	for _, tt := range tests {
		hb, chain, err := parseDevicePath(tt.in)
		if (err != nil) != tt.wantErr || hb != tt.wantHB || !slices.Equal(chain, tt.wantChain) {
			t.Errorf("parseDevicePath(%q) = %q, %v, %v; want %q, %v, err=%v", tt.in, hb, chain, err, tt.wantHB, tt.wantChain, tt.wantErr)
		}
	}
}

// FuzzSysfsParsers feeds the same input to every sysfs text parser: none
// may panic, and accepted values must be self-consistent.
func FuzzSysfsParsers(f *testing.F) {
	for _, s := range []string{
		"Node 0 MemTotal: 1 kB", "MemTotal: 18446744073709551615 kB", "10 21", "0000:3b:00.0",
		"/sys/devices/pci0000:10/0000:10:01.0/0000:00:00.0", "10000:e0:17.0", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if m, err := ParseMeminfoTotal(s); err == nil && m/1024 > 1<<54 {
			t.Fatalf("MemTotal %d accepted beyond the 16 EiB bound", m)
		}
		if d, err := ParseDistances(s); err == nil {
			for _, x := range d {
				if x < 0 || x > 255 {
					t.Fatalf("distance %d accepted", x)
				}
			}
		}
		if a, err := ParsePCIAddr(s); err == nil {
			if again, err := ParsePCIAddr(string(a)); err != nil || again != a {
				t.Fatalf("PCI address %q not canonical", a)
			}
		}
		if hb, chain, err := parseDevicePath(s); err == nil && (hb == "" || len(chain) == 0) {
			t.Fatalf("parseDevicePath(%q) accepted without host bridge or chain", s)
		}
	})
}

package simhost_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/devices/fpga"
	"github.com/fusiond/fusiond/devices/fpga/bitstream"
	"github.com/fusiond/fusiond/devices/fpga/simhost"
)

func TestSamplesParse(t *testing.T) {
	ss, err := simhost.WriteSamples(t.TempDir(), 1001)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bitstream.UUID{"nlb0": simhost.AFUNLB0, "dma": simhost.AFUDMA, "gzip-d5005": simhost.AFUGzip, "vadd": simhost.XclbinVadd, "matmul": simhost.XclbinMatmul, "blinky": {}}
	if len(ss) != len(want) {
		t.Fatalf("%d samples, want %d", len(ss), len(want))
	}
	for _, s := range ss {
		data, err := os.ReadFile(s.Path)
		if err != nil {
			t.Fatal(err)
		}
		h, err := bitstream.Parse(data, int64(len(data)), filepath.Base(s.Path))
		if err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		if h.Format != s.Format || h.AFUID != want[s.Name] || h.PayloadSize%4 != 0 {
			t.Errorf("%s: %+v", s.Name, h)
		}
	}
}

// TestRewriteKeepsState programs a region, writes the host again over the
// same directory, and expects a new Manager to read the same bitstream.
func TestRewriteKeepsState(t *testing.T) {
	dir := t.TempDir()
	h, err := simhost.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	ss, err := simhost.WriteSamples(dir, 4096)
	if err != nil {
		t.Fatal(err)
	}
	lib, err := bitstream.OpenLibrary(filepath.Join(dir, "state"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range ss {
		if _, err := lib.AddFile(s.Path, ""); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	m, _ := fpga.NewManager(append(h.Options(), fpga.WithLibrary(lib))...)
	if err := m.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Program(ctx, simhost.DFL1, "dma"); err != nil {
		t.Fatal(err)
	}
	h2, err := simhost.Write(dir)
	if err != nil {
		t.Fatalf("second Write: %v", err)
	}
	m2, _ := fpga.NewManager(append(h2.Options(), fpga.WithLibrary(lib))...)
	rs, err := m2.Regions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.ID == simhost.DFL1 && r.LoadedName != "dma" {
			t.Errorf("after rewrite %s holds %q, want dma", r.ID, r.LoadedName)
		}
	}
	if len(rs) != 4 {
		t.Errorf("%d regions after rewrite", len(rs))
	}
}

func TestFailNextIsConsumedOnce(t *testing.T) {
	h, err := simhost.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pr := h.PortPR()
	dev := filepath.Join(h.Dev, "dfl-fme.0")
	h.FailNext(simhost.DFL0, "boom")
	err = pr.PortPR(context.Background(), fpga.PRRequest{Device: dev, Data: make([]byte, 8), AFUID: simhost.AFUDMA})
	if err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("first PR: %v", err)
	}
	if err := pr.PortPR(context.Background(), fpga.PRRequest{Device: dev, Data: make([]byte, 8), AFUID: simhost.AFUDMA}); err != nil {
		t.Fatalf("second PR: %v", err)
	}
	if err := pr.PortPR(context.Background(), fpga.PRRequest{Device: dev, Data: make([]byte, 6)}); err == nil {
		t.Errorf("unaligned PR accepted")
	}
}

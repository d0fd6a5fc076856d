package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/devices"
	"github.com/fusiond/fusiond/devices/nvidia"
)

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// h100x2 is what fusiond's inventory holds for the host of
// testdata/smi-q-h100x2.xml and the first two GPUs of topo-m-nvlink4.txt.
func h100x2() []nvidia.GPU {
	return []nvidia.GPU{
		{Index: 0, UUID: "GPU-6f0d2b7e-4a3c-9c6e-1d2f-3b4a5c6d7e8f", Model: "NVIDIA H100 80GB HBM3", MemoryMB: 81559,
			BDF: "0000:19:00.0", NUMANode: 0, Minor: 0, MIGCapable: true},
		{Index: 1, UUID: "GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9", Model: "NVIDIA H100 80GB HBM3", MemoryMB: 81559 - 328,
			BDF: "0000:3b:00.0", NUMANode: 0, Minor: 1, MIGCapable: true, MIGEnabled: true},
	}
}

func TestParseSMIQuery(t *testing.T) {
	l, err := parseSMIQuery(readFixture(t, "smi-q-h100x2.xml"))
	if err != nil {
		t.Fatal(err)
	}
	if l.DriverVersion != "550.54.15" || len(l.GPUs) != 2 {
		t.Fatalf("parsed %+v", l)
	}
	g := l.GPUs[1]
	if g.UUID != "GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9" || g.PCIBusID != "00000000:3B:00.0" || g.MIGCurrent != "Enabled" ||
		g.FBTotal != "81559 MiB" || g.FBReserved != "328 MiB" || g.MinorNumber != "1" {
		t.Errorf("gpu 1 %+v", g)
	}
	for name, in := range map[string]string{
		"not XML":       "Failed to initialize NVML: Driver/library version mismatch",
		"no gpu":        "<nvidia_smi_log><attached_gpus>0</attached_gpus></nvidia_smi_log>",
		"count differs": "<nvidia_smi_log><attached_gpus>2</attached_gpus><gpu id='x'><uuid>GPU-a</uuid></gpu></nvidia_smi_log>",
		"other root":    "<nvidia_smi><gpu/></nvidia_smi>",
	} {
		if _, err := parseSMIQuery([]byte(in)); err == nil || !strings.Contains(err.Error(), "nvidia-smi -q -x") {
			t.Errorf("%s: err %v", name, err)
		}
	}
}

func TestCompareInventory(t *testing.T) {
	l, err := parseSMIQuery(readFixture(t, "smi-q-h100x2.xml"))
	if err != nil {
		t.Fatal(err)
	}
	if d := compareInventory(h100x2(), l); len(d) != 0 {
		t.Fatalf("agreeing inventories differ: %v", d)
	}
	cases := []struct {
		name   string
		change func(g []nvidia.GPU) []nvidia.GPU
		want   string
	}{
		{"model", func(g []nvidia.GPU) []nvidia.GPU { g[0].Model = "H100"; return g }, `gpu 0: model "H100"`},
		{"pci", func(g []nvidia.GPU) []nvidia.GPU { g[1].BDF = "0000:3c:00.0"; return g }, "gpu 1: PCI 0000:3c:00.0, nvidia-smi 0000:3b:00.0"},
		{"minor", func(g []nvidia.GPU) []nvidia.GPU { g[1].Minor = 7; return g }, "gpu 1: minor 7, nvidia-smi 1"},
		{"mig mode", func(g []nvidia.GPU) []nvidia.GPU { g[0].MIGEnabled = true; return g }, "gpu 0: MIG enabled=true, nvidia-smi Disabled"},
		{"memory", func(g []nvidia.GPU) []nvidia.GPU { g[0].MemoryMB = 40960; return g }, "gpu 0: memory 40960 MiB, nvidia-smi 81559 MiB"},
		{"missing GPU", func(g []nvidia.GPU) []nvidia.GPU { return g[:1] }, "nvidia-smi GPU GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9: not seen by fusiond"},
		{"unknown GPU", func(g []nvidia.GPU) []nvidia.GPU { g[1].UUID = "GPU-other"; return g }, "gpu 1 GPU-other: not in nvidia-smi"},
	}
	for _, c := range cases {
		d := compareInventory(c.change(h100x2()), l)
		if len(d) == 0 || !strings.Contains(strings.Join(d, "\n"), c.want) {
			t.Errorf("%s: differences %q, want one with %q", c.name, d, c.want)
		}
	}
	bad := l
	bad.GPUs = append([]smiGPU(nil), l.GPUs...)
	bad.GPUs[0].FBTotal = "80 GB"
	if d := compareInventory(h100x2(), bad); len(d) != 1 || !strings.Contains(d[0], `memory "80 GB"`) {
		t.Errorf("unparsable memory: %q", d)
	}
}

func TestParseSMITopo(t *testing.T) {
	top, err := parseSMITopo(string(readFixture(t, "topo-m-nvlink4.txt")))
	if err != nil {
		t.Fatal(err)
	}
	if top.GPUs != 4 || len(top.NVLink) != 6 || top.NVLink[[2]int{0, 3}] != 18 || top.NVLink[[2]int{2, 3}] != 18 {
		t.Errorf("nvlink host: %+v", top)
	}
	if top.NUMA[0] != "0" || top.NUMA[3] != "1" {
		t.Errorf("NUMA affinities %v", top.NUMA)
	}
	pcie, err := parseSMITopo(string(readFixture(t, "topo-m-pcie2.txt")))
	if err != nil {
		t.Fatal(err)
	}
	if pcie.GPUs != 2 || len(pcie.NVLink) != 0 || pcie.NUMA[1] != "1" {
		t.Errorf("pcie host: %+v", pcie)
	}
	for name, in := range map[string]string{
		"empty":        "",
		"no header":    "GPU0\t X \n",
		"error text":   "Failed to initialize NVML: Unknown Error\n",
		"bad NV cell":  "\tGPU0\tGPU1\nGPU0\t X \tNVx\nGPU1\tNVx\t X \n",
		"short row":    "\tGPU0\tGPU1\nGPU0\t X \nGPU1\tSYS\t X \n",
		"rows != cols": "\tGPU0\tGPU1\nGPU0\t X \tSYS\n",
		"no GPU rows":  "\tGPU0\nNIC0\t X \n",
		"negative NV":  "\tGPU0\tGPU1\nGPU0\t X \tNV-2\nGPU1\tNV-2\t X \n",
	} {
		if _, err := parseSMITopo(in); err == nil || !strings.Contains(err.Error(), "nvidia-smi topo -m") {
			t.Errorf("%s: err %v", name, err)
		}
	}
}

func TestCompareTopology(t *testing.T) {
	top, err := parseSMITopo(string(readFixture(t, "topo-m-nvlink4.txt")))
	if err != nil {
		t.Fatal(err)
	}
	gpus := []nvidia.GPU{
		{Index: 0, BDF: "0000:19:00.0", NUMANode: 0}, {Index: 1, BDF: "0000:3b:00.0", NUMANode: 0},
		{Index: 2, BDF: "0000:9a:00.0", NUMANode: 1}, {Index: 3, BDF: "0000:bb:00.0", NUMANode: 1},
	}
	var links []devices.Link
	for a := range gpus {
		for b := a + 1; b < len(gpus); b++ {
			links = append(links, devices.Link{A: gpus[a].BDF, B: strings.ToUpper(gpus[b].BDF), Type: devices.NVLink, Lanes: 18})
		}
	}
	if d := compareTopology(gpus, links, top); len(d) != 0 {
		t.Fatalf("agreeing topologies differ: %v", d)
	}
	// An NVSwitch host where fusiond sees no GPU-to-GPU links (NVML names
	// the switch as the remote end): every pair differs.
	if d := compareTopology(gpus, nil, top); len(d) != 6 || d[0] != "GPU0-GPU1: fusiond 0 NVLinks, nvidia-smi 18" {
		t.Errorf("no links: %q", d)
	}
	wrong := append([]devices.Link(nil), links...)
	wrong[0].Lanes = 12
	gpus[3].NUMANode = 0
	d := compareTopology(gpus, wrong, top)
	if len(d) != 2 || d[0] != "GPU0-GPU1: fusiond 12 NVLinks, nvidia-smi 18" || d[1] != "gpu 3: NUMA node 0, nvidia-smi 1" {
		t.Errorf("differences %q", d)
	}
	if d := compareTopology(gpus[:3], links, top); len(d) == 0 || !strings.Contains(d[0], "fusiond sees 3 GPUs, nvidia-smi topo 4") {
		t.Errorf("GPU count: %q", d)
	}
}

// FuzzParseSMI feeds arbitrary text to both parsers: errors, never panics.
func FuzzParseSMI(f *testing.F) {
	f.Add(readFixtureF(f, "smi-q-h100x2.xml"))
	f.Add(readFixtureF(f, "topo-m-nvlink4.txt"))
	f.Add(readFixtureF(f, "topo-m-pcie2.txt"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if l, err := parseSMIQuery(data); err == nil {
			_ = compareInventory(h100x2(), l)
		}
		if top, err := parseSMITopo(string(data)); err == nil {
			_ = compareTopology(h100x2(), nil, top)
		}
	})
}

func readFixtureF(f *testing.F, name string) []byte {
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		f.Fatal(err)
	}
	return b
}

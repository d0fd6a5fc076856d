package main

import (
	"encoding/xml"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/fusiond/fusiond/devices"
	"github.com/fusiond/fusiond/devices/nvidia"
)

// smiGPU is what the check reads of one GPU in `nvidia-smi -q -x` (the
// nvsmi_device XML NVIDIA documents: <nvidia_smi_log><gpu id="BDF">...).
type smiGPU struct {
	ID          string `xml:"id,attr"`
	ProductName string `xml:"product_name"`
	UUID        string `xml:"uuid"`
	MinorNumber string `xml:"minor_number"`
	PCIBusID    string `xml:"pci>pci_bus_id"`
	MIGCurrent  string `xml:"mig_mode>current_mig"`
	FBTotal     string `xml:"fb_memory_usage>total"`
	FBReserved  string `xml:"fb_memory_usage>reserved"`
}

type smiLog struct {
	XMLName       xml.Name `xml:"nvidia_smi_log"`
	DriverVersion string   `xml:"driver_version"`
	AttachedGPUs  int      `xml:"attached_gpus"`
	GPUs          []smiGPU `xml:"gpu"`
}

// parseSMIQuery parses `nvidia-smi -q -x` output.
func parseSMIQuery(data []byte) (smiLog, error) {
	var l smiLog
	if err := xml.Unmarshal(data, &l); err != nil {
		return smiLog{}, fmt.Errorf("nvidia-smi -q -x: %w", err)
	}
	if len(l.GPUs) == 0 {
		return smiLog{}, errors.New("nvidia-smi -q -x: no <gpu> element")
	}
	if l.AttachedGPUs != 0 && l.AttachedGPUs != len(l.GPUs) {
		return smiLog{}, fmt.Errorf("nvidia-smi -q -x: attached_gpus %d but %d <gpu> elements", l.AttachedGPUs, len(l.GPUs))
	}
	return l, nil
}

// mib parses an nvidia-smi memory figure ("81559 MiB").
func mib(s string) (uint64, error) {
	f := strings.Fields(s)
	if len(f) != 2 || f[1] != "MiB" {
		return 0, fmt.Errorf("memory %q: want \"<n> MiB\"", s)
	}
	return strconv.ParseUint(f[0], 10, 64)
}

// normBDF turns nvidia-smi's 8-digit-domain PCI address (00000000:07:00.0)
// and NVML's into fusiond's form: lower case, 4-digit domain.
func normBDF(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	if i := strings.IndexByte(s, ':'); i > 4 {
		s = s[i-4:]
	}
	return s
}

// compareInventory reports every difference between fusiond's inventory
// and nvidia-smi's, one line each; none means they agree. Memory may be
// below nvidia-smi's total by at most its reserved figure plus 1%
// (drivers report the framebuffer with or without the reserved part).
func compareInventory(gpus []nvidia.GPU, l smiLog) []string {
	var diffs []string
	if len(gpus) != len(l.GPUs) {
		diffs = append(diffs, fmt.Sprintf("fusiond sees %d GPUs, nvidia-smi %d", len(gpus), len(l.GPUs)))
	}
	byUUID := map[string]smiGPU{}
	for _, s := range l.GPUs {
		byUUID[strings.TrimSpace(s.UUID)] = s
	}
	for _, g := range gpus {
		s, ok := byUUID[g.UUID]
		if !ok {
			diffs = append(diffs, fmt.Sprintf("gpu %d %s: not in nvidia-smi", g.Index, g.UUID))
			continue
		}
		delete(byUUID, g.UUID)
		if name := strings.TrimSpace(s.ProductName); name != g.Model {
			diffs = append(diffs, fmt.Sprintf("gpu %d: model %q, nvidia-smi %q", g.Index, g.Model, name))
		}
		if bdf := normBDF(s.PCIBusID); bdf != normBDF(g.BDF) {
			diffs = append(diffs, fmt.Sprintf("gpu %d: PCI %s, nvidia-smi %s", g.Index, g.BDF, bdf))
		}
		if m := strings.TrimSpace(s.MinorNumber); m != "" && m != "N/A" && m != strconv.Itoa(g.Minor) {
			diffs = append(diffs, fmt.Sprintf("gpu %d: minor %d, nvidia-smi %s", g.Index, g.Minor, m))
		}
		switch mig := strings.TrimSpace(s.MIGCurrent); {
		case mig == "Enabled" && !g.MIGEnabled, mig == "Disabled" && g.MIGEnabled:
			diffs = append(diffs, fmt.Sprintf("gpu %d: MIG enabled=%t, nvidia-smi %s", g.Index, g.MIGEnabled, mig))
		case (mig == "" || mig == "N/A") && g.MIGCapable:
			diffs = append(diffs, fmt.Sprintf("gpu %d: MIG-capable for fusiond, nvidia-smi reports no MIG mode", g.Index))
		}
		total, err := mib(s.FBTotal)
		if err != nil {
			diffs = append(diffs, fmt.Sprintf("gpu %d: nvidia-smi %v", g.Index, err))
			continue
		}
		reserved, _ := mib(s.FBReserved) // absent before driver 510
		slack := reserved + total/100
		if g.MemoryMB > total+slack || g.MemoryMB+slack < total {
			diffs = append(diffs, fmt.Sprintf("gpu %d: memory %d MiB, nvidia-smi %d MiB (reserved %d)", g.Index, g.MemoryMB, total, reserved))
		}
	}
	for _, u := range slices.Sorted(maps.Keys(byUUID)) {
		diffs = append(diffs, fmt.Sprintf("nvidia-smi GPU %s: not seen by fusiond", u))
	}
	return diffs
}

// smiTopo is what the check reads of `nvidia-smi topo -m`: the NVLink
// bond width of each GPU pair (NV# cells) and each GPU's NUMA affinity.
type smiTopo struct {
	GPUs int
	// NVLink maps GPU index pairs (a < b) to their bonded link count.
	NVLink map[[2]int]int
	// NUMA is each GPU's "NUMA Affinity" cell ("0", "0-1", "N/A").
	NUMA map[int]string
}

// parseSMITopo parses the matrix `nvidia-smi topo -m` prints: a header
// row of tab-separated column names (GPU0.., NIC0.., CPU Affinity, NUMA
// Affinity, GPU NUMA ID), one row per GPU and NIC, then a Legend.
func parseSMITopo(out string) (smiTopo, error) {
	t := smiTopo{NVLink: map[[2]int]int{}, NUMA: map[int]string{}}
	lines := strings.Split(strings.ReplaceAll(out, "\r", ""), "\n")
	var header []string
	gpuCols := 0
	for i, line := range lines {
		if strings.TrimSpace(line) == "" {
			continue
		}
		cells := strings.Split(line, "\t")
		for k := range cells {
			cells[k] = strings.TrimSpace(cells[k])
		}
		if header == nil {
			if len(cells) < 2 || !strings.HasPrefix(cells[1], "GPU") {
				return smiTopo{}, fmt.Errorf("nvidia-smi topo -m: line %d: want a header of GPU columns, got %q", i+1, line)
			}
			header = cells
			for _, h := range header {
				if _, ok := gpuIndex(h); ok {
					gpuCols++
				}
			}
			continue
		}
		if strings.HasPrefix(cells[0], "Legend") {
			break
		}
		row, ok := gpuIndex(cells[0])
		if !ok {
			continue // a NIC row
		}
		// nvidia-smi pads the last columns with an extra tab ("0\t\tN/A"):
		// cells beyond the header are ignored, but every GPU column must
		// be there.
		if len(cells) < gpuCols+1 {
			return smiTopo{}, fmt.Errorf("nvidia-smi topo -m: line %d: %d cells, the header has %d GPU columns", i+1, len(cells), gpuCols)
		}
		t.GPUs++
		for k := 1; k < min(len(cells), len(header)); k++ {
			name := header[k]
			if col, ok := gpuIndex(name); ok {
				c := cells[k]
				if n, ok := strings.CutPrefix(c, "NV"); ok {
					lanes, err := strconv.Atoi(n)
					if err != nil || lanes <= 0 {
						return smiTopo{}, fmt.Errorf("nvidia-smi topo -m: line %d: cell %q", i+1, c)
					}
					if row < col {
						t.NVLink[[2]int{row, col}] = lanes
					}
				}
				continue
			}
			if name == "NUMA Affinity" {
				t.NUMA[row] = cells[k]
			}
		}
	}
	if header == nil || t.GPUs == 0 {
		return smiTopo{}, errors.New("nvidia-smi topo -m: no GPU rows")
	}
	if t.GPUs != gpuCols {
		return smiTopo{}, fmt.Errorf("nvidia-smi topo -m: %d GPU rows but %d GPU columns", t.GPUs, gpuCols)
	}
	return t, nil
}

// gpuIndex parses "GPU3".
func gpuIndex(s string) (int, bool) {
	n, ok := strings.CutPrefix(s, "GPU")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(n)
	return i, err == nil && i >= 0
}

// compareTopology reports every difference between fusiond's NVLink pairs
// and NUMA nodes and nvidia-smi's matrix, one line each.
func compareTopology(gpus []nvidia.GPU, links []devices.Link, t smiTopo) []string {
	var diffs []string
	if t.GPUs != len(gpus) {
		diffs = append(diffs, fmt.Sprintf("fusiond sees %d GPUs, nvidia-smi topo %d", len(gpus), t.GPUs))
	}
	idx := map[string]int{}
	for _, g := range gpus {
		idx[normBDF(g.BDF)] = g.Index
	}
	ours := map[[2]int]int{}
	for _, l := range links {
		a, okA := idx[normBDF(l.A)]
		b, okB := idx[normBDF(l.B)]
		if !okA || !okB {
			continue
		}
		ours[[2]int{min(a, b), max(a, b)}] = l.Lanes
	}
	pairs := map[[2]int]bool{}
	for p := range ours {
		pairs[p] = true
	}
	for p := range t.NVLink {
		pairs[p] = true
	}
	keys := make([][2]int, 0, len(pairs))
	for p := range pairs {
		keys = append(keys, p)
	}
	slices.SortFunc(keys, func(x, y [2]int) int {
		if x[0] != y[0] {
			return x[0] - y[0]
		}
		return x[1] - y[1]
	})
	for _, p := range keys {
		if ours[p] != t.NVLink[p] {
			diffs = append(diffs, fmt.Sprintf("GPU%d-GPU%d: fusiond %d NVLinks, nvidia-smi %d", p[0], p[1], ours[p], t.NVLink[p]))
		}
	}
	for _, g := range gpus {
		n, ok := t.NUMA[g.Index]
		if !ok {
			continue
		}
		want, err := strconv.Atoi(n)
		if err != nil {
			continue // N/A or a range: nothing single to compare
		}
		if want != g.NUMANode {
			diffs = append(diffs, fmt.Sprintf("gpu %d: NUMA node %d, nvidia-smi %d", g.Index, g.NUMANode, want))
		}
	}
	return diffs
}

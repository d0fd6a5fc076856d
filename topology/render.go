package topology

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// WriteTree writes a readable tree of h: sockets (with their dies, where
// the kernel reports dies) → NUMA nodes → L3 groups → cores, then the PCIe tree per host bridge with accelerators and NICs
// marked, then the discovery warnings.
func WriteTree(w io.Writer, h *Host) error {
	ew := &errWriter{w: w}
	ew.printf("Host %s: %d sockets, %d NUMA nodes, %d cores, %d CPUs online", cmp.Or(h.Hostname, "?"),
		len(h.Sockets), len(h.Nodes), len(h.Cores), h.OnlineCPUs.Len())
	if !h.OfflineCPUs.IsEmpty() {
		ew.printf(", offline %s", h.OfflineCPUs)
	}
	ew.printf("\n")
	for _, l := range h.CoreKindLines() {
		ew.printf("Hybrid cores (%s) %s\n", h.CoreKindSource, l)
	}
	for _, s := range h.Sockets {
		ew.printf("Socket %d  cpus %s\n", s.ID, s.CPUs)
		for _, d := range h.Dies {
			if d.Socket == s.ID {
				ew.printf("  Die %d  cpus %s\n", d.ID, d.CPUs)
			}
		}
		for _, id := range s.Nodes {
			writeNode(ew, h, h.Node(id), "  ")
		}
	}
	for i := range h.Nodes {
		if h.Nodes[i].Socket == NoSocket {
			ew.printf("Memory-only\n")
			writeNode(ew, h, &h.Nodes[i], "  ")
		}
	}
	writePCITree(ew, h)
	if len(h.Links) > 0 {
		ew.printf("Links\n")
		for _, l := range h.Links {
			ew.printf("  %s <-> %s  %s x%d\n", l.A, l.B, l.Type, l.Lanes)
		}
	}
	if len(h.Warnings) > 0 {
		ew.printf("Warnings\n")
		for _, m := range h.Warnings {
			ew.printf("  ! %s\n", m)
		}
	}
	return ew.err
}

func writeNode(ew *errWriter, h *Host, n *Node, indent string) {
	if n == nil {
		return
	}
	dist := make([]string, len(n.Distances))
	for i, d := range n.Distances {
		dist[i] = strconv.Itoa(d)
	}
	ew.printf("%sNUMA node %d  cpus %s  memory %s  distances [%s]\n", indent, n.ID, cmp.Or(n.CPUs.String(), "-"),
		humanBytes(n.MemoryBytes), strings.Join(dist, " "))
	var cores []Core
	for _, c := range h.Cores {
		if c.Node == n.ID {
			cores = append(cores, c)
		}
	}
	for _, g := range h.L3 {
		var in []Core
		for _, c := range cores {
			if c.L3 == g.ID {
				in = append(in, c)
			}
		}
		if len(in) == 0 {
			continue
		}
		ew.printf("%s  L3 #%d %s  cpus %s\n", indent, g.ID, humanBytes(g.SizeBytes), g.CPUs)
		writeCores(ew, in, indent+"    ")
	}
	var noL3 []Core
	for _, c := range cores {
		if c.L3 < 0 {
			noL3 = append(noL3, c)
		}
	}
	writeCores(ew, noL3, indent+"  ")
}

// writeCores prints cores as "core ID [cpus]", several per line.
func writeCores(ew *errWriter, cores []Core, indent string) {
	const perLine = 8
	for i := 0; i < len(cores); i += perLine {
		var parts []string
		for _, c := range cores[i:min(i+perLine, len(cores))] {
			parts = append(parts, fmt.Sprintf("core %d [%s]", c.ID, c.CPUs))
		}
		ew.printf("%s%s\n", indent, strings.Join(parts, "  "))
	}
}

func writePCITree(ew *errWriter, h *Host) {
	if len(h.Devices) == 0 {
		return
	}
	children := map[PCIAddr][]*PCIDevice{}
	roots := map[string][]*PCIDevice{}
	for i := range h.Devices {
		d := &h.Devices[i]
		if p := d.Parent(); p != "" && h.Device(p) != nil {
			children[p] = append(children[p], d)
		} else {
			roots[d.HostBridge] = append(roots[d.HostBridge], d)
		}
	}
	hbs := make([]string, 0, len(roots))
	for hb := range roots {
		hbs = append(hbs, hb)
	}
	slices.Sort(hbs)
	ew.printf("PCIe\n")
	for _, hb := range hbs {
		ew.printf("  %s (node %s)\n", hb, nodeLabel(roots[hb][0].Node))
		var walk func(d *PCIDevice, indent string)
		walk = func(d *PCIDevice, indent string) {
			ew.printf("%s%s\n", indent, deviceLine(d))
			for _, c := range children[d.Addr] {
				walk(c, indent+"  ")
			}
		}
		for _, d := range roots[hb] {
			walk(d, "    ")
		}
	}
}

// deviceLine is one device in the tree; accelerators and NICs get a
// marker in front ("[GPU]", "[NIC]").
func deviceLine(d *PCIDevice) string {
	var sb strings.Builder
	if d.Kind.IsAccelerator() || d.Kind == KindNIC {
		sb.WriteString("[" + strings.ToUpper(string(d.Kind)) + "] ")
	}
	sb.WriteString(string(d.Addr))
	name := strings.TrimSpace(d.VendorName + " " + cmp.Or(d.DeviceName, fmt.Sprintf("[%04x:%04x]", d.VendorID, d.DeviceID)))
	fmt.Fprintf(&sb, " %s: %s", cmp.Or(d.ClassName, fmt.Sprintf("class %06x", d.Class)), name)
	if d.LinkWidth > 0 || d.LinkSpeed != "" {
		fmt.Fprintf(&sb, "  %s x%d", strings.TrimSuffix(d.LinkSpeed, " PCIe"), d.LinkWidth)
	}
	if d.Kind.IsAccelerator() || d.Kind == KindNIC {
		fmt.Fprintf(&sb, "  node %s", nodeLabel(d.Node))
	}
	return sb.String()
}

func nodeLabel(n NodeID) string {
	if n == NoNode {
		return "N/A"
	}
	return strconv.Itoa(int(n))
}

func humanBytes(b uint64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTPE"[exp])
}

// MatrixDevices returns the devices WriteMatrix shows: accelerators and
// NICs in address order, with their labels (GPU0, NIC0, ...), numbered
// per kind in address order.
func MatrixDevices(h *Host) (addrs []PCIAddr, labels []string) {
	count := map[DeviceKind]int{}
	for _, d := range h.Devices {
		if !d.Kind.IsAccelerator() && d.Kind != KindNIC {
			continue
		}
		addrs = append(addrs, d.Addr)
		labels = append(labels, fmt.Sprintf("%s%d", strings.ToUpper(string(d.Kind)), count[d.Kind]))
		count[d.Kind]++
	}
	return addrs, labels
}

// WriteMatrix writes the device distance matrix in the layout of
// nvidia-smi topo -m: one row and column per accelerator and NIC, then
// each device's CPU and NUMA affinity, then a legend.
func WriteMatrix(w io.Writer, h *Host) error {
	addrs, labels := MatrixDevices(h)
	m, err := NewLocality(h).Matrix(addrs)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	ew := &errWriter{w: tw}
	ew.printf("\t%s\tCPU Affinity\tNUMA Affinity\n", strings.Join(labels, "\t"))
	for i, a := range addrs {
		row := make([]string, len(m[i]))
		for j, d := range m[i] {
			row[j] = d.String()
		}
		d := h.Device(a)
		ew.printf("%s\t%s\t%s\t%s\n", labels[i], strings.Join(row, "\t"), cmp.Or(d.LocalCPUs.String(), "N/A"), nodeLabel(d.Node))
	}
	if ew.err == nil {
		ew.err = tw.Flush()
	}
	ew.w = w
	ew.printf("\nLegend:\n\n" +
		"  X    = Self\n" +
		"  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n" +
		"  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node\n" +
		"  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n" +
		"  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)\n" +
		"  PIX  = Connection traversing at most a single PCIe bridge\n" +
		"  NV#  = Connection traversing a bonded set of # NVLinks\n\n" +
		"Devices:\n\n")
	for i, a := range addrs {
		d := h.Device(a)
		ew.printf("  %-6s %s %s\n", labels[i], a, strings.TrimSpace(d.VendorName+" "+d.DeviceName))
	}
	return ew.err
}

// errWriter keeps the first write error.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, args ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, args...)
	}
}

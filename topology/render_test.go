package topology

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/topology/simhost"
)

func TestWriteMatrix(t *testing.T) {
	h := discoverAt(t, writeSimhost(t))
	var buf bytes.Buffer
	if err := WriteMatrix(&buf, h); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(buf.String(), "\n")
	header := strings.Fields(lines[0])
	addrs, labels := MatrixDevices(h)
	if len(labels) != len(simhost.GPUAddrs())+len(simhost.NICAddrs()) || header[0] != labels[0] {
		t.Fatalf("labels %v, header %v", labels, header)
	}
	l := NewLocality(h)
	for i, a := range addrs {
		row := strings.Fields(lines[1+i])
		if row[0] != labels[i] || len(row) != 1+len(addrs)+2 {
			t.Fatalf("row %d = %v", i, row)
		}
		for j, b := range addrs {
			d, _ := l.Between(a, b)
			if row[1+j] != d.String() {
				t.Errorf("cell %s/%s = %s, want %s", labels[i], labels[j], row[1+j], d)
			}
		}
		if want := nodeLabel(h.Device(a).Node); row[len(row)-1] != want {
			t.Errorf("%s NUMA affinity %s, want %s", labels[i], row[len(row)-1], want)
		}
	}
	for _, a := range simhost.GPUAddrs() {
		if !strings.Contains(buf.String(), a) {
			t.Errorf("legend lacks %s", a)
		}
	}
}

func TestWriteTree(t *testing.T) {
	root := writeSimhost(t)
	offlineCPU(t, root, 5, "0-4,6-7\n", "0-1,4\n")
	h := discoverAt(t, root)
	h.Nodes = append(h.Nodes, Node{ID: 2, Socket: NoSocket, MemoryBytes: 1 << 30})
	var buf bytes.Buffer
	if err := WriteTree(&buf, h); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"Socket 0", "Socket 1", "  Die 0  cpus ", "NUMA node 0", "NUMA node 1", "offline 5", "Memory-only", "NUMA node 2", "1.0 GiB", "L3 #0", "Warnings"} {
		if !strings.Contains(out, want) {
			t.Errorf("tree lacks %q", want)
		}
	}
	for _, d := range h.Devices {
		line := lineWith(out, string(d.Addr))
		marked := strings.Contains(line, "["+strings.ToUpper(string(d.Kind))+"] ")
		if marked != (d.Kind.IsAccelerator() || d.Kind == KindNIC) {
			t.Errorf("marker wrong for %s (%s): %q", d.Addr, d.Kind, line)
		}
	}
	// Each GPU is printed deeper than its switch's downstream port.
	gpu := h.Device(PCIAddr(simhost.GPUAddrs()[0]))
	if indent(lineWith(out, string(gpu.Addr))) <= indent(lineWith(out, string(gpu.Parent()))) {
		t.Error("GPU not nested under its parent bridge")
	}
}

func lineWith(s, substr string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) && !strings.Contains(l, "<->") {
			return l
		}
	}
	return ""
}

func indent(s string) int { return len(s) - len(strings.TrimLeft(s, " ")) }

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestRenderWriteErrors(t *testing.T) {
	h := synthHost()
	if err := WriteTree(failWriter{}, h); err == nil {
		t.Error("WriteTree ignored a write error")
	}
	if err := WriteMatrix(failWriter{}, h); err == nil {
		t.Error("WriteMatrix ignored a write error")
	}
}

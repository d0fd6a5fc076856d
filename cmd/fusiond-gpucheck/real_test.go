package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/devices/nvidia"
)

// fakeTools writes shell scripts standing in for nvidia-smi, python3 and
// nvidia-cuda-mps-control into a directory and returns a checker over the
// simulated dgxh200 that finds them there (and nothing else), with the
// simulated-host skips off, so that each step runs its real code path on
// the scripts' output.
func fakeTools(t *testing.T, scripts map[string]string) (*checker, *bytes.Buffer, string) {
	t.Helper()
	m, err := nvidia.Open(nvidia.WithSimulated("dgxh200"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	dir := t.TempDir()
	for name, body := range scripts {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	c := newChecker(m, &out)
	c.simulated = false
	c.procWait = 300 * time.Millisecond
	c.lookPath = func(name string) (string, error) {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err != nil {
			return "", exec.ErrNotFound
		}
		return p, nil
	}
	return c, &out, dir
}

// smiFor writes nvidia-smi outputs that agree with the simulated host:
// the -q -x XML of its GPUs (model changed to model for GPU 0 when not
// empty) and its topology matrix (every pair NV2, NUMA node index/4).
func smiFor(t *testing.T, m *nvidia.Manager, dir, model string) string {
	t.Helper()
	var x strings.Builder
	gpus := m.GPUs()
	fmt.Fprintf(&x, "<?xml version=\"1.0\" ?>\n<nvidia_smi_log>\n<driver_version>550.54.15</driver_version>\n<attached_gpus>%d</attached_gpus>\n", len(gpus))
	for _, g := range gpus {
		name := g.Model
		if g.Index == 0 && model != "" {
			name = model
		}
		mig := "Disabled"
		if g.MIGEnabled {
			mig = "Enabled"
		}
		fmt.Fprintf(&x, "<gpu id=\"0000%s\"><product_name>%s</product_name><mig_mode><current_mig>%s</current_mig></mig_mode><uuid>%s</uuid><minor_number>%d</minor_number><pci><pci_bus_id>0000%s</pci_bus_id></pci><fb_memory_usage><total>%d MiB</total><reserved>0 MiB</reserved></fb_memory_usage></gpu>\n",
			strings.ToUpper(g.BDF), name, mig, g.UUID, g.Minor, strings.ToUpper(g.BDF), g.MemoryMB)
	}
	x.WriteString("</nvidia_smi_log>\n")
	var topo strings.Builder
	for _, g := range gpus {
		fmt.Fprintf(&topo, "\tGPU%d", g.Index)
	}
	topo.WriteString("\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n")
	for _, g := range gpus {
		fmt.Fprintf(&topo, "GPU%d", g.Index)
		for _, h := range gpus {
			if h.Index == g.Index {
				topo.WriteString("\t X ")
			} else {
				topo.WriteString("\tNV2")
			}
		}
		fmt.Fprintf(&topo, "\t0-15\t%d\t\tN/A\n", g.Index/4)
	}
	topo.WriteString("\nLegend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n")
	for name, body := range map[string]string{"q.xml": x.String(), "topo.txt": topo.String()} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return fmt.Sprintf("case \"$1\" in -q) cat %s/q.xml;; topo) cat %s/topo.txt;; *) exit 2;; esac\n", dir, dir)
}

func TestRealChecksWithoutTools(t *testing.T) {
	c, out, _ := fakeTools(t, nil)
	if err := c.realChecks(context.Background()); err != nil {
		t.Fatalf("only skips, yet: %v\n%s", err, out)
	}
	s := out.String()
	for _, want := range []string{
		"SKIP  inventory vs nvidia-smi -q -x: no nvidia-smi",
		"SKIP  topology vs nvidia-smi topo -m: no nvidia-smi",
		"PASS  NVML event subscription: Xid and double-bit ECC events registered on 8 GPU(s)",
		"SKIP  per-process memory during a CUDA allocation: no python3\n",
		"SKIP  MPS memory cap: no MPS",
		"OK: real-GPU checks complete",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q:\n%s", want, s)
		}
	}
	c, out, _ = fakeTools(t, map[string]string{"python3": "exit 1\n", "nvidia-cuda-mps-control": "exit 0\n"})
	if err := c.realChecks(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); strings.Count(s, "\nSKIP ") != 4 || !strings.Contains(s, "MPS memory cap: no python3 torch|cupy") ||
		!strings.Contains(s, "CUDA allocation: no python3 torch|cupy") {
		t.Errorf("python3 without torch or cupy:\n%s", s)
	}
}

func TestRealChecksSMI(t *testing.T) {
	c, out, dir := fakeTools(t, nil)
	if err := os.WriteFile(filepath.Join(dir, "nvidia-smi"), []byte("#!/bin/sh\n"+smiFor(t, c.m, dir, "")), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := c.realChecks(context.Background()); err != nil {
		t.Fatalf("agreeing nvidia-smi: %v\n%s", err, out)
	}
	for _, want := range []string{"PASS  inventory vs nvidia-smi -q -x: 8 GPU(s) agree", "driver 550.54.15",
		"PASS  topology vs nvidia-smi topo -m: 8 GPU(s), 28 NVLink pair(s)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}

	c, out, dir = fakeTools(t, nil)
	if err := os.WriteFile(filepath.Join(dir, "nvidia-smi"), []byte("#!/bin/sh\n"+smiFor(t, c.m, dir, "NVIDIA H100 80GB HBM3")), 0o755); err != nil {
		t.Fatal(err)
	}
	err := c.realChecks(context.Background())
	if err == nil || err.Error() != "real-GPU checks: 1 failed: inventory vs nvidia-smi -q -x" {
		t.Fatalf("err %v\n%s", err, out)
	}
	if !strings.Contains(out.String(), `FAIL  inventory vs nvidia-smi -q -x: gpu 0: model "NVIDIA H200 141GB HBM3e", nvidia-smi "NVIDIA H100 80GB HBM3"`) {
		t.Errorf("report:\n%s", out)
	}

	c, out, _ = fakeTools(t, map[string]string{"nvidia-smi": "echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'; exit 9\n"})
	if err := c.realChecks(context.Background()); err == nil || !strings.Contains(err.Error(), "2 failed") {
		t.Fatalf("failing nvidia-smi: %v\n%s", err, out)
	}
	if !strings.Contains(out.String(), "FAIL  inventory vs nvidia-smi -q -x: nvidia-smi -q -x: exit status 9") {
		t.Errorf("report:\n%s", out)
	}
}

// fakePython stands in for python3 with torch: it "allocates" argv[3] MiB,
// failing like torch when CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (0=NM) is below
// it unless capIgnored, and holds it until stdin closes.
func fakePython(capIgnored bool) string {
	ignore := "0"
	if capIgnored {
		ignore = "1"
	}
	return `[ "$1" = -c ] && [ "$2" = "import torch" ] && exit 0
[ "$1" = -c ] && [ "$2" = "import cupy" ] && exit 1
cap=${CUDA_MPS_PINNED_DEVICE_MEM_LIMIT#0=}; cap=${cap%M}
if [ -n "$cap" ] && [ "$3" -gt "$cap" ] && [ ` + ignore + ` = 0 ]; then
  echo "OOM CUDA out of memory. Tried to allocate $3.00 MiB"; exit 0
fi
echo "READY $$"; cat >/dev/null
`
}

func TestRealChecksCUDA(t *testing.T) {
	c, out, dir := fakeTools(t, nil)
	ctl := fmt.Sprintf("echo \"$* pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY stdin=$( [ \"$1\" = -d ] || cat)\" >> %s/mps.log\n", dir)
	for name, body := range map[string]string{"python3": fakePython(false), "nvidia-cuda-mps-control": ctl} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The simulated GPUs run no process: the per-process step fails, the
	// MPS step passes (256 MiB allocates, 1024 MiB fails under 512 MiB).
	err := c.realChecks(context.Background())
	if err == nil || err.Error() != "real-GPU checks: 1 failed: per-process memory during a CUDA allocation" {
		t.Fatalf("err %v\n%s", err, out)
	}
	s := out.String()
	if !strings.Contains(s, "not in fusiond's per-process memory") ||
		!strings.Contains(s, "PASS  MPS memory cap: under a 512 MiB MPS cap 256 MiB allocates and 1024 MiB fails (OOM CUDA out of memory. Tried to allocate 1024.00 MiB)") {
		t.Errorf("report:\n%s", s)
	}
	log, err := os.ReadFile(filepath.Join(dir, "mps.log"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(log)), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "-d pipe=") || !strings.HasSuffix(lines[1], "stdin=quit") {
		t.Fatalf("MPS control calls %q, want start (-d) then quit", lines)
	}
	pipe := strings.Fields(strings.TrimPrefix(lines[0], "-d pipe="))[0]
	if !strings.HasPrefix(pipe, os.TempDir()) || strings.HasPrefix(pipe, "/tmp/nvidia-mps") {
		t.Errorf("MPS pipe directory %q, want a temporary one of its own", pipe)
	}
	if _, err := os.Stat(pipe); !os.IsNotExist(err) {
		t.Errorf("MPS temporary directory %s left behind: %v", pipe, err)
	}

	// A cap that is not enforced fails the step.
	c, out, dir = fakeTools(t, map[string]string{"python3": fakePython(true), "nvidia-cuda-mps-control": "cat >/dev/null; exit 0\n"})
	_ = dir
	if err := c.realChecks(context.Background()); err == nil || !strings.Contains(err.Error(), "MPS memory cap") {
		t.Fatalf("unenforced cap: %v\n%s", err, out)
	}
	if !strings.Contains(out.String(), "1024 MiB allocated under a 512 MiB MPS cap: the cap is not enforced") {
		t.Errorf("report:\n%s", out)
	}
}

func TestFindProcess(t *testing.T) {
	ss := []nvidia.Sample{{UUID: "GPU-a", Processes: []nvidia.ProcessUsage{{PID: 10, MemoryMB: 900}}},
		{UUID: "GPU-b", Processes: []nvidia.ProcessUsage{{PID: 42, MemoryMB: 300, GIID: -1}}}}
	if got, _ := findProcess(ss, 42, 256); got != "pid 42 holds 300 MiB on GPU-b (allocated 256 MiB)" {
		t.Errorf("found %q", got)
	}
	if got, seen := findProcess(ss, 42, 512); got != "" || len(seen) != 2 {
		t.Errorf("pid 42 under 512 MiB: %q %v", got, seen)
	}
	if got, _ := findProcess(ss, 7, 1); got != "" {
		t.Errorf("absent pid found: %q", got)
	}
}

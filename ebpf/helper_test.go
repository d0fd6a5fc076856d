package ebpf

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The test binary doubles as the workload: with FUSIOND_EBPFHELPER set,
// TestMain runs a helper instead of the tests. Every helper first waits for
// a line on stdin, so the test can move it into its cgroup (and attach its
// probes) before it acts.
const helperEnv = "FUSIOND_EBPFHELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelper(mode))
	}
	os.Exit(m.Run())
}

func runHelper(mode string) int {
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fmt.Fprintln(os.Stderr, "helper: stdin:", err)
		return 2
	}
	verb, arg, _ := strings.Cut(mode, ":")
	switch verb {
	case "wake": // wake:N sleeps 1 ms N times, for at most 20 s
		n, _ := strconv.Atoi(arg)
		end := time.Now().Add(20 * time.Second)
		for i := 0; i < n && time.Now().Before(end); i++ {
			time.Sleep(time.Millisecond)
		}
		return 0
	case "hog":
		for x := 0; ; x++ {
			_ = x * x
		}
	case "block":
		select {}
	}
	fmt.Fprintln(os.Stderr, "helper: unknown mode", mode)
	return 2
}

// testCgroup is a cgroup made for one test: on v1 in the cpu hierarchy
// (what the probe reads there), on v2 in the unified hierarchy.
type testCgroup struct {
	dir string
	id  uint64
}

// cgroupV1 reports whether the cpu controller is on cgroup v1 here.
func cgroupV1(t testing.TB) bool {
	t.Helper()
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return false
	}
	if _, err := os.Stat("/sys/fs/cgroup/cpu/cgroup.procs"); err != nil {
		t.Fatalf("no cgroup v2 at /sys/fs/cgroup and no v1 cpu hierarchy: %v", err)
	}
	return true
}

func newTestCgroup(t testing.TB, name string) *testCgroup {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("real-kernel eBPF tests need root")
	}
	base := "/sys/fs/cgroup"
	if cgroupV1(t) {
		base = "/sys/fs/cgroup/cpu"
	}
	dir := filepath.Join(base, fmt.Sprintf("fusiond-ebpf-%d-%s", os.Getpid(), name))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("create cgroup: %v", err)
	}
	id, err := CgroupID(dir)
	if err != nil {
		t.Fatal(err)
	}
	cg := &testCgroup{dir: dir, id: id}
	t.Cleanup(func() {
		for i := 0; ; i++ {
			err := os.Remove(dir)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				return
			}
			if i == 100 {
				t.Errorf("remove %s: %v", dir, err)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	return cg
}

// setLowWeight gives cg an eighth of the default CPU weight (v1
// cpu.shares 128, v2 cpu.weight 12).
func (cg *testCgroup) setLowWeight(t testing.TB) {
	t.Helper()
	file, val := "cpu.weight", "12"
	if cgroupV1(t) {
		file, val = "cpu.shares", "128"
	} else {
		// The cpu controller must be on for the root's children.
		if err := os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte("+cpu"), 0); err != nil {
			t.Fatalf("enable the cpu controller: %v", err)
		}
	}
	if err := os.WriteFile(filepath.Join(cg.dir, file), []byte(val), 0); err != nil {
		t.Fatalf("set the weight of %s: %v", cg.dir, err)
	}
}

// helper is a started workload process, moved into its cgroup and waiting
// for go().
type helper struct {
	cmd *exec.Cmd
	in  *os.File
}

// startHelper starts the test binary as mode (under the name argv0 when not
// empty, which becomes its comm), in cg.
func startHelper(t testing.TB, mode, argv0 string, cg *testCgroup) *helper {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if argv0 != "" {
		link := filepath.Join(t.TempDir(), argv0)
		if err := os.Symlink(exe, link); err != nil {
			t.Fatal(err)
		}
		exe = link
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r, os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	h := &helper{cmd: cmd, in: w}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		w.Close()
	})
	if cg != nil {
		if err := os.WriteFile(filepath.Join(cg.dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
			t.Fatalf("move helper into %s: %v", cg.dir, err)
		}
	}
	return h
}

func (h *helper) start(t testing.TB) {
	t.Helper()
	if _, err := h.in.WriteString("go\n"); err != nil {
		t.Fatal(err)
	}
}

func (h *helper) wait(t testing.TB) {
	t.Helper()
	if err := h.cmd.Wait(); err != nil {
		t.Fatalf("helper: %v", err)
	}
}

func loadProbe(t testing.TB) *Probe {
	t.Helper()
	p, err := Load(WithCgroupV1(cgroupV1(t)))
	if err != nil {
		t.Fatalf("the kernel cannot run the probe: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return p
}

package cgroups

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The test binary doubles as the job process: with FUSIOND_CGHELPER set,
// TestMain runs a helper instead of the tests. Every helper first waits for
// a line on stdin, so the test can move it into its cgroup before it acts.
const helperEnv = "FUSIOND_CGHELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelper(mode))
	}
	os.Exit(m.Run())
}

// Helper exit codes.
const (
	helperEPERM = 13
	helperError = 14
)

func runHelper(mode string) int {
	in := bufio.NewReader(os.Stdin)
	if mode != "child" {
		if _, err := in.ReadString('\n'); err != nil {
			fmt.Fprintln(os.Stderr, "helper: stdin:", err)
			return helperError
		}
	}
	verb, arg, _ := strings.Cut(mode, ":")
	switch verb {
	case "hog":
		for x := 0; ; x++ {
			_ = x * x
		}
	case "sleep", "child":
		time.Sleep(time.Hour)
	case "affinity":
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(0, &set); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return helperError
		}
		var cpus []string
		for i := range 1024 {
			if set.IsSet(i) {
				cpus = append(cpus, strconv.Itoa(i))
			}
		}
		fmt.Println(strings.Join(cpus, ","))
	case "alloc":
		n, _ := strconv.Atoi(arg)
		var keep [][]byte
		for got := 0; got < n; got += 1 << 20 {
			b := make([]byte, 1<<20)
			for i := range b {
				b[i] = 1
			}
			keep = append(keep, b)
		}
		fmt.Println("allocated", len(keep))
		time.Sleep(time.Hour)
	case "open":
		f, err := os.OpenFile(arg, os.O_RDONLY, 0)
		if errors.Is(err, unix.EPERM) {
			return helperEPERM
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return helperError
		}
		f.Close()
	case "work":
		// One fixed unit of CPU work per input line, answered with a line.
		x := uint64(88172645463325252)
		for {
			if _, err := in.ReadString('\n'); err != nil {
				return 0
			}
			for range 5_000_000 {
				x ^= x << 13
				x ^= x >> 7
				x ^= x << 17
			}
			fmt.Println(x & 1)
		}
	case "fork":
		n, _ := strconv.Atoi(arg)
		for range n {
			c := exec.Command(os.Args[0])
			c.Env = append(os.Environ(), helperEnv+"=child")
			if err := c.Start(); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return helperError
			}
		}
		time.Sleep(time.Hour)
	default:
		fmt.Fprintln(os.Stderr, "unknown helper", mode)
		return helperError
	}
	return 0
}

// helper is a started helper process waiting for its go line.
type helper struct {
	cmd   *exec.Cmd
	stdin interface{ Write([]byte) (int, error) }
	out   *strings.Builder
}

// startHelper starts the helper and moves it into cg before releasing it.
func startHelper(t testing.TB, cg *Cgroup, mode string) *helper {
	t.Helper()
	return startHelperWith(t, cg.AddProc, mode, nil)
}

// startHelperWith starts the helper and calls move with its pid before
// releasing it.
// Output goes to stdout, or to h.out when stdout is nil.
func startHelperWith(t testing.TB, move func(pid int) error, mode string, stdout io.Writer) *helper {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	out := &strings.Builder{}
	cmd.Stdout = out
	cmd.Stderr = out
	if stdout != nil {
		cmd.Stdout = stdout
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{cmd: cmd, stdin: in, out: out}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_, _ = cmd.Process.Wait()
		}
	})
	if err := move(cmd.Process.Pid); err != nil {
		t.Fatalf("move helper into its cgroup: %v", err)
	}
	if _, err := in.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	return h
}

// wait waits for the helper to end and returns its wait status.
func (h *helper) wait(t *testing.T, limit time.Duration) syscall.WaitStatus {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- h.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(limit):
		_ = h.cmd.Process.Kill()
		<-done
		t.Fatalf("helper did not end within %v; output %q", limit, h.out.String())
	}
	return h.cmd.ProcessState.Sys().(syscall.WaitStatus)
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fusiond/fusiond/devices/nvidia"
)

// The real-GPU part: steps that compare fusiond's view with the driver's
// own tools and exercise event subscription, per-process memory and an
// MPS memory cap. None changes MIG mode, clocks or power limits or resets
// a GPU; the only thing started is an MPS control daemon in its own
// temporary pipe directory, quit again at the end of its step.

// result is a step's outcome.
type result string

const (
	pass result = "PASS"
	fail result = "FAIL"
	skip result = "SKIP"
)

// allocMiB is the CUDA allocation the per-process and MPS steps make;
// capMiB the MPS memory cap (an allocation of 2×capMiB must fail under it).
const (
	allocMiB = 256
	capMiB   = 512
)

// checker runs the steps; its tools are injectable for tests.
type checker struct {
	m   *nvidia.Manager
	out io.Writer
	// procWait is how long the per-process step waits for the
	// allocation to show in telemetry.
	procWait time.Duration
	// simulated skips the steps that need the real driver's tools.
	simulated bool
	// lookPath and command are exec.LookPath and exec.CommandContext.
	lookPath func(string) (string, error)
	command  func(ctx context.Context, name string, args ...string) *exec.Cmd
	failed   []string
}

func newChecker(m *nvidia.Manager, out io.Writer) *checker {
	return &checker{m: m, out: out, simulated: m.Simulated() != "", procWait: 10 * time.Second, lookPath: exec.LookPath, command: exec.CommandContext}
}

func (c *checker) report(step string, r result, detail string) {
	fmt.Fprintf(c.out, "%-5s %s: %s\n", r, step, detail)
	if r == fail {
		c.failed = append(c.failed, step)
	}
}

// realChecks runs every step, each under its own timeout within ctx's.
func (c *checker) realChecks(ctx context.Context) error {
	fmt.Fprintln(c.out, "== real-GPU checks (read-only; PASS/FAIL/SKIP per step)")
	steps := []struct {
		name    string
		timeout time.Duration
		fn      func(context.Context) (result, string)
	}{
		{"inventory vs nvidia-smi -q -x", 60 * time.Second, c.inventory},
		{"topology vs nvidia-smi topo -m", 60 * time.Second, c.topology},
		{"NVML event subscription", 30 * time.Second, c.events},
		{"per-process memory during a CUDA allocation", 120 * time.Second, c.processMemory},
		{"MPS memory cap", 150 * time.Second, c.mpsCap},
	}
	for _, s := range steps {
		sctx, cancel := context.WithTimeout(ctx, s.timeout)
		r, d := s.fn(sctx)
		if sctx.Err() != nil && r != pass {
			r, d = fail, fmt.Sprintf("timed out after %s: %s", s.timeout, d)
		}
		cancel()
		c.report(s.name, r, d)
	}
	if len(c.failed) > 0 {
		return fmt.Errorf("real-GPU checks: %d failed: %s", len(c.failed), strings.Join(c.failed, "; "))
	}
	fmt.Fprintln(c.out, "OK: real-GPU checks complete (nothing was changed)")
	return nil
}

// smi runs nvidia-smi with args: its output and pass, or skip (no
// nvidia-smi to compare with) or fail (it failed) and why.
func (c *checker) smi(ctx context.Context, args ...string) ([]byte, result, string) {
	if c.simulated {
		return nil, skip, "simulated host"
	}
	path, err := c.lookPath("nvidia-smi")
	if err != nil {
		return nil, skip, "no nvidia-smi"
	}
	out, err := c.command(ctx, path, args...).Output()
	if err != nil {
		return nil, fail, fmt.Sprintf("nvidia-smi %s: %v", strings.Join(args, " "), err)
	}
	return out, pass, ""
}

func (c *checker) inventory(ctx context.Context) (result, string) {
	out, r, why := c.smi(ctx, "-q", "-x")
	if r != pass {
		return r, why
	}
	l, err := parseSMIQuery(out)
	if err != nil {
		return fail, err.Error()
	}
	if d := compareInventory(c.m.GPUs(), l); len(d) > 0 {
		return fail, strings.Join(d, "; ")
	}
	return pass, fmt.Sprintf("%d GPU(s) agree (UUID, model, PCI, minor, MIG mode, memory), driver %s", len(l.GPUs), strings.TrimSpace(l.DriverVersion))
}

func (c *checker) topology(ctx context.Context) (result, string) {
	out, r, why := c.smi(ctx, "topo", "-m")
	if r != pass {
		return r, why
	}
	t, err := parseSMITopo(string(out))
	if err != nil {
		return fail, err.Error()
	}
	links, err := c.m.DeviceLinks(ctx)
	if err != nil {
		return fail, fmt.Sprintf("fusiond NVLinks: %v", err)
	}
	if d := compareTopology(c.m.GPUs(), links, t); len(d) > 0 {
		return fail, strings.Join(d, "; ")
	}
	return pass, fmt.Sprintf("%d GPU(s), %d NVLink pair(s) and the NUMA affinities agree", t.GPUs, len(t.NVLink))
}

func (c *checker) events(context.Context) (result, string) {
	n, got, err := c.m.CheckEvents(time.Second)
	if errors.Is(err, nvidia.ErrNotSupported) {
		return fail, fmt.Sprintf("NVML event sets not supported (%v): fusiond falls back to probing only", err)
	}
	if err != nil {
		return fail, err.Error()
	}
	detail := fmt.Sprintf("Xid and double-bit ECC events registered on %d GPU(s); no event within 1s", n)
	if got {
		detail = fmt.Sprintf("registered on %d GPU(s); an event arrived within 1s (see the health watch above)", n)
	}
	return pass, detail
}

// cudaScript allocates argv[1] MiB on the first visible GPU with torch or
// cupy, prints "READY <pid>" (or "OOM <message>" when the allocation
// fails) and holds it until stdin closes.
const cudaScript = `import os, sys
mib = int(sys.argv[1])
try:
    import torch
    def alloc(n): return torch.empty(n << 20, dtype=torch.uint8, device="cuda")
    oom = (torch.cuda.OutOfMemoryError, RuntimeError)
except ImportError:
    import cupy
    def alloc(n): return cupy.empty(n << 20, dtype=cupy.uint8)
    oom = (cupy.cuda.memory.OutOfMemoryError, cupy.cuda.runtime.CUDARuntimeError)
try:
    buf = alloc(mib)
except oom as e:
    print("OOM", str(e).splitlines()[0] if str(e) else type(e).__name__, flush=True)
    sys.exit(0)
print("READY", os.getpid(), flush=True)
sys.stdin.read()
`

// cudaPython finds python3 with torch or cupy; the reason when there is none.
func (c *checker) cudaPython(ctx context.Context) (string, string) {
	if c.simulated {
		return "", "simulated host"
	}
	py, err := c.lookPath("python3")
	if err != nil {
		return "", "no python3"
	}
	if c.command(ctx, py, "-c", "import torch").Run() != nil && c.command(ctx, py, "-c", "import cupy").Run() != nil {
		return "", "no python3 torch|cupy"
	}
	return py, ""
}

// allocation is a running CUDA allocation.
type allocation struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	pid   int
}

func (a *allocation) stop() {
	_ = a.stdin.Close()
	_ = a.cmd.Wait()
}

// allocate runs cudaScript for mib MiB with env added; it returns the
// running allocation, or the OOM line, or an error.
func (c *checker) allocate(ctx context.Context, py string, mib int, env []string) (*allocation, string, error) {
	cmd := c.command(ctx, py, "-c", cudaScript, strconv.Itoa(mib))
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = io.Discard
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, "", err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	a := &allocation{cmd: cmd, stdin: stdin}
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	f := strings.Fields(line)
	switch {
	case len(f) == 2 && f[0] == "READY":
		a.pid, err = strconv.Atoi(f[1])
		if err == nil {
			return a, "", nil
		}
	case len(f) > 0 && f[0] == "OOM":
		a.stop()
		return nil, strings.TrimSpace(line), nil
	}
	a.stop()
	return nil, "", fmt.Errorf("CUDA allocation of %d MiB: unexpected output %q", mib, strings.TrimSpace(line))
}

func (c *checker) processMemory(ctx context.Context) (result, string) {
	py, why := c.cudaPython(ctx)
	if py == "" {
		return skip, why
	}
	a, oom, err := c.allocate(ctx, py, allocMiB, nil)
	switch {
	case err != nil:
		return fail, err.Error()
	case a == nil:
		return fail, fmt.Sprintf("%d MiB allocation failed: %s", allocMiB, oom)
	}
	defer a.stop()
	var seen []string
	for deadline := time.Now().Add(c.procWait); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(200 * time.Millisecond) {
		ss, err := c.m.SampleAll(ctx)
		if err != nil {
			return fail, fmt.Sprintf("telemetry: %v", err)
		}
		var found string
		if found, seen = findProcess(ss, a.pid, allocMiB); found != "" {
			return pass, found
		}
	}
	return fail, fmt.Sprintf("pid %d with >= %d MiB not in fusiond's per-process memory within %s (seen: %v; a PID namespace hides host PIDs)", a.pid, allocMiB, c.procWait, seen)
}

// mpsCap starts an MPS control daemon in a temporary pipe directory, runs
// one client capped at capMiB (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) that
// allocates allocMiB (must succeed) and one that allocates 2×capMiB (must
// fail), then quits the daemon.
func (c *checker) mpsCap(ctx context.Context) (result, string) {
	if c.simulated {
		return skip, "simulated host"
	}
	ctl, err := c.lookPath("nvidia-cuda-mps-control")
	if err != nil {
		return skip, "no MPS (nvidia-cuda-mps-control not found)"
	}
	py, why := c.cudaPython(ctx)
	if py == "" {
		return skip, why
	}
	dir, err := os.MkdirTemp("", "fusiond-gpucheck-mps-")
	if err != nil {
		return fail, err.Error()
	}
	defer os.RemoveAll(dir)
	env := []string{"CUDA_MPS_PIPE_DIRECTORY=" + filepath.Join(dir, "pipe"), "CUDA_MPS_LOG_DIRECTORY=" + filepath.Join(dir, "log")}
	for _, d := range []string{"pipe", "log"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			return fail, err.Error()
		}
	}
	start := c.command(ctx, ctl, "-d")
	start.Env = append(os.Environ(), env...)
	if out, err := start.CombinedOutput(); err != nil {
		return fail, fmt.Sprintf("starting an MPS control daemon in %s: %v %s", dir, err, strings.TrimSpace(string(out)))
	}
	defer func() {
		// Quit even when ctx has ended: a fresh, short context.
		qctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		q := c.command(qctx, ctl)
		q.Env = append(os.Environ(), env...)
		q.Stdin = strings.NewReader("quit\n")
		if out, err := q.CombinedOutput(); err != nil {
			fmt.Fprintf(c.out, "      MPS control daemon in %s did not quit: %v %s\n", dir, err, strings.TrimSpace(string(out)))
		}
	}()
	limit := append(env, fmt.Sprintf("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=%dM", capMiB))
	a, oom, err := c.allocate(ctx, py, allocMiB, limit)
	switch {
	case err != nil:
		return fail, fmt.Sprintf("MPS client under a %d MiB cap: %v", capMiB, err)
	case a == nil:
		return fail, fmt.Sprintf("%d MiB under a %d MiB MPS cap failed: %s", allocMiB, capMiB, oom)
	}
	a.stop()
	a, oom, err = c.allocate(ctx, py, 2*capMiB, limit)
	switch {
	case err != nil:
		return fail, fmt.Sprintf("MPS client above the cap: %v", err)
	case a != nil:
		a.stop()
		return fail, fmt.Sprintf("%d MiB allocated under a %d MiB MPS cap: the cap is not enforced", 2*capMiB, capMiB)
	}
	if !strings.Contains(strings.ToLower(oom), "out of memory") {
		return fail, fmt.Sprintf("%d MiB under a %d MiB MPS cap failed, but not for memory: %s", 2*capMiB, capMiB, oom)
	}
	return pass, fmt.Sprintf("under a %d MiB MPS cap %d MiB allocates and %d MiB fails (%s)", capMiB, allocMiB, 2*capMiB, oom)
}

// findProcess looks for pid holding at least minMiB in the samples; it
// returns what it found ("" when not) and every process seen.
func findProcess(ss []nvidia.Sample, pid, minMiB int) (string, []string) {
	var seen []string
	for _, s := range ss {
		for _, p := range s.Processes {
			seen = append(seen, fmt.Sprintf("pid %d %d MiB", p.PID, p.MemoryMB))
			if int(p.PID) == pid && p.MemoryMB >= uint64(minMiB) {
				return fmt.Sprintf("pid %d holds %d MiB on %s (allocated %d MiB)", p.PID, p.MemoryMB, s.UUID, minMiB), seen
			}
		}
	}
	return "", seen
}

package ebpf

// The oracle: bpftrace's runqlat (the classic tracefs-tracepoint version)
// beside our probe on the same workload. bpftrace needs tracefs, which this
// test mounts at /sys/kernel/tracing and unmounts afterwards. It needs
// bpftrace (apt-get install -y bpftrace) and fails without it.
//
// Tolerance: both time the same transitions with the same clock, so the
// event counts agree within 5 % and the p50, p90 and p99 within a factor of 2
// (one log2 bucket: the two probes take their timestamps a few hundred
// nanoseconds apart, which can move an event across a bucket edge).

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const tracefs = "/sys/kernel/tracing"

func mountTracefs(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(tracefs + "/events"); err == nil {
		return // already mounted by someone else: leave it
	}
	if err := unix.Mount("tracefs", tracefs, "tracefs", 0, ""); err != nil {
		t.Fatalf("mount tracefs at %s: %v", tracefs, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(tracefs, 0); err != nil {
			t.Errorf("unmount tracefs: %v", err)
		}
	})
}

// oracleScript is runqlat.bt restricted to tasks named $comm, in ns.
const oracleScript = `
tracepoint:sched:sched_wakeup, tracepoint:sched:sched_wakeup_new
/args->comm == "%[1]s"/ { @qtime[args->pid] = nsecs; }
tracepoint:sched:sched_switch {
	if (args->prev_comm == "%[1]s" && (args->prev_state == 0 || args->prev_state == 0x100)) {
		@qtime[args->prev_pid] = nsecs;
	}
	$ns = @qtime[args->next_pid];
	if ($ns) { @lat = hist(nsecs - $ns); @n = count(); }
	delete(@qtime[args->next_pid]);
}
END { clear(@qtime); }
`

// parseBpftraceHist reads bpftrace's hist() output into our bucket layout.
// bpftrace's bucket [lo, hi) has lo a power of two (or 0 and 1 for the
// first two), which is our bucket log2(lo).
func parseBpftraceHist(out string) (Histogram, error) {
	var h Histogram
	re := regexp.MustCompile(`^\[(\d+)([KMG]?)(?:, \S+\)|\])\s+(\d+) \|`)
	found := false
	for line := range strings.Lines(out) {
		m := re.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		found = true
		lo, err := strconv.ParseUint(m[1], 10, 64)
		if err != nil {
			return h, err
		}
		lo <<= map[string]uint{"": 0, "K": 10, "M": 20, "G": 30}[m[2]] // bpftrace's 1024-based suffixes
		n, _ := strconv.ParseUint(m[3], 10, 64)
		i := 0
		if lo > 1 {
			i = int(math.Log2(float64(lo)))
		}
		if i >= Buckets {
			i = Buckets - 1
		}
		h.Buckets[i] += n
		h.Count += n
	}
	if !found {
		return h, fmt.Errorf("no histogram in bpftrace output:\n%s", out)
	}
	return h, nil
}

func TestOracleBpftrace(t *testing.T) {
	if _, err := exec.LookPath("bpftrace"); err != nil {
		t.Fatalf("bpftrace missing (apt-get install -y bpftrace): %v", err)
	}
	mountTracefs(t)
	p := loadProbe(t)
	job := newTestCgroup(t, "oracle")
	if err := p.Register(job.id, 1); err != nil {
		t.Fatal(err)
	}
	const comm = "fdlatoracle"
	w := startHelper(t, "wake:1500", comm, job)
	const minEvents = 1000 // the helper stops after 20 s even if its 1500 wake-ups are not done
	// Something to wait behind: two CPU hogs outside the job's cgroup.
	for range 2 {
		startHelper(t, "hog", "", nil).start(t)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bt := exec.CommandContext(ctx, "bpftrace", "-e", fmt.Sprintf(oracleScript, comm))
	var out bytes.Buffer
	stdout, err := bt.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	bt.Stderr = &out
	if err := bt.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	attached := false
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "Attaching") {
			attached = true
			break
		}
	}
	if !attached {
		_ = bt.Wait()
		t.Fatalf("bpftrace did not attach: %s", out.String())
	}
	time.Sleep(300 * time.Millisecond)
	before, err := p.Histogram(job.id)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	w.start(t)
	w.wait(t)
	t.Logf("workload ran %v", time.Since(t0).Round(time.Millisecond))
	time.Sleep(100 * time.Millisecond)
	after, err := p.Histogram(job.id)
	if err != nil {
		t.Fatal(err)
	}
	if err := bt.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	var rest bytes.Buffer
	exited := make(chan error, 1)
	go func() {
		for sc.Scan() {
			rest.WriteString(sc.Text() + "\n")
		}
		exited <- bt.Wait()
	}()
	select {
	case err := <-exited:
		if err != nil && !errors.As(err, new(*exec.ExitError)) {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		_ = bt.Process.Kill()
		<-exited
		t.Fatalf("bpftrace did not exit within 30 s of SIGINT; stderr: %s", out.String())
	}
	oracle, err := parseBpftraceHist(rest.String())
	if err != nil {
		t.Fatalf("%v\nstderr: %s", err, out.String())
	}
	ours := after.Sub(before)
	t.Logf("ours:   %d events, p50 %v, p90 %v, p99 %v", ours.Count, ours.Quantile(0.5), ours.Quantile(0.9), ours.Quantile(0.99))
	t.Logf("oracle: %d events, p50 %v, p90 %v, p99 %v", oracle.Count, oracle.Quantile(0.5), oracle.Quantile(0.9), oracle.Quantile(0.99))
	if ours.Count < minEvents {
		t.Fatalf("our probe saw %d events, want at least %d wake-ups", ours.Count, minEvents)
	}
	if d := math.Abs(float64(ours.Count)-float64(oracle.Count)) / float64(oracle.Count); d > 0.05 {
		t.Errorf("event counts differ by %.1f %% (ours %d, bpftrace %d), tolerance 5 %%", 100*d, ours.Count, oracle.Count)
	}
	for _, q := range []float64{0.5, 0.9, 0.99} {
		a, b := ours.Quantile(q), oracle.Quantile(q)
		if r := float64(a) / float64(b); r > 2 || r < 0.5 {
			t.Errorf("p%.0f: ours %v, bpftrace %v: more than one log2 bucket apart", 100*q, a, b)
		}
	}
}

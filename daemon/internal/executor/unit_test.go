package executor

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/devices"
)

func TestParseStartTime(t *testing.T) {
	// A command name with spaces and parentheses must not shift fields.
	stat := "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100"
	got, err := parseStartTime(stat)
	if err != nil || got != 987654 {
		t.Fatalf("parseStartTime = %d, %v; want 987654", got, err)
	}
	for _, bad := range []string{"", "1 (x) S 1 2", "1 (x" + strings.Repeat(" 1", 30)} {
		if _, err := parseStartTime(bad); !errors.Is(err, errBadStat) {
			t.Errorf("parseStartTime(%q): %v, want errBadStat", bad, err)
		}
	}
	self, err := processStart("/proc", os.Getpid())
	if err != nil || self == 0 {
		t.Fatalf("own start time: %d, %v", self, err)
	}
}

func FuzzParseStartTime(f *testing.F) {
	f.Add("4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100")
	f.Add("1 (x) S")
	f.Add(")")
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseStartTime(s)
		if err == nil && !strings.Contains(s, ")") {
			t.Fatalf("parsed %d from a line without a command name", n)
		}
	})
}

func TestRotatingLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "output.log")
	l, err := openRotatingLog(path, 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"aaaa", "bbbb", "cccc", "dddddddddddddddd", "e"} {
		if _, err := l.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	cur, _ := os.ReadFile(path)
	old, _ := os.ReadFile(path + ".1")
	// aaaabbbb fit; cccc starts a new file; the oversized write gets a
	// file of its own; e starts another.
	if string(cur) != "e" || string(old) != "dddddddddddddddd" {
		t.Fatalf("current %q, rotated %q", cur, old)
	}
	// Reopening appends and counts what is there.
	l, err = openRotatingLog(path, 3)
	if err != nil {
		t.Fatal(err)
	}
	l.Write([]byte("fg"))
	l.Write([]byte("h"))
	l.Close()
	cur, _ = os.ReadFile(path)
	old, _ = os.ReadFile(path + ".1")
	if string(cur) != "h" || string(old) != "efg" {
		t.Fatalf("after reopen: current %q, rotated %q", cur, old)
	}
}

func TestRotatingLogFailedRename(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "output.log")
	// A non-empty directory where the rotated file goes makes the rename fail.
	if err := os.MkdirAll(filepath.Join(path+".1", "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := openRotatingLog(path, 4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Write([]byte("abcd")); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Write([]byte("e")); err == nil {
		t.Fatal("write that needed a failing rotation succeeded")
	}
	// The original file was reopened: it is still written to.
	if _, err := l.f.Write([]byte("f")); err != nil {
		t.Fatalf("log not reopened after a failed rotation: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != "abcdf" {
		t.Fatalf("log holds %q, want %q", got, "abcdf")
	}
}

func TestWriteJSONDurably(t *testing.T) {
	path := filepath.Join(t.TempDir(), "result.json")
	want := Result{Exit: api.ExitStatus{Code: 137, Signal: "KILL", OOMKilled: true}, Reason: cgroups.ExitOOMKilled}
	for range 2 {
		if err := writeJSONDurably(path, want); err != nil {
			t.Fatal(err)
		}
	}
	var got Result
	if err := readJSON(path, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("read back %+v", got)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("temporary files left: %v", entries)
	}
}

func TestCgroupPlacement(t *testing.T) {
	shared := []int{0, 1}
	dev := devices.DeviceNode{Path: "/dev/x", Type: devices.CharDevice, Major: 10, Minor: 1}
	req := func(tier api.Tier, cpuset string) jobs.RunRequest {
		return jobs.RunRequest{Tier: tier, Devices: []devices.DeviceNode{dev},
			Allocation: api.Allocation{CPU: 1500, Memory: 1 << 30, CPUSet: cpuset, NUMANode: 1}}
	}
	g, err := cgroupPlacement(req(api.TierGuaranteed, "2-3"), shared, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g.ExclusiveCPUs, []int{2, 3}) || g.SharedCPUs != nil || !reflect.DeepEqual(g.MemNodes, []int{1}) ||
		g.MemoryLimit != 1<<30 || g.MemoryRequest != 1<<30 || len(g.Devices) != 1 {
		t.Errorf("guaranteed placement %+v", g)
	}
	if _, err := cgroups.Plan(g); err != nil {
		t.Errorf("guaranteed placement does not plan: %v", err)
	}
	// A memory-less node 1: its jobs allocate from node 0; an unknown
	// answer (nil) leaves cpuset.mems unset.
	nearest := func(n int) []int {
		if n == 1 {
			return []int{0}
		}
		return nil
	}
	if m, err := cgroupPlacement(req(api.TierGuaranteed, "2-3"), shared, nearest); err != nil || !reflect.DeepEqual(m.MemNodes, []int{0}) {
		t.Errorf("memory-less node: MemNodes %v, %v", m.MemNodes, err)
	}
	u := req(api.TierGuaranteed, "2-3")
	u.Allocation.NUMANode = 5
	if m, err := cgroupPlacement(u, shared, nearest); err != nil || m.MemNodes != nil {
		t.Errorf("unknown node: MemNodes %v, %v", m.MemNodes, err)
	} else if lim, err := cgroups.Plan(m); err != nil || lim.Mems != "" {
		t.Errorf("unknown node: mems %q, %v", lim.Mems, err)
	}
	if _, err := cgroupPlacement(req(api.TierGuaranteed, ""), shared, nil); !errors.Is(err, ErrNoExclusiveCPUs) {
		t.Errorf("guaranteed without cores: %v", err)
	}
	b, err := cgroupPlacement(req(api.TierBurstable, ""), shared, nil)
	if err != nil || b.CPULimitMilli != 0 || b.CPURequestMilli != 1500 || !reflect.DeepEqual(b.SharedCPUs, shared) || b.MemNodes != nil {
		t.Errorf("burstable placement %+v, %v", b, err)
	}
	be, err := cgroupPlacement(req(api.TierBestEffort, ""), shared, nil)
	if err != nil || be.CPULimitMilli != 1500 {
		t.Errorf("besteffort placement %+v, %v", be, err)
	}
	lim, err := cgroups.Plan(be)
	if err != nil || lim.CPUQuota != 150_000 || lim.MemoryMax != 1<<30 {
		t.Errorf("besteffort limits %+v, %v", lim, err)
	}
}

func TestDispatch(t *testing.T) {
	if _, ok := Dispatch([]string{"fusiond", "--config", "x"}); ok {
		t.Error("a normal start was taken for a hidden mode")
	}
	if _, ok := Dispatch([]string{"fusiond"}); ok {
		t.Error("no arguments taken for a hidden mode")
	}
	if code, ok := Dispatch([]string{"fusiond", MonitorArg}); !ok || code != 2 {
		t.Errorf("monitor without a directory: %d, %v", code, ok)
	}
}

type failingWriter struct{ closed bool }

func (w *failingWriter) Write([]byte) (int, error) { return 0, errors.New("no space left on device") }
func (w *failingWriter) Close() error              { w.closed = true; return nil }

func TestCopyOutputDrainsAfterLogError(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var buf strings.Builder
	m := &monitor{log: slog.New(slog.NewTextHandler(&buf, nil))}
	out := &failingWriter{}
	m.copyOutput(r, out)
	// Far more than a pipe buffer: it only goes through if the monitor
	// keeps reading after the log failed, and the job never sees EPIPE.
	if _, err := w.Write(make([]byte, 1<<20)); err != nil {
		t.Fatalf("job's write failed: %v", err)
	}
	w.Close()
	select {
	case <-m.logDone:
	case <-time.After(10 * time.Second):
		t.Fatal("output copy did not finish")
	}
	if !out.closed {
		t.Error("log not closed")
	}
	if n := strings.Count(buf.String(), "no space left"); n != 1 {
		t.Errorf("log error reported %d times, want once:\n%s", n, buf.String())
	}
}

func TestWithDeviceEnv(t *testing.T) {
	job := []string{"PATH=/bin", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100", "A=b=c", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=80G", "NOEQUALS"}
	dev := map[string]string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M", "CUDA_VISIBLE_DEVICES": "GPU-1"}
	got := withDeviceEnv(job, dev)
	want := []string{"PATH=/bin", "A=b=c", "NOEQUALS",
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M", "CUDA_VISIBLE_DEVICES=GPU-1"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	if len(job) != 5 || job[1] != "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100" {
		t.Fatalf("input changed: %q", job)
	}
}

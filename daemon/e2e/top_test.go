package e2e

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestTop runs `fusionctl top` against the simulated DGX H200: its plain
// mode prints the same table twice over an idle node, and under tmux the
// terminal view renders the devices and jobs, refreshes when a job is
// submitted, and quits on q.
func TestTop(t *testing.T) {
	tmux, err := exec.LookPath("tmux")
	if err != nil {
		t.Fatalf("tmux not found (Debian package tmux; make deps installs it): %v", err)
	}
	dir := publicTempDir(t)
	d := newDaemon(t, dir, "")
	d.args = []string{"--simulate", "dgxh200"}
	d.start()
	ok := func(args ...string) string {
		t.Helper()
		r := d.ctl(nil, "", args...)
		if r.code != 0 {
			t.Fatalf("fusionctl %v: exit %d: %s%s", args, r.code, r.stdout, r.stderr)
		}
		return r.stdout
	}
	ok("run", "--name", "sleeper", "--class", "training", "--cpu", "100m", "--memory", "16Mi", "--gpu", "1", "--", "sleep", "600")
	waitFor(t, d.client(), "1", "running")

	// Plain mode (stdout is a pipe here): a stable table.
	first := ok("top", "--once")
	time.Sleep(1200 * time.Millisecond)
	if second := ok("top", "--once"); !sameFrame(first, second) {
		t.Errorf("two frames of an idle node differ:\n%s\n---\n%s", first, second)
	}
	lines := strings.Split(first, "\n")
	if !strings.HasPrefix(lines[0], "NODE ") || !strings.Contains(lines[0], "devices SIMULATED (dgxh200)") {
		t.Errorf("first line %q", lines[0])
	}
	for _, want := range []string{
		"GPU 1/8  FPGA 0/4  JOBS 1 running",
		"TIER        RUNNING  QUEUED  CPU RESERVED  MEM RESERVED  CPU USED  MEM USED",
		"burstable   1        0       100m          16Mi",
		"\nGPUS\nGPU  MODEL                    HEALTH  UTIL",
		"\n7    NVIDIA H200 141GB HBM3e  ok ",
		"\nFPGA REGIONS\n",
		"dfl/0000:af:00.0/0  dfl       empty  ok      idle",
		"\nJOBS\nID  NAME     STATE    CLASS     TIER       CPU   MEM   DEVICES",
		"\n1   sleeper  running  training  burstable  100m  16Mi  GPU-",
	} {
		if !strings.Contains(first, want) {
			t.Errorf("plain frame lacks %q:\n%s", want, first)
		}
	}
	// The running job's usage is measured (its cgroup), not left blank.
	for _, line := range lines {
		if f := strings.Fields(line); len(f) > 2 && f[1] == "sleeper" && (!strings.HasSuffix(f[len(f)-2], "s") || f[len(f)-1] == "-") {
			t.Errorf("sleeper's usage not measured: %q", line)
		}
	}
	if r := d.ctl(nil, "", "top", "-n", "2", "--interval", "150ms"); r.code != 0 || strings.Count(r.stdout, "\nJOBS\n") != 2 {
		t.Errorf("top -n 2: exit %d, %d frames:\n%s%s", r.code, strings.Count(r.stdout, "\nJOBS\n"), r.stdout, r.stderr)
	}
	if r := d.ctl(nil, "", "top", "-o", "json"); r.code == 0 || !strings.Contains(r.stderr, "--once") {
		t.Errorf("top -o json without --once: exit %d %s", r.code, r.stderr)
	}

	// The terminal view under tmux.
	sock := filepath.Join(dir, "tmux.sock")
	session := "fusiond-top"
	tm := func(args ...string) (string, error) {
		out, err := exec.Command(tmux, append([]string{"-S", sock}, args...)...).CombinedOutput()
		return string(out), err
	}
	t.Cleanup(func() { tm("kill-server") })
	cmdline := fmt.Sprintf("%s --socket %s top", filepath.Join(binDir, "fusionctl"), d.socket)
	if out, err := tm("new-session", "-d", "-s", session, "-x", "160", "-y", "50", "env", "TERM=xterm-256color", "sh", "-c", cmdline+"; echo top-exited=$?; sleep 30"); err != nil {
		t.Fatalf("tmux new-session: %v %s", err, out)
	}
	capture := func(want ...string) string {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			screen, err := tm("capture-pane", "-p", "-t", session)
			missing := ""
			for _, w := range want {
				if !strings.Contains(screen, w) {
					missing = w
					break
				}
			}
			if err == nil && missing == "" {
				return screen
			}
			if time.Now().After(deadline) {
				t.Fatalf("screen lacks %q (%v):\n%s", missing, err, screen)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	screen := capture("NODE ", "GPUS", "NVIDIA H200 141GB HBM3e", "FPGA REGIONS", "sleeper", "q quits")
	if n := strings.Count(screen, "NVIDIA H200 141GB HBM3e"); n != 8 {
		t.Errorf("%d GPU rows on screen, want 8:\n%s", n, screen)
	}
	// It refreshes: a job submitted now appears without a key press.
	ok("run", "--name", "late-arrival", "--cpu", "100m", "--memory", "16Mi", "--", "sleep", "600")
	capture("late-arrival", "JOBS 2 running")
	if out, err := tm("send-keys", "-t", session, "q"); err != nil {
		t.Fatalf("send-keys: %v %s", err, out)
	}
	capture("top-exited=0")
}

// sameFrame compares two plain frames; the measured usage of running jobs
// (the last two columns of the TIERS and JOBS rows: CPU used, memory) may
// move by a page between two frames, everything else must not.
func sameFrame(a, b string) bool {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	if len(la) != len(lb) {
		return false
	}
	section := ""
	for i := range la {
		if la[i] == lb[i] {
			if f := strings.Fields(la[i]); len(f) == 1 || len(f) == 2 && f[0] == "FPGA" {
				section = la[i]
			}
			continue
		}
		fa, fb := strings.Fields(la[i]), strings.Fields(lb[i])
		if (section != "TIERS" && section != "JOBS") || len(fa) != len(fb) || len(fa) < 3 {
			return false
		}
		if strings.Join(fa[:len(fa)-2], " ") != strings.Join(fb[:len(fb)-2], " ") {
			return false
		}
	}
	return true
}

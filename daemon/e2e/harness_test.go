package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/executor/exectest"
)

var binDir string

func TestMain(m *testing.M) {
	if spec := os.Getenv(floodEnv); spec != "" {
		os.Exit(floodHelper(spec)) // a flood test's attacker, as another user
	}
	if spec := os.Getenv(gossipMemberEnv); spec != "" {
		os.Exit(gossipMember(spec)) // a gossip-only member on a host of its own
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "e2e tests must run as root (they run jobs as other users and read peer credentials)")
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "fusiond-e2e-bin-")
	if err != nil {
		panic(err)
	}
	binDir = dir
	os.Chmod(dir, 0o755)
	build := osexec.Command("go", "build", "-o", dir, "github.com/fusiond/fusiond/cmd/fusiond", "github.com/fusiond/fusiond/cmd/fusionctl")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building binaries:", err)
		os.Exit(1)
	}
	// The flood tests run this binary again as other users: a copy they
	// can execute.
	if err := copyExecutable(os.Args[0], filepath.Join(dir, "e2e.test")); err != nil {
		fmt.Fprintln(os.Stderr, "copying the test binary:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// publicTempDir is a temporary directory every user can traverse, so an
// unprivileged fusionctl can reach the socket.
func publicTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "fusiond-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

type daemon struct {
	t      *testing.T
	dir    string
	socket string
	config string
	// cgroupParent is the daemon's own cgroup subtree, so that daemons of
	// concurrent tests never share job cgroups.
	cgroupParent string
	cmd          *osexec.Cmd
	log          *bytes.Buffer
	done         chan error
	// args are extra fusiond flags.
	args []string
	// netns, when set, is the network namespace fusiond runs in.
	netns string
}

// newDaemon writes a config for a daemon living in dir. extra is appended
// to the YAML.
func newDaemon(t *testing.T, dir, extra string) *daemon {
	d := &daemon{t: t, dir: dir, socket: filepath.Join(dir, "fusiond.sock"), config: filepath.Join(dir, "config.yaml"),
		cgroupParent: "fusiond-e2e-" + filepath.Base(dir)}
	if !strings.Contains(extra, "leave_jobs_on_shutdown") {
		// Tests stop their daemons at the end: stop the jobs with them, so
		// nothing outlives a test on the CI host.
		extra = "leave_jobs_on_shutdown: false\n" + extra
	}
	cfg := fmt.Sprintf("state_dir: %s\nsocket: %s\nsocket_group: \"\"\nsocket_mode: \"0666\"\ncancel_grace: 2s\nlog: {level: debug}\ncgroup_parent: %s\n%s",
		filepath.Join(dir, "state"), d.socket, d.cgroupParent, extra)
	if err := os.WriteFile(d.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	// Runs after the daemon's own cleanup: every job cgroup must be gone
	// by then. Whatever a failing test left (monitors of this daemon's
	// state directory, processes of its job cgroups) is killed before the
	// hierarchy is removed, so no process outlives the test.
	t.Cleanup(func() {
		if left := d.jobCgroups(); len(left) > 0 {
			t.Errorf("job cgroups left behind: %v", left)
		}
		if err := exectest.Cleanup(cgroups.DefaultRoot, d.cgroupParent, filepath.Join(dir, "state"), 10*time.Second); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return d
}

// start runs the daemon and waits until it is ready.
func (d *daemon) start() {
	d.t.Helper()
	d.log = &bytes.Buffer{}
	d.cmd = osexec.Command(filepath.Join(binDir, "fusiond"), append([]string{"--config", d.config}, d.args...)...)
	if d.netns != "" {
		// nsenter, not ip netns exec: that remounts /sys, hiding the cgroups.
		d.cmd = osexec.Command("nsenter", append([]string{"--net=/var/run/netns/" + d.netns, d.cmd.Path}, d.cmd.Args[1:]...)...)
	}
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.done = make(chan error, 1)
	go func() { d.done <- d.cmd.Wait() }()
	d.t.Cleanup(func() {
		if d.cmd.ProcessState == nil {
			d.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-d.done:
			case <-time.After(15 * time.Second):
				d.cmd.Process.Kill()
			}
		}
	})
	c := api.NewClient(d.socket)
	defer c.Close()
	// A simulated host writes its sysfs trees on first start: seconds on
	// a loaded machine.
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ready(ctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case err := <-d.done:
			d.t.Fatalf("fusiond exited: %v\n%s", err, d.log)
		default:
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("fusiond not ready: %v\n%s", err, d.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop sends sig and waits for the daemon to exit.
func (d *daemon) stop(sig syscall.Signal) error {
	d.t.Helper()
	d.cmd.Process.Signal(sig)
	select {
	case err := <-d.done:
		return err
	case <-time.After(20 * time.Second):
		d.t.Fatalf("fusiond did not exit after %s\n%s", sig, d.log)
		return nil
	}
}

func (d *daemon) client() *api.Client {
	c := api.NewClient(d.socket)
	d.t.Cleanup(c.Close)
	return c
}

type result struct {
	stdout, stderr string
	code           int
}

// ctl runs fusionctl against d, as the given uid/gid when cred is set.
func (d *daemon) ctl(cred *syscall.Credential, stdin string, args ...string) result {
	d.t.Helper()
	cmd := osexec.Command(filepath.Join(binDir, "fusionctl"), append([]string{"--socket", d.socket}, args...)...)
	cmd.Dir = "/"
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*osexec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		d.t.Fatalf("fusionctl %v: %v", args, err)
	}
	return result{out.String(), errb.String(), code}
}

// mustCtl runs fusionctl as root against d and returns its output; the
// test fails when it exits non-zero.
func (d *daemon) mustCtl(args ...string) string {
	d.t.Helper()
	r := d.ctl(nil, "", args...)
	if r.code != 0 {
		d.t.Fatalf("fusionctl %v: exit %d: %s%s", args, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

func waitFor(t *testing.T, c *api.Client, id string, want api.State) api.Job {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		j, err := c.Get(context.Background(), id)
		if err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		if j.State == want {
			return j
		}
		if time.Now().After(deadline) || (j.State.Terminal() && j.State != want) {
			t.Fatalf("job %s is %s (%s), want %s", id, j.State, j.Reason, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// jobCgroups lists the job cgroups under the daemon's subtree (in any
// hierarchy).
func (d *daemon) jobCgroups() []string {
	var out []string
	for _, pattern := range []string{"/sys/fs/cgroup/*/%s/fusiond/*/*/cgroup.procs", "/sys/fs/cgroup/%s/fusiond/*/*/cgroup.procs"} {
		m, _ := filepath.Glob(fmt.Sprintf(pattern, d.cgroupParent))
		for _, f := range m {
			out = append(out, filepath.Dir(f))
		}
	}
	return out
}

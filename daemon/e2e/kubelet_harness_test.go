//go:build kubelet

// The kubelet harness: a real kubelet (standalone: static pods, no API
// server) on a real containerd, for the tests of fusiond's Kubernetes
// device plugin. Built only with -tags kubelet; the artefacts come from
// .ci/kubelet/build.sh, found through FUSIOND_KUBELET_DIR:
//
//	FUSIOND_KUBELET_DIR=$(.ci/kubelet/build.sh) \
//	    go test -tags kubelet -count=1 -v -run '^TestKubelet' ./daemon/e2e/
//
// What a test gets:
//   - startContainerd: a containerd of its own (temporary root, state and
//     socket) with the images fusiond.test/busybox:1 and fusiond.test/pause:1
//     imported into the CRI namespace.
//   - startKubelet: a kubelet on it, root directory /var/lib/kubelet (the
//     device-plugin directory /var/lib/kubelet/device-plugins/ is fixed by
//     the kubelet), Stop and Start to restart it.
//   - writeStaticPod/removeStaticPod, waitPodRunning/waitPodGone, podLog,
//     busyboxPod (a pod manifest) and podResources (a pod-resources v1
//     client on /var/lib/kubelet/pod-resources/kubelet.sock).
//
// Pods run with hostNetwork (there is no CNI), image fusiond.test/busybox:1,
// imagePullPolicy Never (no registry is reachable). The kubelet names a
// static pod "<manifest name>-<node name>": the helpers take the manifest's
// name and podName gives the kubelet's.
//
// Everything is torn down in t.Cleanup, whatever the test's outcome: the
// kubelet stopped, every container and shim killed, the kubepods cgroups,
// /var/lib/kubelet, the pods' log directories and containerd's temporary
// directory removed. The kubelet and containerd logs are printed when the
// test failed (and kept in FUSIOND_KUBELET_LOG_DIR when that is set).
// Tests that run a kubelet are serialised: they share /var/lib/kubelet.

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/internal/executor/exectest"
)

const (
	// kubeletDirEnv names the directory build.sh filled: kubelet,
	// busybox.tar, pause.tar.
	kubeletDirEnv = "FUSIOND_KUBELET_DIR"
	// kubeletLogDirEnv, when set, names a directory that receives the
	// full kubelet and containerd logs of every test (<test>.kubelet.log,
	// <test>.containerd.log), passed or failed; CI can keep it as an
	// artefact. Without it the logs are printed only when a test fails.
	kubeletLogDirEnv = "FUSIOND_KUBELET_LOG_DIR"

	// kubeletRootDir is the kubelet's --root-dir. The kubelet always
	// serves device plugins at /var/lib/kubelet/device-plugins/, whatever
	// its root directory, so the harness uses the default one and owns it
	// for the duration of a test.
	kubeletRootDir = "/var/lib/kubelet"
	// kubeletDevicePluginDir is where device plugins find kubelet.sock
	// (their registration socket) and put their own sockets.
	kubeletDevicePluginDir = "/var/lib/kubelet/device-plugins"
	// kubeletPodResourcesSocket is the pod-resources API of the kubelet.
	kubeletPodResourcesSocket = kubeletRootDir + "/pod-resources/kubelet.sock"
	// kubeletPodLogsDir holds one directory per pod: <ns>_<name>_<uid>.
	kubeletPodLogsDir = "/var/log/pods"
	// kubeletContainerLogsDir holds the kubelet's symbolic links to the
	// containers' logs.
	kubeletContainerLogsDir = "/var/log/containers"
	// kubeletNodeName is the kubelet's --hostname-override: fixed, so that
	// static pod names are known in advance.
	kubeletNodeName = "fusiond-e2e"

	busyboxImage = "fusiond.test/busybox:1"
	pauseImage   = "fusiond.test/pause:1"
	// criNamespace is the containerd namespace of the CRI plugin.
	criNamespace = "k8s.io"
)

// kubeletArtefacts returns FUSIOND_KUBELET_DIR after checking that it
// holds what build.sh makes; it fails the test otherwise.
func kubeletArtefacts(t *testing.T) string {
	t.Helper()
	dir := os.Getenv(kubeletDirEnv)
	if dir == "" {
		t.Fatalf("%s is not set: run FUSIOND_KUBELET_DIR=$(.ci/kubelet/build.sh) first (make test-kubelet does both)", kubeletDirEnv)
	}
	for _, f := range []string{"kubelet", "busybox.tar", "pause.tar"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("%s=%s lacks %s (%v): rerun .ci/kubelet/build.sh", kubeletDirEnv, dir, f, err)
		}
	}
	for _, cmd := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr"} {
		if _, err := osexec.LookPath(cmd); err != nil {
			t.Fatalf("%s not found (%v): .ci/kubelet/build.sh installs the Debian packages containerd and runc", cmd, err)
		}
	}
	return dir
}

// running says whether the process whose Wait result done will carry is
// still running. done is the buffered channel of one: an exit read here is
// put back for the next reader.
func running(done chan error) bool {
	if done == nil {
		return false
	}
	select {
	case err := <-done:
		done <- err
		return false
	default:
		return true
	}
}

// syncBuffer is a bytes.Buffer that a process writes while a test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// saveLog writes a log to FUSIOND_KUBELET_LOG_DIR when that is set.
func saveLog(t *testing.T, what, log string) {
	dir := os.Getenv(kubeletLogDirEnv)
	if dir == "" {
		return
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + "." + what + ".log"
	err := os.MkdirAll(dir, 0o755)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, name), []byte(log), 0o644)
	}
	if err != nil {
		t.Logf("saving the %s log: %v", what, err)
	}
}

// logTail is at most the last limit bytes of s, cut at a line start.
func logTail(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	tail := s[len(s)-limit:]
	if i := strings.IndexByte(tail, '\n'); i >= 0 {
		tail = tail[i+1:]
	}
	return fmt.Sprintf("[... %d bytes cut ...]\n%s", len(s)-len(tail), tail)
}

// --- containerd --------------------------------------------------------------

// containerd is one containerd of a test, with the CRI plugin.
type containerd struct {
	t           *testing.T
	dir         string // root of everything it writes
	socket      string
	snapshotter string
	cmd         *osexec.Cmd
	done        chan error
	log         *syncBuffer
	// madeRun lists the directories of the shims' sockets (a path fixed
	// in containerd 1.6) that did not exist before: removed at the end
	// when empty.
	madeRun []string
}

// containerdConfig is containerd 1.6's configuration (version 2). Every
// path lies under the test's directory, the runc state too (Root), so that
// nothing is shared with another containerd of the host. The CNI
// directories stay empty: pods use the host's network; the CRI plugin logs
// that it found no network configuration and reports its network not
// ready, which the kubelet tolerates for host-network pods.
const containerdConfig = `version = 2
root = "%[1]s/root"
state = "%[1]s/state"

[grpc]
  address = "%[2]s"

[plugins."io.containerd.internal.v1.opt"]
  path = "%[1]s/opt"

[plugins."io.containerd.grpc.v1.cri"]
  # The pod sandbox image: built locally, no registry can be reached.
  sandbox_image = "%[3]s"
  # AppArmor is off on the CI kernel; where it is on, containerd would
  # need apparmor_parser to load its default profile.
  disable_apparmor = true
  # Without CAP_SYS_RESOURCE (the CI sandbox drops it) a process may not
  # lower its oom_score_adj, and the kubelet asks -998 for pod sandboxes:
  # runc's nsexec then dies ("failed to update /proc/self/oom_score_adj:
  # Permission denied", seen by the kubelet as "can't get final child's
  # PID from pipe: EOF"). This clamps every container's score to no lower
  # than containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "%[4]s"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # The kubelet runs with the cgroupfs driver: there is no systemd.
        SystemdCgroup = false
        Root = "%[1]s/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "%[1]s/cni/bin"
    conf_dir = "%[1]s/cni/net.d"
`

// startContainerd runs a containerd for the test and imports the two
// images; t.Cleanup kills its containers and shims, stops it and removes
// its files.
func startContainerd(t *testing.T) *containerd {
	t.Helper()
	art := kubeletArtefacts(t)
	if os.Geteuid() != 0 {
		t.Fatal("the kubelet harness needs root")
	}
	dir, err := os.MkdirTemp("", "fusiond-containerd-")
	if err != nil {
		t.Fatal(err)
	}
	c := &containerd{t: t, dir: dir, socket: filepath.Join(dir, "containerd.sock"), log: &syncBuffer{}}
	for _, d := range []string{"/run/containerd/s", "/run/containerd"} {
		if _, err := os.Stat(d); err != nil {
			c.madeRun = append(c.madeRun, d)
		}
	}
	t.Cleanup(c.cleanup)

	// overlayfs where the kernel and the file system under the directory
	// allow it (both do on the CI host), the slower copying snapshotter
	// otherwise.
	c.snapshotter = "overlayfs"
	if err := probeOverlay(dir); err != nil {
		t.Logf("containerd: overlay mounts fail here (%v): using the native snapshotter", err)
		c.snapshotter = "native"
	}
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, containerdConfig, dir, c.socket, pauseImage, c.snapshotter), 0o644); err != nil {
		t.Fatal(err)
	}

	c.cmd = osexec.Command("containerd", "--config", cfg, "--log-level", "info")
	c.cmd.Stdout, c.cmd.Stderr = c.log, c.log
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("starting containerd: %v", err)
	}
	c.done = make(chan error, 1)
	go func() { c.done <- c.cmd.Wait() }()

	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := c.ctr(context.Background(), "version"); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("containerd not ready after 30 s: %v", err)
		}
		select {
		case err := <-c.done:
			c.done <- err
			t.Fatalf("containerd exited: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	for _, img := range []string{"pause.tar", "busybox.tar"} {
		// Unpacked into the CRI plugin's snapshotter: the CRI plugin
		// creates container snapshots from unpacked layers only.
		out, err := c.ctr(context.Background(), "images", "import", "--snapshotter", c.snapshotter, filepath.Join(art, img))
		if err != nil {
			t.Fatalf("importing %s: %v\n%s", img, err, out)
		}
	}
	out, err := c.ctr(context.Background(), "images", "ls", "-q")
	if err != nil || !strings.Contains(out, busyboxImage) || !strings.Contains(out, pauseImage) {
		t.Fatalf("images after import: %v\n%s", err, out)
	}
	return c
}

// probeOverlay mounts and unmounts one overlay file system under dir.
func probeOverlay(dir string) error {
	p := filepath.Join(dir, "overlay-probe")
	defer os.RemoveAll(p)
	for _, d := range []string{"lower", "upper", "work", "merged"} {
		if err := os.MkdirAll(filepath.Join(p, d), 0o755); err != nil {
			return err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s/lower,upperdir=%s/upper,workdir=%s/work", p, p, p)
	if err := syscall.Mount("overlay", filepath.Join(p, "merged"), "overlay", 0, opts); err != nil {
		return err
	}
	return syscall.Unmount(filepath.Join(p, "merged"), 0)
}

// ctr runs containerd's ctr client in the CRI namespace, for a minute at
// most.
func (c *containerd) ctr(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := osexec.CommandContext(ctx, "ctr", append([]string{"--address", c.socket, "--namespace", criNamespace}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// podTasks lists the containerd tasks (sandbox and containers) of the pod
// ns/pod (the kubelet's name) with their status: RUNNING, STOPPED, ...
func (c *containerd) podTasks(ns, pod string) (map[string]string, error) {
	ids, err := c.ctr(context.Background(), "containers", "ls", "-q",
		fmt.Sprintf(`labels."io.kubernetes.pod.name"==%s,labels."io.kubernetes.pod.namespace"==%s`, pod, ns))
	if err != nil {
		return nil, fmt.Errorf("ctr containers ls: %v: %s", err, ids)
	}
	tasks, err := c.tasks()
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, id := range strings.Fields(ids) {
		if st, ok := tasks[id]; ok {
			out[id] = st
		}
	}
	return out, nil
}

// tasks maps every task of the CRI namespace to its status.
func (c *containerd) tasks() (map[string]string, error) {
	out, err := c.ctr(context.Background(), "tasks", "ls")
	if err != nil {
		return nil, fmt.Errorf("ctr tasks ls: %v: %s", err, out)
	}
	tasks := map[string]string{}
	for i, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) < 3 { // the header: TASK PID STATUS
			continue
		}
		tasks[f[0]] = f[2]
	}
	return tasks, nil
}

// killTasks SIGKILLs every task of the CRI namespace and deletes it, so
// that its shim exits and unmounts the container's root file system.
func (c *containerd) killTasks() {
	if !running(c.done) {
		return
	}
	tasks, err := c.tasks()
	if err != nil {
		c.t.Logf("containerd: listing tasks: %v", err)
		return
	}
	for id := range tasks {
		c.ctr(context.Background(), "tasks", "kill", "--all", "--signal", "SIGKILL", id)
	}
	for id := range tasks {
		if out, err := c.ctr(context.Background(), "tasks", "delete", "--force", id); err != nil && !strings.Contains(out, "not found") {
			c.t.Logf("containerd: deleting task %s: %v: %s", id, err, strings.TrimSpace(out))
		}
	}
}

// shims lists the pids of the runc shims this containerd started: their
// command line names its socket.
func (c *containerd) shims() []int {
	return processes(func(pid int) bool {
		cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		args := strings.Split(string(cmdline), "\x00")
		return err == nil && strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") && slices.Contains(args, c.socket)
	})
}

// processes lists the pids of the processes match accepts.
func processes(match func(pid int) bool) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && match(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func (c *containerd) cleanup() {
	t := c.t
	c.killTasks()
	if running(c.done) {
		c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-c.done:
			c.done <- err
		case <-time.After(15 * time.Second):
			c.cmd.Process.Kill()
			c.done <- <-c.done
		}
	}
	// A shim outlives containerd by design; these must not outlive the
	// test. Deleted tasks have taken theirs with them already.
	for _, pid := range c.shims() {
		t.Logf("containerd: killing shim %d left behind", pid)
		syscall.Kill(pid, syscall.SIGKILL)
	}
	// Whatever a killed shim left of the pods: their processes, their
	// cgroups (also done by the kubelet's cleanup; both are idempotent).
	if err := exectest.Cleanup(cgroups.DefaultRoot, "kubepods", "", 10*time.Second); err != nil {
		t.Errorf("kubepods cgroups: %v", err)
	}
	if err := unmountUnder(c.dir); err != nil {
		t.Errorf("containerd: %v", err)
	}
	if err := os.RemoveAll(c.dir); err != nil {
		t.Errorf("containerd: removing its directory: %v", err)
	}
	for _, d := range c.madeRun {
		os.Remove(d) // only when empty
	}
	saveLog(t, "containerd", c.log.String())
	if t.Failed() {
		t.Logf("containerd log:\n%s", logTail(c.log.String(), 64<<10))
	}
}

// unmountUnder lazily unmounts every mount point at or below dir, deepest
// first.
func unmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		p := unescapeMountPath(fields[4])
		if p == dir || strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	var errs []error
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// --- kubelet -------------------------------------------------------------------

// kubeletOptions adjust the kubelet of a test.
type kubeletOptions struct {
	// Config entries override or extend the KubeletConfiguration the
	// harness writes (top-level keys, e.g. "cpuManagerPolicy": "static").
	Config map[string]any
	// FeatureGates are merged into the configuration's featureGates.
	FeatureGates map[string]bool
	// Args are extra command-line flags.
	Args []string
}

// kubeletMu serialises the tests that run a kubelet (parallel ones
// included): they all use /var/lib/kubelet and the pod log directories.
var kubeletMu sync.Mutex

// kubelet is the standalone kubelet of a test.
type kubelet struct {
	t            *testing.T
	cd           *containerd
	bin          string
	dir          string // configuration and static pod manifests
	config       string
	staticPodDir string
	readOnlyPort int
	healthzPort  int
	args         []string

	cmd    *osexec.Cmd
	done   chan error
	log    *syncBuffer
	starts int
	// logDirs are the pod log directories and their entries that existed
	// before the test: the others are removed at its end.
	logDirs map[string]bool
}

// startKubelet writes the kubelet's configuration, starts it on cd and
// waits until it serves its health, device-plugin registration and
// pod-resources endpoints. t.Cleanup stops it, kills its pods and removes
// what it wrote on the host.
func startKubelet(t *testing.T, cd *containerd, opts kubeletOptions) *kubelet {
	t.Helper()
	art := kubeletArtefacts(t)
	kubeletMu.Lock()
	t.Cleanup(kubeletMu.Unlock) // after the kubelet's own cleanup
	if pids := processesNamed("kubelet"); len(pids) > 0 {
		t.Fatalf("another kubelet runs on this host (pids %v): the harness needs /var/lib/kubelet for itself", pids)
	}
	k := &kubelet{t: t, cd: cd, bin: filepath.Join(art, "kubelet"), dir: t.TempDir(), log: &syncBuffer{}}
	k.config = filepath.Join(k.dir, "kubelet.yaml")
	k.staticPodDir = filepath.Join(k.dir, "manifests")
	for _, d := range []string{k.staticPodDir, filepath.Join(k.dir, "volume-plugins")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// What a crashed earlier run left would be read back as state (pods,
	// checkpoints, CPU manager state): start clean.
	if err := removeKubeletRoot(); err != nil {
		t.Fatal(err)
	}
	k.logDirs = map[string]bool{}
	for _, d := range []string{kubeletPodLogsDir, kubeletContainerLogsDir} {
		ents, err := os.ReadDir(d)
		if err == nil {
			k.logDirs[d] = true
		}
		for _, e := range ents {
			k.logDirs[filepath.Join(d, e.Name())] = true
		}
	}
	t.Cleanup(k.cleanup)

	k.readOnlyPort, k.healthzPort = freeTCPPort(t), freeTCPPort(t)
	securePort := freeTCPPort(t)
	cfg := map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1",
		"kind":       "KubeletConfiguration",
		// Kubernetes ≥ 1.35 refuses cgroup v1 unless told; the CI host
		// has its controllers on v1 (cgroup2 holds none of cpu/memory).
		"failCgroupV1": false,
		// No systemd as PID 1.
		"cgroupDriver":  "cgroupfs",
		"cgroupsPerQOS": true,
		"failSwapOn":    false,
		// No API server: static pods only, read from this directory,
		// picked up within a second or two of a change.
		"staticPodPath":            k.staticPodDir,
		"fileCheckFrequency":       "1s",
		"syncFrequency":            "5s",
		"containerRuntimeEndpoint": "unix://" + cd.socket,
		// Everything on the loopback: the secure port (TLS with a
		// self-signed certificate), the plain read-only port the
		// harness reads /pods from, healthz.
		"address":            "127.0.0.1",
		"port":               securePort,
		"readOnlyPort":       k.readOnlyPort,
		"healthzBindAddress": "127.0.0.1",
		"healthzPort":        k.healthzPort,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": true},
			"webhook":   map[string]any{"enabled": false},
		},
		"authorization": map[string]any{"mode": "AlwaysAllow"},
		// The CI disk may be nearly full and the host's memory is
		// shared with other tests: no evictions ("0%" disables a
		// signal), no image garbage collection (the images cannot be
		// pulled again).
		"evictionHard": map[string]string{
			"memory.available":   "0%",
			"nodefs.available":   "0%",
			"nodefs.inodesFree":  "0%",
			"imagefs.available":  "0%",
			"imagefs.inodesFree": "0%",
		},
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"serializeImagePulls":         false,
		// The kubelet would otherwise add iptables chains to the host.
		"makeIPTablesUtilChains": false,
		// Its own directory, not /usr/libexec on the host.
		"volumePluginDir": filepath.Join(k.dir, "volume-plugins"),
	}
	for key, v := range opts.Config {
		cfg[key] = v
	}
	if len(opts.FeatureGates) > 0 {
		gates, _ := cfg["featureGates"].(map[string]bool)
		if gates == nil {
			gates = map[string]bool{}
		}
		for g, on := range opts.FeatureGates {
			gates[g] = on
		}
		cfg["featureGates"] = gates
	}
	// JSON is YAML: the kubelet reads it as such.
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(k.config, data, 0o644); err != nil {
		t.Fatal(err)
	}
	k.args = append([]string{
		"--config=" + k.config,
		"--root-dir=" + kubeletRootDir,
		"--hostname-override=" + kubeletNodeName,
		"--v=2",
	}, opts.Args...)
	k.Start()
	return k
}

// Start runs the kubelet (again, after Stop) and waits until it is ready:
// healthz answers ok, the device-plugin registration socket and the
// pod-resources socket accept connections.
func (k *kubelet) Start() {
	k.t.Helper()
	if running(k.done) {
		k.t.Fatal("kubelet already running")
	}
	k.starts++
	fmt.Fprintf(k.log, "==== kubelet start %d at %s ====\n", k.starts, time.Now().Format(time.RFC3339Nano))
	k.cmd = osexec.Command(k.bin, k.args...)
	k.cmd.Stdout, k.cmd.Stderr = k.log, k.log
	begin := time.Now()
	if err := k.cmd.Start(); err != nil {
		k.t.Fatalf("starting the kubelet: %v", err)
	}
	k.done = make(chan error, 1)
	go func() { k.done <- k.cmd.Wait() }()

	deadline := time.Now().Add(60 * time.Second)
	for {
		err := k.ready()
		if err == nil {
			break
		}
		select {
		case err := <-k.done:
			k.done <- err
			k.t.Fatalf("kubelet exited while starting: %v\n%s", err, logTail(k.log.String(), 16<<10))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			k.t.Fatalf("kubelet not ready after 60 s: %v", err)
		}
	}
	k.t.Logf("kubelet ready in %v (start %d)", time.Since(begin).Round(time.Millisecond), k.starts)
}

// ready says why the kubelet is not ready yet, or nil.
func (k *kubelet) ready() error {
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", k.healthzPort))
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthz: %s: %s", resp.Status, body)
	}
	for _, sock := range []string{filepath.Join(kubeletDevicePluginDir, "kubelet.sock"), kubeletPodResourcesSocket} {
		conn, err := net.DialTimeout("unix", sock, time.Second)
		if err != nil {
			return err
		}
		conn.Close()
	}
	return nil
}

// Stop stops the kubelet (SIGTERM, SIGKILL after 20 s). Its pods keep
// running in containerd, as on a real node.
func (k *kubelet) Stop() {
	k.t.Helper()
	if !running(k.done) {
		return
	}
	k.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-k.done:
		k.done <- err
	case <-time.After(20 * time.Second):
		k.t.Errorf("kubelet ignored SIGTERM for 20 s: killed")
		k.cmd.Process.Kill()
		k.done <- <-k.done
	}
	fmt.Fprintf(k.log, "==== kubelet stopped at %s ====\n", time.Now().Format(time.RFC3339Nano))
}

// Log is what the kubelet printed so far, over all its starts.
func (k *kubelet) Log() string { return k.log.String() }

func (k *kubelet) cleanup() {
	t := k.t
	k.Stop()
	// The pods die after the kubelet, so nothing restarts them.
	k.cd.killTasks()
	if err := exectest.Cleanup(cgroups.DefaultRoot, "kubepods", "", 10*time.Second); err != nil {
		t.Errorf("kubepods cgroups: %v", err)
	}
	if err := removeKubeletRoot(); err != nil {
		t.Error(err)
	}
	for _, d := range []string{kubeletPodLogsDir, kubeletContainerLogsDir} {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if p := filepath.Join(d, e.Name()); !k.logDirs[p] {
				os.RemoveAll(p)
			}
		}
		if !k.logDirs[d] {
			os.Remove(d) // the kubelet made it
		}
	}
	saveLog(t, "kubelet", k.log.String())
	if t.Failed() {
		t.Logf("kubelet log:\n%s", logTail(k.log.String(), 256<<10))
	}
}

// removeKubeletRoot unmounts what the kubelet mounted under its root
// directory (volumes of pods) and removes the directory.
func removeKubeletRoot() error {
	if err := unmountUnder(kubeletRootDir); err != nil {
		return fmt.Errorf("kubelet root: %w", err)
	}
	if err := os.RemoveAll(kubeletRootDir); err != nil {
		return fmt.Errorf("kubelet root: %w", err)
	}
	return nil
}

// processesNamed lists the pids whose command name is name.
func processesNamed(name string) []int {
	return processes(func(pid int) bool {
		comm, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
		return err == nil && strings.TrimSpace(string(comm)) == name && !isZombie(pid)
	})
}

// --- static pods ---------------------------------------------------------------

// podName is the kubelet's name of the static pod whose manifest says name.
func podName(name string) string { return name + "-" + kubeletNodeName }

// writeStaticPod puts a pod manifest into the kubelet's static pod
// directory (atomically: the kubelet skips files whose name starts with a
// dot). name is the manifest's metadata.name; writing it again replaces the
// pod (a new UID when the manifest changed).
func writeStaticPod(t *testing.T, k *kubelet, name, manifest string) {
	t.Helper()
	tmp := filepath.Join(k.staticPodDir, "."+name+".yaml")
	if err := os.WriteFile(tmp, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(k.staticPodDir, name+".yaml")); err != nil {
		t.Fatal(err)
	}
}

// removeStaticPod removes the manifest: the kubelet then stops the pod.
func removeStaticPod(t *testing.T, k *kubelet, name string) {
	t.Helper()
	if err := os.Remove(filepath.Join(k.staticPodDir, name+".yaml")); err != nil {
		t.Fatal(err)
	}
}

// busyboxPod is a static pod manifest: one container "main" of the busybox
// image running script with sh, on the host's network. limits, when not
// empty, become the container's resource limits (e.g. an extended resource
// "fusiond.io/gpu": "1"; the kubelet sets requests equal to limits for
// extended resources).
func busyboxPod(name, script string, limits map[string]string) string {
	var lim strings.Builder
	if len(limits) > 0 {
		keys := make([]string, 0, len(limits))
		for k := range limits {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		lim.WriteString("    resources:\n      limits:\n")
		for _, k := range keys {
			fmt.Fprintf(&lim, "        %s: %q\n", k, limits[k])
		}
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: default
spec:
  hostNetwork: true
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: ["sh", "-c", %q]
%s`, name, busyboxImage, script, lim.String())
}

// kubeletPod is the part of a v1.Pod the tests read from the kubelet.
type kubeletPod struct {
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
		UID       string `json:"uid"`
	} `json:"metadata"`
	Spec struct {
		Containers []struct {
			Name string `json:"name"`
		} `json:"containers"`
	} `json:"spec"`
	Status struct {
		Phase             string                   `json:"phase"`
		Reason            string                   `json:"reason"`
		Message           string                   `json:"message"`
		ContainerStatuses []kubeletContainerStatus `json:"containerStatuses"`
	} `json:"status"`
}

type kubeletContainerStatus struct {
	Name         string `json:"name"`
	ContainerID  string `json:"containerID"` // containerd://<id>
	RestartCount int    `json:"restartCount"`
	State        struct {
		Running *struct {
			StartedAt string `json:"startedAt"`
		} `json:"running"`
		Waiting *struct {
			Reason  string `json:"reason"`
			Message string `json:"message"`
		} `json:"waiting"`
		Terminated *struct {
			ExitCode int    `json:"exitCode"`
			Reason   string `json:"reason"`
			Message  string `json:"message"`
		} `json:"terminated"`
	} `json:"state"`
}

// running says whether the pod and all its containers run.
func (p *kubeletPod) running() bool {
	if p.Status.Phase != "Running" || len(p.Status.ContainerStatuses) != len(p.Spec.Containers) {
		return false
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Running == nil {
			return false
		}
	}
	return true
}

func (p *kubeletPod) String() string {
	s := fmt.Sprintf("%s/%s uid %s phase %q", p.Metadata.Namespace, p.Metadata.Name, p.Metadata.UID, p.Status.Phase)
	if p.Status.Reason != "" || p.Status.Message != "" {
		s += fmt.Sprintf(" (%s: %s)", p.Status.Reason, p.Status.Message)
	}
	for _, c := range p.Status.ContainerStatuses {
		st := "unknown"
		switch {
		case c.State.Running != nil:
			st = "running"
		case c.State.Waiting != nil:
			st = fmt.Sprintf("waiting (%s: %s)", c.State.Waiting.Reason, c.State.Waiting.Message)
		case c.State.Terminated != nil:
			st = fmt.Sprintf("terminated (exit %d, %s: %s)", c.State.Terminated.ExitCode, c.State.Terminated.Reason, c.State.Terminated.Message)
		}
		s += fmt.Sprintf("; %s %s restarts %d", c.Name, st, c.RestartCount)
	}
	return s
}

// pods are the kubelet's pods with their status, from its read-only
// /pods endpoint.
func (k *kubelet) pods() ([]kubeletPod, error) {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/pods", k.readOnlyPort))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("/pods: %s: %s", resp.Status, b)
	}
	var list struct {
		Items []kubeletPod `json:"items"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, fmt.Errorf("/pods: %w", err)
	}
	return list.Items, nil
}

// pod is the static pod ns/name (manifest name) as the kubelet sees it,
// or nil.
func (k *kubelet) pod(ns, name string) (*kubeletPod, error) {
	pods, err := k.pods()
	if err != nil {
		return nil, err
	}
	for i := range pods {
		if pods[i].Metadata.Namespace == ns && pods[i].Metadata.Name == podName(name) {
			return &pods[i], nil
		}
	}
	return nil, nil
}

// waitPodRunning waits until the kubelet reports the static pod ns/name
// (manifest name) running with all its containers, and returns it.
func waitPodRunning(t *testing.T, k *kubelet, ns, name string, timeout time.Duration) *kubeletPod {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := "not seen"
	for {
		p, err := k.pod(ns, name)
		switch {
		case err != nil:
			last = err.Error()
		case p != nil && p.running():
			return p
		case p != nil && (p.Status.Phase == "Failed" || p.Status.Phase == "Succeeded"):
			// Final: a pod the kubelet refused (admission: a device it
			// cannot allocate) or whose containers ended never runs.
			t.Fatalf("pod %s/%s ended instead of running: %s", ns, podName(name), p)
		case p != nil:
			last = p.String()
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s/%s not running after %v: %s", ns, podName(name), timeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitPodGone waits until the static pod ns/name (manifest name) is gone:
// unknown to the kubelet, absent from the pod-resources List, and without a
// running task (sandbox or container) in containerd.
func waitPodGone(t *testing.T, k *kubelet, ns, name string, timeout time.Duration) {
	t.Helper()
	pr := podResources(t)
	deadline := time.Now().Add(timeout)
	for {
		why := ""
		if p, err := k.pod(ns, name); err != nil {
			why = err.Error()
		} else if p != nil {
			why = "kubelet still has " + p.String()
		}
		if why == "" {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := pr.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
			cancel()
			if err != nil {
				why = "pod-resources List: " + err.Error()
			} else if slices.ContainsFunc(resp.GetPodResources(), func(r *podresourcesv1.PodResources) bool {
				return r.GetNamespace() == ns && r.GetName() == podName(name)
			}) {
				why = "still in the pod-resources List"
			}
		}
		if why == "" {
			tasks, err := k.cd.podTasks(ns, podName(name))
			if err != nil {
				why = err.Error()
			}
			for id, st := range tasks {
				if st != "STOPPED" {
					why = fmt.Sprintf("containerd task %s is %s", id, st)
				}
			}
		}
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s/%s not gone after %v: %s", ns, podName(name), timeout, why)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// podLog is what container printed (stdout and stderr, as the CRI log
// has them, without the timestamps) in its latest run in the newest pod
// ns/name (manifest name): /var/log/pods/<ns>_<pod>_<uid>/<container>/<n>.log.
func podLog(t *testing.T, ns, name, container string) string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(kubeletPodLogsDir, ns+"_"+podName(name)+"_*", container, "*.log"))
	if len(files) == 0 {
		t.Fatalf("no log of container %s of pod %s/%s under %s", container, ns, podName(name), kubeletPodLogsDir)
	}
	newest, newestTime := "", time.Time{}
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil && !fi.ModTime().Before(newestTime) {
			newest, newestTime = f, fi.ModTime()
		}
	}
	data, err := os.ReadFile(newest)
	if err != nil {
		t.Fatal(err)
	}
	return parseCRILog(data)
}

// parseCRILog strips the CRI log format: each line is
// "<RFC3339Nano time> <stdout|stderr> <P|F> <text>", P marking a partial
// line that the next one continues.
func parseCRILog(data []byte) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(string(data), "\n") {
		f := strings.SplitN(strings.TrimSuffix(line, "\n"), " ", 4)
		if len(f) < 3 {
			continue
		}
		text := ""
		if len(f) == 4 {
			text = f[3]
		}
		b.WriteString(text)
		if f[2] != "P" {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// podResources is a client of the kubelet's pod-resources API (List,
// GetAllocatableResources, Get), closed when the test ends.
func podResources(t *testing.T) podresourcesv1.PodResourcesListerClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+kubeletPodResourcesSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return podresourcesv1.NewPodResourcesListerClient(conn)
}

// --- the smoke test ------------------------------------------------------------

// TestKubeletRunsStaticPod proves the harness: a real kubelet on a real
// containerd runs a static busybox pod, lists it in the pod-resources API,
// keeps it across its own restart, and stops it when the manifest goes.
func TestKubeletRunsStaticPod(t *testing.T) {
	cd := startContainerd(t)
	k := startKubelet(t, cd, kubeletOptions{})

	const marker = "fusiond-kubelet-smoke-marker"
	written := time.Now()
	writeStaticPod(t, k, "smoke", busyboxPod("smoke", "env; echo "+marker+"; exec sleep 3600", nil))
	pod := waitPodRunning(t, k, "default", "smoke", 2*time.Minute)
	t.Logf("pod running %v after its manifest was written: %s", time.Since(written).Round(time.Millisecond), pod)

	// The container printed its environment and the marker: the log is
	// written by the shim as the container prints, so wait a little.
	var log string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		log = podLog(t, "default", "smoke", "main")
		if strings.Contains(log, marker) || time.Now().After(deadline) {
			break
		}
	}
	if !strings.Contains(log, marker) || !strings.Contains(log, "HOSTNAME=") {
		t.Fatalf("pod log lacks the marker or the environment:\n%s", log)
	}

	// The pod-resources API lists it, with its container.
	pr := podResources(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := pr.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatalf("pod-resources List: %v", err)
	}
	found := false
	for _, r := range list.GetPodResources() {
		if r.GetNamespace() == "default" && r.GetName() == podName("smoke") {
			found = len(r.GetContainers()) == 1 && r.GetContainers()[0].GetName() == "main"
		}
	}
	if !found {
		t.Fatalf("pod-resources List lacks default/%s with container main: %v", podName("smoke"), list.GetPodResources())
	}
	if _, err := pr.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{}); err != nil {
		t.Fatalf("pod-resources GetAllocatableResources: %v", err)
	}

	// A kubelet restart leaves the pod running: the same container, not
	// restarted, and the pod listed again.
	before := pod.Status.ContainerStatuses[0].ContainerID
	k.Stop()
	if _, err := os.Stat(filepath.Join(kubeletDevicePluginDir, "kubelet.sock")); err == nil {
		t.Logf("the stopped kubelet left its registration socket behind (a device plugin sees no removal)")
	} else {
		t.Logf("the stopped kubelet removed its registration socket: %v", err)
	}
	if tasks, err := cd.podTasks("default", podName("smoke")); err != nil || len(tasks) != 2 || !allRunning(tasks) {
		t.Fatalf("pod's tasks with the kubelet stopped: %v %v (want sandbox and container running)", tasks, err)
	}
	k.Start()
	pod = waitPodRunning(t, k, "default", "smoke", time.Minute)
	if after := pod.Status.ContainerStatuses[0]; after.ContainerID != before || after.RestartCount != 0 {
		t.Fatalf("after the kubelet's restart the container is %s (restarts %d), was %s", after.ContainerID, after.RestartCount, before)
	}
	// The new kubelet's pod-resources server lists the pod once it has
	// read the manifest again (the same moment as /pods, here).
	pr = podResources(t)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		list, err = pr.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
		cancel()
		if err == nil && slices.ContainsFunc(list.GetPodResources(), func(r *podresourcesv1.PodResources) bool { return r.GetName() == podName("smoke") }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod-resources List after the restart lacks the pod: %v %v", list.GetPodResources(), err)
		}
	}

	// Removing the manifest stops the pod.
	removed := time.Now()
	removeStaticPod(t, k, "smoke")
	waitPodGone(t, k, "default", "smoke", time.Minute)
	t.Logf("pod gone %v after its manifest was removed", time.Since(removed).Round(time.Millisecond))
}

func allRunning(tasks map[string]string) bool {
	for _, st := range tasks {
		if st != "RUNNING" {
			return false
		}
	}
	return true
}

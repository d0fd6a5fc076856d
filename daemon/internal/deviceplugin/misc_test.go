package deviceplugin

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestConfigDefaults(t *testing.T) {
	c, err := Config{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.Dir != "/var/lib/kubelet/device-plugins" || c.PodResources != DefaultPodResources ||
		c.Reconcile != 10*time.Second || c.Grace != time.Minute || c.FeaturePrefix != "fusiond.io/" ||
		c.FeaturesFile != "" || c.Logger == nil {
		t.Errorf("defaults %+v", c)
	}
	for _, prefix := range []string{"feature.node.kubernetes.io/", "gpu.profile.node.kubernetes.io/", "example.com/"} {
		if _, err := (Config{FeaturePrefix: prefix}).withDefaults(); err != nil {
			t.Errorf("prefix %q: %v", prefix, err)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	_, err := Config{
		Dir:           "relative/dir",
		PodResources:  "kubelet.sock",
		Reconcile:     -time.Second,
		Grace:         -time.Second,
		FeaturesFile:  "/etc/nfd/features.d/.fusiond",
		FeaturePrefix: "kubernetes.io/",
	}.withDefaults()
	if err == nil {
		t.Fatal("no error")
	}
	for _, field := range []string{"Dir", "PodResources", "Reconcile", "Grace", "FeaturesFile", "FeaturePrefix"} {
		if !strings.Contains(err.Error(), "deviceplugin: "+field+":") {
			t.Errorf("the error does not name %s: %v", field, err)
		}
	}
	for _, prefix := range []string{"fusiond.io", "Fusiond.io/", "node.kubernetes.io/", "/"} {
		if _, err := (Config{FeaturePrefix: prefix}).withDefaults(); err == nil {
			t.Errorf("prefix %q accepted", prefix)
		}
	}
	if _, err := (Config{Dir: "/" + strings.Repeat("d", 100)}).withDefaults(); err == nil {
		t.Error("a Dir too long for a socket path accepted")
	}
	if _, err := New(nil, Config{}); err == nil {
		t.Error("New without a pool succeeded")
	}
}

func TestSocketNames(t *testing.T) {
	taken := map[string]bool{}
	name := func(resource string) string {
		n := socketName(resource, func(s string) bool { return taken[s] })
		taken[n] = true
		return n
	}
	for _, tc := range []struct{ resource, want string }{
		{"fusiond.io/gpu-h200", "fusiond-gpu-h200.sock"},
		{"fusiond.io/gpu-h200-mig-1g.18gb", "fusiond-gpu-h200-mig-1g.18gb.sock"},
		{"example.com/fpga", "fusiond-example.com-fpga.sock"},
		{"fusiond.io/.hidden", "fusiond-hidden.sock"},
	} {
		if got := name(tc.resource); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.resource, got, tc.want)
		}
	}
	// "fusiond.io/example.com-fpga" sanitises like "example.com/fpga".
	a := name("fusiond.io/example.com-fpga")
	if a == "fusiond-example.com-fpga.sock" || !strings.HasPrefix(a, "fusiond-example.com-fpga-") || !strings.HasSuffix(a, ".sock") {
		t.Errorf("colliding name: %s", a)
	}
	if long := socketBase("fusiond.io/" + strings.Repeat("x", 200)); len(long) > 80 {
		t.Errorf("long name %d bytes", len(long))
	}
	for _, bad := range []string{"gpu", "/gpu", "fusiond.io/", "kubernetes.io/gpu", "x.kubernetes.io/gpu", "fusiond.io/a/b", "Fusiond.IO/gpu"} {
		if err := checkResourceName(bad); err == nil {
			t.Errorf("resource name %q accepted", bad)
		}
	}
	if err := checkResourceName("fusiond.io/gpu-h200_mig.1g"); err != nil {
		t.Error(err)
	}
}

func TestLatencyPercentiles(t *testing.T) {
	var l latencies
	if s := l.stats(); s != (Latency{}) {
		t.Errorf("empty: %+v", s)
	}
	for i := 100; i >= 1; i-- {
		l.record(time.Duration(i)*time.Millisecond, nil)
	}
	l.record(time.Millisecond, errors.New("x"))
	s := l.stats()
	if s.Count != 101 || s.Errors != 1 || s.P50 != 50*time.Millisecond || s.P99 != 99*time.Millisecond || s.Max != 100*time.Millisecond {
		t.Errorf("stats %+v", s)
	}
	// The window keeps the last 1024 calls.
	for range latencyWindow {
		l.record(time.Second, nil)
	}
	if s := l.stats(); s.P50 != time.Second || s.Max != time.Second || s.Count != 101+latencyWindow {
		t.Errorf("after the window turned: %+v", s)
	}
}

func TestCheckPreferred(t *testing.T) {
	avail, must := []string{"a", "b", "c"}, []string{"c"}
	for _, tc := range []struct {
		ids []string
		ok  bool
	}{
		{[]string{"c", "a"}, true},
		{[]string{"a", "b"}, false},      // leaves out c
		{[]string{"c"}, false},           // too few
		{[]string{"c", "c"}, false},      // twice
		{[]string{"c", "x"}, false},      // not offered
		{[]string{"c", "a", "b"}, false}, // too many
	} {
		if err := checkPreferred(tc.ids, avail, must, 2); (err == nil) != tc.ok {
			t.Errorf("%v: %v", tc.ids, err)
		}
	}
}

func TestRenderFeatures(t *testing.T) {
	content, skipped := renderFeatures("fusiond.io/", map[string]string{
		"gpu.count": "8", "gpu.model": "NVIDIA-H200", "fpga": "", "bad name": "x",
		"long": strings.Repeat("v", 64), "-dash": "x", "mig": "true",
	})
	want := "fusiond.io/fpga=\nfusiond.io/gpu.count=8\nfusiond.io/gpu.model=NVIDIA-H200\nfusiond.io/mig=true\n"
	if string(content) != want {
		t.Errorf("content:\n%s\nwant:\n%s", content, want)
	}
	if len(skipped) != 3 {
		t.Errorf("skipped %v", skipped)
	}
}

func TestFeaturesFile(t *testing.T) {
	pool := newFakePool(gpus(true))
	pool.features = map[string]string{"gpu.count": "1", "gpu.model": "H200", "bad name!": "x"}
	e := newEnv(t, pool)
	dir := filepath.Join(e.dir, "nfd", "features.d") // made by the plugin
	e.cfg.FeaturesFile = filepath.Join(dir, "fusiond")
	p := e.plugin()
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(context.Background()) // safe after the Stop below

	read := func() string {
		b, _ := os.ReadFile(e.cfg.FeaturesFile)
		return string(b)
	}
	eventually(t, "the features file", func() bool { return read() == "fusiond.io/gpu.count=1\nfusiond.io/gpu.model=H200\n" })
	eventually(t, "the left-out feature logged", func() bool { return strings.Contains(e.logs.String(), "bad name!") })
	id1, err := statID(e.cfg.FeaturesFile)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(e.cfg.FeaturesFile)
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("mode %v", fi.Mode())
	}

	// A signal without a change leaves the file alone.
	pool.fire()
	time.Sleep(50 * time.Millisecond)
	if id, _ := statID(e.cfg.FeaturesFile); id != id1 {
		t.Error("the file was rewritten without a change")
	}

	// A change replaces the file by a rename: a new inode, no temporary
	// file left beside it.
	pool.setFeatures(map[string]string{"gpu.count": "2"})
	eventually(t, "the new features", func() bool { return read() == "fusiond.io/gpu.count=2\n" })
	if n := e.logs.count("features left out"); n != 1 {
		t.Errorf("the left-out feature logged %d times", n)
	}
	if id, _ := statID(e.cfg.FeaturesFile); id.ino == id1.ino {
		t.Error("the file was rewritten in place, not replaced")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("files in the features directory: %v", entries)
	}

	// Removed by someone: written again.
	if err := os.Remove(e.cfg.FeaturesFile); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the file written again", func() bool { return read() == "fusiond.io/gpu.count=2\n" })

	// Stopping the plugin leaves the file (see features.go).
	if err := p.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if read() != "fusiond.io/gpu.count=2\n" {
		t.Error("the features file went with the plugin")
	}
}

func TestFeaturesFileRetriesAfterFailure(t *testing.T) {
	dir := t.TempDir()
	blocker := filepath.Join(dir, "features.d")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil { // a file where the directory should be
		t.Fatal(err)
	}
	f := &featuresFile{path: filepath.Join(blocker, "fusiond"), prefix: "fusiond.io/"}
	if _, err := f.update(map[string]string{"a": "1"}); err == nil {
		t.Fatal("write into a file succeeded")
	}
	if !f.stale() {
		t.Error("a failed write is not retried")
	}
	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	if _, err := f.update(map[string]string{"a": "1"}); err != nil {
		t.Fatal(err)
	}
	if f.stale() {
		t.Error("stale after a write")
	}
}

func TestStaleSocketReplaced(t *testing.T) {
	e := newEnv(t, newFakePool(gpus(true)))
	// A socket left by a daemon that was killed.
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(e.cfg.Dir, "fusiond-gpu-h200.sock"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	k := startKubelet(t, e.cfg.Dir)
	e.run(e.plugin())
	eventually(t, "registration over the stale socket", func() bool { return len(k.registrations()) == 1 })
}

func TestRegularFileNotReplaced(t *testing.T) {
	e := newEnv(t, newFakePool(gpus(true)))
	path := filepath.Join(e.cfg.Dir, "fusiond-gpu-h200.sock")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	k := startKubelet(t, e.cfg.Dir)
	e.run(e.plugin())
	eventually(t, "the failure to serve logged", func() bool { return e.logs.count("cannot serve the resource") > 0 })
	time.Sleep(100 * time.Millisecond) // retries
	if n := len(k.registrations()); n != 0 {
		t.Fatalf("registered over a regular file")
	}
	if n := e.logs.count("cannot serve the resource"); n != 1 {
		t.Errorf("the failure to serve logged %d times", n)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	eventually(t, "registration once the path is free", func() bool { return len(k.registrations()) == 1 })
}

package systemd_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/coreos/go-systemd/v22/unit"

	"github.com/fusiond/fusiond/daemon"
	"github.com/fusiond/fusiond/systemd"
)

// options parses a unit file into section -> key -> values.
func options(t *testing.T, data []byte) map[string]map[string][]string {
	t.Helper()
	opts, err := unit.DeserializeOptions(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("unit file does not parse: %v", err)
	}
	m := map[string]map[string][]string{}
	for _, o := range opts {
		if m[o.Section] == nil {
			m[o.Section] = map[string][]string{}
		}
		m[o.Section][o.Name] = append(m[o.Section][o.Name], o.Value)
	}
	return m
}

func one(t *testing.T, m map[string]map[string][]string, section, key string) string {
	t.Helper()
	v := m[section][key]
	if len(v) != 1 {
		t.Fatalf("[%s] %s: want exactly one value, have %q", section, key, v)
	}
	return v[0]
}

// The socket unit must open the socket where the daemon and fusionctl
// look for it by default, with the default group and mode: fusiond
// refuses an activated socket at another path.
func TestSocketUnitMatchesConfigDefaults(t *testing.T) {
	m := options(t, systemd.SocketUnit)
	def := daemon.DefaultConfig()
	for key, want := range map[string]string{
		"ListenStream": def.Socket,
		"SocketGroup":  def.SocketGroup,
		"SocketMode":   def.SocketMode,
	} {
		if got := one(t, m, "Socket", key); got != want {
			t.Errorf("fusiond.socket %s=%s, daemon default is %s", key, got, want)
		}
	}
}

// The service settings other parts of fusiond depend on.
func TestServiceUnitSettings(t *testing.T) {
	m := options(t, systemd.ServiceUnit)
	for key, want := range map[string]string{
		"Type":             "notify",  // the daemon sends READY=1
		"NotifyAccess":     "main",    // monitors must not notify
		"KillMode":         "process", // job monitors outlive restarts
		"Delegate":         "yes",     // fusiond/ cgroup subtree
		"Restart":          "on-failure",
		"OOMPolicy":        "continue", // one job's OOM kill is not fatal
		"StateDirectory":   "fusiond",
		"RuntimeDirectory": "fusiond",
	} {
		if got := one(t, m, "Service", key); got != want {
			t.Errorf("fusiond.service %s=%s, want %s", key, got, want)
		}
	}
	if one(t, m, "Service", "WatchdogSec") == "" {
		t.Error("fusiond.service has no WatchdogSec")
	}
	// No flags: the daemon reads daemon.DefaultConfigPath, which the
	// package installs, and runs on defaults if an admin deleted it.
	if exe := one(t, m, "Service", "ExecStart"); exe != "/usr/bin/fusiond" {
		t.Errorf("ExecStart=%s, want /usr/bin/fusiond with no flags", exe)
	}
	if daemon.DefaultConfigPath != "/etc/fusiond/config.yaml" {
		t.Errorf("daemon reads %s; the packages install /etc/fusiond/config.yaml", daemon.DefaultConfigPath)
	}
	if got := m["Unit"]["Requires"]; len(got) != 1 || got[0] != "fusiond.socket" {
		t.Errorf("Requires=%q, want fusiond.socket", got)
	}
}

// Every setting in both units is explained by the comment block right
// above it (a run of settings may share one comment).
func TestEverySettingIsCommented(t *testing.T) {
	for name, data := range map[string][]byte{"fusiond.service": systemd.ServiceUnit, "fusiond.socket": systemd.SocketUnit} {
		commented := false
		for i, line := range strings.Split(string(data), "\n") {
			line = strings.TrimSpace(line)
			switch {
			case line == "", strings.HasPrefix(line, "["):
				commented = false
			case strings.HasPrefix(line, "#"):
				commented = true
			case !commented && !strings.HasPrefix(line, "Description=") && !strings.HasPrefix(line, "Documentation="):
				t.Errorf("%s:%d: %q has no comment above it", name, i+1, line)
			}
		}
	}
}

// systemd-analyze verify checks both units as systemd 252 (Debian 12)
// would load them. It insists that ExecStart's binary exists, so the test
// builds fusiond and points a copy of the service at it; nothing else in
// the units is changed. The booted-Debian test (packaging/test) verifies
// the installed units unchanged.
func TestSystemdAnalyzeVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatalf("systemd-analyze is needed (apt-get install -y systemd): %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "fusiond")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/fusiond/fusiond/cmd/fusiond").CombinedOutput(); err != nil {
		t.Fatalf("building fusiond: %v\n%s", err, out)
	}
	svc := bytes.Replace(systemd.ServiceUnit, []byte("ExecStart=/usr/bin/fusiond\n"), []byte("ExecStart="+bin+"\n"), 1)
	if bytes.Equal(svc, systemd.ServiceUnit) {
		t.Fatal("ExecStart=/usr/bin/fusiond not found in fusiond.service")
	}
	for name, data := range map[string][]byte{"fusiond.service": svc, "fusiond.socket": systemd.SocketUnit} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// --man=no: the man pages are only installed by the package.
	cmd := exec.Command(analyze, "verify", "--man=no", filepath.Join(dir, "fusiond.socket"), filepath.Join(dir, "fusiond.service"))
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

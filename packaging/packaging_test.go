package packaging_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/goreleaser/chglog"

	"github.com/fusiond/fusiond/daemon"
	"github.com/fusiond/fusiond/packaging"
)

func TestPackageVersion(t *testing.T) {
	for in, want := range map[string]string{
		"v1.2.3":                   "1.2.3",
		"1.2.3":                    "1.2.3",
		"v1.2.3-rc.1":              "1.2.3~rc.1",
		"v1.2.3-4-gabc1234":        "1.2.3+git.4.abc1234",
		"v1.2.3-4-gabc1234-dirty":  "1.2.3+git.4.abc1234.dirty",
		"v1.2.3-dirty":             "1.2.3+git.dirty",
		"5a6997b":                  "0.0.0~git.5a6997b",
		"5a6997b-dirty":            "0.0.0~git.5a6997b~dirty",
		"dev":                      "0.0.0~git.dev",
		" v2.0.0\n":                "2.0.0",
		"1234567890abcdef12345678": "0.0.0~git.1234567890abcdef12345678",
	} {
		got, err := packaging.PackageVersion(in)
		if err != nil || got != want {
			t.Errorf("PackageVersion(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "v1.2.3 beta", "1.2_3", "1.2.3:4"} {
		if got, err := packaging.PackageVersion(bad); !errors.Is(err, packaging.ErrVersion) {
			t.Errorf("PackageVersion(%q) = %q, %v; want ErrVersion", bad, got, err)
		}
	}
}

// Versions that sort one way as tags must sort the same way as packages.
func TestPackageVersionOrder(t *testing.T) {
	dpkg, err := exec.LookPath("dpkg")
	if err != nil {
		t.Fatalf("dpkg is needed to compare versions: %v", err)
	}
	order := []string{"5a6997b", "v0.9.0", "v1.0.0-rc.1", "v1.0.0", "v1.0.0-3-gabc1234", "v1.0.1"}
	for i := 1; i < len(order); i++ {
		a, _ := packaging.PackageVersion(order[i-1])
		b, _ := packaging.PackageVersion(order[i])
		if err := exec.Command(dpkg, "--compare-versions", a, "lt", b).Run(); err != nil {
			t.Errorf("dpkg does not order %s (%s) before %s (%s)", a, order[i-1], b, order[i])
		}
	}
}

func TestWriteChangelog(t *testing.T) {
	dir := t.TempDir()
	dst := filepath.Join(dir, "changelog.yaml")
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	if err := packaging.WriteChangelog("changelog.yaml", dst, "0.2.0~dev-1", now); err != nil {
		t.Fatal(err)
	}
	got, err := chglog.Parse(dst)
	if err != nil {
		t.Fatal(err)
	}
	src, _ := chglog.Parse("changelog.yaml")
	if len(got) != len(src)+1 || got[0].Semver != "0.2.0~dev-1" || !got[0].Date.Equal(now) || got[1].Semver != src[0].Semver {
		t.Errorf("development entry not added on top: %+v", got[0])
	}
	if err := packaging.WriteChangelog("changelog.yaml", dst, src[0].Semver, now); err != nil {
		t.Fatal(err)
	}
	if got, _ = chglog.Parse(dst); len(got) != len(src) {
		t.Errorf("release build added an entry: %d entries, want %d", len(got), len(src))
	}
}

// The shipped config.yaml documents the defaults: as shipped it means
// all defaults, and uncommenting every setting changes nothing.
func TestDefaultConfigDocumentsDefaults(t *testing.T) {
	data, err := os.ReadFile("config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := daemon.DefaultConfig()
	if err := daemon.ParseConfig(data, &cfg); err != nil {
		t.Fatalf("shipped config: %v", err)
	}
	setting := regexp.MustCompile(`(?m)^#([^ #\n]|  )`)
	uncommented := setting.ReplaceAll(data, []byte("$1"))
	if bytes.Equal(uncommented, data) {
		t.Fatal("no commented settings found")
	}
	var got daemon.Config
	if err := daemon.ParseConfig(uncommented, &got); err != nil {
		t.Fatalf("uncommented config: %v\n%s", err, uncommented)
	}
	if a, b := mustJSON(t, got), mustJSON(t, daemon.DefaultConfig()); a != b {
		t.Errorf("documented values differ from the defaults:\n doc: %s\n def: %s", a, b)
	}
}

func mustJSON(t *testing.T, c daemon.Config) string {
	t.Helper()
	var b strings.Builder
	if err := writeJSON(&b, c); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// Build makes a deb and an rpm whose contents, conffiles and scripts are
// what nfpm.yaml promises.
func TestBuildPackages(t *testing.T) {
	for _, tool := range []string{"dpkg-deb", "rpm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed to inspect the packages (apt-get install -y dpkg rpm): %v", tool, err)
		}
	}
	dir := t.TempDir()
	bin, stage, out := filepath.Join(dir, "bin"), filepath.Join(dir, "stage"), filepath.Join(dir, "out")
	os.MkdirAll(bin, 0o755)
	// fusionctl is built for real: it writes its own man pages and
	// completions; fusiond is only carried, so a stand-in will do.
	if err := os.WriteFile(filepath.Join(bin, "fusiond"), []byte("#!/bin/sh\necho fusiond\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-o", bin, "github.com/fusiond/fusiond/cmd/fusionctl")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building fusionctl: %v\n%s", err, out)
	}
	mtime := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	if err := packaging.WriteDocs(filepath.Join(bin, "fusionctl"), "man/fusiond.8", stage, mtime); err != nil {
		t.Fatal(err)
	}
	if err := packaging.WriteChangelog("changelog.yaml", filepath.Join(stage, "changelog.yaml"), "1.2.3-1", mtime); err != nil {
		t.Fatal(err)
	}
	paths, err := packaging.Build(packaging.Options{
		Root: "..", Config: "packaging/nfpm.yaml", Version: "1.2.3", Arch: "amd64",
		Bin: bin, Stage: stage, Out: out, MTime: mtime,
	}, "deb", "rpm")
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 2 || filepath.Base(paths[0]) != "fusiond_1.2.3-1_amd64.deb" || filepath.Base(paths[1]) != "fusiond-1.2.3-1.x86_64.rpm" {
		t.Fatalf("packages %q", paths)
	}
	common := []string{
		"/usr/bin/fusiond", "/usr/bin/fusionctl",
		"/usr/lib/systemd/system/fusiond.service", "/usr/lib/systemd/system/fusiond.socket",
		"/usr/lib/sysusers.d/fusiond.conf", "/etc/fusiond/config.yaml",
		"/usr/share/man/man1/fusionctl.1.gz", "/usr/share/man/man1/fusionctl-run.1.gz", "/usr/share/man/man8/fusiond.8.gz",
		"/usr/share/bash-completion/completions/fusionctl", "/usr/share/fish/vendor_completions.d/fusionctl.fish",
		"/usr/share/man/man1/fusionctl-top.1.gz",
		"/usr/share/fusiond/grafana/fusiond-dashboard.json", "/usr/share/fusiond/prometheus/fusiond-alerts.yml",
	}
	debList := lines(t, "sh", "-c", "dpkg-deb -c "+paths[0]+" | awk '{print substr($6, 2)}'")
	for _, f := range append(common, "/usr/share/zsh/vendor-completions/_fusionctl", "/usr/share/doc/fusiond/copyright", "/usr/share/doc/fusiond/changelog.Debian.gz") {
		if !slices.Contains(debList, f) {
			t.Errorf("deb lacks %s", f)
		}
	}
	if got := strings.Join(lines(t, "sh", "-c", "dpkg-deb --ctrl-tarfile "+paths[0]+" | tar -xO ./conffiles"), ","); got != "/etc/fusiond/config.yaml" {
		t.Errorf("deb conffiles %q", got)
	}
	ctrl := strings.Join(lines(t, "dpkg-deb", "-f", paths[0], "Version", "Depends"), "\n")
	if !strings.Contains(ctrl, "Version: 1.2.3-1") || !strings.Contains(ctrl, "libc6 (>= 2.34)") {
		t.Errorf("deb control:\n%s", ctrl)
	}
	for _, s := range []string{"postinst", "prerm", "postrm"} {
		if len(lines(t, "sh", "-c", "dpkg-deb --ctrl-tarfile "+paths[0]+" | tar -xO ./"+s)) < 3 {
			t.Errorf("deb %s script missing", s)
		}
	}
	rpmList := lines(t, "rpm", "-qlp", paths[1])
	for _, f := range append(common, "/usr/share/zsh/site-functions/_fusionctl", "/usr/share/licenses/fusiond/LICENSE") {
		if !slices.Contains(rpmList, f) {
			t.Errorf("rpm lacks %s", f)
		}
	}
	if got := lines(t, "rpm", "-qcp", paths[1]); !slices.Equal(got, []string{"/etc/fusiond/config.yaml"}) {
		t.Errorf("rpm config files %q", got)
	}
	scripts := strings.Join(lines(t, "rpm", "-qp", "--scripts", paths[1]), "\n")
	for _, want := range []string{"preinstall scriptlet", "postinstall scriptlet", "preuninstall scriptlet", "postuninstall scriptlet", "systemctl --no-reload preset"} {
		if !strings.Contains(scripts, want) {
			t.Errorf("rpm scripts lack %q", want)
		}
	}
}

func lines(t *testing.T, name string, args ...string) []string {
	t.Helper()
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		t.Fatalf("%s %q: %v", name, args, err)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// The maintainer scripts parse as POSIX sh, and the deb ones stop at the
// first failing command.
func TestMaintainerScriptsParse(t *testing.T) {
	scripts, err := filepath.Glob("scripts/*/*")
	if err != nil || len(scripts) != 7 {
		t.Fatalf("maintainer scripts %q, %v; want 3 deb and 4 rpm", scripts, err)
	}
	for _, s := range scripts {
		if out, err := exec.Command("sh", "-n", s).CombinedOutput(); err != nil {
			t.Errorf("%s: %v\n%s", s, err, out)
		}
		if strings.HasPrefix(s, "scripts/deb/") {
			data, _ := os.ReadFile(s)
			if !strings.HasPrefix(string(data), "#!/bin/sh\n") || !strings.Contains(string(data), "\nset -e\n") {
				t.Errorf("%s: want #!/bin/sh and set -e", s)
			}
		}
	}
}

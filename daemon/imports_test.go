package daemon_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/fusiond/fusiond"

// goList runs go list over the whole module (production code only: tests
// may import what they test with) and returns each package's direct
// imports, or with deps the transitive dependencies of the named packages.
func goList(t *testing.T, args ...string) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, msg)
	}
	pkgs := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 0 {
			pkgs[fields[0]] = fields[1:]
		}
	}
	return pkgs
}

func rel(p string) string { return strings.TrimPrefix(strings.TrimPrefix(p, module), "/") }

func under(p string, prefixes ...string) bool {
	for _, pre := range prefixes {
		if p == pre || strings.HasPrefix(p, pre+"/") {
			return true
		}
	}
	return false
}

// TestImportRules keeps the layout docs/architecture.md describes: who may
// import whom. It fails naming the package and the import that breaks a
// rule.
func TestImportRules(t *testing.T) {
	imports := goList(t, "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./...")
	if len(imports) < 20 {
		t.Fatalf("go list found only %d packages", len(imports))
	}
	// Libraries that touch hardware or the kernel, and the only packages
	// that may import them directly.
	hardwareLibs := map[string][]string{
		"github.com/NVIDIA/go-nvml":         {"devices/nvidia"},
		"github.com/jaypipes/ghw":           {"topology"},
		"github.com/containerd/cgroups":     {"cgroups"},
		"github.com/cilium/ebpf":            {"cgroups", "ebpf"},
		"github.com/opencontainers/runc":    {"daemon/internal/executor/container"}, // containers are the executor's, over cgroups' limits
		"github.com/opencontainers/cgroups": {"cgroups", "daemon/internal/executor/container"},
		// Not hardware, but confined the same way: membership and gossip
		// are the peers package's.
		"github.com/hashicorp/memberlist": {"daemon/internal/peers"},
		// Kubelet's device-plugin and pod-resources APIs (and their gRPC)
		// are the device plugin's.
		"k8s.io/kubelet":         {"daemon/internal/deviceplugin"},
		"google.golang.org/grpc": {"daemon/internal/deviceplugin"},
	}
	// Public packages: what a user of the module may import. None of them
	// may reach into the daemon's internals or its composition root.
	public := []string{"daemon/api", "daemon/sched", "daemon/forecast", "daemon/profile", "daemon/buildinfo", "devices", "topology", "cgroups", "systemd", "ebpf"}
	// The pure engine's allowed standard-library imports: no I/O.
	pureStd := []string{"cmp", "errors", "fmt", "iter", "maps", "math", "math/bits", "math/rand/v2", "slices", "sort", "strconv", "strings", "sync"}

	for pkg, deps := range imports {
		p := rel(pkg)
		for _, d := range deps {
			dr := rel(d)
			local := strings.HasPrefix(d, module)
			switch {
			case local && dr == "daemon" && p != "cmd/fusiond":
				t.Errorf("%s imports the composition root daemon: only cmd/fusiond may", p)
			case local && under(dr, "daemon/internal") && under(p, public...):
				t.Errorf("public package %s imports daemon internal %s", p, dr)
			case local && under(dr, "cmd") && !under(p, "cmd"):
				t.Errorf("%s imports command code %s", p, dr)
			}
			for lib, owners := range hardwareLibs {
				if under(d, lib) && !under(p, owners...) {
					t.Errorf("%s imports %s directly: hardware is touched only in %s", p, d, strings.Join(owners, ", "))
				}
			}
			if p == "daemon/sched" && (local || !slices.Contains(pureStd, d)) {
				t.Errorf("the pure engine daemon/sched imports %s: it may import only %s", d, strings.Join(pureStd, " "))
			}
			// Admission's rules need no records: of this module they
			// use the API types alone (the job manager runs them).
			if p == "daemon/internal/admission" && local && dr != "daemon/api" {
				t.Errorf("daemon/internal/admission imports %s: it may import only daemon/api of this module", dr)
			}
			// The hand-over reaches the records through its own
			// interface (jobs.Manager.Records implements it): no
			// records, no store, no peers of its own.
			if p == "daemon/internal/handover" && local && dr != "daemon/api" {
				t.Errorf("daemon/internal/handover imports %s: it may import only daemon/api of this module", dr)
			}
			// The lifecycle orders parts it knows only by name.
			if p == "daemon/internal/lifecycle" && local {
				t.Errorf("daemon/internal/lifecycle imports %s: it may import no package of this module", dr)
			}
			// The forecasters are pure too (the CLI and the daemon share them).
			if p == "daemon/forecast" && (local || !slices.Contains(append(pureStd, "math/cmplx"), d)) {
				t.Errorf("the pure forecasters daemon/forecast import %s: they may import only %s math/cmplx", d, strings.Join(pureStd, " "))
			}
			// Task profiles are pure too (the simulator and the daemon
			// share them): no I/O but the reader and writer they are given.
			if p == "daemon/profile" && (local || !slices.Contains(append(pureStd, "time", "io", "bufio", "encoding/json", "unicode/utf8"), d)) {
				t.Errorf("the pure task profiles daemon/profile import %s", d)
			}
		}
		// Hardware packages never depend on the daemon or the API; they
		// may use the scheduling vocabulary (tiers) of the pure engine.
		if under(p, "devices", "topology", "cgroups", "ebpf") {
			for _, d := range deps {
				if under(rel(d), "daemon", "cmd") && rel(d) != "daemon/sched" && strings.HasPrefix(d, module) {
					t.Errorf("hardware package %s imports %s", p, rel(d))
				}
			}
		}
	}
}

// TestBinaryDependencies checks what each binary links: the privileged
// daemon links neither the CLI nor the offline simulator, and the CLI
// links no driver, cgroup, container or store code.
func TestBinaryDependencies(t *testing.T) {
	linked := func(bin string) []string {
		var out []string
		for p := range goList(t, "-deps", "./cmd/"+bin) {
			out = append(out, p)
		}
		return out
	}
	fusiond := linked("fusiond")
	for _, p := range fusiond {
		if under(rel(p), "cmd/fusionctl") || under(p, "github.com/spf13/cobra") {
			t.Errorf("fusiond links %s: the CLI and the simulator stay out of the daemon", p)
		}
	}
	if !slices.Contains(fusiond, module+"/daemon/internal/jobs") {
		t.Errorf("fusiond does not link daemon/internal/jobs: go list -deps is not telling the truth")
	}
	for _, p := range linked("fusionctl") {
		if under(rel(p), "daemon/internal", "devices/nvidia", "devices/rapl", "cgroups", "ebpf") ||
			under(p, "github.com/NVIDIA/go-nvml", "github.com/opencontainers/runc", "github.com/containerd/cgroups", "github.com/cilium/ebpf", "go.etcd.io/bbolt", "github.com/hashicorp/memberlist", "google.golang.org/grpc") {
			t.Errorf("fusionctl links %s: the CLI talks to the daemon's API and touches no hardware", p)
		}
	}
}

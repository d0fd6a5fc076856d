package topology

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/topology/simhost"
)

// writeSimhost writes a fresh simhost tree into a temporary directory,
// with simCores cores per socket unless opts say otherwise (the full 56-core
// tree has ~12k files and takes seconds on a busy machine).
func writeSimhost(t testing.TB, opts ...simhost.Option) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "root")
	if err := simhost.Plan(append([]simhost.Option{simhost.WithCoresPerSocket(simCores)}, opts...)...).Write(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// discoverAt runs Discover on a tree and fails the test on error.
func discoverAt(t testing.TB, root string, opts ...Option) *Host {
	t.Helper()
	h, err := Discover(context.Background(), append([]Option{WithRoot(root)}, opts...)...)
	if err != nil {
		t.Fatalf("Discover(%s): %v", root, err)
	}
	return h
}

// writeFile overwrites (or creates) a file in a fixture tree.
func writeFile(t testing.TB, root, p, content string) {
	t.Helper()
	full := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func hasWarning(h *Host, substr string) bool {
	for _, w := range h.Warnings {
		if strings.Contains(w, substr) {
			return true
		}
	}
	return false
}

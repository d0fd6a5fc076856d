package topology

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// TestHwlocProvenance: every file PROVENANCE.md lists for a vendored
// hwloc set is there with that sha256, and every file there (but the
// provenance itself and our allow-list) is listed, so a clone that lost a
// file (a .gitignore pattern, an LFS pointer) fails here by name.
func TestHwlocProvenance(t *testing.T) {
	row := regexp.MustCompile(`(?m)^\| ([0-9a-f]{64}) \| ([^ |]+) \|$`)
	for _, dir := range []string{hwlocTreeDir, hwlocMasterDir} {
		doc, err := os.ReadFile(filepath.Join(dir, "PROVENANCE.md"))
		if err != nil {
			t.Fatal(err)
		}
		listed := map[string]bool{}
		for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
			listed[m[2]] = true
			b, err := os.ReadFile(filepath.Join(dir, m[2]))
			if err != nil {
				t.Errorf("%s: listed in PROVENANCE.md but unreadable: %v", dir, err)
				continue
			}
			if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != m[1] {
				t.Errorf("%s/%s: sha256 %x, PROVENANCE.md says %s", dir, m[2], sum, m[1])
			}
		}
		if len(listed) == 0 {
			t.Fatalf("%s/PROVENANCE.md lists no files", dir)
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if n := e.Name(); n != "PROVENANCE.md" && n != "allow.txt" && !listed[n] {
				t.Errorf("%s/%s is not listed in PROVENANCE.md", dir, n)
			}
		}
	}
}

package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The scheduling.defrag section: its defaults reach the job manager, and
// each bad setting is refused naming the file and the key.
func TestDefragConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(body string) string {
		p := filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg, err := LoadConfig(write(""), true)
	if err != nil {
		t.Fatal(err)
	}
	if q := cfg.Scheduling.queue().Defrag; !q.Enabled || q.MaxMoves != 4 || q.Window != 10*time.Minute || q.MinInterval != 30*time.Minute {
		t.Errorf("default defrag config reaches the manager as %+v", q)
	}
	cfg, err = LoadConfig(write("scheduling: {defrag: {enabled: false, max_moves: 2, window: 1m, min_interval_per_job: 5m}}\n"), true)
	if err != nil {
		t.Fatal(err)
	}
	if q := cfg.Scheduling.queue().Defrag; q.Enabled || q.MaxMoves != 2 || q.Window != time.Minute || q.MinInterval != 5*time.Minute {
		t.Errorf("defrag config reaches the manager as %+v", q)
	}
	for body, key := range map[string]string{
		"scheduling: {defrag: {max_moves: 0}}\n":             "scheduling.defrag.max_moves",
		"scheduling: {defrag: {max_moves: 1001}}\n":          "scheduling.defrag.max_moves",
		"scheduling: {defrag: {window: 0s}}\n":               "scheduling.defrag.window",
		"scheduling: {defrag: {min_interval_per_job: 0s}}\n": "scheduling.defrag.min_interval_per_job",
		"scheduling: {defrag: {per_job: 1m}}\n":              "scheduling.defrag.per_job",
	} {
		p := write(body)
		_, err := LoadConfig(p, true)
		if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), key) {
			t.Errorf("%q: error %v, want one naming the file and the key %q", body, err, key)
		}
	}
}

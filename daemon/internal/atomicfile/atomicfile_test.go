package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteReplaces(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f.json")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, 0o640, func(f *os.File) error { _, err := f.WriteString("new"); return err }); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil || string(got) != "new" {
		t.Fatalf("content %q, %v; want new", got, err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v, %v; want 0640", st.Mode(), err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("%d entries left in the directory, want the file alone", len(ents))
	}
}

// TestWriteFailureKeepsOld: a failing writer leaves the old file and no
// temporary file, and its error is wrapped.
func TestWriteFailureKeepsOld(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f.json")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := Write(path, 0o600, func(f *os.File) error { _, _ = f.WriteString("half"); return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("error %v, want it to wrap %v", err, boom)
	}
	if got, _ := os.ReadFile(path); string(got) != "old" {
		t.Fatalf("content %q after a failed write, want old", got)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("%d entries left in the directory, want the file alone", len(ents))
	}
	if err := Write(filepath.Join(dir, "missing", "f"), 0o600, func(*os.File) error { return nil }); err == nil {
		t.Fatal("a write into a missing directory succeeded")
	}
}

package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func readRecords(t *testing.T, path string) []Record {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []Record
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%s: line %q: %v", path, sc.Text(), err)
		}
		out = append(out, r)
	}
	return out
}

func TestRecordToLogAndFile(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := Open(path, Options{}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.Record(Record{UID: 1000, GID: 1000, User: "alice", PID: 42, Action: "job.cancel", Method: "POST",
		Path: "/v1/jobs/7/cancel", Target: "7", Outcome: Refused, Status: 404, Code: "not_found", Message: "no job 7"})
	recs := readRecords(t, path)
	if len(recs) != 1 || recs[0].User != "alice" || recs[0].PID != 42 || recs[0].Target != "7" || recs[0].Time.IsZero() {
		t.Fatalf("file records %+v", recs)
	}
	var line struct {
		Msg   string         `json:"msg"`
		Level string         `json:"level"`
		Audit map[string]any `json:"audit"`
	}
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("log line %q: %v", buf.String(), err)
	}
	if line.Msg != "audit" || line.Level != "WARN" || line.Audit["uid"] != 1000.0 || line.Audit["user"] != "alice" ||
		line.Audit["pid"] != 42.0 || line.Audit["action"] != "job.cancel" || line.Audit["outcome"] != Refused || line.Audit["status"] != 404.0 {
		t.Errorf("log line %s", buf.String())
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("audit file mode: %v %v", st.Mode(), err)
	}
}

// TestRotation: the file stays under its cap, Keep old files are kept and
// the newest records are where they should be.
func TestRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	const maxBytes = 1000
	l, err := Open(path, Options{MaxBytes: maxBytes, Keep: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	for i := range n {
		l.Record(Record{UID: int64(i), Action: "job.submit", Outcome: OK, Status: 201, Target: fmt.Sprint(i)})
	}
	l.Close()
	files, _ := filepath.Glob(path + "*")
	if len(files) != 4 {
		t.Fatalf("files %v, want audit.log and 3 rotated", files)
	}
	for _, f := range files {
		if st, _ := os.Stat(f); st.Size() > maxBytes {
			t.Errorf("%s is %d bytes, cap %d", f, st.Size(), maxBytes)
		}
	}
	cur, old := readRecords(t, path), readRecords(t, path+".1")
	if len(cur) == 0 || cur[len(cur)-1].UID != n-1 {
		t.Fatalf("newest record not last in audit.log: %+v", cur)
	}
	if old[len(old)-1].UID != cur[0].UID-1 {
		t.Errorf("audit.log.1 ends at %d, audit.log starts at %d", old[len(old)-1].UID, cur[0].UID)
	}
	// Reopening appends to the existing file and keeps counting its size.
	l, err = Open(path, Options{MaxBytes: maxBytes, Keep: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	before := len(readRecords(t, path))
	l.Record(Record{UID: n, Outcome: OK})
	l.Close()
	if got := readRecords(t, path); len(got) != before+1 && len(got) != 1 {
		t.Errorf("after reopening: %d records, had %d", len(got), before)
	}
}

// TestFailingFile: a file that cannot be written is reported once on the
// log, the record still reaches the log, and writing resumes.
func TestFailingFile(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	l, err := Open(path, Options{MaxBytes: 64 << 10, Keep: 1}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.f.Close() // every write now fails
	l.Record(Record{UID: 1, Action: "node.cordon", Outcome: OK})
	l.Record(Record{UID: 2, Action: "node.cordon", Outcome: OK})
	if c := strings.Count(buf.String(), "writing the audit file failed"); c != 1 {
		t.Errorf("failure reported %d times:\n%s", c, buf.String())
	}
	if c := strings.Count(buf.String(), "audit.action=node.cordon"); c != 2 {
		t.Errorf("records on the log: %d:\n%s", c, buf.String())
	}
	l.f = nil // reopened on the next write
	l.Record(Record{UID: 3, Action: "node.uncordon", Outcome: OK})
	if recs := readRecords(t, path); len(recs) != 1 || recs[0].UID != 3 || !strings.Contains(buf.String(), "works again") {
		t.Errorf("after recovery: %+v\n%s", recs, buf.String())
	}
}

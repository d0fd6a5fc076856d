package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
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
	path = StreamPaths(path)[Refusals] // a user's refusal
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
	base := filepath.Join(dir, "audit.log")
	path := StreamPaths(base)[Users] // users' actions
	const maxBytes = 1000
	l, err := Open(base, Options{MaxBytes: maxBytes, Keep: 3}, nil)
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
		t.Fatalf("files %v, want audit-users.log and 3 rotated", files)
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
	l, err = Open(base, Options{MaxBytes: maxBytes, Keep: 3}, nil)
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
	l.streams[Admins].f.Close() // every write now fails
	l.Record(Record{UID: 1, Admin: true, Action: "node.cordon", Outcome: OK})
	l.Record(Record{UID: 2, Admin: true, Action: "node.cordon", Outcome: OK})
	if c := strings.Count(buf.String(), "writing the audit file failed"); c != 1 {
		t.Errorf("failure reported %d times:\n%s", c, buf.String())
	}
	if c := strings.Count(buf.String(), "audit.action=node.cordon"); c != 2 {
		t.Errorf("records on the log: %d:\n%s", c, buf.String())
	}
	l.streams[Admins].f = nil // reopened on the next write
	l.Record(Record{UID: 3, Admin: true, Action: "node.uncordon", Outcome: OK})
	if recs := readRecords(t, path); len(recs) != 1 || recs[0].UID != 3 || !strings.Contains(buf.String(), "works again") {
		t.Errorf("after recovery: %+v\n%s", recs, buf.String())
	}
}

// TestFloodKeepsRootsRecords: root's actions go to their own file, which
// neither 3,000 refusals of another user nor 3,000 of that user's
// actions rotate; the refusals beyond the rate limit are counted in a
// summary record, so written and summed up they make every one.
func TestFloodKeepsRootsRecords(t *testing.T) {
	base := filepath.Join(t.TempDir(), "audit.log")
	l, err := Open(base, Options{MaxBytes: 64 << 10, Keep: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	clock := time.Unix(1_800_000_000, 0)
	l.now = func() time.Time { return clock }
	for i := range 3 {
		l.Record(Record{UID: 0, Admin: true, Action: "node.cordon", Outcome: OK, Status: 200, Target: fmt.Sprint("root-", i)})
	}
	for i := range 3000 {
		l.Record(Record{UID: 1000, User: "mallory", Action: "request", Method: "GET", Path: "/v1/jobs/x", Outcome: Refused, Status: 404})
		l.Record(Record{UID: 1000, User: "mallory", Action: "job.submit", Outcome: OK, Status: 201, Target: fmt.Sprint(i)})
		if i%600 == 599 {
			clock = clock.Add(time.Second) // 3,000 over 4 s: 4 × 5 more tokens
		}
	}
	l.Close()
	paths := StreamPaths(base)
	admins := readRecords(t, paths[Admins])
	if len(admins) != 3 || admins[0].Target != "root-0" {
		t.Fatalf("root's records: %+v", admins)
	}
	if _, err := os.Stat(paths[Admins] + ".1"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the admins' file was rotated by another user's traffic: %v", err)
	}
	written, summed := 0, 0
	for _, r := range readRecords(t, paths[Refusals]) {
		if r.Action == SummaryAction {
			n, _ := strconv.Atoi(r.Target)
			summed += n
			if r.UID != 1000 || !strings.Contains(r.Message, "refused requests of uid 1000") {
				t.Errorf("summary %+v", r)
			}
			continue
		}
		written++
	}
	if want := DefaultRefusedBurst + 4*DefaultRefusedRate; written != want || written+summed != 3000 {
		t.Errorf("refusals: %d written and %d summed up; want %d written (burst + 4 s of rate) and 3000 in all", written, summed, want)
	}
}

// TestRecordBounded: a request with a 900 KB path makes a record of a
// few KiB that still says how long the path was.
func TestRecordBounded(t *testing.T) {
	base := filepath.Join(t.TempDir(), "audit.log")
	l, err := Open(base, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	long := "/v1/jobs/" + strings.Repeat("é", 450_000)
	l.Record(Record{UID: 1000, Action: "request", Path: long, Message: strings.Repeat("m", 1<<20), User: strings.Repeat("u", 5000), Outcome: Refused, Status: 404})
	l.Close()
	b, err := os.ReadFile(StreamPaths(base)[Refusals])
	if err != nil {
		t.Fatal(err)
	}
	recs := readRecords(t, StreamPaths(base)[Refusals])
	if len(b) > 4096 || len(recs) != 1 || !strings.HasSuffix(recs[0].Path, fmt.Sprintf("…(%d bytes)", len(long))) || !utf8.ValidString(recs[0].Path) {
		t.Errorf("record of %d bytes: %.200q", len(b), b)
	}
}

// TestMaxAge: rotated files older than MaxAge are removed, younger kept.
func TestMaxAge(t *testing.T) {
	base := filepath.Join(t.TempDir(), "audit.log")
	old, young := base+".2", base+".1"
	for _, p := range []string{old, young} {
		if err := os.WriteFile(p, []byte("{}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	past := time.Now().Add(-100 * 24 * time.Hour)
	os.Chtimes(old, past, past)
	l, err := Open(base, Options{MaxAge: DefaultMaxAge}, nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if _, err := os.Stat(old); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a file of 100 days kept under a 90-day MaxAge: %v", err)
	}
	if _, err := os.Stat(young); err != nil {
		t.Errorf("a young rotated file removed: %v", err)
	}
}

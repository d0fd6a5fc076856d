package store

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/fusiond/fusiond/daemon/api"
)

func open(t *testing.T, path string, opts Options) *Store {
	t.Helper()
	s, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestCreatePutReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	s := open(t, path, Options{})
	var wg sync.WaitGroup
	ids := make(chan string, 60)
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 1
			if i < 5 {
				n = 3 // a few batches among the single jobs
			}
			jobs, err := s.CreateJobs(n, func(k int, id string) api.Job {
				return api.Job{ID: id, State: api.StatePending, Version: 1, Spec: api.JobSpec{Priority: i}}
			})
			if err != nil || len(jobs) != n {
				t.Errorf("CreateJobs(%d) = %d jobs, %v", n, len(jobs), err)
			}
			for k, j := range jobs {
				if k > 0 && idNumT(t, j.ID) != idNumT(t, jobs[k-1].ID)+1 {
					t.Errorf("a batch's IDs are not consecutive: %s after %s", j.ID, jobs[k-1].ID)
				}
				ids <- j.ID
			}
		}()
	}
	wg.Wait()
	close(ids)
	seen := map[string]bool{}
	for id := range ids {
		if seen[id] {
			t.Fatalf("duplicate id %s", id)
		}
		seen[id] = true
	}
	// A newer version wins; an older write does not move the record back.
	if err := s.PutJob(api.Job{ID: "7", State: api.StateRunning, Version: 3}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutJob(api.Job{ID: "7", State: api.StatePlaced, Version: 2}); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s = open(t, path, Options{})
	n := 0
	if err := s.Jobs(func(api.Job) error { n++; return nil }); err != nil || n != 60 {
		t.Fatalf("reopened store has %d jobs (%v), want 60", n, err)
	}
	j, err := s.GetJob("7")
	if err != nil || j.State != api.StateRunning {
		t.Errorf("job 7: %+v %v, want the version-3 record", j.State, err)
	}
	if err := s.DeleteJobs("7"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetJob("7"); !errors.Is(err, ErrNotFound) {
		t.Errorf("deleted job: %v", err)
	}
}

func TestOpenRefusesBadDatabases(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage")
	os.WriteFile(garbage, make([]byte, 64<<10), 0o600)
	if _, err := Open(garbage, Options{}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("zeroed file: %v, want ErrCorrupt", err)
	}

	locked := filepath.Join(dir, "locked")
	open(t, locked, Options{})
	if _, err := Open(locked, Options{LockTimeout: 50e6}); !errors.Is(err, ErrLocked) {
		t.Errorf("second open: %v, want ErrLocked", err)
	}

	newer := filepath.Join(dir, "newer")
	s := open(t, newer, Options{})
	s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(keySchema, []byte("99")) })
	s.Close()
	if _, err := Open(newer, Options{}); !errors.Is(err, ErrTooNew) {
		t.Errorf("schema 99: %v, want ErrTooNew", err)
	}

	bad := filepath.Join(dir, "badrecord")
	s = open(t, bad, Options{})
	s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketJobs).Put(seqKey(1), []byte("{not json")) })
	if err := s.Jobs(func(api.Job) error { return nil }); !errors.Is(err, ErrCorrupt) {
		t.Errorf("undecodable record: %v, want ErrCorrupt", err)
	}
}

func TestMigrationHook(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	s := open(t, path, Options{})
	s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(keySchema, []byte("0")) })
	s.Close()

	if _, err := Open(path, Options{}); err == nil {
		t.Fatal("opened a schema-0 database with no migration")
	}
	ran := false
	s = open(t, path, Options{Migrations: []Migration{{From: 0, Apply: func(tx *bolt.Tx) error {
		ran = true
		return tx.Bucket(bucketMeta).Put([]byte("x.migrated"), []byte("yes"))
	}}}})
	if v, _ := s.Meta("migrated"); !ran || v != "yes" {
		t.Errorf("migration ran=%v, meta=%q", ran, v)
	}
}

func idNumT(t *testing.T, id string) int {
	n, err := strconv.Atoi(id)
	if err != nil {
		t.Fatalf("job id %q: %v", id, err)
	}
	return n
}

// TestGroupCommit holds a commit on its way (its write waits inside the
// transaction) while 63 writers arrive: they are committed together in
// the next transaction, not one each; a write whose function fails (a
// bad ID, a panic) gets its own error and the others commit; a write
// after Close fails.
func TestGroupCommit(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "db"), Options{})
	commits := 0
	hold, held := make(chan struct{}), make(chan struct{})
	go s.commit(func(tx *bolt.Tx) error {
		commits++
		close(held)
		<-hold
		return nil
	})
	<-held
	var wg sync.WaitGroup
	errs := make([]error, 63)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch i {
			case 7:
				errs[i] = s.DeleteJobs("not-a-number")
			case 8:
				errs[i] = s.commit(func(*bolt.Tx) error { panic("bad write") })
			default:
				_, errs[i] = s.CreateJobs(1, func(_ int, id string) api.Job {
					return api.Job{ID: id, State: api.StatePending, Version: 1, Spec: api.JobSpec{Name: strconv.Itoa(i)}}
				})
			}
		}()
	}
	for {
		s.mu.Lock()
		n := len(s.queue)
		s.mu.Unlock()
		if n == len(errs) {
			break
		}
		runtime.Gosched()
	}
	// Count the transactions the waiting writes take from here on (first
	// in the group, it runs in each).
	s.mu.Lock()
	s.queue = append([]write{{fn: func(*bolt.Tx) error { commits++; return nil }, err: make(chan error, 1)}}, s.queue...)
	s.mu.Unlock()
	close(hold)
	wg.Wait()
	for i, err := range errs {
		switch {
		case i == 7 && !errors.Is(err, ErrNotFound), i == 8 && (err == nil || !strings.Contains(err.Error(), "panicked: bad write")):
			t.Errorf("write %d: %v", i, err)
		case i != 7 && i != 8 && err != nil:
			t.Errorf("write %d: %v", i, err)
		}
	}
	// The held commit, the group (with the counter), and the group again
	// after each of the two failures took it out.
	if commits != 4 {
		t.Errorf("%d transactions ran the counting write and the held one, want 4 (1 + the group, run again after each of 2 failures)", commits)
	}
	n := 0
	if err := s.Jobs(func(api.Job) error { n++; return nil }); err != nil || n != len(errs)-2 {
		t.Errorf("%d jobs stored (%v), want %d", n, err, len(errs)-2)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.SetMeta("x", "y"); !errors.Is(err, ErrClosed) {
		t.Errorf("a write after Close: %v", err)
	}
}

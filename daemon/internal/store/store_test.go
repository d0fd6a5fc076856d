package store

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
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

// Package store keeps fusiond's durable records — jobs with their spec,
// state, events, allocation and exit status — in a bbolt database in the
// state directory. What it writes is its own Record type, converted from
// and to the API's api.Job at this package's boundary. Every write is
// fsynced before it returns, so a job the API acknowledged survives a
// crash. Writes that arrive while a commit is on its way to the disk are
// committed together in the next one (group commit, see commit). The
// schema is versioned; Open runs the migrations from older
// versions and refuses databases from newer ones.
//
// It owns the bbolt database and may import daemon/api, bbolt and the
// standard library.
package store

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/fusiond/fusiond/daemon/api"
)

// SchemaVersion is the version of the on-disk layout this code writes.
const SchemaVersion = 1

var (
	bucketMeta = []byte("meta")
	bucketJobs = []byte("jobs")
	keySchema  = []byte("schema_version")
)

// Sentinel errors for callers that branch.
var (
	// ErrLocked means another process holds the database.
	ErrLocked = errors.New("state database is locked by another process")
	// ErrCorrupt means the database cannot be read.
	ErrCorrupt = errors.New("state database is corrupt")
	// ErrTooNew means the database was written by a newer fusiond.
	ErrTooNew = errors.New("state database schema is newer than this fusiond")
	// ErrNotFound means no record has that key.
	ErrNotFound = errors.New("no such record")
)

// Migration upgrades the database from schema From to From+1 inside one
// transaction.
type Migration struct {
	From  int
	Apply func(tx *bolt.Tx) error
}

// Options tune Open.
type Options struct {
	// LockTimeout is how long Open waits for another process's lock.
	LockTimeout time.Duration
	// Migrations are run in order for databases older than SchemaVersion.
	Migrations []Migration
	Logger     *slog.Logger
}

// Store is the job database.
type Store struct {
	db  *bolt.DB
	log *slog.Logger
	// mu guards queue and closed: the writes waiting for the next
	// commit (group commit); wake tells the committer there are some,
	// done is closed when it has stopped.
	mu     sync.Mutex
	queue  []write
	closed bool
	wake   chan struct{}
	done   chan struct{}
}

// write is one caller's part of a commit: fn runs in the transaction,
// its outcome (the commit's, or fn's own error) goes to err.
type write struct {
	fn  func(*bolt.Tx) error
	err chan error
}

// ErrClosed means the store was closed.
var ErrClosed = errors.New("state database is closed")

// Open opens (creating if needed) the database at path. A locked, corrupt
// or too-new database is an error; it never silently starts empty.
func Open(path string, opts Options) (*Store, error) {
	if opts.LockTimeout == 0 {
		opts.LockTimeout = time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: opts.LockTimeout})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("%w: %s (is another fusiond running with the same state directory?)", ErrLocked, path)
		}
		return nil, fmt.Errorf("%w: %s: %w (move it aside to start with an empty database; its jobs will be forgotten)", ErrCorrupt, path, err)
	}
	s := &Store{db: db, log: opts.Logger, wake: make(chan struct{}, 1), done: make(chan struct{})}
	if err := s.init(path, opts.Migrations); err != nil {
		db.Close()
		return nil, err
	}
	go s.committer()
	return s, nil
}

// commit runs fn in a write transaction and returns once it is on disk
// (fsynced). It is group commit: a write arriving while no commit is
// under way is committed at once, alone; those arriving during a commit
// wait for it and are then committed together in one transaction, so
// concurrent writers share the disk's syncs instead of queueing for one
// each, and none waits for company (bbolt's Batch closes a batch after
// a fixed delay instead, then queues it behind the commit under way). A
// write whose fn fails is run again alone, so its error is its own and
// the others still commit; fn may therefore run more than once.
func (s *Store) commit(fn func(*bolt.Tx) error) error {
	w := write{fn: fn, err: make(chan error, 1)}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.queue = append(s.queue, w)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return <-w.err
}

// committer commits the waiting writes, all of them in one transaction,
// until the store is closed and none waits.
func (s *Store) committer() {
	defer close(s.done)
	for {
		<-s.wake
		for {
			s.mu.Lock()
			batch, closed := s.queue, s.closed
			s.queue = nil
			s.mu.Unlock()
			if len(batch) == 0 {
				if closed {
					return
				}
				break
			}
			s.run(batch)
		}
	}
}

// run commits batch in one transaction. A write whose fn fails is taken
// out and committed alone (its error is its answer), and the rest again.
func (s *Store) run(batch []write) {
	for len(batch) > 0 {
		failed := -1
		err := s.db.Update(func(tx *bolt.Tx) error {
			for i, w := range batch {
				if err := safely(w.fn, tx); err != nil {
					failed = i
					return err
				}
			}
			return nil
		})
		if failed < 0 {
			for _, w := range batch {
				w.err <- err
			}
			return
		}
		alone := batch[failed]
		alone.err <- s.db.Update(func(tx *bolt.Tx) error { return safely(alone.fn, tx) })
		batch = append(batch[:failed:failed], batch[failed+1:]...)
	}
}

// safely runs fn, a panic in it turned into its error: one bad write must
// not stop the committer every other write waits on.
func safely(fn func(*bolt.Tx) error, tx *bolt.Tx) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("store write panicked: %v", p)
		}
	}()
	return fn(tx)
}

func (s *Store) init(path string, migrations []Migration) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrCorrupt, path, err)
		}
		if _, err := tx.CreateBucketIfNotExists(bucketJobs); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrCorrupt, path, err)
		}
		v := meta.Get(keySchema)
		version := SchemaVersion
		if v != nil {
			version, err = strconv.Atoi(string(v))
			if err != nil {
				return fmt.Errorf("%w: %s: schema version %q is not a number", ErrCorrupt, path, v)
			}
		}
		if version > SchemaVersion {
			return fmt.Errorf("%w: %s has schema %d, this fusiond supports up to %d", ErrTooNew, path, version, SchemaVersion)
		}
		for version < SchemaVersion {
			m := findMigration(migrations, version)
			if m == nil {
				return fmt.Errorf("%s: no migration from schema %d to %d", path, version, version+1)
			}
			if err := m.Apply(tx); err != nil {
				return fmt.Errorf("%s: migrating schema %d to %d: %w", path, version, version+1, err)
			}
			s.log.Info("migrated state database", "path", path, "from", version, "to", version+1)
			version++
		}
		return meta.Put(keySchema, []byte(strconv.Itoa(version)))
	})
}

func findMigration(ms []Migration, from int) *Migration {
	for i := range ms {
		if ms[i].From == from {
			return &ms[i]
		}
	}
	return nil
}

// Close closes the database, after the writes already waiting are
// committed; later writes fail with ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	<-s.done
	return s.db.Close()
}

// Path is the database file.
func (s *Store) Path() string { return s.db.Path() }

func seqKey(seq uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], seq)
	return k[:]
}

func idKey(id string) ([]byte, error) {
	seq, err := strconv.ParseUint(id, 10, 64)
	if err != nil || seq == 0 {
		return nil, fmt.Errorf("%w: job id %q", ErrNotFound, id)
	}
	return seqKey(seq), nil
}

// CreateJobs assigns n consecutive job IDs, lets build fill in each record,
// and writes them in one transaction: all are stored or none is. It
// returns only after the records are on disk (fsynced). Concurrent callers
// are committed together in one transaction (build may then run again:
// see commit).
func (s *Store) CreateJobs(n int, build func(i int, id string) api.Job) ([]api.Job, error) {
	var jobs []api.Job
	err := s.commit(func(tx *bolt.Tx) error {
		jobs = jobs[:0]
		b := tx.Bucket(bucketJobs)
		for i := range n {
			seq, err := b.NextSequence()
			if err != nil {
				return err
			}
			job := build(i, strconv.FormatUint(seq, 10))
			data, err := json.Marshal(recordOf(job))
			if err != nil {
				return err
			}
			if err := b.Put(seqKey(seq), data); err != nil {
				return err
			}
			jobs = append(jobs, job)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store jobs: %w", err)
	}
	return jobs, nil
}

// PutJob writes a job record unless the stored one is newer (has a higher
// Version), so concurrent writers of one record cannot move it backwards.
// It returns after the write is on disk.
func (s *Store) PutJob(job api.Job) error {
	key, err := idKey(job.ID)
	if err != nil {
		return err
	}
	data, err := json.Marshal(recordOf(job))
	if err != nil {
		return fmt.Errorf("encode job %s: %w", job.ID, err)
	}
	err = s.commit(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketJobs)
		if old := b.Get(key); old != nil {
			var v struct {
				Version uint64 `json:"version"`
			}
			if err := json.Unmarshal(old, &v); err == nil && v.Version > job.Version {
				return nil
			}
		}
		return b.Put(key, data)
	})
	if err != nil {
		return fmt.Errorf("store job %s: %w", job.ID, err)
	}
	return nil
}

// DeleteJobs removes job records, committed with the other writes waiting
// (see commit).
func (s *Store) DeleteJobs(ids ...string) error {
	return s.commit(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketJobs)
		for _, id := range ids {
			key, err := idKey(id)
			if err != nil {
				return err
			}
			if err := b.Delete(key); err != nil {
				return err
			}
		}
		return nil
	})
}

// Jobs calls fn for every job record in ID order. A record that cannot be
// decoded is an error naming it.
func (s *Store) Jobs(fn func(api.Job) error) error {
	return s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketJobs).ForEach(func(k, v []byte) error {
			var r Record
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("%w: job record %d: %w", ErrCorrupt, binary.BigEndian.Uint64(k), err)
			}
			return fn(r.Job())
		})
	})
}

// GetJob reads one job record.
func (s *Store) GetJob(id string) (api.Job, error) {
	key, err := idKey(id)
	if err != nil {
		return api.Job{}, err
	}
	var r Record
	err = s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketJobs).Get(key)
		if v == nil {
			return fmt.Errorf("%w: job %s", ErrNotFound, id)
		}
		return json.Unmarshal(v, &r)
	})
	if err != nil {
		return api.Job{}, err
	}
	return r.Job(), nil
}

// SetMeta stores a small daemon-wide setting (e.g. "cordoned").
func (s *Store) SetMeta(key, value string) error {
	return s.commit(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put([]byte("x."+key), []byte(value))
	})
}

// Probe checks that the store takes writes: it stores a record of size
// bytes (as large as a job record could need, so that a few free pages left
// in the file do not pass for a writable filesystem), then removes it.
func (s *Store) Probe(size int) error {
	key := []byte("probe")
	err := s.commit(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(key, make([]byte, size))
	})
	if err != nil {
		return fmt.Errorf("probe write: %w", err)
	}
	if err := s.commit(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Delete(key) }); err != nil {
		return fmt.Errorf("probe write: %w", err)
	}
	return nil
}

// Meta reads a setting stored with SetMeta ("" when unset).
func (s *Store) Meta(key string) (string, error) {
	var out string
	err := s.db.View(func(tx *bolt.Tx) error {
		out = string(tx.Bucket(bucketMeta).Get([]byte("x." + key)))
		return nil
	})
	return out, err
}

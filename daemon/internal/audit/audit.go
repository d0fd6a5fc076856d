// Package audit records who did what, when, and with what outcome: every
// privileged action the API performs (job submission and cancellation, the
// admin routes) and every request it refuses (401, 403, 404, 413, 422,
// 429). Each record goes to the daemon's log (the journal under systemd)
// as one line with the message "audit" and its fields under the key
// "audit", and as one JSON line to one of three size-capped files in the
// state directory — the admins', other users' actions, other users'
// refusals — each rotated to file.1 … file.N on its own and expired by
// age, so that no user's traffic rotates root's records out. Refusals are
// rate-limited per user with a counted summary, and every record is
// bounded in size.
package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// Outcomes of a record.
const (
	// OK: the action was done.
	OK = "ok"
	// Refused: the caller was not allowed, or asked for something invalid
	// (a 4xx answer).
	Refused = "refused"
	// Failed: the daemon could not do it (a 5xx answer).
	Failed = "failed"
)

// Record is one audited request.
type Record struct {
	Time time.Time `json:"time"`
	// Who: the caller's kernel identity (SO_PEERCRED) and user name; UID
	// and GID are -1 for a caller whose credentials could not be read.
	UID   int64  `json:"uid"`
	GID   int64  `json:"gid"`
	User  string `json:"user,omitempty"`
	PID   int32  `json:"pid"`
	Admin bool   `json:"admin,omitempty"`
	// Peer is the calling peer's certificate identity (its node name),
	// for a request over the peer API; User is then the user the peer
	// asked a job to run as.
	Peer string `json:"peer,omitempty"`
	// Source is how a submitted job entered (socket, batch, peer, gang,
	// replica: daemon/internal/admission).
	Source string `json:"source,omitempty"`
	// What: the action ("job.submit", "node.cordon", …; "request" for a
	// refusal of an unprivileged request), the route and its target (a
	// job id, GPU index, region, bitstream).
	Action string `json:"action"`
	Method string `json:"method"`
	Path   string `json:"path"`
	Target string `json:"target,omitempty"`
	// Outcome: OK, Refused or Failed, with the HTTP status and, for an
	// error, its code, field and message.
	Outcome string `json:"outcome"`
	Status  int    `json:"status"`
	Code    string `json:"code,omitempty"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message,omitempty"`
}

// Options bound the audit files.
type Options struct {
	// MaxBytes is the size at which each stream's file is rotated.
	MaxBytes int64
	// Keep is how many rotated files (path.1 … path.Keep) each stream
	// keeps.
	Keep int
	// MaxAge removes a stream's rotated files older than this (0: they
	// go by Keep alone).
	MaxAge time.Duration
	// RefusedRate and RefusedBurst bound the refusals recorded per user
	// (non-admin callers; a token bucket: RefusedRate a second, RefusedBurst
	// at once). Those beyond are counted, not written, and a summary
	// record says how many of whose were left out and when.
	RefusedRate  float64
	RefusedBurst int
}

// Defaults for Options.
const (
	DefaultMaxBytes     = 16 << 20
	DefaultKeep         = 5
	DefaultMaxAge       = 90 * 24 * time.Hour
	DefaultRefusedRate  = 5
	DefaultRefusedBurst = 50
)

// Streams. Records go to one of three files, each rotated on its own, so
// that no caller's traffic can push another's records out:
//   - Admins: everything root, the daemon's user and the admin group did
//     or were refused (the path Open is given, audit.log);
//   - Users: other users' privileged actions, done or failed
//     (audit-users.log);
//   - Refusals: other users' refused requests, rate-limited per user
//     (audit-refused.log).
const (
	Admins   = "admins"
	Users    = "users"
	Refusals = "refused"
)

// Field bounds: a record is at most a few KiB whatever a caller sends
// (a 900 KB path is kept as its first 512 bytes and its length).
const (
	maxPath    = 512
	maxMessage = 1024
	maxShort   = 256
)

// SummaryAction is the action of a record that counts the refusals a
// rate limit kept out of the file.
const SummaryAction = "audit.suppressed"

// Log is the audit log. Its methods are safe for concurrent use.
type Log struct {
	log  *slog.Logger
	opts Options

	mu      sync.Mutex
	streams map[string]*stream
	buckets map[string]*bucket // per uid (per peer, for peers), for Refusals
	now     func() time.Time
	stop    chan struct{}
	done    chan struct{}
}

// stream is one audit file.
type stream struct {
	path string
	f    *os.File
	size int64
	// failing is set once writing the file failed, so that a full disk is
	// reported once, not per request; it is cleared by the next success.
	failing bool
}

// bucket is one user's refusals allowance and what it kept out.
type bucket struct {
	tokens      float64
	at          time.Time
	suppressed  int
	first, last time.Time
	user        string
	uid         int64
	peer        string
}

// Open opens (creating, mode 0600) the audit files: the admins' at path,
// the others beside it (path's name with "-users" and "-refused" before
// its extension); records also go to log.
func Open(path string, opts Options, log *slog.Logger) (*Log, error) {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.Keep <= 0 {
		opts.Keep = DefaultKeep
	}
	if opts.RefusedRate <= 0 {
		opts.RefusedRate = DefaultRefusedRate
	}
	if opts.RefusedBurst <= 0 {
		opts.RefusedBurst = DefaultRefusedBurst
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Log{log: log, opts: opts, streams: map[string]*stream{}, buckets: map[string]*bucket{}, now: time.Now,
		stop: make(chan struct{}), done: make(chan struct{})}
	for name, p := range StreamPaths(path) {
		st := &stream{path: p}
		if err := st.open(); err != nil {
			for _, o := range l.streams {
				o.f.Close()
			}
			return nil, err
		}
		l.streams[name] = st
		l.expire(st)
	}
	go l.flusher()
	return l, nil
}

// StreamPaths are the files of the audit log at path, by stream.
func StreamPaths(path string) map[string]string {
	ext := filepath.Ext(path)
	base := strings.TrimSuffix(path, ext)
	return map[string]string{Admins: path, Users: base + "-users" + ext, Refusals: base + "-refused" + ext}
}

func (s *stream) open() error {
	f, err := os.OpenFile(s.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("audit log: %w", err)
	}
	s.f, s.size = f, st.Size()
	return nil
}

// streamOf is where r goes.
func streamOf(r Record) string {
	switch {
	case r.Admin:
		return Admins
	case r.Outcome == Refused:
		return Refusals
	default:
		return Users
	}
}

// Record writes r to the log and its stream's file. A non-admin's refusal
// beyond the rate limit is only counted (see Options.RefusedRate). A
// failing file does not fail the request: it is reported on the log (once
// until it works again), and the record is still in the log.
func (l *Log) Record(r Record) {
	if r.Time.IsZero() {
		r.Time = l.now().UTC()
	}
	bound(&r)
	name := streamOf(r)
	l.mu.Lock()
	defer l.mu.Unlock()
	if name == Refusals {
		b := l.bucketOf(r)
		if b.tokens < 1 {
			if b.suppressed == 0 {
				b.first = r.Time
			}
			b.suppressed++
			b.last = r.Time
			return
		}
		b.tokens--
		if b.suppressed > 0 {
			l.write(Refusals, l.summary(b))
		}
	}
	l.write(name, r)
}

// bucketOf refills and returns r's caller's bucket. l.mu held.
func (l *Log) bucketOf(r Record) *bucket {
	now := l.now()
	key := strconv.FormatInt(r.UID, 10)
	if r.Peer != "" {
		key = "peer " + r.Peer
	}
	b, ok := l.buckets[key]
	if !ok {
		if len(l.buckets) >= 4096 {
			l.flushLocked(true) // forget idle users' buckets
		}
		b = &bucket{tokens: float64(l.opts.RefusedBurst), at: now, uid: r.UID, peer: r.Peer}
		l.buckets[key] = b
	}
	b.tokens = min(float64(l.opts.RefusedBurst), b.tokens+now.Sub(b.at).Seconds()*l.opts.RefusedRate)
	b.at = now
	b.user = r.User
	return b
}

// summary is the record of what b kept out, which it then forgets.
func (l *Log) summary(b *bucket) Record {
	who := "uid " + strconv.FormatInt(b.uid, 10)
	if b.peer != "" {
		who = "peer " + b.peer
	}
	rec := Record{Time: b.last.UTC(), UID: b.uid, GID: -1, User: b.user, Peer: b.peer, Action: SummaryAction, Outcome: Refused, Status: 429,
		Target: strconv.Itoa(b.suppressed),
		Message: fmt.Sprintf("%d refused requests of %s between %s and %s not recorded: more than %g a second (burst %d)",
			b.suppressed, who, b.first.UTC().Format(time.RFC3339Nano), b.last.UTC().Format(time.RFC3339Nano), l.opts.RefusedRate, l.opts.RefusedBurst)}
	b.suppressed = 0
	return rec
}

// flusher writes pending summaries every few seconds, so that a flood
// that stops is still summed up.
func (l *Log) flusher() {
	defer close(l.done)
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			l.mu.Lock()
			l.flushLocked(false)
			l.mu.Unlock()
		}
	}
}

// flushLocked writes every pending summary and, with forget, drops the
// buckets that are full again. l.mu held.
func (l *Log) flushLocked(forget bool) {
	for key, b := range l.buckets {
		if b.suppressed > 0 {
			l.write(Refusals, l.summary(b))
		}
		if forget && b.tokens+l.now().Sub(b.at).Seconds()*l.opts.RefusedRate >= float64(l.opts.RefusedBurst) {
			delete(l.buckets, key)
		}
	}
}

// bound truncates the fields a caller controls.
func bound(r *Record) {
	cut := func(s *string, n int) {
		if len(*s) > n {
			i := n
			for i > 0 && !utf8.RuneStart((*s)[i]) {
				i--
			}
			*s = fmt.Sprintf("%s…(%d bytes)", (*s)[:i], len(*s))
		}
	}
	cut(&r.Path, maxPath)
	cut(&r.Message, maxMessage)
	for _, f := range []*string{&r.User, &r.Peer, &r.Source, &r.Action, &r.Method, &r.Target, &r.Code, &r.Field} {
		cut(f, maxShort)
	}
}

// write logs r and appends it to stream name. l.mu held.
func (l *Log) write(name string, r Record) {
	level := slog.LevelInfo
	if r.Outcome != OK {
		level = slog.LevelWarn
	}
	attrs := []any{
		slog.Int64("uid", r.UID), slog.Int64("gid", r.GID), slog.String("user", r.User),
		slog.Int("pid", int(r.PID)), slog.String("action", r.Action), slog.String("method", r.Method),
		slog.String("path", r.Path), slog.String("outcome", r.Outcome), slog.Int("status", r.Status),
	}
	if r.Admin {
		attrs = append(attrs, slog.Bool("admin", true))
	}
	for _, kv := range [][2]string{{"peer", r.Peer}, {"source", r.Source}, {"target", r.Target}, {"code", r.Code}, {"field", r.Field}, {"message", r.Message}} {
		if kv[1] != "" {
			attrs = append(attrs, slog.String(kv[0], kv[1]))
		}
	}
	l.log.Log(context.Background(), level, "audit", slog.Group("audit", attrs...))

	line, err := json.Marshal(r)
	if err != nil {
		l.log.Error("audit record not encoded", "err", err)
		return
	}
	line = append(line, '\n')
	st := l.streams[name]
	err = l.append(st, line)
	switch {
	case err != nil && !st.failing:
		st.failing = true
		l.log.Error("writing the audit file failed; records still go to this log", "path", st.path, "err", err)
	case err == nil && st.failing:
		st.failing = false
		l.log.Info("writing the audit file works again", "path", st.path)
	}
}

func (l *Log) append(st *stream, line []byte) error {
	if st.f == nil {
		if err := st.open(); err != nil {
			return err
		}
	}
	if st.size > 0 && st.size+int64(len(line)) > l.opts.MaxBytes {
		if err := l.rotate(st); err != nil {
			return err
		}
	}
	n, err := st.f.Write(line)
	st.size += int64(n)
	return err
}

// rotate shifts path.N-1 → path.N … path → path.1 (dropping the oldest),
// starts an empty file and removes rotated files past MaxAge.
func (l *Log) rotate(st *stream) error {
	name := func(i int) string { return st.path + "." + strconv.Itoa(i) }
	if err := os.Remove(name(l.opts.Keep)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("audit rotation: %w", err)
	}
	for i := l.opts.Keep - 1; i >= 1; i-- {
		if err := os.Rename(name(i), name(i+1)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("audit rotation: %w", err)
		}
	}
	if err := os.Rename(st.path, name(1)); err != nil {
		return fmt.Errorf("audit rotation: %w", err)
	}
	st.f.Close()
	st.f = nil
	if err := st.open(); err != nil {
		return err
	}
	l.expire(st)
	return nil
}

// expire removes st's rotated files older than MaxAge (their last record
// is that old).
func (l *Log) expire(st *stream) {
	if l.opts.MaxAge <= 0 {
		return
	}
	for i := 1; i <= l.opts.Keep; i++ {
		p := st.path + "." + strconv.Itoa(i)
		if fi, err := os.Stat(p); err == nil && l.now().Sub(fi.ModTime()) > l.opts.MaxAge {
			if err := os.Remove(p); err != nil {
				l.log.Warn("expired audit file not removed", "path", p, "err", err)
			}
		}
	}
}

// Close writes pending summaries and closes the files.
func (l *Log) Close() error {
	select {
	case <-l.stop:
		return nil
	default:
	}
	close(l.stop)
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flushLocked(false)
	var err error
	for _, st := range l.streams {
		if st.f != nil {
			err = errors.Join(err, st.f.Close())
			st.f = nil
		}
	}
	return err
}

type markKey struct{}

// WithMark returns a context for a request whose handler may record it
// itself (the job manager audits every admission): Mark on that context
// sets the returned flag, and the API's own record is then left out.
func WithMark(ctx context.Context) (context.Context, *atomic.Bool) {
	var b atomic.Bool
	return context.WithValue(ctx, markKey{}, &b), &b
}

// Mark notes on ctx (from WithMark) that its request has been recorded.
func Mark(ctx context.Context) {
	if b, ok := ctx.Value(markKey{}).(*atomic.Bool); ok {
		b.Store(true)
	}
}

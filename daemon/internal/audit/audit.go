// Package audit records who did what, when, and with what outcome: every
// privileged action the API performs (job submission and cancellation, the
// admin routes) and every request it refuses (401, 403, 404, 413, 422,
// 429). Each record goes to the daemon's log (the journal under systemd)
// as one line with the message "audit" and its fields under the key
// "audit", and as one JSON line to a size-capped file in the state
// directory that is rotated to file.1 … file.N.
package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"
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

// Options bound the audit file.
type Options struct {
	// MaxBytes is the size at which the file is rotated.
	MaxBytes int64
	// Keep is how many rotated files (path.1 … path.Keep) are kept.
	Keep int
}

// Defaults for Options.
const (
	DefaultMaxBytes = 16 << 20
	DefaultKeep     = 5
)

// Log is the audit log. Its methods are safe for concurrent use.
type Log struct {
	log  *slog.Logger
	path string
	opts Options

	mu   sync.Mutex
	f    *os.File
	size int64
	// failing is set once writing the file failed, so that a full disk is
	// reported once, not per request; it is cleared by the next success.
	failing bool
}

// Open opens (creating, mode 0600) the audit file at path; records also go
// to log.
func Open(path string, opts Options, log *slog.Logger) (*Log, error) {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.Keep <= 0 {
		opts.Keep = DefaultKeep
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Log{log: log, path: path, opts: opts}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *Log) open() error {
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("audit log: %w", err)
	}
	l.f, l.size = f, st.Size()
	return nil
}

// Record writes r to the log and the file. A failing file does not fail
// the request: it is reported on the log (once until it works again), and
// the record is still in the log.
func (l *Log) Record(r Record) {
	if r.Time.IsZero() {
		r.Time = time.Now().UTC()
	}
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
	for _, kv := range [][2]string{{"target", r.Target}, {"code", r.Code}, {"field", r.Field}, {"message", r.Message}} {
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
	l.mu.Lock()
	defer l.mu.Unlock()
	err = l.write(line)
	switch {
	case err != nil && !l.failing:
		l.failing = true
		l.log.Error("writing the audit file failed; records still go to this log", "path", l.path, "err", err)
	case err == nil && l.failing:
		l.failing = false
		l.log.Info("writing the audit file works again", "path", l.path)
	}
}

func (l *Log) write(line []byte) error {
	if l.f == nil {
		if err := l.open(); err != nil {
			return err
		}
	}
	if l.size > 0 && l.size+int64(len(line)) > l.opts.MaxBytes {
		if err := l.rotate(); err != nil {
			return err
		}
	}
	n, err := l.f.Write(line)
	l.size += int64(n)
	return err
}

// rotate shifts path.N-1 → path.N … path → path.1 (dropping the oldest)
// and starts an empty file.
func (l *Log) rotate() error {
	name := func(i int) string { return l.path + "." + strconv.Itoa(i) }
	if err := os.Remove(name(l.opts.Keep)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("audit rotation: %w", err)
	}
	for i := l.opts.Keep - 1; i >= 1; i-- {
		if err := os.Rename(name(i), name(i+1)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("audit rotation: %w", err)
		}
	}
	if err := os.Rename(l.path, name(1)); err != nil {
		return fmt.Errorf("audit rotation: %w", err)
	}
	l.f.Close()
	l.f = nil
	return l.open()
}

// Close closes the file.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

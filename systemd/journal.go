package systemd

import (
	"context"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/journal"
)

// JournalStream reports whether stderr is connected to the journal
// (systemd set JOURNAL_STREAM to stderr's device and inode), which is when
// fusiond should log through JournalHandler.
func JournalStream() bool {
	ok, err := journal.StderrIsJournalStream()
	return ok && err == nil
}

// SendFunc writes one journal entry; the default is go-systemd's
// journal.Send.
type SendFunc func(message string, priority journal.Priority, fields map[string]string) error

// JournalOptions configure a JournalHandler.
type JournalOptions struct {
	// Level is the minimum level logged (default info).
	Level slog.Leveler
	// Identifier is SYSLOG_IDENTIFIER, what `journalctl -t` selects
	// (default "fusiond").
	Identifier string
	// AddSource records CODE_FILE, CODE_LINE and CODE_FUNC.
	AddSource bool
	// Fallback receives records the journal refused (its socket gone,
	// say), so nothing is lost silently. Nil drops them.
	Fallback slog.Handler
	// Send replaces journal.Send, for tests.
	Send SendFunc
}

// JournalHandler is a slog.Handler writing to journald's native protocol:
// the message is MESSAGE, the level is PRIORITY, and every attribute is a
// field of its own, its key upper-cased with groups joined by "_"
// (job_id=j-1 in group exec becomes EXEC_JOB_ID=j-1), so that
// `journalctl -u fusiond JOB_ID=j-1` or `-o json` work on them.
type JournalHandler struct {
	opts   JournalOptions
	fields []field // from WithAttrs, already named
	prefix string  // from WithGroup: "EXEC_"
}

type field struct{ name, value string }

var _ slog.Handler = (*JournalHandler)(nil)

// NewJournalHandler returns a handler with the options' defaults filled.
func NewJournalHandler(o JournalOptions) *JournalHandler {
	if o.Level == nil {
		o.Level = slog.LevelInfo
	}
	if o.Identifier == "" {
		o.Identifier = "fusiond"
	}
	if o.Send == nil {
		o.Send = journal.Send
	}
	return &JournalHandler{opts: o}
}

// Enabled reports whether records at level are logged.
func (h *JournalHandler) Enabled(_ context.Context, level slog.Level) bool {
	return level >= h.opts.Level.Level()
}

// Handle sends one record as one journal entry.
func (h *JournalHandler) Handle(ctx context.Context, r slog.Record) error {
	vars := make(map[string]string, len(h.fields)+r.NumAttrs()+4)
	vars["SYSLOG_IDENTIFIER"] = h.opts.Identifier
	for _, f := range h.fields {
		vars[f.name] = f.value
	}
	r.Attrs(func(a slog.Attr) bool {
		for _, f := range flatten(h.prefix, a, nil) {
			vars[f.name] = f.value
		}
		return true
	})
	if h.opts.AddSource && r.PC != 0 {
		fr, _ := runtime.CallersFrames([]uintptr{r.PC}).Next()
		vars["CODE_FILE"], vars["CODE_LINE"], vars["CODE_FUNC"] = fr.File, strconv.Itoa(fr.Line), fr.Function
	}
	err := h.opts.Send(r.Message, Priority(r.Level), vars)
	if err != nil && h.opts.Fallback != nil {
		return h.opts.Fallback.Handle(ctx, r)
	}
	return err
}

// WithAttrs returns a handler that adds attrs to every record.
func (h *JournalHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	c.fields = append([]field(nil), h.fields...)
	for _, a := range attrs {
		c.fields = flatten(h.prefix, a, c.fields)
	}
	if h.opts.Fallback != nil {
		c.opts.Fallback = h.opts.Fallback.WithAttrs(attrs)
	}
	return &c
}

// WithGroup returns a handler whose later attributes are named NAME_KEY.
func (h *JournalHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	c := *h
	c.prefix = h.prefix + FieldName(name) + "_"
	if h.opts.Fallback != nil {
		c.opts.Fallback = h.opts.Fallback.WithGroup(name)
	}
	return &c
}

// flatten appends a's fields to dst: groups become prefixes, empty
// attributes are dropped as slog.Handler's contract asks.
func flatten(prefix string, a slog.Attr, dst []field) []field {
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		p := prefix
		if a.Key != "" {
			p += FieldName(a.Key) + "_"
		}
		for _, g := range v.Group() {
			dst = flatten(p, g, dst)
		}
		return dst
	}
	if a.Key == "" {
		return dst
	}
	var s string
	switch v.Kind() {
	case slog.KindTime:
		s = v.Time().UTC().Format(time.RFC3339Nano)
	default:
		s = v.String()
	}
	return append(dst, field{name: fieldName(prefix + FieldName(a.Key)), value: s})
}

// reserved are the fields the handler writes itself; an attribute of the
// same name is renamed ATTR_NAME rather than overwrite them.
var reserved = map[string]bool{
	"MESSAGE": true, "PRIORITY": true, "SYSLOG_IDENTIFIER": true,
	"CODE_FILE": true, "CODE_LINE": true, "CODE_FUNC": true, "MESSAGE_ID": true,
}

func fieldName(s string) string {
	if reserved[s] {
		s = "ATTR_" + s
	}
	if len(s) > 64 { // journald drops longer field names
		s = s[:64]
	}
	return s
}

// FieldName turns an attribute key into a valid journal field name:
// upper case letters, digits and underscores, not starting with a digit
// or an underscore (those are journald's trusted fields).
func FieldName(key string) string {
	b := make([]byte, 0, len(key))
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch {
		case c >= 'a' && c <= 'z':
			c -= 'a' - 'A'
		case c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		default:
			c = '_'
		}
		b = append(b, c)
	}
	s := strings.TrimLeft(string(b), "_")
	if s == "" || s[0] >= '0' && s[0] <= '9' {
		s = "F_" + s
	}
	return s
}

// Priority maps a slog level to a syslog priority.
func Priority(l slog.Level) journal.Priority {
	switch {
	case l >= slog.LevelError:
		return journal.PriErr
	case l >= slog.LevelWarn:
		return journal.PriWarning
	case l >= slog.LevelInfo:
		return journal.PriInfo
	default:
		return journal.PriDebug
	}
}

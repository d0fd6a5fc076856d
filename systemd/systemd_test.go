package systemd

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-systemd/v22/journal"
)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestNotifierStates(t *testing.T) {
	var sent []string
	n := NewNotifier(discard(), NotifierOptions{
		Notify:   func(s string) (bool, error) { sent = append(sent, s); return true, nil },
		Watchdog: func() (time.Duration, error) { return 30 * time.Second, nil },
	})
	n.Ready("serving on /run/x.sock\nand more")
	n.Status("busy")
	n.Ping()
	n.Stopping()
	want := []string{
		"READY=1\nSTATUS=serving on /run/x.sock and more",
		"STATUS=busy",
		"WATCHDOG=1",
		"STOPPING=1\nSTATUS=shutting down",
	}
	if strings.Join(sent, "|") != strings.Join(want, "|") {
		t.Errorf("sent %q\nwant %q", sent, want)
	}
	if got := n.WatchdogInterval(); got != 15*time.Second {
		t.Errorf("WatchdogInterval = %s, want half of WatchdogSec (15s)", got)
	}
}

func TestNotifierWatchdogOffOrBroken(t *testing.T) {
	for _, tc := range []struct {
		d   time.Duration
		err error
	}{{0, nil}, {time.Second, errors.New("bad WATCHDOG_USEC")}} {
		n := NewNotifier(discard(), NotifierOptions{
			Notify:   func(string) (bool, error) { return false, nil },
			Watchdog: func() (time.Duration, error) { return tc.d, tc.err },
		})
		if got := n.WatchdogInterval(); got != 0 {
			t.Errorf("watchdog (%s, %v): interval %s, want 0 (no pings)", tc.d, tc.err, got)
		}
	}
}

// Outside systemd (no NOTIFY_SOCKET) the real sd_notify does nothing and
// the notifier must not complain.
func TestNotifierWithoutSystemd(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	t.Setenv("WATCHDOG_USEC", "")
	var logged strings.Builder
	n := NewNotifier(slog.New(slog.NewTextHandler(&logged, nil)), NotifierOptions{})
	n.Ready("x")
	n.Ping()
	if n.WatchdogInterval() != 0 {
		t.Error("watchdog interval without systemd")
	}
	if logged.Len() > 0 {
		t.Errorf("logged without systemd: %s", logged.String())
	}
}

// A real notify socket receives the datagrams, as systemd's would.
func TestNotifierRealSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", path)
	NewNotifier(discard(), NotifierOptions{}).Ready("up")
	buf := make([]byte, 256)
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	k, err := conn.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(buf[:k]); got != "READY=1\nSTATUS=up" {
		t.Errorf("datagram %q", got)
	}
}

func listenerFile(t *testing.T, network, path string) *os.File {
	t.Helper()
	ln, err := net.Listen(network, path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var f *os.File
	switch l := ln.(type) {
	case *net.UnixListener:
		l.SetUnlinkOnClose(false)
		f, err = l.File()
	case *net.TCPListener:
		f, err = l.File()
	}
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestActivationListener(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.sock")
	ln, err := listenerFrom([]*os.File{listenerFile(t, "unix", path)}, path)
	if err != nil || ln == nil {
		t.Fatalf("listener %v, err %v", ln, err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dialling the activated socket: %v", err)
	}
	defer c.Close()
	b, _ := io.ReadAll(c)
	if string(b) != "hi" {
		t.Errorf("read %q through the activated listener", b)
	}
}

func TestActivationNone(t *testing.T) {
	ln, err := listenerFrom(nil, "/run/fusiond/fusiond.sock")
	if ln != nil || err != nil {
		t.Errorf("no sockets: got %v, %v; want nil, nil", ln, err)
	}
}

func TestActivationRefused(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock")
	cases := map[string][]*os.File{
		"other path": {listenerFile(t, "unix", a)},
		"two":        {listenerFile(t, "unix", a+"2"), listenerFile(t, "unix", b+"2")},
		"tcp":        {listenerFile(t, "tcp", "127.0.0.1:0")},
	}
	for name, files := range cases {
		ln, err := listenerFrom(files, b)
		if !errors.Is(err, ErrActivation) || ln != nil {
			t.Errorf("%s: got %v, %v; want ErrActivation", name, ln, err)
		}
	}
}

type entry struct {
	msg    string
	pri    journal.Priority
	fields map[string]string
}

func captureJournal(level slog.Level, fail error) (*[]entry, *JournalHandler) {
	var got []entry
	h := NewJournalHandler(JournalOptions{Level: level, Send: func(m string, p journal.Priority, f map[string]string) error {
		got = append(got, entry{m, p, f})
		return fail
	}})
	return &got, h
}

func TestJournalHandlerFields(t *testing.T) {
	got, h := captureJournal(slog.LevelDebug, nil)
	log := slog.New(h).With("node", "n1").WithGroup("exec").With(slog.Int("pid", 42))
	when := time.Date(2026, 11, 30, 1, 2, 3, 0, time.UTC)
	log.Warn("job started", "job_id", "j-1", "at", when, slog.Group("res", "cpu", "500m"), "message", "x", "9lives", 9, "", "empty")
	slog.New(h).Debug("dbg")
	slog.New(h).Error("bad", "err", errors.New("boom"), "priority", "p")
	if len(*got) != 3 {
		t.Fatalf("%d entries, want 3", len(*got))
	}
	e := (*got)[0]
	if e.msg != "job started" || e.pri != journal.PriWarning {
		t.Errorf("entry %q priority %d", e.msg, e.pri)
	}
	want := map[string]string{
		"SYSLOG_IDENTIFIER": "fusiond",
		"NODE":              "n1",
		"EXEC_PID":          "42",
		"EXEC_JOB_ID":       "j-1",
		"EXEC_AT":           "2026-11-30T01:02:03Z",
		"EXEC_RES_CPU":      "500m",
		"EXEC_MESSAGE":      "x",
		"EXEC_F_9LIVES":     "9",
	}
	for k, v := range want {
		if e.fields[k] != v {
			t.Errorf("field %s=%q, want %q (all: %v)", k, e.fields[k], v, e.fields)
		}
	}
	if len(e.fields) != len(want) {
		t.Errorf("fields %v, want exactly %v", e.fields, want)
	}
	if (*got)[1].pri != journal.PriDebug || (*got)[2].pri != journal.PriErr || (*got)[2].fields["ERR"] != "boom" || (*got)[2].fields["ATTR_PRIORITY"] != "p" {
		t.Errorf("debug/error entries: %+v", (*got)[1:])
	}
}

func TestJournalHandlerLevel(t *testing.T) {
	got, h := captureJournal(slog.LevelInfo, nil)
	slog.New(h).Debug("hidden")
	if len(*got) != 0 || h.Enabled(context.Background(), slog.LevelDebug) {
		t.Error("debug logged at level info")
	}
}

func TestJournalHandlerFallback(t *testing.T) {
	var stderr strings.Builder
	h := NewJournalHandler(JournalOptions{
		Fallback: slog.NewTextHandler(&stderr, nil),
		Send:     func(string, journal.Priority, map[string]string) error { return errors.New("journal gone") },
	})
	slog.New(h).With("a", 1).Info("kept")
	if !strings.Contains(stderr.String(), "msg=kept a=1") {
		t.Errorf("fallback got %q", stderr.String())
	}
}

func TestFieldName(t *testing.T) {
	for in, want := range map[string]string{
		"job_id": "JOB_ID", "gpu.uuid": "GPU_UUID", "_secret": "SECRET", "9x": "F_9X", "": "F_", "ü": "F_",
	} {
		if got := FieldName(in); got != want {
			t.Errorf("FieldName(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzFieldName(f *testing.F) {
	for _, s := range []string{"job_id", "_x", "9", "", "a.b-c", "ÿ"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		n := FieldName(key)
		if n == "" || n[0] == '_' || n[0] >= '0' && n[0] <= '9' {
			t.Fatalf("FieldName(%q) = %q starts badly", key, n)
		}
		for i := 0; i < len(n); i++ {
			c := n[i]
			if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
				t.Fatalf("FieldName(%q) = %q has %q", key, n, c)
			}
		}
	})
}

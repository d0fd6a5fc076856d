// Package systemd is fusiond's glue to systemd: the unit files
// (fusiond.service, fusiond.socket) live in this directory, and the Go code
// here lets the daemon use what systemd offers when it runs under it:
//
//   - Listener takes over the API socket systemd opened for fusiond.socket
//     (socket activation), or reports that there is none so the daemon
//     opens its own.
//   - Notifier sends READY=1, STATUS=, STOPPING=1 and WATCHDOG=1 to the
//     service manager (sd_notify); outside systemd every call is a no-op.
//   - JournalHandler is a slog.Handler that writes records to journald's
//     native protocol with their attributes as journal fields, used when
//     stderr is connected to the journal (JOURNAL_STREAM).
//
// All of it is built on github.com/coreos/go-systemd/v22. Nothing here is
// required: fusiond started by hand behaves exactly as without systemd.
//
// It may import go-systemd and the standard library; nothing of the daemon
// (the daemon imports it).
package systemd

package systemd

import (
	"log/slog"
	"strings"
	"time"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"
)

// NotifyFunc sends one sd_notify state string. It reports false with a nil
// error when there is no service manager to notify (no NOTIFY_SOCKET).
type NotifyFunc func(state string) (bool, error)

// WatchdogFunc reports the watchdog timeout systemd expects pings within
// (WATCHDOG_USEC for this process), or 0 when the watchdog is off.
type WatchdogFunc func() (time.Duration, error)

// Notifier tells systemd about the daemon's life cycle. The zero value is
// not usable; build it with NewNotifier.
type Notifier struct {
	notify   NotifyFunc
	watchdog WatchdogFunc
	log      *slog.Logger
}

// NotifierOptions replace the real sd_notify calls, for tests.
type NotifierOptions struct {
	// Notify defaults to go-systemd's SdNotify (keeping NOTIFY_SOCKET in
	// the environment, so re-executed helpers could still see it; the
	// unit's NotifyAccess=main makes systemd ignore them).
	Notify NotifyFunc
	// Watchdog defaults to go-systemd's SdWatchdogEnabled.
	Watchdog WatchdogFunc
}

// NewNotifier returns a Notifier that logs failed notifications to log.
func NewNotifier(log *slog.Logger, o NotifierOptions) *Notifier {
	n := &Notifier{notify: o.Notify, watchdog: o.Watchdog, log: log}
	if n.notify == nil {
		n.notify = func(state string) (bool, error) { return sddaemon.SdNotify(false, state) }
	}
	if n.watchdog == nil {
		n.watchdog = func() (time.Duration, error) { return sddaemon.SdWatchdogEnabled(false) }
	}
	return n
}

func (n *Notifier) send(state string) {
	sent, err := n.notify(state)
	switch {
	case err != nil:
		n.log.Warn("sd_notify failed", "state", state, "err", err)
	case sent:
		n.log.Debug("sd_notify", "state", state)
	}
}

// Ready tells systemd the daemon serves requests (Type=notify units count
// as started from here on), with a one-line status.
func (n *Notifier) Ready(status string) { n.send(sddaemon.SdNotifyReady + "\n" + statusLine(status)) }

// Status sets the one-line status `systemctl status` shows.
func (n *Notifier) Status(status string) { n.send(statusLine(status)) }

// Stopping tells systemd a graceful shutdown has begun.
func (n *Notifier) Stopping() { n.send(sddaemon.SdNotifyStopping + "\n" + statusLine("shutting down")) }

// Ping is one watchdog keep-alive. Call it only after the daemon has
// checked that it is healthy.
func (n *Notifier) Ping() { n.send(sddaemon.SdNotifyWatchdog) }

// WatchdogInterval is how often Ping must be called: half the unit's
// WatchdogSec, as sd_watchdog_enabled(3) recommends, or 0 when systemd
// runs no watchdog for this process.
func (n *Notifier) WatchdogInterval() time.Duration {
	d, err := n.watchdog()
	if err != nil {
		n.log.Warn("watchdog settings unreadable; not pinging", "err", err)
		return 0
	}
	return d / 2
}

// statusLine keeps a status on one line: sd_notify states are
// newline-separated assignments.
func statusLine(s string) string {
	return "STATUS=" + strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, s)
}

// Command fusiond is the fusiond node daemon. See the README for its
// configuration and the API it serves on its Unix socket.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/fusiond/fusiond/daemon"
	"github.com/fusiond/fusiond/daemon/buildinfo"
	"github.com/fusiond/fusiond/systemd"
)

func main() {
	if code, ok := daemon.Reexec(os.Args); ok {
		os.Exit(code)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		sig := <-sigs
		fmt.Fprintf(os.Stderr, "fusiond: %s received, shutting down (send again to exit at once)\n", sig)
		cancel()
		<-sigs
		fmt.Fprintln(os.Stderr, "fusiond: second signal, exiting now")
		os.Exit(130)
	}()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "fusiond: %v\n", err)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer, stderr *os.File) error {
	fs := flag.NewFlagSet("fusiond", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", daemon.DefaultConfigPath, "configuration file (YAML)")
	stateDir := fs.String("state-dir", "", "state directory (default from config: /var/lib/fusiond)")
	socket := fs.String("socket", "", "API socket (default from config: /run/fusiond/fusiond.sock)")
	logFormat := fs.String("log-format", "", "log format: text or json")
	logLevel := fs.String("log-level", "", "log level: debug, info, warn, error")
	simulate := fs.String("simulate", "", "run over a simulated host: dgxa100, dgxh100, dgxh200, dgxb200 or mixed (one H100 + two L4s) (overrides the config)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (fusiond takes only flags; see -help)", fs.Arg(0))
	}
	if *showVersion {
		v := buildinfo.Get()
		fmt.Fprintf(stdout, "fusiond %s (commit %s, built %s, API %s)\n", v.Version, v.Commit, v.BuildDate, v.API)
		return nil
	}
	explicit := false
	fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "config" })
	cfg, err := daemon.LoadConfig(*configPath, explicit)
	if err != nil {
		return err
	}
	override := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	override(&cfg.StateDir, *stateDir)
	override(&cfg.Socket, *socket)
	override(&cfg.Log.Format, *logFormat)
	override(&cfg.Log.Level, *logLevel)
	override(&cfg.Simulate, *simulate)
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("flags: %w", err)
	}
	log := daemon.NewLogger(cfg.Log, stderr)
	if systemd.JournalStream() {
		// Under systemd: structured entries straight to journald, and
		// the stderr handler for any the journal refuses.
		level, _ := daemon.ParseLevel(cfg.Log.Level)
		log = slog.New(systemd.NewJournalHandler(systemd.JournalOptions{Level: level, Fallback: log.Handler()}))
	}
	ln, err := systemd.Listener(cfg.Socket)
	if err != nil {
		return err
	}
	sd := systemd.NewNotifier(log, systemd.NotifierOptions{})
	return daemon.Run(ctx, daemon.Options{
		Config: cfg, Logger: log, Version: buildinfo.Get(),
		Listener:         ln,
		OnReady:          func() { sd.Ready("serving on " + cfg.Socket) },
		Watchdog:         sd.Ping,
		WatchdogInterval: sd.WatchdogInterval(),
		OnStopping:       sd.Stopping,
	})
}

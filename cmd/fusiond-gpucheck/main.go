// Command fusiond-gpucheck is a read-only check of a host with NVIDIA GPUs:
// it takes the inventory, lists MIG profile names, samples telemetry and
// watches health events for a while, and prints a report. Its second part
// (real.go) compares the inventory and topology with `nvidia-smi -q -x` and
// `nvidia-smi topo -m`, subscribes to NVML events, reads per-process memory
// while a small CUDA allocation runs, and checks that an MPS memory cap
// stops an allocation above it, printing PASS, FAIL or SKIP (reason) per
// step. It changes nothing: no MIG mode change, no GPU reset, no clock or
// power-limit change; the only thing it starts is an MPS control daemon in
// its own temporary pipe directory, quit at the end of that step. The
// whole check is bounded by -timeout (8 minutes).
//
// It exits non-zero with one line on stderr when there is no driver or no
// GPU, or when a step fails.
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
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fusiond/fusiond/devices/nvidia"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "fusiond-gpucheck:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("fusiond-gpucheck", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	telemetry := fs.Duration("telemetry", 10*time.Second, "how long to sample telemetry")
	rate := fs.Duration("interval", 100*time.Millisecond, "telemetry sampling interval")
	health := fs.Duration("health", 10*time.Second, "how long to watch health events")
	realChecks := fs.Bool("real", true, "after the report, run the real-GPU checks (nvidia-smi comparison, NVML events, per-process memory, MPS cap)")
	total := fs.Duration("timeout", 8*time.Minute, "limit for the whole check")
	simulate := fs.String("simulate", "", "run over a simulated host ("+strings.Join(nvidia.SimulatedHosts(), ", ")+") instead of the driver")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *total)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	opts := []nvidia.Option{nvidia.WithLogger(log)}
	if *simulate != "" {
		opts = append(opts, nvidia.WithSimulated(*simulate))
	}
	m, err := nvidia.Open(opts...)
	if errors.Is(err, nvidia.ErrNoDriver) {
		return errors.New("no NVIDIA driver on this host (libnvidia-ml.so.1 not found); nothing to check")
	}
	if err != nil {
		return err
	}
	defer m.Close()
	gpus := m.GPUs()
	if len(gpus) == 0 {
		return errors.New("NVIDIA driver present but no GPU found")
	}
	if m.Simulated() != "" {
		fmt.Fprintf(out, "SIMULATED host %s (go-nvml mock), not real hardware\n", m.Simulated())
	}
	fmt.Fprintf(out, "== inventory: %d GPU(s)\n", len(gpus))
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "IDX\tUUID\tMODEL\tMEM(MiB)\tBDF\tNUMA\tCC\tMIG\tPOWER(W)")
	for _, g := range gpus {
		mig := "no"
		if g.MIGCapable {
			mig = "capable"
			if g.MIGEnabled {
				mig = "enabled"
			}
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%d\t%s\t%s\t%.0f (%.0f-%.0f)\n", g.Index, g.UUID, g.Model, g.MemoryMB,
			g.BDF, g.NUMANode, g.ComputeCapability, mig, g.PowerLimitW, g.PowerMinLimitW, g.PowerMaxLimitW)
	}
	tw.Flush()
	links, err := m.DeviceLinks(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "NVLink pairs: %d\n", len(links))

	fmt.Fprintln(out, "== MIG profiles")
	for _, g := range gpus {
		if len(g.Profiles) == 0 {
			continue
		}
		var parts []string
		for _, p := range g.Profiles {
			parts = append(parts, fmt.Sprintf("%s(id %d, max %d, %d MiB)", p.Name, p.ID, p.MaxCount, p.MemoryMB))
		}
		fmt.Fprintf(out, "gpu %d: %s\n", g.Index, strings.Join(parts, " "))
	}
	st, err := m.State(ctx, nil)
	if err != nil {
		return err
	}
	for _, g := range st.GPUs {
		for _, in := range g.Instances {
			fmt.Fprintf(out, "gpu %d: instance %s GI %d slots %d+%d %s\n", g.Index, in.Profile, in.GIID, in.Start, in.Size, in.UUID)
		}
	}

	if err := reportTelemetry(ctx, m, *telemetry, *rate, out); err != nil {
		return err
	}
	if err := reportHealth(ctx, m, *health, out); err != nil {
		return err
	}
	if !*realChecks {
		return nil
	}
	return newChecker(m, out).realChecks(ctx)
}

type agg struct {
	n                 int
	powerMin, powerMx float64
	powerSum          float64
	tempMax, smMax    uint32
	missing           map[string]bool
}

func reportTelemetry(ctx context.Context, m *nvidia.Manager, d, interval time.Duration, out io.Writer) error {
	fmt.Fprintf(out, "== telemetry for %s at %s\n", d, interval)
	tctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	aggs := map[string]*agg{}
	sweeps := 0
	s := m.NewSampler(interval)
	err := s.Run(tctx, func(ss []nvidia.Sample) {
		sweeps++
		for _, x := range ss {
			a, ok := aggs[x.UUID]
			if !ok {
				a = &agg{powerMin: x.PowerW, missing: map[string]bool{}}
				aggs[x.UUID] = a
			}
			a.n++
			a.powerSum += x.PowerW
			a.powerMin, a.powerMx = min(a.powerMin, x.PowerW), max(a.powerMx, x.PowerW)
			a.tempMax, a.smMax = max(a.tempMax, x.TempC), max(a.smMax, x.SMUtil)
			for _, f := range x.Missing {
				a.missing[f] = true
			}
		}
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "sweeps: %d (%.1f Hz)\n", sweeps, float64(sweeps)/d.Seconds())
	for _, g := range m.GPUs() {
		a, ok := aggs[g.UUID]
		if !ok {
			continue
		}
		var miss []string
		for f := range a.missing {
			miss = append(miss, f)
		}
		fmt.Fprintf(out, "gpu %d: samples %d power %.0f/%.0f/%.0f W (min/avg/max) temp max %d C SM util max %d%% unsupported %v\n",
			g.Index, a.n, a.powerMin, a.powerSum/float64(a.n), a.powerMx, a.tempMax, a.smMax, miss)
	}
	return nil
}

func reportHealth(ctx context.Context, m *nvidia.Manager, d time.Duration, out io.Writer) error {
	fmt.Fprintf(out, "== health watch for %s\n", d)
	hctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var events []nvidia.HealthEvent
	if err := m.WatchHealth(hctx, time.Second, func(e nvidia.HealthEvent) { events = append(events, e) }); err != nil {
		return err
	}
	for _, e := range events {
		fmt.Fprintf(out, "event: %s healthy=%t %s\n", e.UUID, e.Healthy, e.Reason)
	}
	bad := 0
	for _, g := range m.GPUs() {
		if !m.Healthy(g.UUID) {
			bad++
		}
	}
	fmt.Fprintf(out, "health events: %d, unhealthy GPUs now: %d\n", len(events), bad)
	fmt.Fprintln(out, "OK: read-only check complete (nothing was changed)")
	return nil
}

package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/devices/fpga/bitstream"
	"github.com/fusiond/fusiond/topology"
)

func newTopologyCmd(o *options) *cobra.Command {
	var matrix bool
	cmd := &cobra.Command{
		Use:   "topology",
		Short: "Show the host's topology: sockets, NUMA nodes, cores, PCIe tree",
		Long: `Show the host model fusiond places work by: sockets → NUMA nodes → cores,
and the PCIe tree from each host bridge down to the devices, accelerators
and NICs marked. --matrix prints the distance between every pair of
accelerators and NICs in nvidia-smi topo -m's classes (X, NV#, PIX, PXB,
PHB, NODE, SYS).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c := o.client()
			defer c.Close()
			if matrix && o.output != "table" {
				m, err := c.TopologyMatrix(cmd.Context())
				if err != nil {
					return err
				}
				return o.print(m, nil)
			}
			h, err := c.Topology(cmd.Context())
			if err != nil {
				return err
			}
			return o.print(h, func(w io.Writer) error {
				if matrix {
					return topology.WriteMatrix(w, h)
				}
				return topology.WriteTree(w, h)
			})
		},
	}
	cmd.Flags().BoolVar(&matrix, "matrix", false, "print the device distance matrix")
	return cmd
}

func newGPUCmd(o *options) *cobra.Command {
	cmd := &cobra.Command{Use: "gpu", Short: "GPUs: inventory, health, sharing, telemetry"}
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List the GPUs with health, share mode, MIG instances and telemetry",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c := o.client()
			defer c.Close()
			l, err := c.GPUs(cmd.Context())
			if err != nil {
				return err
			}
			return o.print(l, func(w io.Writer) error { return gpuTable(w, l) })
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "share",
		Short: "Show each GPU's sharing mode, replicas and the jobs' shares (milli-GPU, memory cap)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c := o.client()
			defer c.Close()
			l, err := c.GPUs(cmd.Context())
			if err != nil {
				return err
			}
			return o.print(l, func(w io.Writer) error { return shareTable(w, l) })
		},
	})
	var xid uint64
	var lost, reset bool
	fault := &cobra.Command{
		Use:   "fault INDEX (--xid N [--lost] | --reset)",
		Short: "Simulated hosts only: inject an Xid into GPU INDEX, or reset it (admin)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			index, err := strconv.Atoi(args[0])
			if err != nil {
				return fmt.Errorf("GPU index: %w", err)
			}
			c := o.client()
			defer c.Close()
			if err := c.InjectGPUFault(cmd.Context(), index, api.GPUFaultRequest{Xid: xid, Lost: lost, Reset: reset}); err != nil {
				return err
			}
			if reset {
				fmt.Fprintf(o.stdout, "GPU %d reset; it returns to service after the probation.\n", index)
			} else {
				fmt.Fprintf(o.stdout, "Xid %d delivered to GPU %d.\n", xid, index)
			}
			return nil
		},
	}
	fault.Flags().Uint64Var(&xid, "xid", 0, "the Xid to deliver (e.g. 79: fallen off the bus, 48: double-bit ECC)")
	fault.Flags().BoolVar(&lost, "lost", false, "the GPU stops answering until reset")
	fault.Flags().BoolVar(&reset, "reset", false, "reset the GPU as an operator would")
	cmd.AddCommand(fault)
	cmd.AddCommand(&cobra.Command{
		Use:   "processes INDEX [PID=MEMORY ...]",
		Short: "Simulated hosts only: set the compute processes GPU INDEX reports, e.g. 4242=2Gi; none clears them (admin)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			index, err := strconv.Atoi(args[0])
			if err != nil {
				return fmt.Errorf("GPU index: %w", err)
			}
			req := api.GPUProcessesRequest{Processes: []api.GPUProcess{}}
			for _, a := range args[1:] {
				pid, mem, ok := strings.Cut(a, "=")
				n, err := strconv.ParseUint(pid, 10, 32)
				if !ok || err != nil || n == 0 {
					return fmt.Errorf("process %q: want PID=MEMORY, e.g. 4242=2Gi", a)
				}
				b, err := api.ParseBytes(mem)
				if err != nil {
					return fmt.Errorf("process %q: memory: %w", a, err)
				}
				req.Processes = append(req.Processes, api.GPUProcess{PID: uint32(n), Memory: b})
			}
			c := o.client()
			defer c.Close()
			if err := c.SetGPUProcesses(cmd.Context(), index, req); err != nil {
				return err
			}
			fmt.Fprintf(o.stdout, "GPU %d reports %d compute %s.\n", index, len(req.Processes), map[bool]string{true: "process", false: "processes"}[len(req.Processes) == 1])
			return nil
		},
	})
	return cmd
}

// shareTable shows one line per share, and one per GPU without shares.
func shareTable(w io.Writer, l api.GPUList) error {
	if len(l.GPUs) == 0 {
		fmt.Fprintln(w, "No GPUs.")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tMODE\tREPLICAS\tUSED\tJOB\tSHARE\tMEMORY CAP")
	for _, g := range l.GPUs {
		s := g.Sharing
		if s == nil {
			s = &api.GPUSharing{Mode: g.ShareMode}
		}
		replicas := "-"
		if s.Replicas > 0 {
			replicas = fmt.Sprint(s.Replicas)
		}
		used := fmt.Sprintf("%d/1000, %s", s.UsedMilli, s.UsedMemory.Human())
		if len(s.Shares) == 0 {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t-\t-\t-\n", g.Index, s.Mode, replicas, used)
		}
		for _, sh := range s.Shares {
			memCap := "-"
			if sh.Memory > 0 {
				memCap = sh.Memory.Human()
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d milli\t%s\n", g.Index, s.Mode, replicas, used, sh.Job, sh.Milli, memCap)
		}
	}
	return tw.Flush()
}

// gpuHealth is the HEALTH column: ok, or why the GPU is out of service and
// when it returns.
func gpuHealth(g api.GPU) string {
	if g.Health.Healthy {
		return "ok"
	}
	h := "UNHEALTHY"
	switch {
	case g.Xid != 0:
		h += fmt.Sprintf(": Xid %d (%s)", g.Xid, g.XidMeaning)
	case g.Health.Reason != "":
		h += ": " + g.Health.Reason
	}
	if g.ProbationEnds != nil {
		h += ", probation until " + g.ProbationEnds.Local().Format("15:04:05")
	} else {
		h += ", still failing"
	}
	return h
}

// deviceHealth names a device event's transition.
func deviceHealth(e api.Event) string {
	if e.Healthy != nil && *e.Healthy {
		return "→ healthy"
	}
	return "→ UNHEALTHY"
}

// maxGPUEvents is how many recent device events gpu list shows.
const maxGPUEvents = 5

func gpuTable(w io.Writer, l api.GPUList) error {
	if len(l.GPUs) == 0 {
		fmt.Fprintln(w, "No GPUs.")
		for _, n := range l.Notes {
			fmt.Fprintf(w, "Note: %s\n", n)
		}
		return nil
	}
	if l.Simulated != "" {
		fmt.Fprintf(w, "SIMULATED GPUs (%s): no real hardware behind them.\n", l.Simulated)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tMODEL\tMEMORY\tNUMA\tPCI\tHEALTH\tSHARING\tMIG\tUTIL\tMEM USED\tPOWER\tTEMP")
	for _, g := range l.GPUs {
		health := gpuHealth(g)
		mig := "off"
		if g.MIGEnabled {
			var ps []string
			for _, in := range g.MIG {
				if in.Health != nil && !in.Health.Healthy {
					ps = append(ps, in.Profile+"(UNHEALTHY)")
				} else {
					ps = append(ps, in.Profile)
				}
			}
			mig = "on"
			if len(ps) > 0 {
				mig = strings.Join(ps, "+")
			}
		} else if !g.MIGCapable {
			mig = "-"
		}
		util, used, power, temp := "-", "-", "-", "-"
		if t := g.Telemetry; t != nil {
			util = fmt.Sprintf("%d%%", t.SMUtilPct)
			used = t.MemoryUsed.Human()
			power = fmt.Sprintf("%.0fW", t.PowerW)
			if g.PowerLimitW > 0 {
				power += fmt.Sprintf("/%.0fW", g.PowerLimitW)
			}
			temp = fmt.Sprintf("%dC", t.TempC)
		}
		numa := "-"
		if g.NUMANode >= 0 {
			numa = fmt.Sprint(g.NUMANode)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Index, g.Model, g.Memory.Human(), numa,
			g.BDF, health, g.ShareMode, mig, util, used, power, temp)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(l.Events) > 0 {
		fmt.Fprintln(w, "\nRecent device events:")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, e := range l.Events[max(0, len(l.Events)-maxGPUEvents):] {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", e.Time.Local().Format("2006-01-02 15:04:05"), e.Device, deviceHealth(e), e.Reason)
		}
		return tw.Flush()
	}
	return nil
}

func newMIGCmd(o *options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mig",
		Short: "MIG layouts in NVIDIA mig-parted's format",
		Long: `Plan and apply MIG layouts written in NVIDIA mig-parted's format
(version: v1, mig-configs: {NAME: [{devices, mig-enabled, mig-devices}]}).
GPUs and MIG instances that hold jobs are never touched.`,
	}
	for _, apply := range []bool{false, true} {
		var file, config string
		use, short := "plan", "Show the actions a layout config needs, without applying them"
		if apply {
			use, short = "apply", "Apply a layout config (root or the admin group)"
		}
		sub := &cobra.Command{
			Use:     use + " -f LAYOUT.yaml -c CONFIG",
			Short:   short,
			Example: "  fusionctl mig " + use + " -f examples/mig-layouts.yaml -c inference-split",
			Args:    cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				layout, err := readInput(o, file)
				if err != nil {
					return err
				}
				c := o.client()
				defer c.Close()
				req := api.MIGRequest{Layout: string(layout), Config: config}
				var p api.MIGPlan
				if apply {
					p, err = c.ApplyMIG(cmd.Context(), req)
				} else {
					p, err = c.PlanMIG(cmd.Context(), req)
				}
				if err != nil {
					return err
				}
				return o.print(p, func(w io.Writer) error { return migPlanText(w, p) })
			},
		}
		sub.Flags().StringVarP(&file, "file", "f", "", "layout file (- reads stdin)")
		sub.Flags().StringVarP(&config, "config", "c", "", "the mig-config to use")
		_ = sub.MarkFlagRequired("file")
		_ = sub.MarkFlagRequired("config")
		cmd.AddCommand(sub)
	}
	return cmd
}

func readInput(o *options, name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(o.stdin)
	}
	return os.ReadFile(name)
}

func migPlanText(w io.Writer, p api.MIGPlan) error {
	if len(p.Actions) == 0 {
		fmt.Fprintf(w, "MIG config %q: nothing to do, the GPUs already match.\n", p.Config)
		return nil
	}
	verb := "would take"
	if p.Applied {
		verb = "applied in an expected"
	}
	fmt.Fprintf(w, "MIG config %q: %d actions, %s %s:\n", p.Config, len(p.Actions), verb,
		(time.Duration(p.ExpectedSeconds * float64(time.Second))).Round(100*time.Millisecond))
	for i, a := range p.Actions {
		fmt.Fprintf(w, "  %2d. %s\n", i+1, a.Description)
	}
	if !p.Applied {
		fmt.Fprintln(w, "Nothing was changed (mig apply carries it out).")
	}
	return nil
}

func newFPGACmd(o *options) *cobra.Command {
	cmd := &cobra.Command{Use: "fpga", Short: "FPGA regions and the bitstream library"}
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List the FPGA regions with what they hold",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c := o.client()
			defer c.Close()
			rs, err := c.FPGARegions(cmd.Context())
			if err != nil {
				return err
			}
			return o.print(rs, func(w io.Writer) error { return regionTable(w, rs) })
		},
	})
	var force bool
	program := &cobra.Command{
		Use:   "program REGION BITSTREAM",
		Short: "Program a region with a library bitstream (root or the admin group)",
		Long: `Program an FPGA region with a bitstream from the library. BITSTREAM is a
library name, sha256 (or a unique prefix of at least 8 hex digits) or an
AFU/xclbin UUID. A bitstream built for another interface (shell) or in a
format the region does not take is refused before anything is touched.`,
		Example: "  fusionctl fpga program dfl/0000:3b:00.0/0 nlb0",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := o.client()
			defer c.Close()
			res, err := c.ProgramFPGA(cmd.Context(), args[0], api.FPGAProgramRequest{Bitstream: args[1], Force: force})
			if err != nil {
				return err
			}
			return o.print(res, func(w io.Writer) error {
				name := res.Name
				if name == "" {
					name = short(res.Bitstream)
				}
				if res.AlreadyLoaded {
					_, err := fmt.Fprintf(w, "%s already holds %s; nothing to do.\n", res.Region, name)
					return err
				}
				_, err := fmt.Fprintf(w, "%s now holds %s (programmed in %s).\n", res.Region, name,
					time.Duration(res.Seconds*float64(time.Second)).Round(time.Millisecond))
				return err
			})
		},
	}
	program.Flags().BoolVar(&force, "force", false, "program even if the region already holds the bitstream")
	cmd.AddCommand(program, newBitstreamCmd(o))
	return cmd
}

func regionTable(w io.Writer, rs []api.FPGARegion) error {
	if len(rs) == 0 {
		_, err := fmt.Fprintln(w, "No FPGA regions.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REGION\tKIND\tDEVICE\tHOLDS\tHEALTH\tSTATE")
	for _, r := range rs {
		holds := "-"
		switch {
		case r.LoadedName != "":
			holds = r.LoadedName
		case r.LoadedAFU != "":
			holds = "AFU " + r.LoadedAFU
		}
		health := "ok"
		if !r.Health.Healthy {
			health = "UNHEALTHY"
			if r.Health.Reason != "" {
				health += ": " + r.Health.Reason
			}
		}
		state := "idle"
		switch {
		case r.Busy:
			state = "programming"
		case r.Held:
			state = "held by a job"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", esc(r.ID), esc(string(r.Kind)), esc(r.Name), esc(holds), esc(health), state)
	}
	return tw.Flush()
}

func newBitstreamCmd(o *options) *cobra.Command {
	cmd := &cobra.Command{Use: "bitstream", Short: "The bitstream library (.gbs, .xclbin, .bit, .bin)"}
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List the library",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c := o.client()
			defer c.Close()
			l, err := c.Bitstreams(cmd.Context())
			if err != nil {
				return err
			}
			return o.print(l, func(w io.Writer) error { return bitstreamTable(w, l) })
		},
	})
	var name string
	add := &cobra.Command{
		Use:   "add FILE",
		Short: "Add a bitstream file to the library (root or the admin group)",
		Long: `Upload a bitstream file to the daemon's content-addressed library. Its
header is parsed and checked (GBS, xclbin, Xilinx .bit; raw .bin/.rbf by
extension). --name defaults to the file name without its extension.`,
		Example: "  fusionctl fpga bitstream add nlb0.gbs --name nlb0",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			fi, err := f.Stat()
			if err != nil {
				return err
			}
			if !fi.Mode().IsRegular() {
				return fmt.Errorf("%s is not a regular file", args[0])
			}
			base := filepath.Base(args[0])
			n := name
			if n == "" {
				n = strings.TrimSuffix(base, filepath.Ext(base))
			}
			c := o.client()
			defer c.Close()
			b, err := c.AddBitstream(cmd.Context(), f, fi.Size(), n, base)
			if err != nil {
				return err
			}
			return o.print(b, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "added %s: %s, %s, id %s\n", b.Name, b.Header.Format, api.Bytes(b.Size).Human(), short(b.ID))
				return err
			})
		},
	}
	add.Flags().StringVar(&name, "name", "", "library name (default: the file name without extension)")
	rm := &cobra.Command{
		Use:   "rm REF",
		Short: "Remove a bitstream from the library (root or the admin group)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := o.client()
			defer c.Close()
			b, err := c.RemoveBitstream(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return o.print(b, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "removed %s (id %s)\n", b.Name, short(b.ID))
				return err
			})
		},
	}
	cmd.AddCommand(add, rm)
	return cmd
}

func bitstreamTable(w io.Writer, l []bitstream.Bitstream) error {
	if len(l) == 0 {
		_, err := fmt.Fprintln(w, "The bitstream library is empty (fusionctl fpga bitstream add FILE).")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tID\tFORMAT\tSIZE\tACCELERATOR\tINTERFACE")
	for _, b := range l {
		acc, iface := "-", "-"
		switch {
		case b.Header.AFUName != "":
			acc = b.Header.AFUName
		case !b.Header.AFUID.IsZero():
			acc = b.Header.AFUID.String()
		case b.Header.Design != "":
			acc = b.Header.Design
		}
		if !b.Header.InterfaceID.IsZero() {
			iface = b.Header.InterfaceID.String()
		} else if b.Header.Part != "" {
			iface = "part " + b.Header.Part
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", esc(b.Name), esc(short(b.ID)), esc(string(b.Header.Format)), api.Bytes(b.Size).Human(), esc(acc), esc(iface))
	}
	return tw.Flush()
}

// short abbreviates a sha256 or a UUID for tables.
func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

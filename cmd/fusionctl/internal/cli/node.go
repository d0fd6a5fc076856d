package cli

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/buildinfo"
	"github.com/fusiond/fusiond/topology"
)

func newStatusCmd(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the node: capacity, allocation, jobs and devices",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c := o.client()
			defer c.Close()
			n, err := c.Node(cmd.Context())
			if err != nil {
				return err
			}
			return o.print(n, func(w io.Writer) error {
				if err := nodeTable(w, n); err != nil {
					return err
				}
				return peerSummary(cmd.Context(), w, c)
			})
		},
	}
}

func nodeTable(w io.Writer, n api.NodeStatus) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "Host:\t%s\n", esc(n.Hostname))
	fmt.Fprintf(tw, "Daemon:\tfusiond %s, up %s\n", esc(n.Version), time.Since(n.StartedAt).Round(time.Second))
	if n.Simulated {
		fmt.Fprintf(tw, "Devices:\tSIMULATED (no real GPU/FPGA hardware behind them)\n")
	}
	sched := "placing jobs"
	if n.Cordoned {
		sched = "cordoned: new jobs stay pending"
	}
	fmt.Fprintf(tw, "Scheduling:\t%s\n", sched)
	fmt.Fprintf(tw, "Isolation:\t%s\n", isolation(n.Isolation))
	fmt.Fprintf(tw, "CPU:\t%s of %s cores allocated\n", n.Allocated.CPU, n.Capacity.CPU)
	fmt.Fprintf(tw, "Memory:\t%s of %s allocated\n", n.Allocated.Memory.Human(), n.Capacity.Memory.Human())
	fmt.Fprintf(tw, "GPUs:\t%d of %d allocated\n", n.Allocated.GPUs, n.Capacity.GPUs)
	fmt.Fprintf(tw, "FPGAs:\t%d of %d allocated\n", n.Allocated.FPGAs, n.Capacity.FPGAs)
	var counts []string
	for _, s := range api.States {
		if c := n.Jobs[s]; c > 0 {
			counts = append(counts, fmt.Sprintf("%d %s", c, s))
		}
	}
	if len(counts) == 0 {
		counts = []string{"none"}
	}
	fmt.Fprintf(tw, "Jobs:\t%s\n", strings.Join(counts, ", "))
	if q := n.QoS; q != nil {
		fmt.Fprintf(tw, "QoS loop:\t%s\n", describeQoS(*q))
	}
	if t := n.Telemetry; t != nil {
		telemetryLines(tw, *t)
	}
	if r := n.Reclaim; r != nil {
		fmt.Fprintf(tw, "Reclaim:\t%s\n", reclaimLine(*r))
	}
	if k := n.Kubernetes; k != nil {
		fmt.Fprintf(tw, "Kubernetes:\t%s\n", kubernetesLine(*k))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(n.Devices) > 0 {
		fmt.Fprintln(w, "\nDevices:")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  ID\tKIND\tMODEL\tHEALTH\tDETAIL")
		for _, d := range n.Devices {
			id := d.ID
			if d.Kind == "gpu" {
				id = short(id) // "GPU-3dee05d7"; fusionctl gpu list -o json has the full UUID
			}
			health := "ok"
			if !d.Healthy {
				health = "UNHEALTHY"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", esc(id), esc(d.Kind), esc(d.Model), health, esc(d.Detail))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, note := range n.Notes {
		fmt.Fprintf(w, "Note: %s\n", esc(note))
	}
	return nil
}

func newVersionCmd(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print fusionctl's version and the daemon's",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			type versions struct {
				Client api.Version  `json:"client"`
				Server *api.Version `json:"server,omitempty"`
				Error  string       `json:"server_error,omitempty"`
			}
			v := versions{Client: buildinfo.Get()}
			c := o.client()
			defer c.Close()
			if sv, err := c.Version(cmd.Context()); err == nil {
				v.Server = &sv
			} else {
				v.Error = err.Error()
			}
			return o.print(v, func(w io.Writer) error {
				fmt.Fprintf(w, "fusionctl %s (commit %s, built %s)\n", v.Client.Version, v.Client.Commit, v.Client.BuildDate)
				if v.Server != nil {
					fmt.Fprintf(w, "fusiond   %s (commit %s, built %s, API %s)\n", v.Server.Version, v.Server.Commit, v.Server.BuildDate, v.Server.API)
				} else {
					fmt.Fprintf(w, "fusiond   unreachable: %s\n", v.Error)
				}
				return nil
			})
		},
	}
}

func newNodeCmd(o *options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Show the node and its CPU cores (core types on hybrid CPUs); administration (root or the admin group)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c := o.client()
			defer c.Close()
			n, err := c.Node(cmd.Context())
			if err != nil {
				return err
			}
			h, err := c.Topology(cmd.Context())
			if err != nil {
				return err
			}
			v := nodeView{Node: n, Cores: h.Cores, CoreKindSource: h.CoreKindSource}
			return o.print(v, func(w io.Writer) error {
				if err := nodeTable(w, n); err != nil {
					return err
				}
				return coreTypes(w, h)
			})
		},
	}
	for _, on := range []bool{true, false} {
		name, short := "cordon", "Stop placing new jobs on this node (running jobs continue)"
		if !on {
			name, short = "uncordon", "Resume placing new jobs"
		}
		cmd.AddCommand(&cobra.Command{
			Use:   name,
			Short: short,
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				c := o.client()
				defer c.Close()
				n, err := c.SetCordoned(cmd.Context(), on)
				if err != nil {
					return err
				}
				return o.print(n, func(w io.Writer) error { return nodeTable(w, n) })
			},
		})
	}
	return cmd
}

// nodeView is what `fusionctl node -o json` prints.
type nodeView struct {
	Node           api.NodeStatus  `json:"node"`
	Cores          []topology.Core `json:"cores"`
	CoreKindSource string          `json:"core_kind_source,omitempty"`
}

// coreTypes prints the host's cores and, on a hybrid CPU, how many of
// each kind (the kind guaranteed jobs' exclusive cores are taken from
// first, docs/scheduling.md "Core types (hybrid CPUs)").
func coreTypes(w io.Writer, h *topology.Host) error {
	lines := h.CoreKindLines()
	if len(lines) == 0 {
		_, err := fmt.Fprintf(w, "\nCores: %d (CPUs %s), one type: no hybrid core information\n", len(h.Cores), h.OnlineCPUs)
		return err
	}
	if _, err := fmt.Fprintf(w, "\nCores: %d (CPUs %s), hybrid: core types from %s\n", len(h.Cores), h.OnlineCPUs, esc(h.CoreKindSource)); err != nil {
		return err
	}
	for _, l := range lines {
		if _, err := fmt.Fprintf(w, "  %s\n", l); err != nil {
			return err
		}
	}
	return nil
}

// isolation is the node's job confinement in words.
func isolation(i api.Isolation) string {
	switch {
	case i.Isolated:
		return fmt.Sprintf("cgroups %s: every job has its limits, device filter and accounting", i.Mode)
	case i.JobsRefused:
		return fmt.Sprintf("NONE (%s): jobs are REFUSED (allow_unisolated_jobs is not set)", i.Reason)
	default:
		return fmt.Sprintf("NONE (%s): jobs run WITHOUT limits or device isolation (allow_unisolated_jobs)", i.Reason)
	}
}

// describeQoS is the QoS loop's state on one line.
func describeQoS(q api.QoSStatus) string {
	if !q.Enabled {
		return "not running (latency probes " + q.Probes + ")"
	}
	be := "no best-effort CPU quota"
	if q.BestEffortQuota > 0 {
		be = "best-effort CPU held at " + q.BestEffortQuota.String()
		if q.SharedPool > 0 {
			be += " (shared pool " + q.SharedPool.String() + " CPU)"
		}
	}
	if q.BestEffortMemoryHigh > 0 {
		be += ", memory high " + q.BestEffortMemoryHigh.Human()
	}
	s := fmt.Sprintf("running every %v, probes %s; %d protected jobs, %d over SLO; %s", q.Window, q.Probes, q.Protected, q.Breaching, be)
	if q.ProbeSlots > 0 {
		s += fmt.Sprintf("; %d of %d probe slots used", q.ProbeSlotsUsed, q.ProbeSlots)
	}
	if q.UntimedJobs > 0 {
		s += fmt.Sprintf(", %d jobs NOT TIMED (qos.max_jobs reached)", q.UntimedJobs)
	}
	if q.ProbeEvents > 0 {
		s += fmt.Sprintf("; probe cost %.0f ns/event over %d events", q.ProbeNsPerEvent, q.ProbeEvents)
	}
	if q.ProbeLostWaits > 0 {
		s += fmt.Sprintf("; %d waits lost (threads sharing a probe slot)", q.ProbeLostWaits)
	}
	if q.Resctrl != "" {
		s += "; cache and bandwidth: " + q.Resctrl
	}
	if d := q.DelayedBy; d != nil {
		s += fmt.Sprintf("; protected jobs waited %v last window: %s", d.Total(), d.Describe())
	}
	if len(q.TopOutside) > 0 {
		s += "; top outside cgroups: " + describeOutside(q.TopOutside)
	}
	if q.LastAction != "" && q.LastActionAt != nil {
		// The reason may name cgroups outside fusiond's, which their
		// owners name.
		s += fmt.Sprintf("; last: %s (%s)", esc(q.LastAction), q.LastActionAt.Local().Format("15:04:05"))
	}
	return s
}

// describeOutside names the outside cgroups charged the most and their
// charges (paths escaped: a cgroup's owner names it).
func describeOutside(top []api.OutsideDelay) string {
	parts := make([]string, 0, len(top))
	for _, o := range top {
		name := esc(o.Cgroup)
		if o.Cgroup == "" {
			name = fmt.Sprintf("cgroup id %d (gone)", o.ID)
		}
		parts = append(parts, fmt.Sprintf("%s %v", name, o.Wait))
	}
	return strings.Join(parts, ", ")
}

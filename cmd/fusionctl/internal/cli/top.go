package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"
	"github.com/charmbracelet/x/term"
	"github.com/spf13/cobra"

	"github.com/fusiond/fusiond/daemon/api"
)

// topFrame is one snapshot of the daemon, as `fusionctl top` shows it.
type topFrame struct {
	Node  api.NodeStatus   `json:"node"`
	GPUs  api.GPUList      `json:"gpus"`
	FPGAs []api.FPGARegion `json:"fpga_regions"`
	// Jobs are the unfinished jobs and the most recent finished ones.
	Jobs []api.Job `json:"jobs"`
}

// topFinished is how many finished jobs a frame shows below the
// unfinished ones.
const topFinished = 5

// topMeasured bounds the running jobs whose usage a frame measures (one
// request each).
const topMeasured = 50

var activeStates = []api.State{api.StatePending, api.StatePlaced, api.StateStarting, api.StateRunning}

// fetchFrame reads node status, GPUs, FPGA regions and jobs.
func fetchFrame(ctx context.Context, c *api.Client) (topFrame, error) {
	var f topFrame
	var err error
	if f.Node, err = c.Node(ctx); err != nil {
		return f, err
	}
	if f.GPUs, err = c.GPUs(ctx); err != nil {
		return f, fmt.Errorf("GPUs: %w", err)
	}
	if f.FPGAs, err = c.FPGARegions(ctx); err != nil {
		return f, fmt.Errorf("FPGA regions: %w", err)
	}
	active, err := c.List(ctx, api.ListOptions{State: activeStates})
	if err != nil {
		return f, fmt.Errorf("jobs: %w", err)
	}
	recent, err := c.List(ctx, api.ListOptions{State: []api.State{api.StateSucceeded, api.StateFailed, api.StateCancelled, api.StateLost, api.StatePreempted}, Limit: topFinished})
	if err != nil {
		return f, fmt.Errorf("jobs: %w", err)
	}
	// Listings carry no live usage; a running job's is measured when it
	// is fetched alone.
	measured := 0
	for i, j := range active {
		if j.State != api.StateRunning || measured == topMeasured {
			continue
		}
		measured++
		if g, err := c.Get(ctx, j.ID); err == nil && g.Usage != nil {
			active[i].Usage = g.Usage
		}
	}
	f.Jobs = append(active, recent...)
	return f, nil
}

func newTopCmd(o *options) *cobra.Command {
	var once bool
	var interval time.Duration
	var frames int
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Live view of the node: devices, tiers and jobs, refreshed every second",
		Long: `top shows the node — CPU and memory allocation, GPUs with utilisation,
memory, power, temperature, MIG instances and shares, FPGA regions, the QoS
tiers and the jobs with their usage — refreshed every --interval (1s).

On a terminal it is a full-screen view (q or Ctrl-C quits). When stdout is
not a terminal it prints plain frames instead, one every --interval, -n of
them (0: until interrupted); --once prints one frame and exits (with -o json
or yaml, the frame's data).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval < 100*time.Millisecond {
				return fmt.Errorf("--interval %s: at least 100ms", interval)
			}
			if frames < 0 {
				return fmt.Errorf("-n %d: must not be negative", frames)
			}
			if once {
				frames = 1
			}
			c := o.client()
			defer c.Close()
			ctx := cmd.Context()
			if f, ok := o.stdout.(*os.File); ok && frames == 0 && o.output == "table" && term.IsTerminal(f.Fd()) {
				return runTopTUI(ctx, c, f, o.stdin, interval)
			}
			if o.output != "table" && frames != 1 {
				return fmt.Errorf("-o %s needs --once (one frame of data)", o.output)
			}
			for i := 0; frames == 0 || i < frames; i++ {
				if i > 0 {
					select {
					case <-ctx.Done():
						return nil
					case <-time.After(interval):
					}
					fmt.Fprintln(o.stdout)
				}
				f, err := fetchFrame(ctx, c)
				if err != nil {
					return err
				}
				if err := o.print(f, func(w io.Writer) error { return renderFrame(w, f, plainStyle) }); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&once, "once", false, "print one plain frame and exit")
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "refresh interval")
	cmd.Flags().IntVarP(&frames, "frames", "n", 0, "plain mode: frames to print (0: until interrupted)")
	return cmd
}

// frameStyle renders section titles and flagged values: plain text, or
// lipgloss colours in the terminal view.
type frameStyle struct {
	title, bad func(string) string
}

var plainStyle = frameStyle{
	title: func(s string) string { return s },
	bad:   func(s string) string { return s },
}

// renderFrame writes f as text: stable (sorted, fixed columns, no clock)
// so that two frames of an idle node are the same.
func renderFrame(w io.Writer, f topFrame, st frameStyle) error {
	n := f.Node
	mode := "placing jobs"
	if n.Cordoned {
		mode = st.bad("CORDONED")
	}
	sim := ""
	if n.Simulated {
		sim = ", devices SIMULATED"
		if f.GPUs.Simulated != "" {
			sim += " (" + f.GPUs.Simulated + ")"
		}
	}
	// The terminal view styles this text (lipgloss), so no writer below
	// can clean it: the fields that come from outside are escaped here.
	fmt.Fprintln(w, st.title(fmt.Sprintf("NODE %s — fusiond %s%s — %s", esc(n.Hostname), esc(n.Version), esc(sim), mode)))
	fmt.Fprintf(w, "CPU %s/%s cores  MEM %s/%s  GPU %d/%d  FPGA %d/%d  JOBS %s\n",
		n.Allocated.CPU, n.Capacity.CPU, n.Allocated.Memory.Human(), n.Capacity.Memory.Human(),
		n.Allocated.GPUs, n.Capacity.GPUs, n.Allocated.FPGAs, n.Capacity.FPGAs, jobCounts(n.Jobs))
	for _, note := range n.Notes {
		fmt.Fprintf(w, "note: %s\n", esc(note))
	}

	// Tiers: jobs, reservations and measured use of each QoS tier.
	fmt.Fprintln(w)
	fmt.Fprintln(w, st.title("TIERS"))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIER\tRUNNING\tQUEUED\tCPU RESERVED\tMEM RESERVED\tCPU USED\tMEM USED")
	for _, t := range api.Tiers {
		var running, queued int
		var cpu api.MilliCPU
		var mem, used api.Bytes
		var cpuSec float64
		for _, j := range f.Jobs {
			if j.Tier != t {
				continue
			}
			switch j.State {
			case api.StatePending:
				queued++
			case api.StatePlaced, api.StateStarting, api.StateRunning:
				running++
				if a := j.Allocation; a != nil {
					cpu += a.CPU
					mem += a.Memory
				}
				if u := j.Usage; u != nil {
					cpuSec += u.CPUSeconds
					used += u.MemoryCurrent
				}
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%.1fs\t%s\n", t, running, queued, cpu, mem.Human(), cpuSec, used.Human())
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	if len(f.GPUs.GPUs) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, st.title("GPUS"))
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "GPU\tMODEL\tHEALTH\tUTIL\tMEMORY\tPOWER\tTEMP\tMODE\tSHARES\tMIG")
		gpus := slices.Clone(f.GPUs.GPUs)
		slices.SortFunc(gpus, func(a, b api.GPU) int { return cmp.Compare(a.Index, b.Index) })
		for _, g := range gpus {
			health := "ok"
			if !g.Health.Healthy {
				health = st.bad("UNHEALTHY")
				if g.Xid != 0 {
					health += fmt.Sprintf(" (Xid %d)", g.Xid)
				}
			}
			util, mem, power, temp := "-", "- / "+g.Memory.Human(), "-", "-"
			if x := g.Telemetry; x != nil {
				util = fmt.Sprintf("%d%%", x.SMUtilPct)
				mem = x.MemoryUsed.Human() + " / " + g.Memory.Human()
				power = fmt.Sprintf("%.0fW", x.PowerW)
				temp = fmt.Sprintf("%dC", x.TempC)
			}
			mode, shares := cmp.Or(g.ShareMode, "exclusive"), "-"
			if s := g.Sharing; s != nil {
				mode = s.Mode
				if len(s.Shares) > 0 || s.UsedMilli > 0 {
					shares = fmt.Sprintf("%d jobs, %d milli", len(s.Shares), s.UsedMilli)
				}
			}
			mig := "-"
			if g.MIGEnabled {
				var parts []string
				for _, in := range g.MIG {
					p := in.Profile
					if in.Busy {
						p += "*"
					}
					parts = append(parts, p)
				}
				mig = cmp.Or(strings.Join(parts, " "), "enabled, no instances")
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Index, g.Model, health, util, mem, power, temp, mode, shares, mig)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	if len(f.FPGAs) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, st.title("FPGA REGIONS"))
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "REGION\tKIND\tHOLDS\tHEALTH\tSTATE")
		regions := slices.Clone(f.FPGAs)
		slices.SortFunc(regions, func(a, b api.FPGARegion) int { return cmp.Compare(a.ID, b.ID) })
		for _, r := range regions {
			holds := cmp.Or(r.LoadedName, short(r.LoadedBitstream), "empty")
			health := "ok"
			if !r.Health.Healthy {
				health = st.bad("UNHEALTHY")
			}
			state := "idle"
			switch {
			case r.Busy:
				state = "programming"
			case r.Held:
				state = "held by a job"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", esc(r.ID), esc(string(r.Kind)), esc(holds), health, state)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	fmt.Fprintln(w)
	fmt.Fprintln(w, st.title("JOBS"))
	if len(f.Jobs) == 0 {
		fmt.Fprintln(w, "none")
		return nil
	}
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSTATE\tCLASS\tTIER\tCPU\tMEM\tDEVICES\tCPU USED\tMEM PEAK")
	for _, j := range f.Jobs {
		cpu, mem, devs := "-", "-", "-"
		if a := j.Allocation; a != nil {
			cpu, mem = a.CPU.String(), a.Memory.Human()
			if len(a.Devices) > 0 {
				var ds []string
				for _, d := range a.Devices {
					ds = append(ds, short(d))
				}
				devs = strings.Join(ds, ",")
			}
		}
		used, peak := "-", "-"
		if u := j.Usage; u != nil {
			used, peak = fmt.Sprintf("%.1fs", u.CPUSeconds), u.MemoryPeak.Human()
		}
		state := string(j.State)
		if j.State == api.StateFailed || j.State == api.StateLost {
			state = st.bad(state)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", esc(j.ID), esc(cmp.Or(j.Spec.Name, "-")), state, esc(string(j.Spec.Class)), j.Tier, cpu, mem, esc(devs), used, peak)
	}
	return tw.Flush()
}

func jobCounts(m map[api.State]int) string {
	var parts []string
	for _, s := range api.States {
		if c := m[s]; c > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", c, s))
		}
	}
	return cmp.Or(strings.Join(parts, ", "), "none")
}

// The terminal view: a bubbletea program that fetches a frame every
// interval and renders it with lipgloss styles.

type frameMsg struct {
	f   topFrame
	err error
	at  time.Time
}

type tickMsg struct{}

type topModel struct {
	ctx      context.Context
	c        *api.Client
	interval time.Duration
	frame    *topFrame
	at       time.Time
	err      error
	width    int
}

var (
	topTitle  = lipgloss.NewStyle().Bold(true).Foreground(lipgloss.Color("12"))
	topBad    = lipgloss.NewStyle().Bold(true).Foreground(lipgloss.Color("9"))
	topFooter = lipgloss.NewStyle().Faint(true)
)

func (m topModel) fetch() tea.Cmd {
	return func() tea.Msg {
		ctx, cancel := context.WithTimeout(m.ctx, 5*time.Second)
		defer cancel()
		f, err := fetchFrame(ctx, m.c)
		return frameMsg{f: f, err: err, at: time.Now()}
	}
}

func (m topModel) Init() tea.Cmd { return m.fetch() }

func (m topModel) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.KeyMsg:
		switch msg.String() {
		case "q", "ctrl+c", "esc":
			return m, tea.Quit
		case "r":
			return m, m.fetch()
		}
	case tea.WindowSizeMsg:
		m.width = msg.Width
	case frameMsg:
		m.at, m.err = msg.at, msg.err
		if msg.err == nil {
			m.frame = &msg.f
		}
		return m, tea.Tick(m.interval, func(time.Time) tea.Msg { return tickMsg{} })
	case tickMsg:
		return m, m.fetch()
	}
	return m, nil
}

func (m topModel) View() string {
	var b strings.Builder
	if m.frame != nil {
		renderFrame(&b, *m.frame, frameStyle{
			title: func(s string) string { return topTitle.Render(s) },
			bad:   func(s string) string { return topBad.Render(s) },
		})
	} else if m.err == nil {
		b.WriteString("connecting to fusiond…\n")
	}
	b.WriteString("\n")
	if m.err != nil {
		b.WriteString(topBad.Render("fusiond: "+oneLine(m.err)) + "\n")
	}
	footer := fmt.Sprintf("refreshed %s every %s — q quits, r refreshes", m.at.Format("15:04:05"), m.interval)
	b.WriteString(topFooter.Render(footer))
	return b.String()
}

func runTopTUI(ctx context.Context, c *api.Client, out *os.File, in io.Reader, interval time.Duration) error {
	m := topModel{ctx: ctx, c: c, interval: interval}
	p := tea.NewProgram(m, tea.WithContext(ctx), tea.WithOutput(out), tea.WithInput(in), tea.WithAltScreen())
	_, err := p.Run()
	if errors.Is(err, tea.ErrProgramKilled) && ctx.Err() != nil {
		return nil
	}
	return err
}

package cli

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/fusiond/fusiond/daemon/api"
)

// SplitDocuments splits a YAML stream on "---" document separators and
// drops empty documents.
func SplitDocuments(data []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	flush := func() {
		if len(bytes.TrimSpace(stripComments(cur.Bytes()))) > 0 {
			docs = append(docs, bytes.Clone(cur.Bytes()))
		}
		cur.Reset()
	}
	for _, line := range bytes.SplitAfter(data, []byte("\n")) {
		if t := bytes.TrimRight(line, " \t\r\n"); bytes.Equal(t, []byte("---")) || bytes.HasPrefix(t, []byte("--- ")) {
			flush()
			continue
		}
		cur.Write(line)
	}
	flush()
	return docs
}

func stripComments(b []byte) []byte {
	var out []byte
	for _, line := range bytes.Split(b, []byte("\n")) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			out = append(out, t...)
		}
	}
	return out
}

func newSubmitCmd(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "submit FILE...",
		Short: "Submit jobs from YAML or JSON spec files (- reads stdin)",
		Long: `Submit one job per YAML document. A file may hold several documents
separated by '---' (for example the members of a gang). All the documents of
all the files go in one request: every job is queued or none is. The daemon
checks every field; an unknown or impossible field is refused with its name
(and the file and document it is in). Spec files are read as YAML 1.2: only
true and false are booleans, so "name: y" is the string "y".`,
		Example: "  fusionctl submit examples/jobs/batch-report.yaml",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			type origin struct {
				file string
				doc  int
			}
			var specs []json.RawMessage
			var from []origin
			for _, name := range args {
				var data []byte
				var err error
				if name == "-" {
					data, err = io.ReadAll(o.stdin)
				} else {
					data, err = os.ReadFile(name)
				}
				if err != nil {
					return err
				}
				docs := SplitDocuments(data)
				if len(docs) == 0 {
					return fmt.Errorf("%s: no job spec in the file", name)
				}
				for i, doc := range docs {
					js, err := SpecJSON(doc)
					if err != nil {
						return fmt.Errorf("%s (document %d): not valid YAML: %w", name, i+1, err)
					}
					specs = append(specs, js)
					from = append(from, origin{name, i + 1})
				}
			}
			c := o.client()
			defer c.Close()
			// One request, one transaction: every document is queued or
			// none is, so a failed submit can be fixed and re-run without
			// duplicating the jobs that would otherwise have gone in.
			var submitted []api.Job
			var err error
			if len(specs) == 1 {
				var j api.Job
				j, err = c.SubmitJSON(cmd.Context(), specs[0])
				submitted = []api.Job{j}
			} else {
				submitted, err = c.SubmitAll(cmd.Context(), specs)
			}
			if err != nil {
				var e *api.Error
				if errors.As(err, &e) && len(specs) > 1 {
					if i, rest, ok := batchIndex(e.Field); ok && i < len(from) {
						out := *e
						out.Field = rest
						return fmt.Errorf("%s (document %d): %w; nothing was submitted", from[i].file, from[i].doc, &out)
					}
				}
				if len(specs) > 1 {
					return fmt.Errorf("%w; nothing was submitted", err)
				}
				return fmt.Errorf("%s (document %d): %w", from[0].file, from[0].doc, err)
			}
			return o.printJobs(submitted)
		},
	}
}

// batchIndex splits a batch error's field "jobs[2].gang.size" into 2 and
// "gang.size".
func batchIndex(field string) (int, string, bool) {
	rest, ok := strings.CutPrefix(field, "jobs[")
	if !ok {
		return 0, "", false
	}
	num, rest, ok := strings.Cut(rest, "]")
	i, err := strconv.Atoi(num)
	if !ok || err != nil {
		return 0, "", false
	}
	return i, strings.TrimPrefix(rest, "."), true
}

func newRunCmd(o *options) *cobra.Command {
	var (
		spec       api.JobSpec
		cpu, mem   string
		gpus       int
		gpuModel   string
		mig        string
		share      int
		gpuMem     string
		bitstream  string
		env        []string
		gang       string
		retries    int
		maxRuntime time.Duration
		wait       bool
		follow     bool
		class, tie string
	)
	cmd := &cobra.Command{
		Use:   "run [flags] -- COMMAND [ARG...]",
		Short: "Submit a job given on the command line",
		Example: `  fusionctl run --cpu 2 --memory 4Gi --class batch -- ./train.sh --epochs 3
  fusionctl run -f --cpu 500m --memory 256Mi -- sh -c 'id -u'`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			spec.Command = args
			spec.Class, spec.Tier = api.Class(class), api.Tier(tie)
			var err error
			if spec.Resources.CPU, err = api.ParseMilliCPU(cpu); err != nil {
				return fmt.Errorf("--cpu: %w", err)
			}
			if spec.Resources.Memory, err = api.ParseBytes(mem); err != nil {
				return fmt.Errorf("--memory: %w", err)
			}
			if gpus > 0 || gpuModel != "" || mig != "" || share > 0 || gpuMem != "" {
				g := &api.GPURequest{Count: gpus, Model: gpuModel, MIG: mig, Share: share}
				if gpuMem != "" {
					if g.Memory, err = api.ParseBytes(gpuMem); err != nil {
						return fmt.Errorf("--gpu-memory: %w", err)
					}
				}
				spec.Resources.GPU = g
			}
			if bitstream != "" {
				spec.Resources.FPGA = &api.FPGARequest{Bitstream: bitstream}
			}
			for _, kv := range env {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return fmt.Errorf("--env %q: want KEY=value", kv)
				}
				if spec.Env == nil {
					spec.Env = map[string]string{}
				}
				spec.Env[k] = v
			}
			if gang != "" {
				name, size, ok := strings.Cut(gang, ":")
				n, err := strconv.Atoi(size)
				if !ok || err != nil {
					return fmt.Errorf("--gang %q: want NAME:SIZE", gang)
				}
				spec.Gang = &api.Gang{Name: name, Size: n}
			}
			if retries > 0 {
				spec.Restart = &api.Restart{Policy: api.RestartOnFailure, MaxRetries: retries}
			}
			spec.MaxRuntime = api.Duration(maxRuntime)
			if spec.Workdir == "" {
				if wd, err := os.Getwd(); err == nil {
					spec.Workdir = wd
				}
			}
			c := o.client()
			defer c.Close()
			job, err := c.Submit(cmd.Context(), spec)
			if err != nil {
				return err
			}
			if follow {
				if err := c.Logs(cmd.Context(), job.ID, true, o.stdout); err != nil {
					return err
				}
			}
			if wait || follow {
				job, err = waitTerminal(cmd.Context(), c, job.ID, 0)
				if err != nil {
					return err
				}
				if follow && o.output == "table" {
					if job.State != api.StateSucceeded {
						fmt.Fprintf(o.stderr, "fusionctl: job %s %s: %s\n", job.ID, job.State, job.Reason)
					}
					return jobExit(job)
				}
			}
			if o.quiet {
				fmt.Fprintln(o.stdout, job.ID)
			} else if err := o.print(job, func(w io.Writer) error { return jobTable(w, []api.Job{job}) }); err != nil {
				return err
			}
			if wait {
				return jobExit(job)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&spec.Name, "name", "", "job name (default: the command's base name)")
	f.StringVar(&class, "class", "batch", "job class: training, inference, batch or service")
	f.StringVar(&tie, "tier", "", "QoS tier: guaranteed, burstable or besteffort (default: from the class)")
	f.IntVar(&spec.Priority, "priority", 0, "queue priority, 0..1000 (higher first)")
	f.StringVar(&cpu, "cpu", "1", "CPU in cores (2, 0.5) or millicores (500m)")
	f.StringVar(&mem, "memory", "256Mi", "memory with a unit (512Mi, 4Gi)")
	f.IntVar(&gpus, "gpu", 0, "number of whole GPUs (or MIG instances with --mig)")
	f.StringVar(&gpuModel, "gpu-model", "", "required GPU model (substring, e.g. H200)")
	f.StringVar(&mig, "mig", "", "MIG profile, e.g. 1g.18gb")
	f.IntVar(&share, "gpu-share", 0, "share of one GPU in milli-GPU (1..999)")
	f.StringVar(&gpuMem, "gpu-memory", "", "GPU memory cap for a shared GPU (e.g. 8Gi)")
	f.StringVar(&bitstream, "fpga-bitstream", "", "FPGA bitstream name or ID")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=value (repeatable)")
	f.StringVar(&spec.Workdir, "workdir", "", "working directory (default: the current directory)")
	f.StringVar(&gang, "gang", "", "gang NAME:SIZE — placed only together with its other members")
	f.IntVar(&retries, "retries", 0, "restart on failure up to this many times")
	f.DurationVar(&maxRuntime, "max-runtime", 0, "stop each attempt after this long (90s, 2h) and fail the job, not retried (default: no limit)")
	f.BoolVar(&spec.Movable, "movable", false, "the daemon may stop the job and start it again elsewhere on this host to make room (it must tolerate a restart)")
	f.BoolVarP(&wait, "wait", "w", false, "wait for the job to finish and exit with its exit code")
	f.BoolVarP(&follow, "follow", "f", false, "stream the job's output until it finishes, then exit with its exit code")
	return cmd
}

// describeMoves says whether the daemon may move j, how often it did and
// for which job it is moving it now.
func describeMoves(j api.Job) string {
	s := "no"
	if j.CanMove() {
		s = "yes"
	}
	if j.Moves > 0 {
		s += fmt.Sprintf("; moved %d times", j.Moves)
	}
	if j.MovingFor != "" {
		s += "; being moved to make room for job " + j.MovingFor
	}
	return s
}

// describeLimit is j's max_runtime and, while it runs, how much of it is
// left at now (counted from the attempt's recorded start, as the daemon
// counts it).
func describeLimit(j api.Job, now time.Time) string {
	limit := time.Duration(j.Spec.MaxRuntime)
	s := limit.String() + " per attempt"
	if j.State != api.StateRunning || j.StartedAt == nil {
		return s
	}
	left := limit - max(now.Sub(*j.StartedAt), 0)
	if left <= 0 {
		return s + "; reached, being stopped"
	}
	return s + "; " + max(left.Truncate(time.Second), time.Second).String() + " left"
}

// jobExit turns a finished job into fusionctl's exit status.
func jobExit(j api.Job) error {
	switch {
	case j.State == api.StateSucceeded:
		return nil
	case j.Exit != nil && j.Exit.Code != 0:
		return exitCode(j.Exit.Code)
	default:
		return exitCode(1)
	}
}

// waitTerminal polls until the job is finished (timeout 0: no limit).
func waitTerminal(ctx context.Context, c *api.Client, id string, timeout time.Duration) (api.Job, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	delay := 20 * time.Millisecond
	for {
		j, err := c.Get(ctx, id)
		if err != nil {
			return j, err
		}
		if j.State.Terminal() {
			return j, nil
		}
		select {
		case <-ctx.Done():
			if timeout == 0 {
				return j, ctx.Err()
			}
			return j, fmt.Errorf("job %s still %s after %s", id, j.State, timeout)
		case <-time.After(delay):
		}
		delay = min(delay*2, 500*time.Millisecond)
	}
}

func newListCmd(o *options) *cobra.Command {
	var states []string
	var opts api.ListOptions
	var class string
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ps"},
		Short:   "List jobs, newest first (yours, or everyone's for root and admins)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q := map[string][]string{"state": states}
			if class != "" {
				q["class"] = []string{class}
			}
			parsed, err := api.ParseListQuery(q)
			if err != nil {
				return fmt.Errorf("--%s: %s", errField(err), errMessage(err))
			}
			opts.State, opts.Class = parsed.State, parsed.Class
			c := o.client()
			defer c.Close()
			jobs, err := c.List(cmd.Context(), opts)
			if err != nil {
				return err
			}
			return o.printJobs(jobs)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&states, "state", nil, "only jobs in these states (pending, running, succeeded, …)")
	f.StringVar(&opts.User, "user", "", "only jobs of this user (name or uid)")
	f.StringVar(&class, "class", "", "only jobs of this class")
	f.IntVar(&opts.Limit, "limit", 0, "show at most this many jobs")
	return cmd
}

func errField(err error) string {
	var e *api.Error
	if errors.As(err, &e) {
		return e.Field
	}
	return ""
}

func errMessage(err error) string {
	var e *api.Error
	if errors.As(err, &e) {
		return e.Message
	}
	return err.Error()
}

func age(t time.Time) string {
	d := time.Since(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func jobTable(w io.Writer, jobs []api.Job) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tCLASS\tTIER\tSTATE\tUSER\tAGE\tREASON")
	for _, j := range jobs {
		user := j.Owner.User
		if user == "" {
			user = strconv.FormatUint(uint64(j.Owner.UID), 10)
		}
		reason := esc(j.Reason)
		if r := []rune(reason); len(r) > 70 {
			reason = string(r[:67]) + "..."
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", esc(j.ID), esc(podName(j)), esc(string(j.Spec.Class)), j.Tier, j.State, esc(user), age(j.CreatedAt), reason)
	}
	return tw.Flush()
}

func newShowCmd(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "show JOB",
		Short: "Show one job: spec, placement, exit status and events",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := o.client()
			defer c.Close()
			j, err := c.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return o.print(j, func(w io.Writer) error { return showJob(w, j) })
		},
	}
}

func showJob(w io.Writer, j api.Job) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	// Every value is one line of text, much of it the user's own (name,
	// command, reason): escaped whole.
	p := func(k, format string, args ...any) {
		fmt.Fprintf(tw, "%s:\t%s\n", k, esc(fmt.Sprintf(format, args...)))
	}
	p("ID", "%s", j.ID)
	p("Name", "%s", j.Spec.Name)
	p("Class / tier", "%s / %s", j.Spec.Class, j.Tier)
	p("Priority", "%d", j.Spec.Priority)
	p("Owner", "%s (uid %d, gid %d)", j.Owner.User, j.Owner.UID, j.Owner.GID)
	p("State", "%s", j.State)
	if j.Reason != "" {
		p("Reason", "%s", j.Reason)
	}
	if j.Spec.Pod == nil {
		p("Command", "%s", strings.Join(j.Spec.Command, " "))
	}
	if j.Spec.Workdir != "" {
		p("Workdir", "%s", j.Spec.Workdir)
	}
	if j.Spec.Rootfs != "" {
		p("Rootfs", "%s", j.Spec.Rootfs)
	}
	if len(j.Spec.Labels) > 0 {
		var ls []string
		for k, v := range j.Spec.Labels {
			ls = append(ls, k+"="+v)
		}
		slices.Sort(ls)
		p("Labels", "%s", strings.Join(ls, ", "))
	}
	r := j.Spec.Resources
	p("Requests", "cpu %s, memory %s%s", r.CPU, r.Memory, deviceRequest(r))
	showProvenance(p, j)
	showPod(p, j)
	if a := j.Allocation; a != nil {
		p("Allocation", "cpu %s, memory %s", a.CPU, a.Memory)
		if a.CPUSet != "" {
			p("CPU set", "%s (NUMA node %d)", a.CPUSet, a.NUMANode)
		}
		if len(a.Devices) > 0 {
			p("Devices", "%s", strings.Join(a.Devices, ", "))
		}
		if len(j.Degraded) > 0 {
			p("Degraded", "%s out of service (the job keeps them)", strings.Join(j.Degraded, ", "))
		}
		if a.Explain != "" {
			p("Placement", "%s", a.Explain)
		}
	}
	if j.PID > 0 {
		p("PID", "%d", j.PID)
	}
	if j.PreemptedBy != "" {
		p("Preempted", "%d times, last by job %s", j.Preemptions, j.PreemptedBy)
	}
	if j.CanMove() || j.Moves > 0 || j.MovingFor != "" {
		p("Movable", "%s", describeMoves(j))
	}
	if j.Attempt > 1 {
		p("Attempt", "%d", j.Attempt)
	}
	if j.Spec.MaxRuntime > 0 {
		p("Max runtime", "%s", describeLimit(j, time.Now()))
	}
	if e := j.Exit; e != nil {
		p("Exit", "code %d%s%s", e.Code, map[bool]string{true: ", signal " + e.Signal}[e.Signal != ""], map[bool]string{true: ", oom-killed"}[e.OOMKilled])
	}
	if u := j.Usage; u != nil {
		p("Usage", "%s", describeUsage(*u))
	}
	if l := j.Latency; l != nil {
		p("Latency", "%s", describeLatency(*l))
		if l.DelayedBy != nil {
			p("Delayed by", "%s", describeDelayedBy(*l))
		}
	}
	p("Created", "%s", j.CreatedAt.Local().Format(time.RFC3339))
	if j.StartedAt != nil {
		p("Started", "%s", j.StartedAt.Local().Format(time.RFC3339))
	}
	if j.FinishedAt != nil {
		p("Finished", "%s", j.FinishedAt.Local().Format(time.RFC3339))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if l := j.Latency; l != nil {
		printHistogram(w, l.Histogram)
	}
	fmt.Fprintln(w, "\nEvents:")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  TIME\tFROM\tTO\tREASON")
	for _, e := range j.Events {
		from := string(e.From)
		if from == "" {
			from = "-"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", e.Time.Local().Format("15:04:05.000"), esc(from), esc(string(e.To)), esc(e.Reason))
	}
	return tw.Flush()
}

// describeUsage is a job's accounting on one line.
func describeUsage(u api.Usage) string {
	s := fmt.Sprintf("cpu %.2fs, peak memory %s", u.CPUSeconds, u.MemoryPeak)
	if u.MemoryCurrent > 0 {
		s += fmt.Sprintf(" (now %s)", u.MemoryCurrent)
	}
	if u.ThrottledPeriods > 0 {
		s += fmt.Sprintf(", throttled %.2fs in %d periods", u.ThrottledSeconds, u.ThrottledPeriods)
	}
	if u.OOMKills > 0 {
		s += fmt.Sprintf(", %d OOM kills", u.OOMKills)
	}
	if p := u.Pressure; p != nil {
		s += fmt.Sprintf(", stalled (60s) cpu %.1f%% memory %.1f%% io %.1f%%", p.CPU, p.Memory, p.IO)
	}
	return s
}

func deviceRequest(r api.Resources) string {
	var s string
	if g := r.GPU; g != nil {
		switch {
		case g.MIG != "":
			s += fmt.Sprintf(", %d× MIG %s", g.Count, g.MIG)
		case g.Share > 0:
			s += fmt.Sprintf(", %d milli-GPU", g.Share)
		default:
			s += fmt.Sprintf(", %d GPU", g.Count)
		}
		if g.Model != "" {
			s += " (" + g.Model + ")"
		}
	}
	if f := r.FPGA; f != nil {
		s += ", FPGA bitstream " + f.Bitstream
	}
	return s
}

func newCancelCmd(o *options) *cobra.Command {
	var wait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "cancel JOB...",
		Short: "Cancel jobs (SIGTERM, then SIGKILL after the daemon's grace period)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := o.client()
			defer c.Close()
			var out []api.Job
			for _, id := range args {
				j, err := c.Cancel(cmd.Context(), id)
				if err != nil {
					return fmt.Errorf("job %s: %w", id, err)
				}
				if wait {
					if j, err = waitTerminal(cmd.Context(), c, id, timeout); err != nil {
						return err
					}
				}
				out = append(out, j)
			}
			return o.printJobs(out)
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", true, "wait until the jobs have stopped")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "how long --wait waits")
	return cmd
}

func newLogsCmd(o *options) *cobra.Command {
	var follow, escape bool
	cmd := &cobra.Command{
		Use:   "logs JOB",
		Short: "Print a job's output (stdout and stderr)",
		Long: `logs prints what the job wrote, byte for byte (like kubectl logs): a
job that colours its output keeps its colours. --escape makes every control
character but newline and tab visible (\x1b, \x07, \u009b), so that the
output of a job you do not trust cannot drive your terminal.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := o.client()
			defer c.Close()
			if !escape {
				return c.Logs(cmd.Context(), args[0], follow, o.stdout)
			}
			out := newEscapeWriter(o.stdout)
			err := c.Logs(cmd.Context(), args[0], follow, out)
			return errors.Join(err, out.Flush())
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep streaming until the job finishes")
	cmd.Flags().BoolVar(&escape, "escape", false, "make control characters other than newline and tab visible")
	return cmd
}

func newEventsCmd(o *options) *cobra.Command {
	var job string
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Stream job state changes and device health transitions as they happen",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c := o.client()
			defer c.Close()
			tw := tabwriter.NewWriter(newEscapeWriter(o.stdout), 0, 4, 2, ' ', 0)
			// The daemon ends a stream that has been idle for
			// limits.stream_idle_timeout: open it again (at most once a
			// second) until interrupted.
			for {
				start := time.Now()
				if err := c.Events(cmd.Context(), job, func(e api.Event) error { return printEvent(o, tw, e) }); err != nil {
					return err
				}
				if cmd.Context().Err() != nil {
					return nil
				}
				select {
				case <-cmd.Context().Done():
					return nil
				case <-time.After(time.Until(start.Add(time.Second))):
				}
			}
		},
	}
	cmd.Flags().StringVar(&job, "job", "", "only this job's events")
	return cmd
}

func printEvent(o *options, tw *tabwriter.Writer, e api.Event) error {
	if o.output != "table" {
		return o.print(e, nil)
	}
	switch e.Kind {
	case api.EventQoS, api.EventScale, api.EventResize, api.EventReclaim:
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", e.Time.Local().Format("15:04:05.000"), esc(cmp.Or(e.JobID, "-")), esc(string(e.Kind)), esc(e.Reason))
		return tw.Flush()
	}
	if e.Kind == api.EventDevice {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", e.Time.Local().Format("15:04:05.000"), esc(e.Device), esc(deviceHealth(e)), esc(e.Reason))
		return tw.Flush()
	}
	fmt.Fprintf(tw, "%s\t%s\t%s → %s\t%s\n", e.Time.Local().Format("15:04:05.000"), esc(e.JobID), esc(cmp.Or(string(e.From), "-")), esc(string(e.To)), esc(e.Reason))
	return tw.Flush()
}

// describeLatency is a job's run-queue latency and SLO state on one line.
func describeLatency(l api.Latency) string {
	slo := "no SLO"
	if l.SLO != nil {
		var parts []string
		if l.SLO.RunqueueP99 > 0 {
			parts = append(parts, "run-queue p99 ≤ "+l.SLO.RunqueueP99.String())
		}
		if l.SLO.PSISomeAvg10 > 0 {
			parts = append(parts, fmt.Sprintf("memory PSI ≤ %g%%", l.SLO.PSISomeAvg10))
		}
		slo = "SLO " + strings.Join(parts, ", ")
	}
	s := fmt.Sprintf("%s: run-queue p50 %v, p99 %v over %d events (last window); %s", l.State, l.P50, l.P99, l.Count, slo)
	if l.Preemptions > 0 {
		s += fmt.Sprintf("; preempted %d times by other tiers", l.Preemptions)
	}
	if l.MemoryPressure != nil {
		s += fmt.Sprintf("; memory PSI %.2f%%", *l.MemoryPressure)
	}
	return s
}

// describeDelayedBy is who held the CPU while the job waited: the last
// window and since the job started.
func describeDelayedBy(l api.Latency) string {
	var parts []string
	if d := l.WindowDelayedBy; d != nil {
		parts = append(parts, fmt.Sprintf("last window %v: %s", d.Total(), d.Describe()))
	}
	if d := l.DelayedBy; d != nil {
		parts = append(parts, fmt.Sprintf("since start %v: %s", d.Total(), d.Describe()))
	}
	return strings.Join(parts, "; ")
}

// printHistogram prints the non-empty log2 buckets of a run-queue latency
// histogram (bucket i: [2^i, 2^(i+1)) ns) with bars.
func printHistogram(w io.Writer, buckets []uint64) {
	var peak uint64
	lo, hi := -1, -1
	for i, n := range buckets {
		if n > 0 {
			if lo < 0 {
				lo = i
			}
			hi = i
			peak = max(peak, n)
		}
	}
	if lo < 0 {
		return
	}
	fmt.Fprintln(w, "\nRun-queue latency (since the job started):")
	for i := lo; i <= hi; i++ {
		from := time.Duration(0)
		if i > 0 {
			from = time.Duration(uint64(1) << i)
		}
		to := time.Duration(uint64(1) << (i + 1))
		bar := strings.Repeat("@", int(40*buckets[i]/peak))
		fmt.Fprintf(w, "  [%9v, %9v) %8d |%-40s|\n", from, to, buckets[i], bar)
	}
}

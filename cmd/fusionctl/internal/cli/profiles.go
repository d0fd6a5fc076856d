package cli

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/profile"
)

func newProfileCmd(o *options) *cobra.Command {
	var q api.ProfileQuery
	cmd := &cobra.Command{
		Use:   "profile",
		Short: "List the task profiles: what finished jobs of each name used and how long they ran",
		Long: `fusionctl profile lists the task profiles the daemon learned from finished
jobs, one per owner, job name (or label set) and class: the runs folded in,
run time p50/p95, CPU, memory, GPU utilisation and GPU memory p50/p95 next
to the latest request, the failure rate and when a run last ended. Recent
runs weigh more (profiles.half_life). You see your own profiles; root and
the admin group see every owner's.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c := o.client()
			defer c.Close()
			l, err := c.Profiles(cmd.Context(), q)
			if err != nil {
				return err
			}
			return o.print(l, func(w io.Writer) error { return profileTable(w, l, time.Now()) })
		},
	}
	cmd.Flags().StringVar(&q.Owner, "owner", "", "only this owner's profiles (a user name)")
	cmd.Flags().StringVar(&q.Name, "name", "", "only profiles of this job name (or label set k=v,k=v)")
	cmd.Flags().StringVar(&q.Class, "class", "", "only profiles of this class")
	return cmd
}

func newRecommendCmd(o *options) *cobra.Command {
	var q api.ProfileQuery
	cmd := &cobra.Command{
		Use:   "recommend JOB_ID | --name NAME",
		Short: "Compare a job's requests with what its earlier runs used, and suggest requests",
		Long: `fusionctl recommend compares what a job asks for with what the finished runs
of its kind (its task profile: owner, name or label set, class) used, and
suggests requests: the p95 of the runs' peak use plus headroom
(profiles.headroom), once the profile has profiles.min_runs sampled runs.
With JOB_ID it compares that job's spec; with --name, the profile's latest
request.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (len(args) == 1) == (q.Name != "") {
				return errors.New("give a job ID or --name, not both")
			}
			if len(args) == 1 && (q.Owner != "" || q.Class != "") {
				return errors.New("--owner and --class go with --name")
			}
			c := o.client()
			defer c.Close()
			var r api.Recommendation
			var err error
			if len(args) == 1 {
				r, err = c.JobRecommendation(cmd.Context(), args[0])
			} else {
				r, err = c.Recommend(cmd.Context(), q)
			}
			if err != nil {
				return err
			}
			return o.print(r, func(w io.Writer) error { return recommendationTable(w, r) })
		},
	}
	cmd.Flags().StringVar(&q.Name, "name", "", "the profile's job name (or label set k=v,k=v)")
	cmd.Flags().StringVar(&q.Owner, "owner", "", "the profile's owner (default you)")
	cmd.Flags().StringVar(&q.Class, "class", "", "the profile's class (default the most recently seen)")
	return cmd
}

// A profile's resources as the tables show them.
type resource struct {
	name string
	get  func(profile.Usage) float64
	dist func(profile.Profile) profile.Dist
	fmt  func(float64) string
}

var resources = []resource{
	{"CPU", func(u profile.Usage) float64 { return u.CPUMilli }, func(p profile.Profile) profile.Dist { return p.CPU }, milli},
	{"memory", func(u profile.Usage) float64 { return u.MemMiB }, func(p profile.Profile) profile.Dist { return p.Mem }, mib},
	{"GPU", func(u profile.Usage) float64 { return u.GPUMilli }, func(p profile.Profile) profile.Dist { return p.GPU }, milli},
	{"GPU memory", func(u profile.Usage) float64 { return u.GPUMemMiB }, func(p profile.Profile) profile.Dist { return p.GPUMem }, mib},
}

func milli(v float64) string { return fmt.Sprintf("%.0fm", math.Round(v)) }

func mib(v float64) string {
	if v >= 10*1024 {
		return fmt.Sprintf("%.1f GiB", v/1024)
	}
	return fmt.Sprintf("%.0f MiB", math.Round(v))
}

func seconds(v float64) string {
	d := time.Duration(v * float64(time.Second))
	switch {
	case d >= time.Minute:
		return d.Round(time.Second).String()
	case d >= time.Second:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

func profileTable(w io.Writer, l api.ProfileList, now time.Time) error {
	if !l.Enabled {
		_, err := fmt.Fprintln(w, "task profiles are off (profiles.enabled: false in the daemon's configuration)")
		return err
	}
	if len(l.Profiles) == 0 {
		_, err := fmt.Fprintln(w, "no task profiles yet: they are learned as named (or labelled) jobs end")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "OWNER\tNAME\tCLASS\tRUNS\tRUN TIME p50/p95\tCPU p50/p95 (REQ)\tMEMORY p50/p95 (REQ)\tGPU p50/p95 (REQ)\tGPU MEM p50/p95 (REQ)\tFAILED\tLAST SEEN")
	for _, p := range l.Profiles {
		run := "-"
		if p.Runtime != (profile.Dist{}) {
			run = seconds(p.Runtime.P50) + "/" + seconds(p.Runtime.P95)
		}
		cols := make([]string, len(resources))
		for i, r := range resources {
			req, d := r.get(p.Requested), r.dist(p)
			switch {
			case p.SampledRuns == 0 && req == 0:
				cols[i] = "-"
			case p.SampledRuns == 0:
				cols[i] = "? (" + r.fmt(req) + ")"
			case req == 0 && d == (profile.Dist{}):
				cols[i] = "-"
			default:
				cols[i] = fmt.Sprintf("%s/%s (%s)", r.fmt(d.P50), r.fmt(d.P95), r.fmt(req))
			}
		}
		runs := fmt.Sprint(p.Runs)
		if p.SampledRuns != p.Runs {
			runs = fmt.Sprintf("%d (%d sampled)", p.Runs, p.SampledRuns)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f%%\t%s\n", esc(p.Key.Owner), esc(dash(p.Key.Name)), esc(dash(p.Key.Class)),
			runs, run, cols[0], cols[1], cols[2], cols[3], 100*p.FailureRate, ago(now, p.LastSeen))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\nRuns weigh half every %v (profiles.half_life); p50 is the runs' typical use, p95 their peak.\n", time.Duration(l.HalfLife))
	return err
}

func ago(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	if d < 0 {
		return t.UTC().Format(time.RFC3339)
	}
	return d.Round(time.Second).String() + " ago"
}

func recommendationTable(w io.Writer, r api.Recommendation) error {
	k := r.Key
	head := fmt.Sprintf("Profile: owner %s, name %s, class %s", esc(k.Owner), esc(dash(k.Name)), esc(dash(k.Class)))
	if r.JobID != "" {
		head = fmt.Sprintf("Job %s — %s", esc(r.JobID), strings.ToLower(head[:1])+head[1:])
	}
	if _, err := fmt.Fprintln(w, head); err != nil {
		return err
	}
	if p := r.Profile; p != nil {
		fmt.Fprintf(w, "Runs: %d (%d sampled), %.0f%% failed, last ended %s", p.Runs, p.SampledRuns, 100*p.FailureRate, p.LastSeen.Local().Format(time.DateTime))
		if p.Runtime != (profile.Dist{}) {
			fmt.Fprintf(w, "; run time p50 %s, p95 %s", seconds(p.Runtime.P50), seconds(p.Runtime.P95))
		}
		fmt.Fprintln(w)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RESOURCE\tREQUESTED\tP50 USED\tP95 USED\tSUGGESTED")
	for _, res := range resources {
		req, sug := res.get(r.Requested), res.get(r.Suggested)
		p50, p95 := "-", "-"
		if p := r.Profile; p != nil && p.SampledRuns > 0 {
			d := res.dist(*p)
			p50, p95 = res.fmt(d.P50), res.fmt(d.P95)
		}
		if req == 0 && (r.Profile == nil || res.dist(*r.Profile) == (profile.Dist{})) {
			continue // neither asked for nor used
		}
		suggested := "-"
		if r.Ready {
			suggested = res.fmt(sug)
			if sug != req {
				suggested += " ←"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", res.name, res.fmt(req), p50, p95, suggested)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case !r.Ready:
		_, err := fmt.Fprintf(w, "No recommendation yet: %s.\n", esc(r.Note))
		return err
	case len(r.Reasons) == 0:
		_, err := fmt.Fprintf(w, "The requests fit the observed use over %d runs: nothing to change.\n", r.Runs)
		return err
	}
	what := "Recommendation"
	if r.OverAsked {
		what = "Recommendation (over-asked: lower the request)"
	}
	fmt.Fprintf(w, "%s:\n", what)
	for _, why := range r.Reasons {
		fmt.Fprintf(w, "  - %s\n", esc(why))
	}
	return nil
}

package cli

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/fusiond/fusiond/daemon/api"
)

// newPodsCmd is fusionctl pods: the devices kubelet allocated to pods
// through fusiond's device plugin, one hold a container.
func newPodsCmd(o *options) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "pods",
		Short: "List the devices kubelet's pods hold (fusiond's device plugin; root and admins)",
		Long: `Each row is one pod container's device hold: the job record fusiond keeps
for what kubelet allocated to it, with the pod's namespace, name and UID once
kubelet's pod-resources API names it ("-" until then). A hold ends when kubelet
frees its devices; --all lists ended holds too.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c := o.client()
			defer c.Close()
			opts := api.ListOptions{}
			if !all {
				opts.State = []api.State{api.StatePending, api.StatePlaced, api.StateStarting, api.StateRunning}
			}
			js, err := c.List(cmd.Context(), opts)
			if err != nil {
				return err
			}
			var holds []api.Job
			for _, j := range js {
				if j.Spec.Pod != nil {
					holds = append(holds, j)
				}
			}
			if o.quiet {
				return o.printJobs(holds)
			}
			return o.print(holds, func(w io.Writer) error { return podTable(w, holds) })
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "list ended holds too")
	return cmd
}

func podTable(w io.Writer, holds []api.Job) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOLD\tSTATE\tRESOURCE\tDEVICES\tNAMESPACE\tPOD\tCONTAINER\tUID\tAGE")
	for _, j := range holds {
		ns, name, container, uid := "-", "-", "-", "-"
		if p := j.Pod; p != nil {
			ns, name, container, uid = esc(p.Namespace), esc(p.Name), esc(p.Container), esc(p.UID)
		}
		devs := j.Spec.Pod.Devices
		if a := j.Allocation; a != nil && len(a.Devices) > 0 {
			devs = a.Devices
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", esc(j.ID), j.State, esc(j.Spec.Pod.Resource), esc(strings.Join(devs, ",")),
			ns, name, orDash(container), orDash(uid), age(j.CreatedAt))
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// podName is how fusionctl list names a pod's device hold: the pod, once
// kubelet's pod resources name it.
func podName(j api.Job) string {
	if p := j.Pod; p != nil {
		return "pod/" + p.Namespace + "/" + p.Name
	}
	return j.Spec.Name
}

// showPod adds a pod's device hold to fusionctl show.
func showPod(p func(k, format string, args ...any), j api.Job) {
	h := j.Spec.Pod
	if h == nil {
		return
	}
	p("Pod hold", "%s: %s (allocated by kubelet)", h.Resource, strings.Join(h.Devices, ", "))
	if q := j.Pod; q != nil {
		p("Pod", "%s/%s (uid %s), container %s", q.Namespace, q.Name, orDash(q.UID), orDash(q.Container))
	} else {
		p("Pod", "not yet named by kubelet's pod resources")
	}
}

// kubernetesLine is the device plugin's state in fusionctl status.
func kubernetesLine(k api.KubernetesStatus) string {
	reg := fmt.Sprintf("%d of %d resources registered with kubelet", k.Registered, k.Resources)
	if k.Registered < k.Resources {
		reg += " (kubelet down or refusing)"
	}
	pr := "pod resources answering"
	if !k.PodResources {
		pr = "kubelet's pod resources not answering: no hold is released"
	}
	return fmt.Sprintf("%s; %d pods' holds (fusionctl pods); %s; Allocate p50 %s p99 %s over %d calls (%d refused)",
		reg, k.Holds, pr, time.Duration(k.Allocate.P50).Round(time.Microsecond), time.Duration(k.Allocate.P99).Round(time.Microsecond), k.Allocate.Count, k.Allocate.Errors)
}

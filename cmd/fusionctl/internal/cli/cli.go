// Package cli implements fusionctl, the command-line client of fusiond:
// every subcommand, output formatting (tables, JSON, YAML) and job-spec
// files. cmd/fusionctl only calls Execute.
//
// It may import daemon/api (types and client), daemon/buildinfo, topology
// (rendering), devices/fpga/bitstream (file checks) and its sibling sim;
// nothing under daemon/internal and no driver (TestBinaryDependencies).
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/fusiond/fusiond/cmd/fusionctl/internal/sim"
	"github.com/fusiond/fusiond/daemon/api"
)

// DefaultSocket is where fusiond listens unless told otherwise.
const DefaultSocket = "/run/fusiond/fusiond.sock"

// options are the flags every subcommand shares.
type options struct {
	socket string
	output string
	quiet  bool
	stdout io.Writer
	stderr io.Writer
	stdin  io.Reader
}

func (o *options) client() *api.Client { return api.NewClient(o.socket) }

// Execute runs fusionctl with args and returns the process exit code.
func Execute(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root, o := NewRootCommand(stdin, stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	if ec, ok := err.(exitCode); ok {
		return int(ec)
	}
	fmt.Fprintf(o.stderr, "fusionctl: %s\n", oneLine(err))
	return 1
}

// exitCode is returned by commands that mirror a job's own exit code.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit code %d", int(e)) }

// oneLine is an error as one line for the terminal: its newlines become
// spaces and any other control character that the daemon quoted from a
// user's input is made visible (esc).
func oneLine(err error) string { return esc(strings.ReplaceAll(err.Error(), "\n", " ")) }

// NewRootCommand builds the command tree.
func NewRootCommand(stdin io.Reader, stdout, stderr io.Writer) (*cobra.Command, *options) {
	o := &options{stdin: stdin, stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "fusionctl",
		Short: "Control the fusiond node daemon",
		Long: `fusionctl talks to the local fusiond daemon over its Unix socket: submit
and run jobs, watch them, read their logs, cancel them, and inspect the node.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			switch o.output {
			case "table", "json", "yaml":
				return nil
			}
			return fmt.Errorf("--output %q: want table, json or yaml", o.output)
		},
	}
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	sock := os.Getenv("FUSIOND_SOCKET")
	if sock == "" {
		sock = DefaultSocket
	}
	root.PersistentFlags().StringVar(&o.socket, "socket", sock, "fusiond's API socket (env FUSIOND_SOCKET)")
	root.PersistentFlags().StringVarP(&o.output, "output", "o", "table", "output format: table, json or yaml")
	root.PersistentFlags().BoolVarP(&o.quiet, "quiet", "q", false, "print only job IDs (submit, run, list, cancel)")
	root.AddCommand(
		newSubmitCmd(o), newRunCmd(o), newListCmd(o), newShowCmd(o), newCancelCmd(o),
		newLogsCmd(o), newStatusCmd(o), newVersionCmd(o), newEventsCmd(o), newNodeCmd(o),
		newTopologyCmd(o), newGPUCmd(o), newMIGCmd(o), newFPGACmd(o), newTopCmd(o), newForecastCmd(o), newPeersCmd(o), newPodsCmd(o), newProfileCmd(o), newRecommendCmd(o),
		simulateCmd(),
	)
	root.AddCommand(newDocsCmd(root))
	return root, o
}

// simulateCmd is fusionctl simulate with its peers replay.
func simulateCmd() *cobra.Command {
	c := sim.NewCommand()
	c.AddCommand(sim.NewPeersCommand())
	return c
}

// printJobs prints jobs as a table, JSON, YAML, or IDs alone with --quiet.
func (o *options) printJobs(jobs []api.Job) error {
	if o.quiet {
		for _, j := range jobs {
			fmt.Fprintln(o.stdout, j.ID)
		}
		return nil
	}
	return o.print(jobs, func(w io.Writer) error { return jobTable(w, jobs) })
}

// print writes v as JSON or YAML, or calls table for the table format.
func (o *options) print(v any, table func(w io.Writer) error) error {
	switch o.output {
	case "json":
		enc := json.NewEncoder(o.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		data, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = o.stdout.Write(data)
		return err
	default:
		w := newEscapeWriter(o.stdout)
		return errors.Join(table(w), w.Flush())
	}
}

package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// DocsCommand is the hidden command the package builder runs on the built
// binary to write fusionctl's man pages and shell completions.
const DocsCommand = "__docs"

// newDocsCmd writes fusionctl's man pages (section 1, one per command,
// generated from the cobra tree) into DIR/man1 and its bash, zsh and fish
// completions into DIR/completions. It is hidden: it is a build step, not
// a user command.
func newDocsCmd(root *cobra.Command) *cobra.Command {
	var date string
	c := &cobra.Command{
		Use:    DocsCommand + " DIR",
		Short:  "Write man pages and completions (used by the package build)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			d, err := time.Parse("2006-01-02", date)
			if err != nil {
				return fmt.Errorf("--date: %w", err)
			}
			return writeDocs(root, args[0], d)
		},
	}
	c.Flags().StringVar(&date, "date", time.Now().UTC().Format("2006-01-02"), "date printed in the man pages (YYYY-MM-DD)")
	return c
}

func writeDocs(root *cobra.Command, dir string, date time.Time) error {
	man1 := filepath.Join(dir, "man1")
	comp := filepath.Join(dir, "completions")
	for _, d := range []string{man1, comp} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	root.DisableAutoGenTag = true // keeps the pages reproducible
	header := &doc.GenManHeader{Title: "FUSIONCTL", Section: "1", Source: "fusiond", Manual: "fusiond manual", Date: &date}
	if err := doc.GenManTree(root, header, man1); err != nil {
		return fmt.Errorf("man pages: %w", err)
	}
	for name, gen := range map[string]func(io.Writer) error{
		"fusionctl.bash": func(w io.Writer) error { return root.GenBashCompletionV2(w, true) },
		"_fusionctl":     root.GenZshCompletion,
		"fusionctl.fish": func(w io.Writer) error { return root.GenFishCompletion(w, true) },
	} {
		f, err := os.Create(filepath.Join(comp, name))
		if err != nil {
			return err
		}
		if err := gen(f); err != nil {
			f.Close()
			return fmt.Errorf("completion %s: %w", name, err)
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	return nil
}

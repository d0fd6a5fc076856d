// Command build makes fusiond's .deb and .rpm from already built binaries:
//
//	go run ./packaging/build -version "$(git describe --tags --always --dirty)" \
//	    -bin _build/pkg/bin -out dist deb rpm
//
// Run it from the repository root. It prints the paths of the packages.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/fusiond/fusiond/packaging"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "packaging/build: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	version := fs.String("version", "", "version being packaged (tag, git describe output or commit)")
	arch := fs.String("arch", runtime.GOARCH, "GOARCH the binaries were built for")
	bin := fs.String("bin", "_build/pkg/bin", "directory holding fusiond and fusionctl")
	stage := fs.String("stage", "_build/pkg/stage", "scratch directory for man pages, completions and changelog")
	out := fs.String("out", "dist", "output directory")
	epoch := fs.Int64("mtime", 0, "file times in the packages, Unix seconds (default: SOURCE_DATE_EPOCH, else now)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	formats := fs.Args()
	if len(formats) == 0 {
		formats = []string{"deb", "rpm"}
	}
	pv, err := packaging.PackageVersion(*version)
	if err != nil {
		return err
	}
	mtime := time.Now().UTC().Truncate(time.Second)
	if *epoch == 0 {
		fmt.Sscan(os.Getenv("SOURCE_DATE_EPOCH"), epoch)
	}
	if *epoch != 0 {
		mtime = time.Unix(*epoch, 0).UTC()
	}
	for _, b := range []string{"fusiond", "fusionctl"} {
		if _, err := os.Stat(filepath.Join(*bin, b)); err != nil {
			return fmt.Errorf("binary missing (build it first): %w", err)
		}
	}
	absStage, err := filepath.Abs(*stage)
	if err != nil {
		return err
	}
	absBin, err := filepath.Abs(*bin)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(absStage); err != nil {
		return err
	}
	if err := packaging.WriteDocs(filepath.Join(absBin, "fusionctl"), "packaging/man/fusiond.8", absStage, mtime); err != nil {
		return err
	}
	if err := packaging.WriteChangelog("packaging/changelog.yaml", filepath.Join(absStage, "changelog.yaml"), pv+"-"+packaging.Release, mtime); err != nil {
		return err
	}
	paths, err := packaging.Build(packaging.Options{
		Root: ".", Config: "packaging/nfpm.yaml", Version: pv, Arch: *arch,
		Bin: absBin, Stage: absStage, Out: *out, MTime: mtime,
	}, formats...)
	for _, p := range paths {
		fmt.Println(p)
	}
	return err
}

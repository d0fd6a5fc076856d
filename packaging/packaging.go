// Package packaging builds fusiond's .deb and .rpm with nfpm
// (github.com/goreleaser/nfpm/v2): it stages what the packages carry
// besides the binaries (man pages generated from fusionctl's cobra tree,
// shell completions, the changelog for the version being built) and runs
// nfpm on nfpm.yaml for each format. The command is ./packaging/build;
// packaging/test holds the lint and booted-Debian checks.
package packaging

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/goreleaser/chglog"
	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // registers the deb packager
	"github.com/goreleaser/nfpm/v2/files"
	_ "github.com/goreleaser/nfpm/v2/rpm" // registers the rpm packager
	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
	"go.yaml.in/yaml/v3"
)

// Release is the packages' release (deb revision, rpm release); nfpm.yaml
// sets the same.
const Release = "1"

// ErrVersion is returned for a version no package can carry.
var ErrVersion = errors.New("package version")

var (
	commitRE   = regexp.MustCompile(`^[0-9a-f]{7,40}(-dirty)?$`)
	describeRE = regexp.MustCompile(`^([0-9]+\.[0-9]+\.[0-9]+)(?:-([0-9]+)-g([0-9a-f]+))?(-dirty)?$`)
	versionOK  = regexp.MustCompile(`^[0-9][A-Za-z0-9.+~]*$`)
)

// PackageVersion turns a build version (a tag such as v1.2.3 or v1.2.3-rc.1,
// `git describe` output such as v1.2.3-4-gabc1234-dirty, or a bare commit)
// into an upstream version that deb and rpm both order correctly:
// 1.2.3, 1.2.3~rc.1, 1.2.3+git.4.abc1234.dirty, 0.0.0~git.abc1234.
func PackageVersion(v string) (string, error) {
	v = strings.TrimPrefix(strings.TrimSpace(v), "v")
	if m := describeRE.FindStringSubmatch(v); m != nil {
		out := m[1]
		if m[2] != "" {
			out += "+git." + m[2] + "." + m[3]
		}
		if m[4] != "" {
			if m[2] == "" {
				out += "+git"
			}
			out += ".dirty"
		}
		return out, nil
	}
	if v == "" {
		return "", fmt.Errorf("%w: empty", ErrVersion)
	}
	if v[0] < '0' || v[0] > '9' || commitRE.MatchString(v) {
		v = "0.0.0~git." + v
	}
	// A pre-release (1.2.3-rc.1) sorts before its release with "~".
	v = strings.ReplaceAll(v, "-", "~")
	if !versionOK.MatchString(v) {
		return "", fmt.Errorf("%w: %q has characters deb or rpm versions cannot hold", ErrVersion, v)
	}
	return v, nil
}

// WriteDocs writes fusionctl's man pages (section 1, one per command,
// generated from the cobra tree), fusiond's hand-written page (section 8)
// and fusionctl's bash, zsh and fish completions under stage: man/man1,
// man/man8 and completions/.
func WriteDocs(root *cobra.Command, fusiondMan, stage string, date time.Time) error {
	man1 := filepath.Join(stage, "man", "man1")
	man8 := filepath.Join(stage, "man", "man8")
	comp := filepath.Join(stage, "completions")
	for _, d := range []string{man1, man8, comp} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	root.DisableAutoGenTag = true // keeps the pages reproducible
	header := &doc.GenManHeader{Title: "FUSIONCTL", Section: "1", Source: "fusiond", Manual: "fusiond manual", Date: &date}
	if err := doc.GenManTree(root, header, man1); err != nil {
		return fmt.Errorf("man pages: %w", err)
	}
	if err := copyFile(fusiondMan, filepath.Join(man8, "fusiond.8")); err != nil {
		return err
	}
	// Debian policy 12.1: man pages are installed compressed (gzip -9n).
	for _, dir := range []string{man1, man8} {
		if err := gzipAll(dir); err != nil {
			return fmt.Errorf("man pages: %w", err)
		}
	}
	for name, gen := range map[string]func(io.Writer) error{
		"fusionctl.bash": func(w io.Writer) error { return root.GenBashCompletionV2(w, true) },
		"_fusionctl":     root.GenZshCompletion,
		"fusionctl.fish": func(w io.Writer) error { return root.GenFishCompletion(w, true) },
	} {
		if err := writeWith(filepath.Join(comp, name), gen); err != nil {
			return fmt.Errorf("completion %s: %w", name, err)
		}
	}
	return nil
}

// WriteChangelog copies the changelog at src to dst, adding an entry for
// version (VERSION-RELEASE, as the packages name it) on top when the
// newest entry is another version (development builds), so that the
// package's changelog names the version it carries.
func WriteChangelog(src, dst, version string, now time.Time) error {
	entries, err := chglog.Parse(src)
	if err != nil {
		return fmt.Errorf("changelog %s: %w", src, err)
	}
	if len(entries) == 0 {
		return fmt.Errorf("changelog %s: no entries", src)
	}
	if entries[0].Semver != version {
		top := *entries[0]
		top.Semver, top.Date = version, now.UTC().Truncate(time.Second)
		top.Changes = chglog.ChangeLogChanges{{Note: "Development build; changes since " + entries[0].Semver + " are in git."}}
		entries = append(chglog.ChangeLogEntries{&top}, entries...)
	}
	data, err := yaml.Marshal(entries)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o644)
}

// Options are Build's inputs. Config and the paths in it are relative to
// Root; ${VERSION}, ${ARCH}, ${BIN} and ${STAGE} in it are replaced.
type Options struct {
	Root    string // repository root
	Config  string // nfpm.yaml
	Version string // upstream version, from PackageVersion
	Arch    string // GOARCH: amd64, arm64
	Bin     string // directory holding fusiond and fusionctl
	Stage   string // directory WriteDocs and WriteChangelog wrote to
	Out     string // where packages are written
	MTime   time.Time
}

// Build writes one package per format ("deb", "rpm") into o.Out and
// returns their paths.
func Build(o Options, formats ...string) ([]string, error) {
	vars := map[string]string{"VERSION": o.Version, "ARCH": o.Arch, "BIN": o.Bin, "STAGE": o.Stage}
	raw, err := os.ReadFile(filepath.Join(o.Root, o.Config))
	if err != nil {
		return nil, err
	}
	var unknown []string
	expanded := os.Expand(string(raw), func(k string) string {
		v, ok := vars[k]
		if !ok {
			unknown = append(unknown, k)
		}
		return v
	})
	if len(unknown) > 0 {
		return nil, fmt.Errorf("%s: unknown variables %q (known: VERSION ARCH BIN STAGE)", o.Config, unknown)
	}
	cfg, err := nfpm.Parse(strings.NewReader(expanded))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.Config, err)
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	// nfpm resolves the contents' relative sources against the working
	// directory.
	wd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	if err := os.Chdir(o.Root); err != nil {
		return nil, err
	}
	defer os.Chdir(wd)
	var out []string
	for _, format := range formats {
		p, err := buildOne(cfg, format, o)
		if err != nil {
			return out, fmt.Errorf("%s: %w", format, err)
		}
		out = append(out, p)
	}
	return out, nil
}

func buildOne(cfg nfpm.Config, format string, o Options) (string, error) {
	info, err := cfg.Get(format)
	if err != nil {
		return "", err
	}
	info = nfpm.WithDefaults(info)
	info.MTime = o.MTime
	if err := nfpm.PrepareForPackager(info, format); err != nil {
		return "", err
	}
	if format == "rpm" {
		// rpm wants man pages flagged as documentation (%doc), which
		// a "tree" entry in nfpm.yaml cannot say per file.
		for _, c := range info.Contents {
			if strings.HasPrefix(c.Destination, "/usr/share/man/") && c.Type == files.TypeFile {
				c.Type = files.TypeRPMDoc
			}
		}
	}
	pkg, err := nfpm.Get(format)
	if err != nil {
		return "", err
	}
	target := filepath.Join(o.Out, pkg.ConventionalFileName(info))
	if !filepath.IsAbs(target) {
		target = filepath.Join(o.Root, target)
	}
	f, err := os.Create(target)
	if err != nil {
		return "", err
	}
	info.Target = target
	if err := pkg.Package(info, f); err != nil {
		f.Close()
		os.Remove(target)
		return "", err
	}
	return target, f.Close()
}

func writeWith(path string, gen func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := gen(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// gzipAll replaces every file in dir with NAME.gz, compressed with no
// name or time in the header, as gzip -9n does.
func gzipAll(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		err = writeWith(p+".gz", func(w io.Writer) error {
			zw, err := gzip.NewWriterLevel(w, gzip.BestCompression)
			if err != nil {
				return err
			}
			if _, err := zw.Write(data); err != nil {
				return err
			}
			return zw.Close()
		})
		if err != nil {
			return err
		}
		if err := os.Remove(p); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o644)
}

package deviceplugin

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/fusiond/fusiond/daemon/internal/atomicfile"
)

// The features file is node-feature-discovery's local-source format: one
// feature a line, "name=value", where the name carries its label
// namespace ("fusiond.io/gpu-count=8"); nfd-worker turns each line into a
// node label. nfd-worker ignores files whose name starts with a dot, so
// the file is written as a hidden temporary file in the same directory and
// renamed over the old one: a reader sees the old content or the new, never
// a part. No comment lines are written, so versions of NFD that read every
// line as a feature read the file too.
//
// The file is left in place when the plugin stops: nfd-worker re-reads it
// on its own interval and would drop the labels while the daemon restarts,
// and a pod's node affinity cannot tell a restart from a node without the
// devices. Removing the labels for good (uninstalling fusiond) is removing
// the file.

var (
	// labelName is the name part of a label (after the namespace).
	labelName = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	// labelValue is a label's value.
	labelValue = regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`)
)

// renderFeatures returns the file content for features under prefix,
// sorted by name, and the features left out because Kubernetes would
// refuse them as labels.
func renderFeatures(prefix string, features map[string]string) (content []byte, skipped []string) {
	names := make([]string, 0, len(features))
	for name := range features {
		names = append(names, name)
	}
	slices.Sort(names)
	var b bytes.Buffer
	for _, name := range names {
		value := features[name]
		if len(name) > 63 || !labelName.MatchString(name) || len(value) > 63 || !labelValue.MatchString(value) {
			skipped = append(skipped, fmt.Sprintf("%q=%q", name, value))
			continue
		}
		fmt.Fprintf(&b, "%s%s=%s\n", prefix, name, value)
	}
	return b.Bytes(), skipped
}

// featuresFile keeps the features file up to date. It is used by one
// goroutine only.
type featuresFile struct {
	path, prefix string
	// written is the content last written; nil when the file must be
	// (re)written at the next update.
	written []byte
	// skipped is the last list of features left out, logged when it
	// changes.
	skipped string
}

// update writes features when they differ from what was last written (or
// the file went missing). It returns the features left out when they
// changed, for the caller to log.
func (f *featuresFile) update(features map[string]string) (skipped []string, err error) {
	content, skip := renderFeatures(f.prefix, features)
	if s := strings.Join(skip, ", "); s != f.skipped {
		f.skipped, skipped = s, skip
	}
	if f.written != nil && bytes.Equal(content, f.written) {
		if _, err := os.Stat(f.path); err == nil || !errors.Is(err, fs.ErrNotExist) {
			return skipped, nil
		}
	}
	if err := writeAtomic(f.path, content); err != nil {
		f.written = nil
		return skipped, err
	}
	f.written = content
	return skipped, nil
}

// writeAtomic replaces path by content (atomicfile.Write), readable by
// all as node-feature-discovery expects. It makes the directory.
func writeAtomic(path string, content []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("features file: %w", err)
	}
	err := atomicfile.Write(path, 0o644, func(f *os.File) error {
		_, err := f.Write(content)
		return err
	})
	if err != nil {
		return fmt.Errorf("features file: %w", err)
	}
	return nil
}

// stale says whether the file must be written again although the features
// did not change: the last write failed or someone removed the file.
func (f *featuresFile) stale() bool {
	if f.written == nil {
		return true
	}
	_, err := os.Stat(f.path)
	return errors.Is(err, fs.ErrNotExist)
}

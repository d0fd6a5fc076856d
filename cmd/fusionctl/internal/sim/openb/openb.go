// Package openb owns the openb trace that fusionctl carries: the node list
// and the 24 pod lists of the FGD paper's data set (Alibaba's GPU
// cluster trace, ATC'23) — the 17 its benchmark publishes results for and
// seven more — stored zstd-compressed beside this file and
// embedded in the binary, so that `fusionctl simulate` runs without the
// repository or a download. README.md here says where the files come from
// and SHA256SUMS holds the digest of each original; the tests check both.
//
// It also opens trace files on disk the same way (Decompress): a CSV
// compressed with zstd or gzip reads as the plain CSV.
package openb

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// The embedded files: what `fusionctl simulate` reads. The paper's
// expected results and the upstream analysis beside them are read by the
// tests from the checkout; the binary does not need them.
//
//go:embed openb_node_list_gpu_node.csv.zst openb_pod_list_*.csv.zst
var files embed.FS

// NodeList is the name of the embedded node list: the 1213 GPU nodes.
const NodeList = "openb_node_list_gpu_node.csv"

// DefaultTrace is the pod list `fusionctl simulate` replays when it is
// given none.
const DefaultTrace = "default"

// podListPrefix and csvSuffix frame a trace's short name in its file name.
const (
	podListPrefix = "openb_pod_list_"
	csvSuffix     = ".csv"
	zstSuffix     = ".zst"
)

// unpublished are the data set's pod lists the paper publishes no result
// for: the simulator replays them like the others, but nothing validates
// our baselines on them.
var unpublished = []string{"cpu0", "cpu037", "cpu072", "cpu235", "cpu300", "gpushare20", "gpuspec05"}

// Published reports whether the paper publishes results for a trace (its
// short name): the 17 of FGD_expected_allocation.txt.
func Published(trace string) bool {
	return slices.Contains(Traces(), trace) && !slices.Contains(unpublished, trace)
}

// ErrUnknownTrace is returned for a trace name that is not embedded.
var ErrUnknownTrace = errors.New("no such embedded openb trace")

// Traces lists the short names of the embedded pod lists ("default",
// "cpu050", ...), sorted.
func Traces() []string {
	ents, _ := fs.ReadDir(files, ".") // cannot fail on an embed.FS root
	var out []string
	for _, e := range ents {
		if n, ok := strings.CutPrefix(e.Name(), podListPrefix); ok {
			out = append(out, strings.TrimSuffix(n, csvSuffix+zstSuffix))
		}
	}
	slices.Sort(out)
	return out
}

// PodList returns the file name of an embedded trace, given its short
// name ("default") or its file name with or without ".csv"
// ("openb_pod_list_default").
func PodList(trace string) (string, error) {
	short := strings.TrimSuffix(strings.TrimPrefix(trace, podListPrefix), csvSuffix)
	if !slices.Contains(Traces(), short) {
		return "", fmt.Errorf("%w %q (fusionctl simulate --list-traces lists them: %s)", ErrUnknownTrace, trace, strings.Join(Traces(), ", "))
	}
	return podListPrefix + short + csvSuffix, nil
}

// Open opens an embedded file by its original name (NodeList, or a
// PodList name), decompressed. The caller closes it.
func Open(name string) (io.ReadCloser, error) {
	f, err := files.Open(name + zstSuffix)
	if err != nil {
		return nil, fmt.Errorf("openb: embedded %s: %w", name, err)
	}
	r, err := Decompress(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("openb: embedded %s: %w", name, err)
	}
	return r, nil
}

// OpenFile opens a trace file on disk: plain, or compressed with zstd or
// gzip (told by its first bytes, whatever its name), read as the plain
// file. The caller closes it.
func OpenFile(path string) (io.ReadCloser, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	r, err := Decompress(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

var (
	zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}
	gzipMagic = []byte{0x1f, 0x8b}
)

// Decompress returns r's content, decompressed when it starts with the
// zstd or gzip magic, else as it is. Closing the result closes r.
func Decompress(r io.ReadCloser) (io.ReadCloser, error) {
	br := bufio.NewReader(r)
	head, err := br.Peek(len(zstdMagic))
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	switch {
	case bytes.HasPrefix(head, zstdMagic):
		// One goroutine, and a window of at most 64 MiB (zstd -19 uses
		// 8 MiB; only --long or --ultra go beyond): a file cannot make
		// the reader allocate without bound.
		d, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(64<<20))
		if err != nil {
			return nil, fmt.Errorf("zstd: %w", err)
		}
		return &decoded{Reader: d, close: func() error { d.Close(); return r.Close() }}, nil
	case bytes.HasPrefix(head, gzipMagic):
		z, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		return &decoded{Reader: z, close: func() error { z.Close(); return r.Close() }}, nil
	default:
		return &decoded{Reader: br, close: r.Close}, nil
	}
}

type decoded struct {
	io.Reader
	close func() error
}

func (d *decoded) Close() error { return d.close() }

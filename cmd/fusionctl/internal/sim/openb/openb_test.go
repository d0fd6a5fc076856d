package openb

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/csv"
	"encoding/hex"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// sums reads SHA256SUMS: original file name → hex sha256.
func sums(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("SHA256SUMS")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for line := range strings.Lines(string(b)) {
		sum, name, ok := strings.Cut(strings.TrimSpace(line), "  ")
		if !ok || len(sum) != 64 {
			t.Fatalf("SHA256SUMS: bad line %q", line)
		}
		out[name] = sum
	}
	return out
}

func digest(t *testing.T, r io.ReadCloser, err error) string {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestChecksums: every compressed file here, and every embedded one,
// decompresses to the original whose sha256 SHA256SUMS gives, and nothing
// here or in the binary is unlisted.
func TestChecksums(t *testing.T) {
	want := sums(t)
	zst, err := filepath.Glob("*" + zstSuffix)
	if err != nil {
		t.Fatal(err)
	}
	var onDisk []string
	for _, f := range zst {
		name := strings.TrimSuffix(f, zstSuffix)
		onDisk = append(onDisk, name)
		sum, ok := want[name]
		if !ok {
			t.Errorf("%s is not listed in SHA256SUMS", f)
			continue
		}
		r, err := OpenFile(f)
		if got := digest(t, r, err); got != sum {
			t.Errorf("%s decompresses to sha256 %s, SHA256SUMS says %s", f, got, sum)
		}
	}
	for name := range want {
		if !slices.Contains(onDisk, name) {
			t.Errorf("SHA256SUMS lists %s, but %s%s is missing", name, name, zstSuffix)
		}
	}
	embedded := []string{NodeList}
	for _, tr := range Traces() {
		name, err := PodList(tr)
		if err != nil {
			t.Fatal(err)
		}
		embedded = append(embedded, name)
	}
	for _, name := range embedded {
		sum, ok := want[name]
		if !ok {
			t.Errorf("embedded %s is not listed in SHA256SUMS", name)
			continue
		}
		r, err := Open(name)
		if got := digest(t, r, err); got != sum {
			t.Errorf("embedded %s: sha256 %s, SHA256SUMS says %s", name, got, sum)
		}
	}
}

// expected reads FGD_expected_allocation.txt: trace → policy → the four
// figures at 100/110/120/130 % and the seed count.
func expected(t *testing.T) map[string]map[string][]float64 {
	t.Helper()
	r, err := OpenFile("FGD_expected_allocation.txt" + zstSuffix)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	out := map[string]map[string][]float64{}
	sc := bufio.NewScanner(r)
	sc.Scan() // header
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 8 || !strings.HasPrefix(f[2], "n=") {
			t.Fatalf("FGD_expected_allocation.txt: bad line %q", sc.Text())
		}
		var v []float64
		for _, s := range append([]string{strings.TrimPrefix(f[2], "n=")}, f[4:]...) {
			x, err := strconv.ParseFloat(s, 64)
			if err != nil {
				t.Fatalf("FGD_expected_allocation.txt: %q: %v", sc.Text(), err)
			}
			v = append(v, x)
		}
		if out[f[0]] == nil {
			out[f[0]] = map[string][]float64{}
		}
		out[f[0]][f[1]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestEmbeddedTracesAreThePapers: the binary carries every pod list the
// paper's results name, and the data set's seven others (those with no
// published result) — none missing, none from elsewhere.
func TestEmbeddedTracesAreThePapers(t *testing.T) {
	var paper []string
	for tr := range expected(t) {
		paper = append(paper, strings.TrimPrefix(tr, podListPrefix))
	}
	slices.Sort(paper)
	if len(paper) != 17 || !slices.Contains(paper, DefaultTrace) {
		t.Errorf("the paper has 17 traces with %q among them: %v", DefaultTrace, paper)
	}
	want := slices.Sorted(slices.Values(append(slices.Clone(paper), "cpu0", "cpu037", "cpu072", "cpu235", "cpu300", "gpushare20", "gpuspec05")))
	if got := Traces(); !slices.Equal(got, want) {
		t.Errorf("embedded traces %v, want the paper's %v and the data set's seven others", got, paper)
	}
	for _, tr := range Traces() {
		if got, want := Published(tr), slices.Contains(paper, tr); got != want {
			t.Errorf("Published(%q) = %v, the paper's results name it: %v", tr, got, want)
		}
	}
}

// TestExpectedFromAnalysis recomputes FGD_expected_allocation.txt from the
// upstream per-seed curves: each figure is the mean over the seeds at that
// arrived-request column, to two decimals (±0.01 for the rounding of the
// means the file was written with).
func TestExpectedFromAnalysis(t *testing.T) {
	r, err := OpenFile("FGD_analysis_allo_discrete.csv" + zstSuffix)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rows, err := csv.NewReader(r).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	col := map[string]int{}
	for i, h := range rows[0] {
		col[h] = i
	}
	type key struct{ trace, policy string }
	sum := map[key][]float64{}
	n := map[key]int{}
	for _, row := range rows[1:] {
		k := key{row[col["workload"]], row[col["sc_policy"]]}
		if sum[k] == nil {
			sum[k] = make([]float64, 4)
		}
		for i, c := range []string{"100", "110", "120", "130"} {
			v, err := strconv.ParseFloat(row[col[c]], 64)
			if err != nil {
				t.Fatalf("%v: %v", row[:4], err)
			}
			sum[k][i] += v
		}
		n[k]++
	}
	exp := expected(t)
	rowsSeen := 0
	for tr, pols := range exp {
		for pol, v := range pols {
			rowsSeen++
			k := key{tr, pol}
			if n[k] != int(v[0]) {
				t.Errorf("%s %s: %d seeds in the analysis, the expected file says n=%v", tr, pol, n[k], v[0])
				continue
			}
			for i := range 4 {
				if mean := sum[k][i] / float64(n[k]); math.Abs(mean-v[i+1]) > 0.0101 {
					t.Errorf("%s %s column %d: mean of the seeds %.3f, expected file %.2f", tr, pol, i, mean, v[i+1])
				}
			}
		}
	}
	if rowsSeen != len(sum) || rowsSeen != 17*6 {
		t.Errorf("expected file has %d rows, the analysis %d (trace, policy) pairs; want 17 × 6", rowsSeen, len(sum))
	}
}

func TestPodList(t *testing.T) {
	for _, in := range []string{"default", "openb_pod_list_default", "openb_pod_list_default.csv"} {
		if got, err := PodList(in); err != nil || got != "openb_pod_list_default.csv" {
			t.Errorf("PodList(%q) = %q, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "nope", "cpu999", "../default", "openb_node_list_gpu_node"} {
		if _, err := PodList(in); !errors.Is(err, ErrUnknownTrace) || !strings.Contains(err.Error(), "default, ") {
			t.Errorf("PodList(%q): %v, want ErrUnknownTrace listing the traces", in, err)
		}
	}
	if _, err := Open("openb_pod_list_nope.csv"); err == nil {
		t.Error("Open of a file not embedded succeeded")
	}
}

// TestDecompress: plain, gzip and zstd content read the same; a stream
// that claims to be compressed but is not is an error, not a panic or
// silent garbage.
func TestDecompress(t *testing.T) {
	const plain = "name,cpu_milli\nopenb-pod-0000,12000\n"
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(plain))
	zw.Close()
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	zs := enc.EncodeAll([]byte(plain), nil)
	dir := t.TempDir()
	for name, content := range map[string][]byte{"plain.csv": []byte(plain), "a.csv.gz": gz.Bytes(), "b.csv.zst": zs, "misnamed.csv": zs, "empty.csv": nil} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, content, 0o644); err != nil {
			t.Fatal(err)
		}
		r, err := OpenFile(p)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		got, err := io.ReadAll(r)
		r.Close()
		want := plain
		if name == "empty.csv" {
			want = ""
		}
		if err != nil || string(got) != want {
			t.Errorf("%s: read %q, %v; want %q", name, got, err, want)
		}
	}
	for name, content := range map[string][]byte{
		"truncated.zst":  zs[:len(zs)-3],
		"garbage.zst":    append(slices.Clone(zstdMagic), bytes.Repeat([]byte{0xff}, 64)...),
		"truncated.gz":   gz.Bytes()[:len(gz.Bytes())-6],
		"bad-header.gz":  append(slices.Clone(gzipMagic), 0, 0, 0),
		"zstd-magic-eof": zstdMagic,
	} {
		r, err := Decompress(io.NopCloser(bytes.NewReader(content)))
		if err == nil {
			_, err = io.ReadAll(r)
			r.Close()
		}
		if err == nil {
			t.Errorf("%s: read without an error", name)
		}
	}
	if _, err := OpenFile(filepath.Join(dir, "missing.csv")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

package simhost_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/fusiond/fusiond/topology"
	"github.com/fusiond/fusiond/topology/simhost"
)

// TestGPUAddrsMatchNVMLMock pins the contract with the daemon's simulated
// NVML host: GPU i of go-nvml's dgxh200 mock has bus ID GPUAddrs()[i]
// and the same PCI device id. (Test-only import; topology itself never
// imports go-nvml.)
func TestGPUAddrsMatchNVMLMock(t *testing.T) {
	s := dgxh200.New()
	addrs := simhost.GPUAddrs()
	if len(s.Devices) != len(addrs) {
		t.Fatalf("mock has %d GPUs, simhost %d", len(s.Devices), len(addrs))
	}
	for i, d := range s.Devices {
		dev := d.(*server.Device)
		if dev.PciBusID != addrs[i] {
			t.Errorf("GPU %d: mock bus ID %q, simhost %q", i, dev.PciBusID, addrs[i])
		}
		if id := dev.Config.PciDeviceId >> 16; id != 0x2333 {
			t.Errorf("GPU %d: mock device id %#x, simhost writes 0x2333", i, id)
		}
	}
}

func TestWriteLayout(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "root")
	if err := simhost.Plan(simhost.WithCoresPerSocket(1)).Write(dir); err != nil {
		t.Fatal(err)
	}
	if err := simhost.Plan().Write(dir); !errors.Is(err, simhost.ErrNotEmpty) {
		t.Fatalf("second Write into %s: %v, want ErrNotEmpty", dir, err)
	}
	for _, d := range simhost.Devices() {
		link := filepath.Join(dir, "sys/bus/pci/devices", d.Addr)
		target, err := os.Readlink(link)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(target, "../../../devices/"+d.HostBridge+"/") || !strings.HasSuffix(target, "/"+d.Addr) {
			t.Errorf("%s -> %s", d.Addr, target)
		}
		if d.Parent != "" && !strings.Contains(target, "/"+d.Parent+"/") {
			t.Errorf("%s -> %s does not pass its parent %s", d.Addr, target, d.Parent)
		}
		cfg, err := os.ReadFile(filepath.Join(link, "config"))
		if err != nil || len(cfg) < 64 {
			t.Fatalf("%s config: %d bytes, %v", d.Addr, len(cfg), err)
		}
		if binary.LittleEndian.Uint16(cfg) == 0 || cfg[0x0e] == 1 && (cfg[0x19] <= cfg[0x18] || cfg[0x1a] < cfg[0x19]) {
			t.Errorf("%s config: bad ids or bus range %x/%x/%x", d.Addr, cfg[0x18], cfg[0x19], cfg[0x1a])
		}
	}
	n, err := os.ReadFile(filepath.Join(dir, "sys/devices/system/node/node1/cpulist"))
	if err != nil || strings.TrimSpace(string(n)) != "1,3" {
		t.Fatalf("node1 cpulist %q, %v (1 core/socket, 2 threads)", n, err)
	}
}

// TestSharedContentReadsTheSame: a tree written WithSharedContent reads,
// file for file, as the plain tree, and discovery sees the same host; it
// is made of far fewer directories and files (hard links and directory
// links instead), which is what makes the daemon's first simulated start
// fast.
func TestSharedContentReadsTheSame(t *testing.T) {
	plain, shared := filepath.Join(t.TempDir(), "plain"), filepath.Join(t.TempDir(), "shared")
	if err := simhost.Plan(simhost.WithCoresPerSocket(4)).Write(plain); err != nil {
		t.Fatal(err)
	}
	if err := simhost.Plan(simhost.WithCoresPerSocket(4), simhost.WithSharedContent()).Write(shared); err != nil {
		t.Fatal(err)
	}
	count := func(root string) (dirs, inodes int) {
		seen := map[uint64]bool{}
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				t.Fatal(err)
			}
			if d.IsDir() {
				dirs++
			}
			var st syscall.Stat_t
			if err := syscall.Lstat(p, &st); err == nil && !seen[st.Ino] {
				seen[st.Ino] = true
				inodes++
			}
			return nil
		})
		return dirs, inodes
	}
	files := 0
	err := filepath.WalkDir(plain, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(plain, p)
		want, err := os.ReadFile(p)
		if err != nil {
			if d.Type()&fs.ModeSymlink != 0 {
				return nil // a link to a directory
			}
			return err
		}
		got, err := os.ReadFile(filepath.Join(shared, rel))
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			return nil
		}
		if string(got) != string(want) {
			t.Errorf("%s reads %q, want %q", rel, got, want)
		}
		files++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 500 {
		t.Fatalf("compared only %d files", files)
	}
	pd, pi := count(plain)
	sd, si := count(shared)
	if sd*4 > pd*3 || si*5 > pi {
		t.Errorf("shared tree: %d directories, %d inodes; plain: %d, %d: want far fewer", sd, si, pd, pi)
	}
	hp, err := topology.Discover(context.Background(), topology.WithRoot(plain))
	if err != nil {
		t.Fatal(err)
	}
	hs, err := topology.Discover(context.Background(), topology.WithRoot(shared))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(hp)
	b, _ := json.Marshal(hs)
	if string(a) != string(b) {
		t.Errorf("discovery differs:\nplain  %s\nshared %s", a, b)
	}
}

// TestDigest: a tree's digest names its content — the same for every plan
// of the same options (whatever order the plan visits files in), another
// for another shape or for shared content — and one plan written twice
// reads the same (the content pool's file names aside).
func TestDigest(t *testing.T) {
	d := simhost.Plan(simhost.WithCoresPerSocket(2)).Digest()
	if len(d) != 64 {
		t.Fatalf("digest %q", d)
	}
	for range 5 {
		if again := simhost.Plan(simhost.WithCoresPerSocket(2)).Digest(); again != d {
			t.Fatalf("two plans of one shape: digests %s and %s", d, again)
		}
	}
	for name, opts := range map[string][]simhost.Option{
		"3 cores":        {simhost.WithCoresPerSocket(3)},
		"shared content": {simhost.WithCoresPerSocket(2), simhost.WithSharedContent()},
		"full size":      nil,
	} {
		if other := simhost.Plan(opts...).Digest(); other == d {
			t.Errorf("%s: same digest as 2 cores per socket", name)
		}
	}
	planned, again := t.TempDir(), t.TempDir()
	tree := simhost.Plan(simhost.WithCoresPerSocket(2), simhost.WithSharedContent())
	if err := tree.Write(planned); err != nil {
		t.Fatal(err)
	}
	if err := simhost.Plan(simhost.WithCoresPerSocket(2), simhost.WithSharedContent()).Write(again); err != nil {
		t.Fatal(err)
	}
	a, b := listTree(t, planned), listTree(t, again)
	if len(a) < 100 || len(a) != len(b) {
		t.Fatalf("trees of %d and %d entries", len(a), len(b))
	}
	for p, v := range a {
		if b[p] != v {
			t.Errorf("%s: %q in one tree, %q in the other", p, v, b[p])
		}
	}
}

// listTree maps every path below dir (the content pool aside) to its
// content or "-> target".
func listTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case e.Name() == simhost.PoolDir:
			return filepath.SkipDir
		case e.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			out[rel] = "-> " + target
			return err
		case e.Type().IsRegular():
			b, err := os.ReadFile(p)
			out[rel] = string(b)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// BenchmarkPlanDigest is what a simulated daemon does at every start to
// find its shared topology tree: plan the full-size tree and digest it.
func BenchmarkPlanDigest(b *testing.B) {
	for b.Loop() {
		simhost.Plan(simhost.WithSharedContent()).Digest()
	}
}

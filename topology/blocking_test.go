package topology

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fusiond/fusiond/devices"
)

// discoverOrHang runs Discover and fails the test if it has not returned
// after a minute (a hang, not a slow run: the trees here take
// milliseconds).
func discoverOrHang(t *testing.T, ctx context.Context, opts ...Option) (*Host, error) {
	t.Helper()
	type result struct {
		h   *Host
		err error
	}
	done := make(chan result, 1)
	go func() {
		h, err := Discover(ctx, opts...)
		done <- result{h, err}
	}()
	select {
	case r := <-done:
		return r.h, r.err
	case <-time.After(time.Minute):
		t.Fatal("Discover has not returned after a minute: it hangs on a file")
		return nil, nil
	}
}

// A FIFO (with a writer that never writes: a blocking read would wait
// forever), a FIFO without a writer (a blocking open would wait forever)
// and a link to /dev/zero (a read that never ends) in the places of
// attributes of a real tree: Discover returns, names each file in a
// warning, and models the rest as from the intact tree.
func TestDiscoverNonRegularFiles(t *testing.T) {
	const tree = "nvidiagpunumanodes"
	root := unpackBz2Tree(t, hwlocTreeDir, tree)
	clean, err := Discover(context.Background(), WithRoot(root), WithoutNames())
	if err != nil {
		t.Fatal(err)
	}
	dev := clean.Devices[0].Addr
	node0, node8 := clean.Node(0), clean.Node(8)
	if node0 == nil || node8 == nil || node0.MemoryBytes == 0 || len(node8.Distances) == 0 || clean.Devices[0].Class == 0 {
		t.Fatalf("intact %s lacks what the test replaces: %+v", tree, clean)
	}
	fifoWithWriter := "/sys/devices/system/node/node0/meminfo"
	fifoNoWriter := sysPCI + "/" + string(dev) + "/class"
	zero := "/sys/devices/system/node/node8/distance"
	online := sysCPU + "/online"
	for _, p := range []string{fifoWithWriter, fifoNoWriter, online} {
		full := filepath.Join(root, p)
		if err := os.Remove(full); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mkfifo(full, 0o644); err != nil {
			t.Fatalf("mkfifo %s: %v", full, err)
		}
	}
	// A writer holds the first FIFO open and never writes (O_RDWR does not
	// wait for a reader).
	w, err := os.OpenFile(filepath.Join(root, fifoWithWriter), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := os.Remove(filepath.Join(root, zero)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/zero", filepath.Join(root, zero)); err != nil {
		t.Fatal(err)
	}

	h, err := discoverOrHang(t, context.Background(), WithRoot(root), WithoutNames())
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	for _, c := range []struct{ path, kind string }{
		{fifoWithWriter, "a FIFO"}, {fifoNoWriter, "a FIFO"}, {online, "a FIFO"}, {zero, "a character device"},
	} {
		if !hasWarning(h, c.path+": "+ErrNotRegular.Error()+" ("+c.kind+"); not read") {
			t.Errorf("no warning names %s as %s: %q", c.path, c.kind, h.Warnings)
		}
	}
	// The rest is read: CPUs from the cpuN directories, every node, the
	// other files of the changed node and device.
	if !h.OnlineCPUs.Equal(clean.OnlineCPUs) || len(h.Nodes) != len(clean.Nodes) || len(h.Devices) != len(clean.Devices) {
		t.Errorf("model differs beyond the replaced files: CPUs %s (want %s), %d nodes (want %d), %d devices (want %d)",
			h.OnlineCPUs, clean.OnlineCPUs, len(h.Nodes), len(clean.Nodes), len(h.Devices), len(clean.Devices))
	}
	if n := h.Node(0); n == nil || n.MemoryBytes != 0 || !n.CPUs.Equal(node0.CPUs) {
		t.Errorf("node0 = %+v; want its CPUs %s and unknown memory", n, node0.CPUs)
	}
	if n := h.Node(8); n == nil || n.Distances != nil || n.MemoryBytes != node8.MemoryBytes {
		t.Errorf("node8 = %+v; want no distances and memory %d", n, node8.MemoryBytes)
	}
	if d := h.Device(dev); d == nil || d.Class != 0 || d.VendorID != clean.Devices[0].VendorID {
		t.Errorf("device %s = %+v; want class 0 and vendor %04x", dev, d, clean.Devices[0].VendorID)
	}
}

// A directory listed by Discover that is a FIFO cannot block it either
// (opened with O_DIRECTORY, as os.ReadDir also does: a regression guard).
func TestDiscoverFIFODirectory(t *testing.T) {
	root := unpackBz2Tree(t, hwlocTreeDir, "nvidiagpunumanodes")
	full := filepath.Join(root, sysPCI)
	if err := os.RemoveAll(full); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(full, 0o644); err != nil {
		t.Fatal(err)
	}
	h, err := discoverOrHang(t, context.Background(), WithRoot(root), WithoutNames())
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	if len(h.Devices) != 0 || !hasWarning(h, sysPCI+": ") || !hasWarning(h, "not a directory") {
		t.Errorf("devices %v, warnings %q; want none and a warning naming %s", h.Devices, h.Warnings, sysPCI)
	}
}

// cancellingLinks cancels the discovery's context when asked for links,
// the last step of Discover.
type cancellingLinks struct{ cancel context.CancelFunc }

func (c cancellingLinks) DeviceLinks(context.Context) ([]devices.Link, error) {
	c.cancel()
	return nil, nil
}

func TestDiscoverCancelled(t *testing.T) {
	root := unpackBz2Tree(t, hwlocTreeDir, "nvidiagpunumanodes")
	// Cancelled before the start: an error wrapping context.Canceled,
	// not ErrNoCPUs (every read fails, so no CPU is found either).
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	h, err := discoverOrHang(t, ctx, WithRoot(root))
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrNoCPUs) || h != nil {
		t.Errorf("cancelled before the start: host %v, error %v; want nil and an error wrapping context.Canceled", h != nil, err)
	}
	// Cancelled on the way (by the link source, after the sysfs reads).
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	h, err = discoverOrHang(t, ctx, WithRoot(root), WithLinkSource(cancellingLinks{cancel}))
	if !errors.Is(err, context.Canceled) || h != nil {
		t.Errorf("cancelled on the way: host %v, error %v; want nil and an error wrapping context.Canceled", h != nil, err)
	}
	// A deadline likewise.
	ctx, cancel = context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if _, err := discoverOrHang(t, ctx, WithRoot(root)); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("past deadline: error %v; want one wrapping context.DeadlineExceeded", err)
	}
	// The reads check the context: a cancelled fsRoot reads nothing.
	ctx, cancel = context.WithCancel(context.Background())
	r := newFSRoot(ctx, root)
	defer r.close()
	if _, err := r.read(sysCPU + "/online"); err != nil {
		t.Fatalf("read before cancel: %v", err)
	}
	cancel()
	if _, err := r.read(sysCPU + "/online"); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), sysCPU+"/online") {
		t.Errorf("read after cancel: %v; want an error naming the file and wrapping context.Canceled", err)
	}
	if _, err := r.readDir(sysCPU); !errors.Is(err, context.Canceled) {
		t.Errorf("readDir after cancel: %v; want context.Canceled", err)
	}
}

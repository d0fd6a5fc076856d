package fpga_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fusiond/fusiond/devices/fpga"
	"github.com/fusiond/fusiond/devices/fpga/bitstream"
	"github.com/fusiond/fusiond/devices/fpga/simhost"
)

// rig is a simulated host, a library holding its sample bitstreams and a
// Manager over both.
type rig struct {
	host *simhost.Host
	lib  *bitstream.Library
	m    *fpga.Manager
	ids  map[string]string // sample name → library ID
	pr   *countingPR
	cmd  *countingCmd
}

type countingPR struct {
	inner fpga.PortPR
	n     atomic.Int32
	hook  func() // runs inside the call, before the inner PR
}

func (c *countingPR) PortPR(ctx context.Context, r fpga.PRRequest) error {
	c.n.Add(1)
	if c.hook != nil {
		c.hook()
	}
	return c.inner.PortPR(ctx, r)
}

type countingCmd struct {
	inner fpga.CommandRunner
	n     atomic.Int32
}

func (c *countingCmd) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	c.n.Add(1)
	return c.inner.Run(ctx, name, args...)
}

func newRig(t *testing.T, opts ...fpga.Option) *rig {
	t.Helper()
	dir := t.TempDir()
	h, err := simhost.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	samples := filepath.Join(dir, "samples")
	os.Mkdir(samples, 0o755)
	ss, err := simhost.WriteSamples(samples, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	lib, err := bitstream.OpenLibrary(filepath.Join(dir, "state"), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{host: h, lib: lib, ids: map[string]string{}}
	for _, s := range ss {
		b, err := lib.AddFile(s.Path, "")
		if err != nil {
			t.Fatal(err)
		}
		r.ids[s.Name] = b.ID
	}
	r.pr = &countingPR{inner: h.PortPR()}
	r.cmd = &countingCmd{inner: h.Xbutil()}
	all := append(h.Options(), fpga.WithLibrary(lib), fpga.WithPortPR(r.pr), fpga.WithCommandRunner(r.cmd))
	r.m, err = fpga.NewManager(append(all, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.m.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *rig) status(t *testing.T, id string) fpga.RegionStatus {
	t.Helper()
	all, err := r.m.Regions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		if s.ID == id {
			return s
		}
	}
	t.Fatalf("region %s not found among %d", id, len(all))
	return fpga.RegionStatus{}
}

func TestDiscoverSimulatedHost(t *testing.T) {
	r := newRig(t)
	all, err := r.m.Regions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range all {
		ids = append(ids, s.ID)
	}
	want := []string{simhost.DFL0, simhost.DFL1, simhost.MGR0, simhost.XRT0}
	if strings.Join(ids, ",") != strings.Join(want, ",") {
		t.Fatalf("regions %v, want %v (the DFL FME's own fpga_manager must not appear)", ids, want)
	}
	d0 := r.status(t, simhost.DFL0)
	if d0.Kind != fpga.KindDFL || d0.PCI != "0000:3b:00.0" || d0.InterfaceID != simhost.DFLInterface || d0.Loaded.AFUID != simhost.AFUNLB0 {
		t.Errorf("dfl0 = %+v", d0.Region)
	}
	if d0.LoadedBitstream != r.ids["nlb0"] || d0.LoadedName != "nlb0" {
		t.Errorf("dfl0 loaded %q (%s), want nlb0", d0.LoadedBitstream, d0.LoadedName)
	}
	if len(d0.Nodes) != 1 || d0.Nodes[0].Path != filepath.Join(r.host.Dev, "dfl-port.0") || d0.Nodes[0].Major != 507 || d0.Nodes[0].Minor != 0 {
		t.Errorf("dfl0 nodes %+v", d0.Nodes)
	}
	if d1 := r.status(t, simhost.DFL1); !d1.Loaded.AFUID.IsZero() || d1.LoadedBitstream != "" || d1.Nodes[0].Minor != 1 {
		t.Errorf("dfl1 = %+v", d1)
	}
	x := r.status(t, simhost.XRT0)
	if x.InterfaceID != simhost.XRTInterface || x.Name != "xilinx_u250_gen3x16_xdma_shell_4_1" || len(x.Nodes) != 1 ||
		x.Nodes[0].Path != filepath.Join(r.host.Dev, "dri", "renderD128") || x.Nodes[0].Major != 226 || x.Nodes[0].Minor != 128 {
		t.Errorf("xrt = %+v", x.Region)
	}
	mg := r.status(t, simhost.MGR0)
	if mg.Name != "Xilinx ZynqMP FPGA Manager" || mg.State != "operating" || !mg.Health.Healthy {
		t.Errorf("mgr = %+v", mg)
	}
}

func TestProgramEachBackend(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	cases := []struct {
		region, sample string
		readBack       func() string
		want           string
	}{
		{simhost.DFL1, "dma", func() string {
			return readFile(t, r.host.Sys, "devices/pci0000:ae/0000:ae:00.0/0000:af:00.0/dfl-port.1/afu_id")
		}, simhost.AFUDMA.Hex()},
		{simhost.XRT0, "vadd", func() string {
			return readFile(t, r.host.Sys, "devices/pci0000:64/0000:64:00.0/0000:65:00.1/xclbinuuid")
		}, simhost.XclbinVadd.Hex()},
		{simhost.MGR0, "blinky", func() string { return readFile(t, r.host.Sys, "class/fpga_manager/fpga0/firmware") }, "fusiond-" + r.ids["blinky"] + ".bin"},
	}
	for _, c := range cases {
		var phases []string
		res, err := r.m.Program(ctx, c.region, c.sample, fpga.WithProgress(func(p fpga.Progress) { phases = append(phases, p.Phase) }))
		if err != nil {
			t.Fatalf("%s: %v", c.region, err)
		}
		if res.AlreadyLoaded || res.Bitstream != r.ids[c.sample] {
			t.Errorf("%s: result %+v", c.region, res)
		}
		if got := c.readBack(); got != c.want {
			t.Errorf("%s: driver state %q, want %q", c.region, got, c.want)
		}
		if st := r.status(t, c.region); st.LoadedBitstream != r.ids[c.sample] || !st.Health.Healthy || st.Busy {
			t.Errorf("%s: after program %+v", c.region, st)
		}
		if len(phases) == 0 || phases[len(phases)-1] != "verify" {
			t.Errorf("%s: progress phases %v", c.region, phases)
		}
		if _, measured := r.m.Estimate(c.region, r.ids[c.sample]); !measured {
			t.Errorf("%s: no measured estimate after a run", c.region)
		}
	}
	// The fpga_manager got the .bit's configuration data, not its header.
	b, _ := r.lib.Get("blinky")
	full, _ := os.ReadFile(b.Path)
	fw, _ := os.ReadFile(filepath.Join(r.host.Firmware, "fusiond-"+b.ID+".bin"))
	if !bytes.Equal(fw, full[b.Header.PayloadOffset:]) {
		t.Errorf("staged firmware (%d bytes) is not the .bit payload (%d bytes)", len(fw), len(full)-int(b.Header.PayloadOffset))
	}
}

func readFile(t *testing.T, parts ...string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(parts...))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestAlreadyLoadedIsNotReprogrammed(t *testing.T) {
	r := newRig(t)
	res, err := r.m.Program(context.Background(), simhost.DFL0, "nlb0")
	if err != nil || !res.AlreadyLoaded {
		t.Fatalf("result %+v err %v, want already loaded", res, err)
	}
	if n := r.pr.n.Load(); n != 0 {
		t.Errorf("PR ioctl called %d times for a bitstream already loaded", n)
	}
	if _, err := r.m.Program(context.Background(), simhost.DFL0, "nlb0", fpga.Force()); err != nil || r.pr.n.Load() != 1 {
		t.Errorf("forced program: err %v, PR calls %d", err, r.pr.n.Load())
	}
}

func TestRefuseMismatchedInterface(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	_, err := r.m.Program(ctx, simhost.DFL0, "gzip-d5005")
	if !errors.Is(err, fpga.ErrInterfaceMismatch) || !errors.Is(err, fpga.ErrIncompatible) {
		t.Fatalf("err %v, want ErrInterfaceMismatch", err)
	}
	for _, s := range []string{simhost.OtherInterface.String(), simhost.DFLInterface.String(), "gzip-d5005", simhost.DFL0} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("message %q does not name %s", err, s)
		}
	}
	if _, err := r.m.Program(ctx, simhost.XRT0, "nlb0"); !errors.Is(err, fpga.ErrIncompatible) {
		t.Errorf("gbs into XRT: err %v", err)
	}
	if _, err := r.m.Program(ctx, simhost.MGR0, "vadd"); !errors.Is(err, fpga.ErrIncompatible) {
		t.Errorf("xclbin into fpga_manager: err %v", err)
	}
	if r.pr.n.Load() != 0 || r.cmd.n.Load() != 0 {
		t.Errorf("hardware touched: %d PR calls, %d commands", r.pr.n.Load(), r.cmd.n.Load())
	}
	st := r.status(t, simhost.DFL0)
	if st.Loaded.AFUID != simhost.AFUNLB0 || !st.Health.Healthy {
		t.Errorf("refused program changed the region: %+v", st)
	}
}

func TestFailureMarksUnhealthyAndRecovery(t *testing.T) {
	for _, c := range []struct{ region, sample, driverMsg string }{
		{simhost.DFL1, "dma", "input/output error"},
		{simhost.XRT0, "matmul", "Failed to download xclbin"},
		{simhost.MGR0, "blinky", "reconfig operation error"},
	} {
		t.Run(strings.ReplaceAll(c.region, "/", "_"), func(t *testing.T) {
			r := newRig(t)
			ctx := context.Background()
			r.host.FailNext(c.region, "PR engine timeout")
			_, err := r.m.Program(ctx, c.region, c.sample)
			if !errors.Is(err, fpga.ErrProgram) || !strings.Contains(err.Error(), c.driverMsg) {
				t.Fatalf("err %v, want ErrProgram with %q", err, c.driverMsg)
			}
			h, _ := r.m.Health(ctx, c.region)
			if h.Healthy || !strings.Contains(h.Reason, c.driverMsg) || h.Since.IsZero() {
				t.Errorf("health after failure %+v", h)
			}
			if _, err := r.m.Grant(ctx, c.region); !errors.Is(err, fpga.ErrUnhealthy) {
				t.Errorf("grant on unhealthy region: err %v", err)
			}
			if st := r.status(t, c.region); st.LoadedBitstream == r.ids[c.sample] {
				t.Errorf("failed run reported as loaded")
			}
			if _, err := r.m.Program(ctx, c.region, c.sample); err != nil {
				t.Fatalf("retry: %v", err)
			}
			if h, _ := r.m.Health(ctx, c.region); !h.Healthy {
				t.Errorf("health after recovery %+v", h)
			}
			if _, err := r.m.Grant(ctx, c.region); err != nil {
				t.Errorf("grant after recovery: %v", err)
			}
		})
	}
}

func TestBusyWhileProgramming(t *testing.T) {
	r := newRig(t)
	entered, release := make(chan struct{}), make(chan struct{})
	r.pr.hook = func() { close(entered); <-release }
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		_, err := r.m.Program(ctx, simhost.DFL1, "dma")
		done <- err
	}()
	<-entered
	if _, err := r.m.Grant(ctx, simhost.DFL1); !errors.Is(err, fpga.ErrBusy) {
		t.Errorf("grant while programming: %v", err)
	}
	if _, err := r.m.Program(ctx, simhost.DFL1, "nlb0"); !errors.Is(err, fpga.ErrBusy) {
		t.Errorf("second program while programming: %v", err)
	}
	if st := r.status(t, simhost.DFL1); !st.Busy {
		t.Errorf("status not busy: %+v", st)
	}
	if _, err := r.m.Grant(ctx, simhost.DFL0); err != nil {
		t.Errorf("other region blocked: %v", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := r.status(t, simhost.DFL1); st.Busy || st.Loaded.AFUID != simhost.AFUDMA {
		t.Errorf("after programming: %+v", st)
	}
}

func TestProgramTimeout(t *testing.T) {
	release := make(chan struct{})
	r := newRig(t, fpga.WithProgramTimeout(50*time.Millisecond))
	var calls atomic.Int32
	r.pr.hook = func() {
		if calls.Add(1) == 1 {
			<-release
		}
	}
	_, err := r.m.Program(context.Background(), simhost.DFL1, "dma")
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, fpga.ErrProgram) {
		t.Fatalf("err %v, want ErrProgram wrapping DeadlineExceeded", err)
	}
	if h, _ := r.m.Health(context.Background(), simhost.DFL1); h.Healthy {
		t.Errorf("timed-out region still healthy")
	}
	// The ioctl has not returned: the region stays busy until it does.
	if _, err := r.m.Program(context.Background(), simhost.DFL1, "dma"); !errors.Is(err, fpga.ErrBusy) {
		t.Errorf("program while the abandoned ioctl runs: %v", err)
	}
	release <- struct{}{}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if st, _ := r.m.Region(context.Background(), simhost.DFL1); !st.Busy {
			break
		}
	}
	if _, err := r.m.Program(context.Background(), simhost.DFL1, "dma"); err != nil {
		t.Errorf("program after the abandoned ioctl returned: %v", err)
	}
}

// fakeClock advances only when told.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func TestEstimateEWMA(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	r := newRig(t, fpga.WithClock(clk.now), fpga.WithEstimateWeight(0.5))
	id := r.ids["dma"]
	prior, measured := r.m.Estimate(simhost.DFL1, id)
	if measured || prior <= 0 {
		t.Fatalf("prior %v measured %v", prior, measured)
	}
	var step time.Duration
	r.pr.hook = func() { clk.add(step) }
	want := time.Duration(0)
	for i, d := range []time.Duration{4 * time.Second, 2 * time.Second, 8 * time.Second} {
		step = d
		res, err := r.m.Program(context.Background(), simhost.DFL1, "dma", fpga.Force())
		if err != nil {
			t.Fatal(err)
		}
		if res.Duration != d {
			t.Errorf("run %d took %v, want %v", i, res.Duration, d)
		}
		if i == 0 {
			want = d
		} else {
			want = (want + d) / 2
		}
		got, measured := r.m.Estimate(simhost.DFL1, id)
		if !measured || got != want {
			t.Errorf("after run %d estimate %v (measured %v), want %v", i, got, measured, want)
		}
	}
	if e := r.m.Estimates(); e[simhost.DFL1][id] != want || len(e) != 1 {
		t.Errorf("Estimates() = %v", e)
	}
}

func TestGrant(t *testing.T) {
	r := newRig(t)
	g, err := r.m.Grant(context.Background(), simhost.DFL0)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Nodes) != 1 || g.Nodes[0].Path != filepath.Join(r.host.Dev, "dfl-port.0") || g.Nodes[0].Access != "rw" {
		t.Errorf("nodes %+v", g.Nodes)
	}
	if g.Env["FUSIOND_FPGA_REGION"] != simhost.DFL0 || g.Env["FUSIOND_FPGA_AFU_ID"] != simhost.AFUNLB0.String() ||
		g.Env["FUSIOND_FPGA_BITSTREAM"] != r.ids["nlb0"] || g.Env["FUSIOND_FPGA_PCI"] != "0000:3b:00.0" {
		t.Errorf("env %v", g.Env)
	}
	if _, err := r.m.Grant(context.Background(), "dfl/nope/0"); !errors.Is(err, fpga.ErrNoRegion) {
		t.Errorf("unknown region: %v", err)
	}
}

func TestUpstreamFPGAManagerUnsupported(t *testing.T) {
	r := newRig(t)
	if err := os.Remove(filepath.Join(r.host.Sys, "class/fpga_manager/fpga0/firmware")); err != nil {
		t.Fatal(err)
	}
	_, err := r.m.Program(context.Background(), simhost.MGR0, "blinky")
	if !errors.Is(err, fpga.ErrUnsupported) || !strings.Contains(err.Error(), "device-tree overlay") {
		t.Errorf("err %v, want ErrUnsupported naming the overlay route", err)
	}
}

func TestDriverErrorRegisterUnhealthy(t *testing.T) {
	r := newRig(t)
	p := filepath.Join(r.host.Sys, "devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/dfl-fme.0/errors/fme_errors")
	if err := os.WriteFile(p, []byte("0x40\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h, _ := r.m.Health(context.Background(), simhost.DFL0)
	if h.Healthy || !strings.Contains(h.Reason, "0x40") {
		t.Errorf("health %+v, want unhealthy with the register value", h)
	}
	if h, _ := r.m.Health(context.Background(), simhost.DFL1); !h.Healthy {
		t.Errorf("other card unhealthy: %+v", h)
	}
}

// TestRealIoctlOnNonDevice runs the production IoctlPR against the
// fixture's /dev/dfl-fme.1, a regular file: the kernel answers ENOTTY,
// which must surface as a programming failure.
func TestRealIoctlOnNonDevice(t *testing.T) {
	dir := t.TempDir()
	h, err := simhost.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	ss, err := simhost.WriteSamples(dir, 4096)
	if err != nil {
		t.Fatal(err)
	}
	lib, _ := bitstream.OpenLibrary(filepath.Join(dir, "state"), nil)
	if _, err := lib.AddFile(ss[1].Path, ""); err != nil {
		t.Fatal(err)
	}
	m, err := fpga.NewManager(append(h.Options(), fpga.WithPortPR(fpga.IoctlPR{}), fpga.WithLibrary(lib))...)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, err = m.Program(context.Background(), simhost.DFL1, "dma")
	if !errors.Is(err, fpga.ErrProgram) || !errors.Is(err, syscall.ENOTTY) {
		t.Fatalf("err %v, want ErrProgram wrapping ENOTTY", err)
	}
}

func TestSeedEstimates(t *testing.T) {
	r := newRig(t)
	r.m.SeedEstimates(map[string]map[string]time.Duration{simhost.DFL1: {r.ids["dma"]: 7 * time.Second, r.ids["nlb0"]: -1}})
	if d, measured := r.m.Estimate(simhost.DFL1, r.ids["dma"]); !measured || d != 7*time.Second {
		t.Errorf("seeded estimate %v %v", d, measured)
	}
	if _, measured := r.m.Estimate(simhost.DFL1, r.ids["nlb0"]); measured {
		t.Errorf("a non-positive seed was kept")
	}
}

// TestDFLOldInterfaceLayout reads the interface from pr/interface_id when
// the FME has no fpga_region compat_id (older intel-fpga layout).
func TestDFLOldInterfaceLayout(t *testing.T) {
	dir := t.TempDir()
	h, err := simhost.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	fme := filepath.Join(h.Sys, "devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/dfl-fme.0")
	if err := os.RemoveAll(filepath.Join(fme, "dfl-fme-region.0")); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(fme, "pr"), 0o755)
	if err := os.WriteFile(filepath.Join(fme, "pr", "interface_id"), []byte(simhost.OtherInterface.Hex()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	m, _ := fpga.NewManager(h.Options()...)
	rs, err := m.Regions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bitstream.UUID{}
	for _, r := range rs {
		got[r.ID] = r.InterfaceID
	}
	if got[simhost.DFL0] != simhost.OtherInterface || got[simhost.DFL1] != simhost.DFLInterface {
		t.Errorf("interfaces %v", got)
	}
}

// TestFPGAManagerStatusReported programs raw data the (simulated) kernel
// rejects: the state and status lines become the failure reason.
func TestFPGAManagerStatusReported(t *testing.T) {
	r := newRig(t)
	if _, err := r.lib.Add(bytes.NewReader(make([]byte, 4096)), "zeros", "zeros.bin"); err != nil {
		t.Fatal(err)
	}
	_, err := r.m.Program(context.Background(), simhost.MGR0, "zeros")
	if !errors.Is(err, fpga.ErrProgram) || !strings.Contains(err.Error(), "reconfig incompatible image") {
		t.Fatalf("err %v", err)
	}
	st := r.status(t, simhost.MGR0)
	if st.Health.Healthy || st.State != "write init error" {
		t.Errorf("status %+v", st)
	}
}

// Package simhost writes a simulated FPGA host — sysfs, /dev and firmware
// fixture trees with two Intel DFL cards, one AMD XRT card and one SoC
// fpga_manager — and provides the simulated hardware behind the fpga
// package's hardware boundary: a PortPR that plays the DFL PR ioctl, a
// CommandRunner that plays xbutil, and an AttrWriter that plays the
// kernel's fpga_manager firmware attribute. Each writes the fixture's
// state files exactly as the kernel or tool would (afu_id, xclbinuuid,
// state/status/firmware), so the fpga back ends' unchanged discovery code
// reads the new bitstream back.
//
// This is the only simulated part: everything in package fpga above
// PortPR, CommandRunner and AttrWriter is the code that runs on hardware.
// fusiond --simulate and the tests use it; there is no FPGA here.
//
// It may import fpga, bitstream, forge and the standard library.
package simhost

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fusiond/fusiond/devices/fpga"
	"github.com/fusiond/fusiond/devices/fpga/bitstream"
	"github.com/fusiond/fusiond/devices/fpga/bitstream/forge"
)

// Interface and AFU IDs of the simulated host and its sample bitstreams.
var (
	// DFLInterface is the FIU/PR interface of both simulated PAC cards.
	DFLInterface = mustUUID("9346116d-a52d-5ca8-b06a-a9a389ef7c8d")
	// XRTInterface is the simulated Alveo shell's interface UUID.
	XRTInterface = mustUUID("15d2f3d9-d9b9-4c09-9e53-6b2c4e7b1a50")
	// OtherInterface is a shell no simulated card has.
	OtherInterface = mustUUID("a5d72a3c-c8b0-4939-912c-f715e5dc10ca")
	AFUNLB0        = mustUUID("d8424dc4-a4a3-c413-f89e-433683f9040b")
	AFUDMA         = mustUUID("331db30c-9885-41ea-9081-f88b8f655caa")
	AFUGzip        = mustUUID("6e1e5b4c-2a49-4f0c-8a1b-3c4d5e6f7a8b")
	XclbinVadd     = mustUUID("0e6b0b4e-6c1d-4d1a-9c1f-0a1b2c3d4e5f")
	XclbinMatmul   = mustUUID("7f8e9d0c-1b2a-4394-a5b6-c7d8e9f00112")
)

func mustUUID(s string) bitstream.UUID {
	u, err := bitstream.ParseUUID(s)
	if err != nil {
		panic(err) // constant input above
	}
	return u
}

// Region IDs of the simulated host, as the fpga back ends name them.
const (
	DFL0   = "dfl/0000:3b:00.0/0"
	DFL1   = "dfl/0000:af:00.0/0"
	XRT0   = "xrt/0000:65:00.1"
	MGR0   = "fpga-mgr/fpga0"
	dflDRV = "dfl-pci"
)

// Option tunes the simulated host.
type Option func(*Host)

// ProgramRate makes simulated programming take size/rate (plus
// Overhead); default 0: instant.
func ProgramRate(bytesPerSecond float64) Option { return func(h *Host) { h.rate = bytesPerSecond } }

// Overhead adds a fixed time to every simulated programming run.
func Overhead(d time.Duration) Option { return func(h *Host) { h.overhead = d } }

// Host is a written simulated host.
type Host struct {
	Root, Sys, Dev, Firmware string

	rate     float64
	overhead time.Duration

	mu       sync.Mutex
	failNext map[string]string
	// dfl maps an FME node path to its ports' sysfs dirs and region IDs.
	dfl map[string][]simPort
	// xrt maps a PCI address to its user function's sysfs dir.
	xrt map[string]string
	// mgr maps an fpga_manager sysfs dir to its region ID.
	mgr map[string]string
}

type simPort struct{ dir, region string }

// Write creates the simulated host under dir and returns it. Files that
// already exist are kept, so writing over an earlier simulated host keeps
// what its regions hold, as hardware does across a daemon restart.
func Write(dir string, opts ...Option) (*Host, error) {
	h := &Host{Root: dir, Sys: filepath.Join(dir, "sys"), Dev: filepath.Join(dir, "dev"), Firmware: filepath.Join(dir, "lib", "firmware"),
		failNext: map[string]string{}, dfl: map[string][]simPort{}, xrt: map[string]string{}, mgr: map[string]string{}}
	for _, o := range opts {
		o(h)
	}
	w := &treeWriter{}
	w.mkdir(h.Dev)
	w.mkdir(h.Firmware)
	h.writeDFL(w, 0, "0000:3b:00.0", "pci0000:3a/0000:3a:00.0", AFUNLB0)
	h.writeDFL(w, 1, "0000:af:00.0", "pci0000:ae/0000:ae:00.0", bitstream.UUID{})
	h.writeXRT(w, "0000:65:00", "pci0000:64/0000:64:00.0")
	h.writeMgr(w)
	if w.err != nil {
		return nil, fmt.Errorf("simhost: %w", w.err)
	}
	return h, nil
}

// treeWriter writes files, stopping at the first error.
type treeWriter struct{ err error }

func (w *treeWriter) mkdir(dir string) {
	if w.err == nil {
		w.err = os.MkdirAll(dir, 0o755)
	}
}

func (w *treeWriter) file(path, content string) {
	w.mkdir(filepath.Dir(path))
	if _, err := os.Lstat(path); w.err == nil && err != nil {
		w.err = os.WriteFile(path, []byte(content), 0o644)
	}
}

// link makes a relative symlink at path pointing to target.
func (w *treeWriter) link(target, path string) {
	w.mkdir(filepath.Dir(path))
	if _, err := os.Lstat(path); w.err != nil || err == nil {
		return
	}
	rel, err := filepath.Rel(filepath.Dir(path), target)
	if err != nil {
		w.err = err
		return
	}
	w.err = os.Symlink(rel, path)
}

func (h *Host) writeDFL(w *treeWriter, n int, pci, parent string, afu bitstream.UUID) {
	card := filepath.Join(h.Sys, "devices", parent, pci)
	w.file(filepath.Join(card, "vendor"), "0x8086\n")
	w.file(filepath.Join(card, "device"), "0x09c4\n")
	w.link(filepath.Join(h.Sys, "bus", "pci", "drivers", dflDRV), filepath.Join(card, "driver"))
	w.link(card, filepath.Join(h.Sys, "bus", "pci", "devices", pci))

	fmeName, portName := fmt.Sprintf("dfl-fme.%d", n), fmt.Sprintf("dfl-port.%d", n)
	fme := filepath.Join(card, fmeName)
	w.file(filepath.Join(fme, "dev"), fmt.Sprintf("%d:%d\n", 508, n))
	w.file(filepath.Join(fme, "ports_num"), "1\n")
	w.file(filepath.Join(fme, "bitstream_id"), "0x2300011001030f\n")
	w.file(filepath.Join(fme, "errors", "fme_errors"), "0x0\n")
	w.file(filepath.Join(fme, fmt.Sprintf("dfl-fme-region.%d", n), "fpga_region", fmt.Sprintf("region%d", n), "compat_id"), DFLInterface.Hex()+"\n")
	// The FME's own manager shows up in the fpga_manager class too.
	mgr := filepath.Join(fme, fmt.Sprintf("dfl-fme-mgr.%d", n), "fpga_manager", fmt.Sprintf("fpga%d", n+1))
	w.file(filepath.Join(mgr, "name"), "DFL FME FPGA Manager\n")
	w.file(filepath.Join(mgr, "state"), "unknown\n")
	w.link(mgr, filepath.Join(h.Sys, "class", "fpga_manager", fmt.Sprintf("fpga%d", n+1)))
	w.link(fme, filepath.Join(h.Sys, "bus", "platform", "devices", fmeName))

	port := filepath.Join(card, portName)
	w.file(filepath.Join(port, "dev"), fmt.Sprintf("%d:%d\n", 507, n))
	w.file(filepath.Join(port, "afu_id"), afu.Hex()+"\n")
	w.file(filepath.Join(port, "errors", "errors"), "0x0\n")
	w.link(port, filepath.Join(h.Sys, "bus", "platform", "devices", portName))

	w.file(filepath.Join(h.Dev, fmeName), "")
	w.file(filepath.Join(h.Dev, portName), "")
	h.dfl[filepath.Join(h.Dev, fmeName)] = []simPort{{dir: port, region: "dfl/" + pci + "/0"}}
}

func (h *Host) writeXRT(w *treeWriter, slot, parent string) {
	mgmt := filepath.Join(h.Sys, "devices", parent, slot+".0")
	user := filepath.Join(h.Sys, "devices", parent, slot+".1")
	for _, f := range []struct{ dir, drv string }{{mgmt, "xclmgmt"}, {user, "xocl"}} {
		w.file(filepath.Join(f.dir, "vendor"), "0x10ee\n")
		w.link(filepath.Join(h.Sys, "bus", "pci", "drivers", f.drv), filepath.Join(f.dir, "driver"))
		w.link(f.dir, filepath.Join(h.Sys, "bus", "pci", "devices", filepath.Base(f.dir)))
	}
	w.file(filepath.Join(mgmt, "interface_uuids"), XRTInterface.Hex()+"\n")
	w.file(filepath.Join(user, "interface_uuids"), XRTInterface.Hex()+"\n")
	w.file(filepath.Join(user, "xclbinuuid"), "\n")
	w.file(filepath.Join(user, "dev_offline"), "0\n")
	w.file(filepath.Join(user, "rom.1", "VBNV"), "xilinx_u250_gen3x16_xdma_shell_4_1\n")
	w.file(filepath.Join(user, "drm", "renderD128", "dev"), "226:128\n")
	w.file(filepath.Join(h.Dev, "dri", "renderD128"), "")
	h.xrt[slot+".1"] = user
}

func (h *Host) writeMgr(w *treeWriter) {
	dir := filepath.Join(h.Sys, "devices", "platform", "firmware:zynqmp-firmware", "firmware:zynqmp-firmware:pcap", "fpga_manager", "fpga0")
	w.file(filepath.Join(dir, "name"), "Xilinx ZynqMP FPGA Manager\n")
	w.file(filepath.Join(dir, "state"), "operating\n")
	w.file(filepath.Join(dir, "status"), "")
	w.file(filepath.Join(dir, "flags"), "0\n")
	w.file(filepath.Join(dir, "firmware"), "\n")
	link := filepath.Join(h.Sys, "class", "fpga_manager", "fpga0")
	w.link(dir, link)
	h.mgr[link] = MGR0
}

// Options returns the fpga.Manager options that point at this host and
// its simulated hardware.
func (h *Host) Options() []fpga.Option {
	return []fpga.Option{
		fpga.WithSysRoot(h.Sys), fpga.WithDevRoot(h.Dev), fpga.WithFirmwareDir(h.Firmware),
		fpga.WithPortPR(h.PortPR()), fpga.WithCommandRunner(h.Xbutil()), fpga.WithAttrWriter(h.Attrs()),
	}
}

// FailNext makes the next programming of region fail as the driver
// would, with reason as the driver's message.
func (h *Host) FailNext(region, reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failNext[region] = reason
}

func (h *Host) takeFailure(region string) (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r, ok := h.failNext[region]
	delete(h.failNext, region)
	return r, ok
}

// program waits the simulated programming time.
func (h *Host) program(ctx context.Context, size int64) error {
	d := h.overhead
	if h.rate > 0 {
		d += time.Duration(float64(size) / h.rate * float64(time.Second))
	}
	if d <= 0 {
		return nil
	}
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// simPR plays the DFL PR ioctl.
type simPR struct{ h *Host }

var _ fpga.PortPR = simPR{}

// PortPR returns the simulated DFL_FPGA_FME_PORT_PR.
func (h *Host) PortPR() fpga.PortPR { return simPR{h} }

func (s simPR) PortPR(ctx context.Context, req fpga.PRRequest) error {
	if _, err := os.Stat(req.Device); err != nil {
		return fmt.Errorf("open FME: %w", err)
	}
	ports := s.h.dfl[req.Device]
	if int(req.Port) >= len(ports) || len(req.Data)%4 != 0 || len(req.Data) == 0 {
		return syscall.EINVAL // as fme-pr.c answers
	}
	p := ports[req.Port]
	if reason, fail := s.h.takeFailure(p.region); fail {
		// The kernel reports the PR engine's error as EIO; the port is
		// left without a usable AFU.
		if err := os.WriteFile(filepath.Join(p.dir, "afu_id"), []byte(bitstream.UUID{}.Hex()+"\n"), 0o644); err != nil {
			return err
		}
		return fmt.Errorf("%w (%s)", syscall.EIO, reason)
	}
	if err := s.h.program(ctx, int64(len(req.Data))); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(p.dir, "afu_id"), []byte(req.AFUID.Hex()+"\n"), 0o644)
}

// simXbutil plays XRT's xbutil program.
type simXbutil struct{ h *Host }

var _ fpga.CommandRunner = simXbutil{}

// Xbutil returns the simulated xbutil.
func (h *Host) Xbutil() fpga.CommandRunner { return simXbutil{h} }

func (s simXbutil) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	exitErr := errors.New("exit status 1")
	if filepath.Base(name) != "xbutil" || len(args) != 5 || args[0] != "program" || args[1] != "--device" || args[3] != "--user" {
		return []byte("ERROR: unsupported simulated command " + name + " " + strings.Join(args, " ")), exitErr
	}
	bdf, path := args[2], args[4]
	user, ok := s.h.xrt[bdf]
	if !ok {
		return []byte("ERROR: Specified device BDF " + bdf + " not found"), exitErr
	}
	f, err := os.Open(path)
	if err != nil {
		return []byte("ERROR: " + err.Error()), exitErr
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return []byte("ERROR: " + err.Error()), exitErr
	}
	head := make([]byte, min(st.Size(), bitstream.HeadSize))
	if _, err := io.ReadFull(f, head); err != nil {
		return []byte("ERROR: " + err.Error()), exitErr
	}
	hdr, err := bitstream.ParseXclbin(head, st.Size())
	if err != nil {
		return []byte("ERROR: Invalid xclbin: " + err.Error()), exitErr
	}
	if hdr.InterfaceID != XRTInterface {
		return []byte("ERROR: xclbin interface uuid does not match the shell on the device"), exitErr
	}
	if reason, fail := s.h.takeFailure("xrt/" + bdf); fail {
		if err := os.WriteFile(filepath.Join(user, "xclbinuuid"), []byte("\n"), 0o644); err != nil {
			return nil, err
		}
		return []byte("ERROR: Failed to download xclbin: " + reason), exitErr
	}
	if err := s.h.program(ctx, st.Size()); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(user, "xclbinuuid"), []byte(hdr.AFUID.Hex()+"\n"), 0o644); err != nil {
		return nil, err
	}
	return []byte("Programming xclbin on device [" + bdf + "]...\nxclbin path: " + path + "\nxclbin loaded successfully\n"), nil
}

// simAttrs plays the downstream fpga_manager flags/firmware attributes.
type simAttrs struct{ h *Host }

var _ fpga.AttrWriter = simAttrs{}

// Attrs returns the simulated sysfs writer.
func (h *Host) Attrs() fpga.AttrWriter { return simAttrs{h} }

func (s simAttrs) WriteAttr(path, value string) error {
	dir, attr := filepath.Dir(path), filepath.Base(path)
	region, ok := s.h.mgr[dir]
	if !ok {
		return fmt.Errorf("simhost: write to %s: %w", path, syscall.EACCES)
	}
	set := func(state, status string) error {
		if err := os.WriteFile(filepath.Join(dir, "state"), []byte(state+"\n"), 0o644); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, "status"), []byte(status), 0o644)
	}
	switch attr {
	case "flags":
		return os.WriteFile(path, []byte(value+"\n"), 0o644)
	case "firmware":
		fw := filepath.Join(s.h.Firmware, strings.TrimSpace(value))
		data, err := os.ReadFile(fw)
		if err != nil {
			return errors.Join(syscall.ENOENT, set("firmware request error", ""))
		}
		if err := set("write init", ""); err != nil {
			return err
		}
		if reason, fail := s.h.takeFailure(region); fail {
			return errors.Join(fmt.Errorf("%w (%s)", syscall.EIO, reason), set("write error", "reconfig operation error\n"))
		}
		if !bytes.Contains(data[:min(len(data), 4096)], []byte{0xaa, 0x99, 0x55, 0x66}) {
			return errors.Join(syscall.EINVAL, set("write init error", "reconfig incompatible image\n"))
		}
		if err := s.h.program(context.Background(), int64(len(data))); err != nil {
			return err
		}
		if err := set("operating", ""); err != nil {
			return err
		}
		return os.WriteFile(path, []byte(strings.TrimSpace(value)+"\n"), 0o644)
	}
	return fmt.Errorf("simhost: write to %s: %w", path, syscall.EACCES)
}

// Sample is a sample bitstream file written by WriteSamples.
type Sample struct {
	Name, Path string
	Format     bitstream.Format
}

// WriteSamples writes sample bitstreams for the simulated host into dir:
// two .gbs for the DFL cards, one .gbs built for another shell (refused),
// two .xclbin for the XRT card and one .bit for the SoC. size is each
// payload's size in bytes (rounded down to a multiple of 4).
func WriteSamples(dir string, size int64) ([]Sample, error) {
	size &^= 3
	type spec struct {
		name  string
		write func(io.Writer) error
		f     bitstream.Format
	}
	specs := []spec{
		{"nlb0.gbs", func(w io.Writer) error {
			return forge.WriteGBS(w, forge.GBS{InterfaceID: DFLInterface, AFUID: AFUNLB0, AFUName: "nlb_mode_0", Platform: "a10_gx_pac", PayloadSize: size, Seed: 1})
		}, bitstream.FormatGBS},
		{"dma.gbs", func(w io.Writer) error {
			return forge.WriteGBS(w, forge.GBS{InterfaceID: DFLInterface, AFUID: AFUDMA, AFUName: "dma_afu", Platform: "a10_gx_pac", PayloadSize: size, Seed: 2})
		}, bitstream.FormatGBS},
		{"gzip-d5005.gbs", func(w io.Writer) error {
			return forge.WriteGBS(w, forge.GBS{InterfaceID: OtherInterface, AFUID: AFUGzip, AFUName: "gzip", Platform: "d5005", PayloadSize: size, Seed: 3})
		}, bitstream.FormatGBS},
		{"vadd.xclbin", func(w io.Writer) error {
			return forge.WriteXclbin(w, forge.Xclbin{InterfaceID: XRTInterface, UUID: XclbinVadd, VBNV: "xilinx_u250_gen3x16_xdma_shell_4_1", PayloadSize: size, Seed: 4})
		}, bitstream.FormatXclbin},
		{"matmul.xclbin", func(w io.Writer) error {
			return forge.WriteXclbin(w, forge.Xclbin{InterfaceID: XRTInterface, UUID: XclbinMatmul, VBNV: "xilinx_u250_gen3x16_xdma_shell_4_1", PayloadSize: size, Seed: 5})
		}, bitstream.FormatXclbin},
		{"blinky.bit", func(w io.Writer) error {
			return forge.WriteBit(w, forge.Bit{Design: "blinky;UserID=0XFFFFFFFF;Version=2023.2", Part: "xczu9eg-ffvb1156-2-e", Date: "2026/11/30", Time: "02:00:00", PayloadSize: size, Seed: 6})
		}, bitstream.FormatBit},
	}
	out := make([]Sample, 0, len(specs))
	for _, s := range specs {
		p := filepath.Join(dir, s.name)
		f, err := os.Create(p)
		if err != nil {
			return nil, fmt.Errorf("simhost samples: %w", err)
		}
		err = s.write(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, fmt.Errorf("simhost samples: %s: %w", s.name, err)
		}
		out = append(out, Sample{Name: strings.TrimSuffix(s.name, filepath.Ext(s.name)), Path: p, Format: s.f})
	}
	return out, nil
}

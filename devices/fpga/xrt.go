package fpga

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/fusiond/fusiond/devices"
	"github.com/fusiond/fusiond/devices/fpga/bitstream"
)

// CommandRunner runs an external tool: the hardware boundary of the XRT
// back end.
type CommandRunner interface {
	Run(ctx context.Context, name string, args ...string) (output []byte, err error)
}

// ExecRunner is the real CommandRunner (os/exec, killed when ctx ends).
type ExecRunner struct{}

var _ CommandRunner = ExecRunner{}

// Run implements CommandRunner, returning stdout and stderr together.
func (ExecRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

// XRT is the AMD/Xilinx XRT back end: each user physical function bound
// to xocl is one region (the card's dynamic region).
type XRT struct {
	sys, dev string
	run      CommandRunner
	xbutil   string
	log      *slog.Logger
}

var _ Backend = (*XRT)(nil)

// NewXRT returns the XRT back end; xbutil is the tool's path ("xbutil"
// resolves through PATH, normally /opt/xilinx/xrt/bin/xbutil).
func NewXRT(sysRoot, devRoot string, run CommandRunner, xbutil string, log *slog.Logger) *XRT {
	return &XRT{sys: sysRoot, dev: devRoot, run: run, xbutil: xbutil, log: log}
}

// Kind implements Backend.
func (x *XRT) Kind() Kind { return KindXRT }

func driverOf(dev string) string {
	l, err := os.Readlink(filepath.Join(dev, "driver"))
	if err != nil {
		return ""
	}
	return filepath.Base(l)
}

// Discover implements Backend: PCI functions bound to xocl.
func (x *XRT) Discover(ctx context.Context) ([]Region, error) {
	devs, _ := filepath.Glob(filepath.Join(x.sys, "bus", "pci", "devices", "*"))
	var out []Region
	for _, d := range devs {
		if driverOf(d) != "xocl" {
			continue
		}
		pci := filepath.Base(d)
		r := Region{
			ID:          "xrt/" + pci,
			Kind:        KindXRT,
			PCI:         pci,
			Accepts:     []bitstream.Format{bitstream.FormatXclbin},
			InterfaceID: x.interfaceID(d, pci),
			State:       "ready",
			sysDir:      d,
		}
		if vbnv, err := filepath.Glob(filepath.Join(d, "rom.*", "VBNV")); err == nil && len(vbnv) > 0 {
			r.Name, _ = readAttr(vbnv[0])
		}
		var err error
		if r.Loaded, err = x.Identify(ctx, r); err != nil {
			x.log.Warn("xrt: cannot read xclbinuuid", "region", r.ID, "err", err)
		}
		renders, _ := filepath.Glob(filepath.Join(d, "drm", "renderD*"))
		for _, rd := range renders {
			node, err := charNode(rd, x.dev, filepath.Join("dri", filepath.Base(rd)))
			if err != nil {
				x.log.Warn("xrt: render node", "region", r.ID, "err", err)
				continue
			}
			r.Nodes = append(r.Nodes, node)
		}
		r.Env = map[string]string{"FUSIOND_FPGA_PCI": pci, "XRT_DEVICE_BDF": pci}
		out = append(out, r)
	}
	return out, nil
}

// interfaceID reads the shell's interface UUID from interface_uuids on
// the user function, or on the management function (function 0).
func (x *XRT) interfaceID(dev, pci string) bitstream.UUID {
	cands := []string{filepath.Join(dev, "interface_uuids")}
	if i := strings.LastIndexByte(pci, '.'); i > 0 {
		cands = append(cands, filepath.Join(x.sys, "bus", "pci", "devices", pci[:i]+".0", "interface_uuids"))
	}
	for _, c := range cands {
		s, err := readAttr(c)
		if err != nil {
			continue
		}
		first, _, _ := strings.Cut(s, "\n")
		if u, err := bitstream.ParseUUID(first); err == nil {
			return u
		}
	}
	return bitstream.UUID{}
}

// Identify implements Backend: xocl's xclbinuuid (all zero: nothing loaded).
func (x *XRT) Identify(_ context.Context, r Region) (Loaded, error) {
	s, err := readAttr(filepath.Join(r.sysDir, "xclbinuuid"))
	if err != nil {
		return Loaded{}, fmt.Errorf("xrt %s: %w", r.ID, err)
	}
	if s == "" {
		return Loaded{}, nil
	}
	u, err := bitstream.ParseUUID(s)
	if err != nil {
		return Loaded{}, fmt.Errorf("xrt %s xclbinuuid: %w", r.ID, err)
	}
	return Loaded{AFUID: u}, nil
}

// Program implements Backend: xbutil program --device BDF --user FILE.
func (x *XRT) Program(ctx context.Context, r Region, b bitstream.Bitstream, progress func(Progress)) error {
	report(progress, Progress{Phase: "program", Total: b.Size})
	out, err := x.run.Run(ctx, x.xbutil, "program", "--device", r.PCI, "--user", b.Path)
	if err != nil {
		return fmt.Errorf("%w: xbutil program %s: %w: %s", ErrProgram, r.PCI, err, lastLines(out, 5))
	}
	report(progress, Progress{Phase: "program", Done: b.Size, Total: b.Size})
	return nil
}

// Health implements Backend: xocl's dev_offline flag.
func (x *XRT) Health(_ context.Context, r Region) devices.Health {
	if s, err := readAttr(filepath.Join(r.sysDir, "dev_offline")); err == nil && s != "0" {
		return devices.Health{Healthy: false, Reason: "xocl reports the device offline"}
	}
	return devices.Health{Healthy: true}
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

package fpga

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/fusiond/fusiond/devices"
	"github.com/fusiond/fusiond/devices/fpga/bitstream"
)

// PRRequest is one DFL_FPGA_FME_PORT_PR call.
type PRRequest struct {
	// Device is the FME node, e.g. /dev/dfl-fme.0 (under the dev root).
	Device string
	// Port is the port index on that FME (dfl_fpga_fme_port_pr.port_id).
	Port uint32
	// Data is the PR payload (the .gbs after its metadata); its length
	// must be a multiple of 4.
	Data []byte
	// AFUID is the accelerator the payload carries. The kernel never sees
	// it (the hardware reports it from the loaded logic afterwards); only
	// a simulated PortPR uses it to play the hardware's part.
	AFUID bitstream.UUID
}

// PortPR performs DFL partial reconfiguration: the hardware boundary of
// the DFL back end.
type PortPR interface {
	PortPR(ctx context.Context, req PRRequest) error
}

// ioctl number of DFL_FPGA_FME_PORT_PR: _IO(DFL_FPGA_MAGIC 0xB6,
// DFL_FME_BASE 0x80 + 0) in include/uapi/linux/fpga-dfl.h.
const dflFMEPortPR = 0xb6<<8 | 0x80

// dflPortPRArgs mirrors struct dfl_fpga_fme_port_pr.
type dflPortPRArgs struct {
	Argsz         uint32
	Flags         uint32
	PortID        uint32
	BufferSize    uint32
	BufferAddress uint64
}

// IoctlPR is the real PortPR: it opens the FME node and issues the ioctl.
type IoctlPR struct{}

var _ PortPR = IoctlPR{}

// PortPR implements PortPR. The ioctl cannot be interrupted; ctx is
// honoured by the caller, which stops waiting.
func (IoctlPR) PortPR(_ context.Context, req PRRequest) error {
	if len(req.Data) == 0 || uint64(len(req.Data)) > 0xffffffff {
		return fmt.Errorf("%w: PR payload of %d bytes", ErrIncompatible, len(req.Data))
	}
	f, err := os.OpenFile(req.Device, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open FME: %w", err)
	}
	defer f.Close()
	args := dflPortPRArgs{
		Argsz:         uint32(24),
		PortID:        req.Port,
		BufferSize:    uint32(len(req.Data)),
		BufferAddress: uint64(uintptrOf(req.Data)),
	}
	if err := ioctlPtr(int(f.Fd()), dflFMEPortPR, &args); err != nil {
		return fmt.Errorf("ioctl: %w", err)
	}
	return nil
}

// DFL is the Intel DFL/OPAE back end.
type DFL struct {
	sys, dev string
	pr       PortPR
	log      *slog.Logger
}

var _ Backend = (*DFL)(nil)

// NewDFL returns the DFL back end over the given sysfs and /dev roots.
func NewDFL(sysRoot, devRoot string, pr PortPR, log *slog.Logger) *DFL {
	return &DFL{sys: sysRoot, dev: devRoot, pr: pr, log: log}
}

// Kind implements Backend.
func (d *DFL) Kind() Kind { return KindDFL }

// Discover finds every dfl-fme.N platform device and the dfl-port.M
// devices that sit under the same PCI function; each port is a region.
func (d *DFL) Discover(ctx context.Context) ([]Region, error) {
	plat := filepath.Join(d.sys, "bus", "platform", "devices")
	fmes, err := filepath.Glob(filepath.Join(plat, "dfl-fme.*"))
	if err != nil || len(fmes) == 0 {
		return nil, nil
	}
	ports, _ := filepath.Glob(filepath.Join(plat, "dfl-port.*"))
	portsByParent := map[string][]string{}
	for _, p := range ports {
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			continue
		}
		parent := filepath.Dir(real)
		portsByParent[parent] = append(portsByParent[parent], real)
	}
	var out []Region
	for _, fmeLink := range fmes {
		fme, err := filepath.EvalSymlinks(fmeLink)
		if err != nil {
			d.log.Warn("dfl: unresolvable FME", "path", fmeLink, "err", err)
			continue
		}
		fmeName := filepath.Base(fme)
		pci := filepath.Base(filepath.Dir(fme))
		ifID := d.interfaceID(fme)
		pp := portsByParent[filepath.Dir(fme)]
		sort.Slice(pp, func(i, j int) bool { return instance(pp[i]) < instance(pp[j]) })
		for idx, port := range pp {
			portName := filepath.Base(port)
			r := Region{
				ID:          fmt.Sprintf("dfl/%s/%d", pci, idx),
				Kind:        KindDFL,
				PCI:         pci,
				Name:        fmeName + "/" + portName,
				Accepts:     []bitstream.Format{bitstream.FormatGBS},
				InterfaceID: ifID,
				State:       "ready",
				sysDir:      port,
				devPath:     filepath.Join(d.dev, fmeName),
				port:        uint32(idx),
			}
			if r.Loaded, err = d.Identify(ctx, r); err != nil {
				d.log.Warn("dfl: cannot read afu_id", "region", r.ID, "err", err)
			}
			node, err := charNode(port, d.dev, portName)
			if err != nil {
				d.log.Warn("dfl: port without device node", "region", r.ID, "err", err)
			} else {
				r.Nodes = []devices.DeviceNode{node}
			}
			r.Env = map[string]string{"FUSIOND_FPGA_PCI": pci, "FUSIOND_FPGA_PORT": filepath.Join(d.dev, portName)}
			out = append(out, r)
		}
	}
	return out, nil
}

// instance is the numeric suffix of "dfl-port.12".
func instance(path string) int {
	_, n, _ := strings.Cut(filepath.Base(path), ".")
	i, _ := strconv.Atoi(n)
	return i
}

// interfaceID reads the FME's PR interface: the compat_id of its FPGA
// region (upstream DFL), or pr/interface_id (older intel-fpga layout).
func (d *DFL) interfaceID(fme string) bitstream.UUID {
	cands, _ := filepath.Glob(filepath.Join(fme, "dfl-fme-region.*", "fpga_region", "region*", "compat_id"))
	cands = append(cands, filepath.Join(fme, "pr", "interface_id"))
	for _, c := range cands {
		s, err := readAttr(c)
		if err != nil {
			continue
		}
		if u, err := bitstream.ParseUUID(s); err == nil {
			return u
		}
	}
	return bitstream.UUID{}
}

// Identify implements Backend: the port's afu_id.
func (d *DFL) Identify(_ context.Context, r Region) (Loaded, error) {
	s, err := readAttr(filepath.Join(r.sysDir, "afu_id"))
	if err != nil {
		return Loaded{}, fmt.Errorf("dfl %s: %w", r.ID, err)
	}
	u, err := bitstream.ParseUUID(s)
	if err != nil {
		return Loaded{}, fmt.Errorf("dfl %s afu_id: %w", r.ID, err)
	}
	return Loaded{AFUID: u}, nil
}

// Program implements Backend: map the .gbs, hand its payload to the PR
// ioctl on the FME node.
func (d *DFL) Program(ctx context.Context, r Region, b bitstream.Bitstream, progress func(Progress)) error {
	h := b.Header
	f, err := os.Open(b.Path)
	if err != nil {
		return fmt.Errorf("dfl program %s: %w", r.ID, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("dfl program %s: %w", r.ID, err)
	}
	if st.Size() != b.Size || h.PayloadOffset+h.PayloadSize > st.Size() {
		return fmt.Errorf("dfl program %s: library file %s changed size (%d, expected %d)", r.ID, b.Path, st.Size(), b.Size)
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("dfl program %s: mmap: %w", r.ID, err)
	}
	report(progress, Progress{Phase: "program", Total: h.PayloadSize})
	req := PRRequest{Device: r.devPath, Port: r.port, Data: data[h.PayloadOffset : h.PayloadOffset+h.PayloadSize], AFUID: h.AFUID}
	err = waitDone(ctx, func() error {
		defer unix.Munmap(data) // only once the ioctl has returned
		if err := d.pr.PortPR(ctx, req); err != nil {
			return fmt.Errorf("%w: DFL_FPGA_FME_PORT_PR on %s port %d: %w", ErrProgram, req.Device, req.Port, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	report(progress, Progress{Phase: "program", Done: h.PayloadSize, Total: h.PayloadSize})
	return nil
}

// Health implements Backend: the FME's and the port's error registers.
func (d *DFL) Health(_ context.Context, r Region) devices.Health {
	fme := filepath.Dir(r.sysDir)
	fmeDir := filepath.Join(fme, filepath.Base(r.devPath))
	for _, reg := range []string{filepath.Join(fmeDir, "errors", "fme_errors"), filepath.Join(r.sysDir, "errors", "errors")} {
		s, err := readAttr(reg)
		if err != nil {
			continue // older kernels lack the errors feature
		}
		if v, err := hexValue(s); err == nil && v != 0 {
			return devices.Health{Healthy: false, Reason: fmt.Sprintf("%s = %#x", strings.TrimPrefix(reg, d.sys), v)}
		}
	}
	return devices.Health{Healthy: true}
}

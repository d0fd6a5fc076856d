// Package fpga discovers FPGA reconfigurable regions, programs bitstreams
// into them and reports their health, over three back ends that cover the
// ways Linux hosts program FPGAs today:
//
//   - KindFPGAManager: the kernel fpga_manager class
//     (/sys/class/fpga_manager/*), programmed through the writable
//     firmware/flags attributes of AMD's downstream kernels;
//   - KindDFL: Intel's Device Feature List driver (/dev/dfl-fme.N), partial
//     reconfiguration with the DFL_FPGA_FME_PORT_PR ioctl and .gbs files;
//   - KindXRT: AMD/Xilinx Alveo cards under XRT (xocl/xclmgmt), programmed
//     with .xclbin files through XRT's xbutil.
//
// Every back end reads sysfs and /dev under injected roots and reaches the
// hardware only through a small interface (PortPR for the ioctl,
// CommandRunner for XRT's tools, AttrWriter for sysfs writes that start
// programming). Tests and the simulated host (package simhost) inject
// implementations that behave as the kernel or tool would on fixture
// trees; the code above that boundary is the code that runs on hardware.
//
// Manager ties the back ends to the bitstream library: it checks a
// bitstream against a region before touching anything, marks the region
// busy while it is reprogrammed, records programming failures as
// unhealthy, and keeps a per-region, per-bitstream programming-time
// estimate for the scheduler. Driver presents the Manager to the daemon as
// a devices.Driver: regions and their loaded bitstreams as an inventory,
// programming runs and regions found or gone as updates, and per-job
// preparation (programming, grants).
//
// It owns the host's FPGA regions and may import the standard library,
// devices and its own subpackages (bitstream); nothing of the daemon.
package fpga

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/fusiond/fusiond/devices"
	"github.com/fusiond/fusiond/devices/fpga/bitstream"
)

// Kind names a back end.
type Kind string

const (
	KindFPGAManager Kind = "fpga-mgr"
	KindDFL         Kind = "dfl"
	KindXRT         Kind = "xrt"
)

// Sentinel errors callers branch on.
var (
	// ErrNoRegion: no region has this ID.
	ErrNoRegion = errors.New("no such FPGA region")
	// ErrIncompatible: the bitstream cannot go into this region (format,
	// interface ID, alignment). Nothing was touched.
	ErrIncompatible = errors.New("bitstream incompatible with FPGA region")
	// ErrInterfaceMismatch: the bitstream was built for another static
	// region / shell interface. It wraps ErrIncompatible.
	ErrInterfaceMismatch = fmt.Errorf("%w: interface ID mismatch", ErrIncompatible)
	// ErrBusy: the region is being reprogrammed.
	ErrBusy = errors.New("FPGA region busy: being reprogrammed")
	// ErrUnhealthy: the region's last programming failed or the driver
	// reports an error.
	ErrUnhealthy = errors.New("FPGA region unhealthy")
	// ErrUnsupported: the host's driver offers no way to program this
	// region from user space.
	ErrUnsupported = errors.New("FPGA programming not supported by this driver")
	// ErrProgram: the driver or tool reported a programming failure.
	ErrProgram = errors.New("FPGA programming failed")
	// ErrNoLibrary: the Manager was built without a bitstream library.
	ErrNoLibrary = errors.New("no bitstream library configured")
)

// Loaded is what the driver says a region currently holds.
type Loaded struct {
	// AFUID is the loaded accelerator's ID (DFL port afu_id, XRT
	// xclbinuuid); zero when the driver does not expose one.
	AFUID bitstream.UUID `json:"afu_id,omitzero"`
	// BitstreamID is the library sha256 when the driver's state names it
	// (fpga_manager: the firmware file fusiond wrote); "" otherwise.
	BitstreamID string `json:"bitstream_id,omitempty"`
}

// Region is one reconfigurable region as a back end discovers it.
type Region struct {
	// ID is stable across restarts: "dfl/<pci>/<port>", "xrt/<pci>",
	// "fpga-mgr/<fpgaN>".
	ID   string `json:"id"`
	Kind Kind   `json:"kind"`
	// PCI is the card's PCI address (DFL, XRT); "" for SoC managers.
	PCI string `json:"pci,omitempty"`
	// Name is the driver's name for the device (fpga_manager name, XRT VBNV).
	Name string `json:"name,omitempty"`
	// Accepts lists the bitstream formats the back end programs.
	Accepts []bitstream.Format `json:"accepts"`
	// InterfaceID is the static region's interface (DFL compat_id, XRT
	// interface_uuids); zero when the driver exposes none.
	InterfaceID bitstream.UUID `json:"interface_id,omitzero"`
	Loaded      Loaded         `json:"loaded"`
	// State is the driver's raw state string, for display.
	State string `json:"state,omitempty"`
	// Nodes and Env are what a job using the region is granted.
	Nodes []devices.DeviceNode `json:"nodes,omitempty"`
	Env   map[string]string    `json:"env,omitempty"`

	// sysDir is the back end's sysfs directory for the region, devPath
	// the node programming goes through, port the DFL port index.
	sysDir  string
	devPath string
	port    uint32
}

// Progress reports a programming step.
type Progress struct {
	Phase string // "copy", "program", "verify"
	Done  int64
	Total int64
}

// Backend is one way of driving FPGAs.
type Backend interface {
	Kind() Kind
	// Discover lists the regions the back end sees, with what each holds.
	Discover(ctx context.Context) ([]Region, error)
	// Identify reads what the region holds now.
	Identify(ctx context.Context, r Region) (Loaded, error)
	// Program loads b into r; it must return when ctx ends. progress
	// may be nil.
	Program(ctx context.Context, r Region, b bitstream.Bitstream, progress func(Progress)) error
	// Health is the driver's own view of the region.
	Health(ctx context.Context, r Region) devices.Health
}

// readAttr reads a sysfs attribute, trimmed.
func readAttr(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// charNode builds the device node of a sysfs device directory whose "dev"
// attribute is "major:minor"; the node path is devRoot/name.
func charNode(sysDir, devRoot, name string) (devices.DeviceNode, error) {
	s, err := readAttr(filepath.Join(sysDir, "dev"))
	if err != nil {
		return devices.DeviceNode{}, fmt.Errorf("device numbers of %s: %w", name, err)
	}
	maj, min, ok := strings.Cut(s, ":")
	ma, err1 := strconv.ParseUint(maj, 10, 32)
	mi, err2 := strconv.ParseUint(min, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return devices.DeviceNode{}, fmt.Errorf("device numbers of %s: malformed %q", name, s)
	}
	return devices.DeviceNode{Path: filepath.Join(devRoot, name), Type: devices.CharDevice, Major: uint32(ma), Minor: uint32(mi), Access: "rw"}, nil
}

// hexValue parses a sysfs error register ("0x0", "0").
func hexValue(s string) (uint64, error) {
	return strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(s), "0x"), 16, 64)
}

// StillRunningError is returned when ctx ended before an uninterruptible
// driver call (the PR ioctl, a sysfs write) returned. Done is closed when
// the call finally returns; until then the region must stay busy.
type StillRunningError struct {
	Done <-chan struct{}
	Err  error
}

func (e *StillRunningError) Error() string {
	return e.Err.Error() + " (the driver call is still running)"
}

func (e *StillRunningError) Unwrap() error { return e.Err }

// waitDone runs fn in a goroutine and returns its error, or a
// *StillRunningError wrapping ErrProgram and ctx's error if ctx ends first.
func waitDone(ctx context.Context, fn func() error) error {
	res := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		res <- fn()
	}()
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return &StillRunningError{Done: done, Err: fmt.Errorf("%w: %w", ErrProgram, ctx.Err())}
	}
}

func report(progress func(Progress), p Progress) {
	if progress != nil {
		progress(p)
	}
}

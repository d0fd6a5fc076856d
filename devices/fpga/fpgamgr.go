package fpga

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/fusiond/fusiond/devices"
	"github.com/fusiond/fusiond/devices/fpga/bitstream"
)

// AttrWriter writes a sysfs attribute. Writing an fpga_manager's firmware
// attribute makes the kernel program the device during the write, so this
// is the hardware boundary of the fpga_manager back end.
type AttrWriter interface {
	WriteAttr(path, value string) error
}

// SysfsWriter is the real AttrWriter.
type SysfsWriter struct{}

var _ AttrWriter = SysfsWriter{}

// WriteAttr implements AttrWriter; it never creates files.
func (SysfsWriter) WriteAttr(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// FPGAManager is the kernel fpga_manager back end. Upstream kernels offer
// no user-space trigger (programming goes through a device-tree overlay
// that names the image in firmware-name); AMD's downstream kernels add the
// writable flags and firmware attributes used here.
type FPGAManager struct {
	sys, firmware string
	w             AttrWriter
	poll          time.Duration
	log           *slog.Logger
}

var _ Backend = (*FPGAManager)(nil)

// NewFPGAManager returns the fpga_manager back end. firmwareDir is where
// the kernel's firmware loader looks (/lib/firmware).
func NewFPGAManager(sysRoot, firmwareDir string, w AttrWriter, log *slog.Logger) *FPGAManager {
	return &FPGAManager{sys: sysRoot, firmware: firmwareDir, w: w, poll: 20 * time.Millisecond, log: log}
}

// Kind implements Backend.
func (m *FPGAManager) Kind() Kind { return KindFPGAManager }

// Discover implements Backend. Managers registered by the DFL driver are
// left to the DFL back end.
func (m *FPGAManager) Discover(ctx context.Context) ([]Region, error) {
	mgrs, _ := filepath.Glob(filepath.Join(m.sys, "class", "fpga_manager", "*"))
	var out []Region
	for _, d := range mgrs {
		name, err := readAttr(filepath.Join(d, "name"))
		if err != nil {
			m.log.Warn("fpga_manager without name", "path", d, "err", err)
			continue
		}
		if real, _ := filepath.EvalSymlinks(d); strings.Contains(name, "DFL") || strings.Contains(real, "dfl-fme") {
			continue
		}
		state, _ := readAttr(filepath.Join(d, "state"))
		dev := filepath.Base(d)
		r := Region{
			ID:      "fpga-mgr/" + dev,
			Kind:    KindFPGAManager,
			Name:    name,
			Accepts: []bitstream.Format{bitstream.FormatBit, bitstream.FormatBin},
			State:   state,
			sysDir:  d,
			Env:     map[string]string{"FUSIOND_FPGA_MANAGER": dev},
		}
		r.Loaded, _ = m.Identify(ctx, r)
		out = append(out, r)
	}
	return out, nil
}

// firmwareName is the file fusiond places in the firmware directory; the
// library ID in it lets Identify name what is loaded.
func firmwareName(b bitstream.Bitstream) string { return "fusiond-" + b.ID + ".bin" }

var firmwareRE = regexp.MustCompile(`^fusiond-([0-9a-f]{64})\.bin$`)

// Identify implements Backend. The kernel keeps no identity of the loaded
// image; when the downstream firmware attribute reads back a name fusiond
// wrote, that names the bitstream.
func (m *FPGAManager) Identify(_ context.Context, r Region) (Loaded, error) {
	fw, err := readAttr(filepath.Join(r.sysDir, "firmware"))
	if err != nil || !strings.HasPrefix(r.State, "operating") {
		return Loaded{}, nil
	}
	if s := firmwareRE.FindStringSubmatch(filepath.Base(fw)); s != nil {
		return Loaded{BitstreamID: s[1]}, nil
	}
	return Loaded{}, nil
}

// Program implements Backend: copy the configuration data into the
// firmware directory, write flags (0: full reconfiguration) and the
// firmware name, then read state until the kernel says operating.
func (m *FPGAManager) Program(ctx context.Context, r Region, b bitstream.Bitstream, progress func(Progress)) error {
	fwAttr := filepath.Join(r.sysDir, "firmware")
	if _, err := os.Stat(fwAttr); err != nil {
		return fmt.Errorf("%w: %s has no firmware attribute (upstream kernel): load the image with a device-tree overlay instead", ErrUnsupported, r.ID)
	}
	name := firmwareName(b)
	if err := m.stage(b, filepath.Join(m.firmware, name), progress); err != nil {
		return fmt.Errorf("fpga-mgr %s: %w", r.ID, err)
	}
	report(progress, Progress{Phase: "program", Total: b.Header.PayloadSize})
	err := waitDone(ctx, func() error {
		if err := m.w.WriteAttr(filepath.Join(r.sysDir, "flags"), "0"); err != nil {
			return fmt.Errorf("%w: %s flags: %w", ErrProgram, r.ID, err)
		}
		if err := m.w.WriteAttr(fwAttr, name); err != nil {
			return fmt.Errorf("%w: %s firmware %s: %w%s", ErrProgram, r.ID, name, err, m.statusSuffix(r))
		}
		return nil
	})
	if err != nil {
		return err
	}
	for {
		state, err := readAttr(filepath.Join(r.sysDir, "state"))
		switch {
		case err != nil:
			return fmt.Errorf("fpga-mgr %s state: %w", r.ID, err)
		case state == "operating":
			report(progress, Progress{Phase: "program", Done: b.Header.PayloadSize, Total: b.Header.PayloadSize})
			return nil
		case strings.HasSuffix(state, "error"):
			return fmt.Errorf("%w: %s state %q%s", ErrProgram, r.ID, state, m.statusSuffix(r))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s still %q: %w", ErrProgram, r.ID, state, ctx.Err())
		case <-time.After(m.poll):
		}
	}
}

func (m *FPGAManager) statusSuffix(r Region) string {
	s, err := readAttr(filepath.Join(r.sysDir, "status"))
	if err != nil || s == "" {
		return ""
	}
	return " (status: " + strings.ReplaceAll(s, "\n", "; ") + ")"
}

// stage copies the configuration data (the .bit's 'e' payload, a .bin
// whole) to dst unless an identical file is already there.
func (m *FPGAManager) stage(b bitstream.Bitstream, dst string, progress func(Progress)) error {
	h := b.Header
	if st, err := os.Stat(dst); err == nil && st.Size() == h.PayloadSize {
		return nil
	}
	src, err := os.Open(b.Path)
	if err != nil {
		return err
	}
	defer src.Close()
	tmp, err := os.CreateTemp(m.firmware, ".fusiond-*")
	if err != nil {
		return fmt.Errorf("stage firmware: %w", err)
	}
	defer os.Remove(tmp.Name())
	n, err := io.Copy(tmp, io.NewSectionReader(src, h.PayloadOffset, h.PayloadSize))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil && n != h.PayloadSize {
		err = errors.New("short copy")
	}
	if err != nil {
		return fmt.Errorf("stage firmware: %w", err)
	}
	report(progress, Progress{Phase: "copy", Done: n, Total: h.PayloadSize})
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("stage firmware: %w", err)
	}
	return os.Rename(tmp.Name(), dst)
}

// Health implements Backend: an error state or status is unhealthy.
func (m *FPGAManager) Health(_ context.Context, r Region) devices.Health {
	state, err := readAttr(filepath.Join(r.sysDir, "state"))
	if err != nil {
		return devices.Health{Healthy: false, Reason: "state unreadable: " + err.Error()}
	}
	if strings.HasSuffix(state, "error") {
		return devices.Health{Healthy: false, Reason: "state " + state + m.statusSuffix(r)}
	}
	return devices.Health{Healthy: true}
}

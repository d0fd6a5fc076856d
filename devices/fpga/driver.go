package fpga

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/fusiond/fusiond/devices"
)

// defaultProgramMs is the programming-time estimate a region reports
// before the first measurement of a bitstream (the engine asks Estimate
// for the bitstream a job wants).
const defaultProgramMs = 1000

// Driver is the Manager as a devices.Driver: the regions it offers (with
// the bitstream each holds), programming runs and hot-plug as updates,
// and per-job preparation: programming the region with the job's
// bitstream and granting its device nodes.
type Driver struct {
	m   *Manager
	log *slog.Logger
}

var _ devices.Driver = (*Driver)(nil)

// NewDriver returns the driver over m; log may be nil.
func NewDriver(m *Manager, log *slog.Logger) *Driver {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Driver{m: m, log: log}
}

// Manager is the FPGA manager behind the driver, for the API's FPGA
// routes (programming, region status, estimates).
func (d *Driver) Manager() *Manager { return d.m }

// Kind reports devices.FPGA.
func (d *Driver) Kind() devices.Kind { return devices.FPGA }

// Subscribe delivers the manager's updates.
func (d *Driver) Subscribe(fn func(devices.Update)) (cancel func()) { return d.m.Subscribe(fn) }

// Inventory rediscovers the regions. One back end's failure does not hide
// the others' regions: the error comes with what was found.
func (d *Driver) Inventory(ctx context.Context) (devices.Inventory, error) {
	rs, err := d.m.Regions(ctx)
	var inv devices.Inventory
	for _, r := range rs {
		inv.Devices = append(inv.Devices, devices.Device{
			ID: r.ID, Kind: devices.FPGA, Model: r.Name, PCI: strings.ToLower(r.PCI), NUMA: -1,
			Health: r.Health, Bitstream: r.LoadedBitstream, ReconfigMs: defaultProgramMs,
		})
	}
	return inv, err
}

// Prepare programs every region of the allocation with its bitstream and
// grants the regions' device nodes. Program returns at once when the
// region already holds the bitstream and is healthy; asking every time
// also covers a region whose last programming failed after the engine
// placed the job.
func (d *Driver) Prepare(ctx context.Context, jobID string, a *devices.Allocation) (devices.Grant, error) {
	var grant devices.Grant
	for _, region := range a.Devices {
		res, err := d.m.Program(ctx, region, a.Bitstream)
		if err != nil {
			return devices.Grant{}, fmt.Errorf("programming FPGA region %s: %w", region, err)
		}
		if res.Duration > 0 {
			d.log.Info("FPGA region programmed for job", "job", jobID, "region", region, "took", res.Duration)
		}
		g, err := d.m.Grant(ctx, region)
		if err != nil {
			return devices.Grant{}, fmt.Errorf("FPGA grant: %w", err)
		}
		grant.Merge(g)
	}
	return grant, nil
}

// Reclaim has nothing to take again: a region's grant is its device
// nodes, and what it holds is on the hardware.
func (d *Driver) Reclaim(context.Context, string, devices.Allocation) error { return nil }

// Release has nothing to give back: the region keeps its bitstream for
// the next job that wants it.
func (d *Driver) Release(context.Context, string) error { return nil }

package daemon

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/hardware"
	"github.com/fusiond/fusiond/devices"
)

// devicePreparer readies the devices a placed job was allocated by handing
// each driver its part of the allocation (a GPU share to admit, a MIG
// instance to create, an FPGA region to program) and returns what the job
// must be granted: environment and device nodes.
type devicePreparer struct {
	// drivers are the host's drivers, in the host's order.
	drivers []devices.Driver
	holders hardware.Holders
	log     *slog.Logger
}

// Prepare runs before the job starts. It changes the allocation in place
// when a driver created a MIG instance (recording the instance's UUID and
// start slot).
func (d *devicePreparer) Prepare(ctx context.Context, j *api.Job) (devices.Grant, error) {
	var grant devices.Grant
	per := driverAllocations(j.Allocation, j.Owner)
	if len(per) == 0 {
		return grant, nil
	}
	for kind := range per {
		if d.driver(kind) == nil {
			return grant, fmt.Errorf("job holds %s devices but this host has no %s driver", kind, kind)
		}
	}
	var held map[string]bool
	if d.holders != nil {
		held = d.holders.HeldDevices()
	}
	for _, drv := range d.drivers {
		a, ok := per[drv.Kind()]
		if !ok {
			continue
		}
		a.Held = held
		g, err := drv.Prepare(ctx, j.ID, &a)
		if err != nil {
			d.Release(j)
			return devices.Grant{}, err
		}
		if m := j.Allocation.MIG; m != nil && a.MIG != nil {
			m.Instance, m.Start = a.MIG.Instance, a.MIG.Start
		}
		grant.Merge(g)
	}
	return grant, nil
}

func (d *devicePreparer) driver(kind devices.Kind) devices.Driver {
	for _, drv := range d.drivers {
		if drv.Kind() == kind {
			return drv
		}
	}
	return nil
}

// driverAllocations splits a job's allocation into each driver kind's part
// in the drivers' hardware-neutral terms; a GPU share carries the job
// owner's uid and gid (the user its processes run as).
func driverAllocations(a *api.Allocation, owner api.Owner) map[devices.Kind]devices.Allocation {
	out := map[devices.Kind]devices.Allocation{}
	if a == nil {
		return out
	}
	if a.GPUs != nil || a.GPUShare != nil || a.MIG != nil {
		g := devices.Allocation{Devices: a.GPUs}
		if s := a.GPUShare; s != nil {
			g.Share = &devices.Share{Device: s.GPU, Milli: s.Milli, MemoryMB: s.MemoryMB, UID: owner.UID, GID: owner.GID}
		}
		if m := a.MIG; m != nil {
			g.MIG = &devices.MIGAllocation{GPU: m.GPU, Profile: m.Profile, Start: m.Start, Instance: m.Instance}
		}
		out[devices.GPU] = g
	}
	if f := a.FPGA; f != nil {
		out[devices.FPGA] = devices.Allocation{Devices: []string{f.Region}, Bitstream: f.Bitstream}
	}
	return out
}

// Reclaim has every driver take again what it holds for a job re-attached
// after a daemon restart (a GPU share, so share admission counts it).
func (d *devicePreparer) Reclaim(j *api.Job) error {
	per := driverAllocations(j.Allocation, j.Owner)
	for _, drv := range d.drivers {
		a, ok := per[drv.Kind()]
		if !ok {
			continue
		}
		if err := drv.Reclaim(context.Background(), j.ID, a); err != nil {
			return fmt.Errorf("%s devices: %w", drv.Kind(), err)
		}
	}
	return nil
}

// Release has every driver give back what Prepare or Reclaim took.
func (d *devicePreparer) Release(j *api.Job) {
	for _, drv := range d.drivers {
		if err := drv.Release(context.Background(), j.ID); err != nil {
			d.log.Warn("releasing devices", "job", j.ID, "driver", drv.Kind(), "err", err)
		}
	}
}

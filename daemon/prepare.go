package daemon

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/host"
	"github.com/fusiond/fusiond/devices"
	"github.com/fusiond/fusiond/devices/nvidia"
)

// devicePreparer readies the devices a placed job was allocated — admits a
// GPU share, creates a MIG instance on demand, programs an FPGA region —
// and returns what the job must be granted: environment and device nodes.
type devicePreparer struct {
	host    *host.Host
	holders host.Holders
	log     *slog.Logger
}

// Prepare runs before the job starts. It changes the allocation in place
// when it creates a MIG instance (recording the instance's UUID).
func (d *devicePreparer) Prepare(ctx context.Context, j *api.Job) (devices.Grant, error) {
	var grant devices.Grant
	a := j.Allocation
	if a == nil {
		return grant, nil
	}
	if a.GPUs != nil || a.GPUShare != nil || a.MIG != nil {
		gm := d.host.GPUs()
		if gm == nil {
			return grant, fmt.Errorf("job holds GPUs but this host has no GPU driver")
		}
		alloc := nvidia.Alloc{GPUs: a.GPUs}
		if s := a.GPUShare; s != nil {
			share := nvidia.Share{ID: j.ID, GPU: s.GPU, Milli: s.Milli, MemoryMB: uint64(max(s.MemoryMB, 0))}
			if err := gm.AdmitShare(ctx, share); err != nil {
				return grant, fmt.Errorf("GPU share: %w", err)
			}
			alloc.Share = &share
		}
		if m := a.MIG; m != nil {
			if m.Instance == "" {
				inst, err := d.createMIG(ctx, gm, m)
				if err != nil {
					d.Release(j)
					return grant, err
				}
				m.Instance = inst
			}
			alloc.MIG = []string{m.Instance}
		}
		g, err := gm.Grant(alloc)
		if err != nil {
			d.Release(j)
			return grant, fmt.Errorf("GPU grant: %w", err)
		}
		grant.Merge(g)
	}
	if f := a.FPGA; f != nil {
		fm := d.host.FPGAs()
		if fm == nil {
			return grant, fmt.Errorf("job holds an FPGA region but this host has no FPGA driver")
		}
		if f.Program {
			res, err := fm.Program(ctx, f.Region, f.Bitstream)
			if err != nil {
				d.Release(j)
				return grant, fmt.Errorf("programming FPGA region %s: %w", f.Region, err)
			}
			d.log.Info("FPGA region programmed for job", "job", j.ID, "region", f.Region, "took", res.Duration)
		}
		g, err := fm.Grant(ctx, f.Region)
		if err != nil {
			d.Release(j)
			return grant, fmt.Errorf("FPGA grant: %w", err)
		}
		grant.Merge(g)
	}
	return grant, nil
}

// createMIG creates one instance of the profile on the allocated GPU from
// free slices only, never touching instances that hold work.
func (d *devicePreparer) createMIG(ctx context.Context, gm *nvidia.Manager, m *api.MIGAllocation) (string, error) {
	busy := nvidia.Busy(d.holders.HeldDevices())
	state, err := gm.State(ctx, busy)
	if err != nil {
		return "", fmt.Errorf("MIG state: %w", err)
	}
	cands, err := nvidia.PlanOnDemand(state, m.Profile)
	if err != nil {
		return "", fmt.Errorf("no room for a %s instance: %w", m.Profile, err)
	}
	for _, c := range cands {
		if c.GPUUUID != m.GPU {
			continue
		}
		inst, err := gm.ApplyOnDemand(ctx, c, busy)
		if err != nil {
			return "", fmt.Errorf("creating a %s instance on %s: %w", m.Profile, m.GPU, err)
		}
		d.log.Info("MIG instance created on demand", "gpu", m.GPU, "profile", m.Profile, "instance", inst.UUID, "cost", c.Cost)
		return inst.UUID, nil
	}
	return "", fmt.Errorf("GPU %s has no room for a %s instance without touching running work", m.GPU, m.Profile)
}

// Release gives back what Prepare took (a GPU share).
func (d *devicePreparer) Release(j *api.Job) {
	if j.Allocation == nil || j.Allocation.GPUShare == nil || d.host.GPUs() == nil {
		return
	}
	if err := d.host.GPUs().ReleaseShare(context.Background(), j.Allocation.GPUShare.GPU, j.ID); err != nil {
		d.log.Warn("releasing GPU share", "job", j.ID, "err", err)
	}
}

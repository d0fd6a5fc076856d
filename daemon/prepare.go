package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/hardware"
	"github.com/fusiond/fusiond/devices"
	"github.com/fusiond/fusiond/devices/nvidia"
)

// devicePreparer readies the devices a placed job was allocated — admits a
// GPU share, creates a MIG instance on demand, programs an FPGA region —
// and returns what the job must be granted: environment and device nodes.
type devicePreparer struct {
	host    *hardware.Host
	holders hardware.Holders
	// placer learns the MIG instances created for jobs.
	placer interface {
		NoteMIG(jobID string, a api.MIGAllocation, start int)
	}
	log *slog.Logger
	// migMu serialises MIG reconfiguration: two jobs placed in one pass
	// must not plan the same free slots.
	migMu sync.Mutex
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
				inst, start, err := d.createMIG(ctx, gm, m)
				if err != nil {
					d.Release(j)
					return grant, err
				}
				m.Instance = inst
				if d.placer != nil {
					d.placer.NoteMIG(j.ID, *m, start)
				}
				m.Start = start
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
		// Program returns at once when the region already holds the
		// bitstream and is healthy; asking every time also covers a region
		// whose last programming failed after the engine placed the job.
		res, err := fm.Program(ctx, f.Region, f.Bitstream)
		if err != nil {
			d.Release(j)
			return grant, fmt.Errorf("programming FPGA region %s: %w", f.Region, err)
		}
		if res.Duration > 0 {
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

// createMIG creates one instance of the profile on the allocated GPU, at
// the slot the engine chose when the driver allows it, else wherever free
// slots allow, never touching instances that hold work. It returns the
// instance's UUID and start slot.
func (d *devicePreparer) createMIG(ctx context.Context, gm *nvidia.Manager, m *api.MIGAllocation) (string, int, error) {
	d.migMu.Lock()
	defer d.migMu.Unlock()
	busy := nvidia.Busy(d.holders.HeldDevices())
	delete(busy, m.GPU) // the GPU is "held" by this very job until its instance exists
	exact := []nvidia.Action{{Kind: nvidia.CreateInstance, GPUUUID: m.GPU, Profile: m.Profile, Start: m.Start}}
	if err := gm.Apply(ctx, exact, busy); err == nil {
		if uuid := findInstance(ctx, gm, m.GPU, m.Profile, m.Start); uuid != "" {
			d.log.Info("MIG instance created for job", "gpu", m.GPU, "profile", m.Profile, "start", m.Start, "instance", uuid)
			return uuid, m.Start, nil
		}
	} else {
		d.log.Info("MIG slot chosen by the engine not usable; planning another", "gpu", m.GPU, "profile", m.Profile, "start", m.Start, "err", err)
	}
	state, err := gm.State(ctx, busy)
	if err != nil {
		return "", 0, fmt.Errorf("MIG state: %w", err)
	}
	cands, err := nvidia.PlanOnDemand(state, m.Profile)
	if err != nil {
		return "", 0, fmt.Errorf("no room for a %s instance: %w", m.Profile, err)
	}
	for _, c := range cands {
		if c.GPUUUID != m.GPU {
			continue
		}
		inst, err := gm.ApplyOnDemand(ctx, c, busy)
		if err != nil {
			return "", 0, fmt.Errorf("creating a %s instance on %s: %w", m.Profile, m.GPU, err)
		}
		d.log.Info("MIG instance created on demand", "gpu", m.GPU, "profile", m.Profile, "instance", inst.UUID, "start", inst.Start, "cost", c.Cost)
		return inst.UUID, inst.Start, nil
	}
	return "", 0, fmt.Errorf("GPU %s has no room for a %s instance without touching running work", m.GPU, m.Profile)
}

// findInstance returns the UUID of the instance of profile at start on gpu.
func findInstance(ctx context.Context, gm *nvidia.Manager, gpu, profile string, start int) string {
	state, err := gm.State(ctx, nil)
	if err != nil {
		return ""
	}
	for _, g := range state.GPUs {
		if g.UUID != gpu {
			continue
		}
		for _, in := range g.Instances {
			if in.Profile == profile && in.Start == start {
				return in.UUID
			}
		}
	}
	return ""
}

// Reclaim admits again the GPU share of a job re-attached after a daemon
// restart, so share admission counts it.
func (d *devicePreparer) Reclaim(j *api.Job) error {
	s := j.Allocation.GPUShare
	if s == nil || d.host.GPUs() == nil {
		return nil
	}
	return d.host.GPUs().AdmitShare(context.Background(),
		nvidia.Share{ID: j.ID, GPU: s.GPU, Milli: s.Milli, MemoryMB: uint64(max(s.MemoryMB, 0))})
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

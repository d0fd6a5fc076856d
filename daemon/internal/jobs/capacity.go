package jobs

import (
	"fmt"
	"sync"

	"github.com/fusiond/fusiond/daemon/api"
)

// CapacityPlacer is the simplest Placer: it counts CPU and memory against
// the host's totals and has no devices. It places a gang only if every
// member fits at once.
type CapacityPlacer struct {
	mu   sync.Mutex
	cap  api.NodeResources
	used api.NodeResources
	held map[string]api.Allocation
}

var (
	_ Placer    = (*CapacityPlacer)(nil)
	_ Reclaimer = (*CapacityPlacer)(nil)
)

// NewCapacityPlacer returns a placer for a host with the given totals.
func NewCapacityPlacer(capacity api.NodeResources) *CapacityPlacer {
	return &CapacityPlacer{cap: capacity, held: map[string]api.Allocation{}}
}

// Admit rejects specs that exceed the host or ask for devices it lacks.
func (p *CapacityPlacer) Admit(s api.JobSpec) error {
	r := s.Resources
	switch {
	case r.CPU > p.cap.CPU:
		return unsatisfiable("resources.cpu", "asks for %s CPU; this host has %s", r.CPU, p.cap.CPU)
	case r.Memory > p.cap.Memory:
		return unsatisfiable("resources.memory", "asks for %s of memory; this host has %s", r.Memory, p.cap.Memory)
	case r.GPU != nil && p.cap.GPUs == 0:
		return unsatisfiable("resources.gpu", "this host has no GPUs")
	case r.GPU != nil && r.GPU.Share == 0 && r.GPU.MIG == "" && r.GPU.Count > p.cap.GPUs:
		return unsatisfiable("resources.gpu.count", "asks for %d GPUs; this host has %d", r.GPU.Count, p.cap.GPUs)
	case r.FPGA != nil && p.cap.FPGAs == 0:
		return unsatisfiable("resources.fpga", "this host has no FPGAs")
	}
	return nil
}

func unsatisfiable(field, format string, args ...any) *api.Error {
	return &api.Error{Code: api.CodeUnsatisfiable, Field: field, Message: fmt.Sprintf(format, args...)}
}

// Place reserves CPU and memory for every job in group, or for none.
func (p *CapacityPlacer) Place(group []*api.Job) ([]api.Allocation, string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var cpu api.MilliCPU
	var mem api.Bytes
	for _, j := range group {
		cpu += j.Spec.Resources.CPU
		mem += j.Spec.Resources.Memory
	}
	freeCPU, freeMem := p.cap.CPU-p.used.CPU, p.cap.Memory-p.used.Memory
	if cpu > freeCPU || mem > freeMem {
		return nil, fmt.Sprintf("needs %s CPU and %s memory; %s CPU and %s free", cpu, mem.Human(), freeCPU, freeMem.Human()), false
	}
	out := make([]api.Allocation, len(group))
	for i, j := range group {
		a := api.Allocation{
			CPU: j.Spec.Resources.CPU, Memory: j.Spec.Resources.Memory, NUMANode: -1,
			Explain: fmt.Sprintf("%s CPU, %s memory from the shared pool", j.Spec.Resources.CPU, j.Spec.Resources.Memory),
		}
		p.held[j.ID] = a
		p.used.CPU += a.CPU
		p.used.Memory += a.Memory
		out[i] = a
	}
	return out, "", true
}

// Reclaim re-reserves the allocation a re-attached job already holds, even
// beyond capacity (the job is running whether or not it fits).
func (p *CapacityPlacer) Reclaim(j *api.Job) error {
	if j.Allocation == nil {
		return fmt.Errorf("job %s has no allocation", j.ID)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.held[j.ID]; ok {
		return nil
	}
	a := *j.Allocation
	p.held[j.ID] = a
	p.used.CPU += a.CPU
	p.used.Memory += a.Memory
	return nil
}

// Release returns a job's reservation; releasing twice is harmless.
func (p *CapacityPlacer) Release(j *api.Job) {
	p.mu.Lock()
	defer p.mu.Unlock()
	a, ok := p.held[j.ID]
	if !ok {
		return
	}
	delete(p.held, j.ID)
	p.used.CPU -= a.CPU
	p.used.Memory -= a.Memory
}

// Capacity is the host's total.
func (p *CapacityPlacer) Capacity() api.NodeResources { return p.cap }

// Allocated is what running and placed jobs hold.
func (p *CapacityPlacer) Allocated() api.NodeResources {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used
}

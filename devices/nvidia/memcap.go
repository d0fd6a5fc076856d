package nvidia

import "sort"

// ShareMemory is what one share's processes hold of a time-sliced GPU's
// memory, from NVML's running compute processes (a telemetry Sample's
// Processes), beside the share's cap.
type ShareMemory struct {
	// GPU is the GPU UUID; Job the share's ID (the job's).
	GPU string `json:"gpu"`
	Job string `json:"job"`
	// UsedMB sums the memory of the job's processes on the GPU; CapMB is
	// the share's memory cap.
	UsedMB uint64 `json:"usedMB"`
	CapMB  uint64 `json:"capMB"`
	// PIDs are the job's processes on the GPU, ascending.
	PIDs []uint32 `json:"pids,omitempty"`
}

// Over is true when the share's processes hold more than its cap.
func (s ShareMemory) Over() bool { return s.UsedMB > s.CapMB }

// TimeSlicedShareMemory sums, per share with a memory cap on a
// time-sliced GPU, the memory its processes hold on that GPU: owner names
// the job a process belongs to ("" for none: processes of no job, or of
// a job without a share there, are not counted against anyone). GPUs in
// MPS mode are left out (MPS enforces their caps), and so are GPUs whose
// sample could not read the processes (Missing "processes"): their use is
// unknown, not zero. Shares come out ordered by GPU then job; a share
// whose job has no process on its GPU is reported at 0.
func TimeSlicedShareMemory(samples []Sample, shares []ShareStatus, owner func(pid uint32) string) []ShareMemory {
	byGPU := make(map[string]*Sample, len(samples))
	for i := range samples {
		byGPU[samples[i].UUID] = &samples[i]
	}
	var out []ShareMemory
	for _, st := range shares {
		if st.Mode != ModeTimeSlicing || len(st.Shares) == 0 {
			continue
		}
		s := byGPU[st.GPU]
		if s == nil || missing(s, "processes") {
			continue
		}
		caps := map[string]int{} // job → index in out
		for _, sh := range st.Shares {
			if sh.MemoryMB == 0 {
				continue // no cap asked for
			}
			caps[sh.ID] = len(out)
			out = append(out, ShareMemory{GPU: st.GPU, Job: sh.ID, CapMB: sh.MemoryMB})
		}
		if len(caps) == 0 {
			continue
		}
		for _, p := range s.Processes {
			i, ok := caps[owner(p.PID)]
			if !ok {
				continue
			}
			out[i].UsedMB += p.MemoryMB
			out[i].PIDs = append(out[i].PIDs, p.PID)
		}
	}
	for i := range out {
		sort.Slice(out[i].PIDs, func(a, b int) bool { return out[i].PIDs[a] < out[i].PIDs[b] })
	}
	sort.SliceStable(out, func(a, b int) bool {
		if out[a].GPU != out[b].GPU {
			return out[a].GPU < out[b].GPU
		}
		return out[a].Job < out[b].Job
	})
	return out
}

func missing(s *Sample, what string) bool {
	for _, m := range s.Missing {
		if m == what {
			return true
		}
	}
	return false
}

package nvidia

import (
	"fmt"
	"math"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// MemorySlots is the number of memory slices every MIG-capable GPU of the
// supported generations (A100, H100, H200, B200) is cut into; compute slices
// number seven.
const (
	MemorySlots   = 8
	ComputeSlices = 7
)

// Profile is a MIG GPU-instance profile of one GPU model, with the name
// operators use ("1g.10gb", "1g.10gb+me").
type Profile struct {
	// Name is the operator name, e.g. "3g.40gb".
	Name string `json:"name"`
	// ID is NVML's GPU-instance profile id (nvml.GPU_INSTANCE_PROFILE_*).
	ID int `json:"id"`
	// Slices is the number of compute slices ("3g" = 3).
	Slices int `json:"slices"`
	// MemSlots is the number of the GPU's eight memory slots it occupies.
	MemSlots int `json:"memSlots"`
	// MemoryMB is the instance's memory as NVML reports it.
	MemoryMB uint64 `json:"memoryMB"`
	// MaxCount is the most instances of this profile one GPU can hold.
	MaxCount int `json:"maxCount"`
	// Media is true for "+me" profiles that own the media engines.
	Media bool `json:"media,omitempty"`
	// SMs is the number of streaming multiprocessors.
	SMs int `json:"sms"`
}

// Starts lists the slot start positions NVIDIA allows for this profile:
// an instance occupies slots [start, start+MemSlots).
//
// The rules (NVIDIA MIG user guide, "placements" of nvidia-smi mig -lgipp)
// are the same on A100, H100, H200 and B200:
//
//	1g (1 slot):  0..6      1g double memory (2 slots): 0,2,4,6
//	2g (2 slots): 0,2,4     3g (4 slots): 0,4    4g (4 slots): 0   7g: 0
func (p Profile) Starts() []int {
	switch {
	case p.Slices == 7 || p.MemSlots >= MemorySlots:
		return []int{0}
	case p.Slices == 4:
		return []int{0}
	case p.Slices == 3:
		return []int{0, 4}
	case p.Slices == 2:
		return []int{0, 2, 4}
	case p.Slices == 1 && p.MemSlots == 2:
		return []int{0, 2, 4, 6}
	case p.Slices == 1:
		return []int{0, 1, 2, 3, 4, 5, 6}
	}
	return nil
}

// profileName derives the operator name from compute slices, instance
// memory and total device memory. The memory figure is the instance's
// share of the device rounded to the nearest eighth (memory slot), times
// the device's size in whole GB rounded up — which reproduces NVIDIA's
// published names (1g.5gb on A100-40GB, 1g.18gb on H200, 1g.23gb on B200).
func profileName(slices int, memMB, totalMB uint64, media bool) string {
	slots := memSlots(memMB, totalMB)
	totalGB := math.Ceil(float64(totalMB) / 1024)
	gb := int(math.Round(float64(slots) / MemorySlots * totalGB))
	name := fmt.Sprintf("%dg.%dgb", slices, gb)
	if media {
		name += "+me"
	}
	return name
}

func memSlots(memMB, totalMB uint64) int {
	if totalMB == 0 {
		return 0
	}
	s := int(math.Round(float64(memMB) / float64(totalMB) * MemorySlots))
	return max(1, min(s, MemorySlots))
}

// candidateProfileIDs are the GPU-instance profile ids fusiond knows how to
// name; other ids (graphics, "-me", "+gfx") are ignored.
var candidateProfileIDs = []int{
	nvml.GPU_INSTANCE_PROFILE_1_SLICE,
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1,
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2,
	nvml.GPU_INSTANCE_PROFILE_2_SLICE,
	nvml.GPU_INSTANCE_PROFILE_3_SLICE,
	nvml.GPU_INSTANCE_PROFILE_4_SLICE,
	nvml.GPU_INSTANCE_PROFILE_7_SLICE,
}

// profilesFromInfo builds the named profile list from NVML profile infos.
// totalMB is the device memory in MiB.
func profilesFromInfo(infos []nvml.GpuInstanceProfileInfo, totalMB uint64) []Profile {
	out := make([]Profile, 0, len(infos))
	for _, in := range infos {
		media := in.Id == nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1
		out = append(out, Profile{
			Name:     profileName(int(in.SliceCount), in.MemorySizeMB, totalMB, media),
			ID:       int(in.Id),
			Slices:   int(in.SliceCount),
			MemSlots: memSlots(in.MemorySizeMB, totalMB),
			MemoryMB: in.MemorySizeMB,
			MaxCount: int(in.InstanceCount),
			Media:    media,
			SMs:      int(in.MultiprocessorCount),
		})
	}
	sort.Slice(out, func(a, b int) bool {
		if out[a].Slices != out[b].Slices {
			return out[a].Slices < out[b].Slices
		}
		if out[a].MemoryMB != out[b].MemoryMB {
			return out[a].MemoryMB < out[b].MemoryMB
		}
		return !out[a].Media && out[b].Media
	})
	return out
}

// ProfileSet is the profiles of one GPU model, looked up by name.
type ProfileSet []Profile

// ByName returns the profile with the given operator name.
func (ps ProfileSet) ByName(name string) (Profile, bool) {
	for _, p := range ps {
		if p.Name == name {
			return p, true
		}
	}
	return Profile{}, false
}

// ByID returns the profile with the given NVML id.
func (ps ProfileSet) ByID(id int) (Profile, bool) {
	for _, p := range ps {
		if p.ID == id {
			return p, true
		}
	}
	return Profile{}, false
}

// Names lists the profile names in order.
func (ps ProfileSet) Names() []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Name
	}
	return out
}

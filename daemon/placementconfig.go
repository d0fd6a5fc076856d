package daemon

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/sched"
)

// PlacementConfig tunes the placement engine's scoring (docs/scheduling.md,
// "Scoring").
type PlacementConfig struct {
	// Profiles overrides weights of the class profiles, per class and
	// dimension (compute, locality, fragmentation, energy, load,
	// priority); the dimensions a class does not name keep their default
	// weight.
	Profiles map[api.Class]map[string]float64 `json:"profiles,omitempty"`
}

// validate reports the first bad key (as its config path) and why.
func (p PlacementConfig) validate() (string, error) {
	for _, class := range slices.Sorted(maps.Keys(p.Profiles)) {
		key := "placement.profiles." + string(class)
		if !slices.Contains(api.Classes, class) {
			return key, fmt.Errorf("unknown class (want training, inference, batch or service)")
		}
		for _, dim := range slices.Sorted(maps.Keys(p.Profiles[class])) {
			w := p.Profiles[class][dim]
			if _, ok := sched.ParseDimension(dim); !ok {
				names := make([]string, 0, sched.NumDims)
				for d := range sched.NumDims {
					names = append(names, d.String())
				}
				return key + "." + dim, fmt.Errorf("unknown dimension (want one of %s)", strings.Join(names, ", "))
			}
			if w < 0 || math.IsNaN(w) || math.IsInf(w, 0) {
				return key + "." + dim, fmt.Errorf("weight must be a non-negative number, got %v", w)
			}
		}
		total := 0.0
		for _, w := range p.profiles()[class] {
			total += w
		}
		if total == 0 {
			return key, fmt.Errorf("every weight of the profile is 0: nothing would tell placements apart")
		}
	}
	return "", nil
}

// profiles is the engine's weight profiles: the defaults with the
// configured weights over them.
func (p PlacementConfig) profiles() sched.Profiles {
	out := sched.DefaultProfiles()
	for class, dims := range p.Profiles {
		w := out[class]
		for name, v := range dims {
			if d, ok := sched.ParseDimension(name); ok {
				w[d] = v
			}
		}
		out[class] = w
	}
	return out
}

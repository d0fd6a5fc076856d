package nvidia

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// ErrLayout marks an invalid MIG layout file.
var ErrLayout = errors.New("nvidia: invalid MIG layout")

// LayoutFile is a MIG layout file in NVIDIA mig-parted's format:
//
//	version: v1
//	mig-configs:
//	  all-1g.10gb:
//	    - devices: all
//	      mig-enabled: true
//	      mig-devices:
//	        "1g.10gb": 7
type LayoutFile struct {
	Version    string                   `json:"version"`
	MigConfigs map[string][]LayoutEntry `json:"mig-configs"`
}

// LayoutEntry is one entry of a named configuration: which GPUs, and what
// they should hold.
type LayoutEntry struct {
	// DeviceFilter optionally restricts the entry to GPUs whose PCI device
	// id (e.g. "0x233010DE") or model name matches one of the values.
	DeviceFilter StringList `json:"device-filter,omitempty"`
	// Devices is "all" or a list of GPU indices.
	Devices    DeviceSelector `json:"devices"`
	MigEnabled bool           `json:"mig-enabled"`
	// MigDevices maps profile names to instance counts.
	MigDevices map[string]int `json:"mig-devices,omitempty"`
}

// StringList accepts either a single string or a list of strings.
type StringList []string

// UnmarshalJSON implements json.Unmarshaler.
func (s *StringList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = StringList{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("device-filter: want a string or a list of strings: %w", err)
	}
	*s = many
	return nil
}

// DeviceSelector is "all" or a list of GPU indices.
type DeviceSelector struct {
	All     bool
	Indices []int
	set     bool
}

// UnmarshalJSON implements json.Unmarshaler.
func (d *DeviceSelector) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		if s != "all" {
			return fmt.Errorf("devices: %q is not \"all\" or a list of GPU indices", s)
		}
		*d = DeviceSelector{All: true, set: true}
		return nil
	}
	var idx []int
	if err := json.Unmarshal(b, &idx); err != nil {
		return fmt.Errorf("devices: want \"all\" or a list of GPU indices: %w", err)
	}
	for _, i := range idx {
		if i < 0 {
			return fmt.Errorf("devices: negative GPU index %d", i)
		}
	}
	*d = DeviceSelector{Indices: idx, set: true}
	return nil
}

// MarshalJSON implements json.Marshaler.
func (d DeviceSelector) MarshalJSON() ([]byte, error) {
	if d.All {
		return json.Marshal("all")
	}
	return json.Marshal(d.Indices)
}

// Matches reports whether GPU index i is selected.
func (d DeviceSelector) Matches(i int) bool {
	if d.All {
		return true
	}
	for _, j := range d.Indices {
		if j == i {
			return true
		}
	}
	return false
}

var profileNameRE = regexp.MustCompile(`^[1-9][0-9]*g\.[1-9][0-9]*gb(\+me|\+gfx|-me)?$`)

// ParseLayout decodes a mig-parted layout file strictly: unknown fields,
// a wrong version, malformed profile names and negative counts are errors
// that name the offending field.
func ParseLayout(data []byte) (*LayoutFile, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrLayout, err)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	var f LayoutFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrLayout, err)
	}
	if err := f.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrLayout, err)
	}
	return &f, nil
}

func (f *LayoutFile) validate() error {
	if f.Version != "v1" {
		return fmt.Errorf("version: got %q, want \"v1\"", f.Version)
	}
	if len(f.MigConfigs) == 0 {
		return errors.New("mig-configs: no configurations")
	}
	for _, name := range f.ConfigNames() {
		entries := f.MigConfigs[name]
		if len(entries) == 0 {
			return fmt.Errorf("mig-configs.%s: no entries", name)
		}
		for i, e := range entries {
			where := fmt.Sprintf("mig-configs.%s[%d]", name, i)
			if !e.Devices.set {
				return fmt.Errorf("%s.devices: missing (want \"all\" or a list of indices)", where)
			}
			if !e.MigEnabled && len(e.MigDevices) > 0 {
				return fmt.Errorf("%s.mig-devices: set while mig-enabled is false", where)
			}
			for p, n := range e.MigDevices {
				if !profileNameRE.MatchString(p) {
					return fmt.Errorf("%s.mig-devices: %q is not a MIG profile name like \"1g.10gb\"", where, p)
				}
				if n < 0 || n > ComputeSlices*2 {
					return fmt.Errorf("%s.mig-devices.%s: count %d out of range", where, p, n)
				}
			}
		}
	}
	return nil
}

// ConfigNames lists the configuration names, sorted.
func (f *LayoutFile) ConfigNames() []string {
	out := make([]string, 0, len(f.MigConfigs))
	for k := range f.MigConfigs {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// GPUTarget is what one GPU should look like.
type GPUTarget struct {
	MIGEnabled bool
	// Counts maps profile names to instance counts.
	Counts map[string]int
}

// Target maps GPU index to its desired state; GPUs not in the map are left
// alone.
type Target map[int]GPUTarget

// Resolve selects configuration name and applies it to the inventory. A GPU
// matched by two entries is an error.
func (f *LayoutFile) Resolve(name string, gpus []GPU) (Target, error) {
	entries, ok := f.MigConfigs[name]
	if !ok {
		return nil, fmt.Errorf("%w: mig-configs: no configuration %q (have %s)", ErrLayout, name, strings.Join(f.ConfigNames(), ", "))
	}
	t := Target{}
	for i, e := range entries {
		for _, idx := range e.Devices.Indices {
			if idx >= len(gpus) {
				return nil, fmt.Errorf("%w: mig-configs.%s[%d].devices: GPU %d does not exist (host has %d)", ErrLayout, name, i, idx, len(gpus))
			}
		}
		for _, g := range gpus {
			if !e.Devices.Matches(g.Index) || !e.DeviceFilter.matches(g) {
				continue
			}
			if _, dup := t[g.Index]; dup {
				return nil, fmt.Errorf("%w: mig-configs.%s[%d]: GPU %d already selected by an earlier entry", ErrLayout, name, i, g.Index)
			}
			counts := map[string]int{}
			for p, n := range e.MigDevices {
				if n > 0 {
					counts[p] = n
				}
			}
			t[g.Index] = GPUTarget{MIGEnabled: e.MigEnabled, Counts: counts}
		}
	}
	return t, nil
}

func (s StringList) matches(g GPU) bool {
	if len(s) == 0 {
		return true
	}
	for _, f := range s {
		if strings.EqualFold(f, g.PCIDeviceID) || strings.EqualFold(f, g.Model) {
			return true
		}
	}
	return false
}

// Package rapl reads CPU package power from the Linux powercap interface
// (Intel RAPL, also used by the kernel for AMD packages): the package
// zones /sys/class/powercap/intel-rapl:N, their cumulative energy
// counters (energy_uj) and the range they wrap at (max_energy_range_uj).
// It owns the conversion of two counter readings into watts, including
// the counter's wrap-around. The root is injectable so tests run on
// fixture trees.
package rapl

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DefaultRoot is where the kernel exposes powercap zones.
const DefaultRoot = "/sys/class/powercap"

// ErrNoZones: the root has no RAPL package zone (no powercap driver, a
// virtual machine, or a CPU without RAPL).
var ErrNoZones = errors.New("rapl: no intel-rapl package zones")

// packageZone matches the top-level zones (one per package); sub-zones
// (intel-rapl:0:0, core/uncore/dram) are not read.
var packageZone = regexp.MustCompile(`^intel-rapl:[0-9]+$`)

// Zone is one package zone.
type Zone struct {
	// Dir is the zone's directory name ("intel-rapl:0").
	Dir string
	// Name is the kernel's name for it ("package-0").
	Name string
	// MaxEnergyUJ is the value energy_uj wraps at.
	MaxEnergyUJ uint64
}

// Reading is one zone's power over the interval between two reads.
type Reading struct {
	Zone string
	// EnergyUJ is the counter now.
	EnergyUJ uint64
	// PowerW is the mean power since the previous read; Valid is false on
	// the first read (no interval yet) or when the interval is not
	// positive.
	PowerW float64
	Valid  bool
}

// Meter reads the package zones under a root. It is not safe for
// concurrent use (each read updates the previous counters).
type Meter struct {
	root  string
	zones []Zone
	prev  []uint64
	at    time.Time
}

// Open finds the package zones under root (DefaultRoot when empty).
func Open(root string) (*Meter, error) {
	if root == "" {
		root = DefaultRoot
	}
	ents, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s does not exist", ErrNoZones, root)
	}
	if err != nil {
		return nil, fmt.Errorf("rapl: %w", err)
	}
	m := &Meter{root: root}
	for _, e := range ents {
		if !packageZone.MatchString(e.Name()) {
			continue
		}
		dir := filepath.Join(root, e.Name())
		name, err := os.ReadFile(filepath.Join(dir, "name"))
		if err != nil {
			return nil, fmt.Errorf("rapl: zone %s: %w", e.Name(), err)
		}
		maxE, err := readUint(filepath.Join(dir, "max_energy_range_uj"))
		if err != nil {
			return nil, fmt.Errorf("rapl: zone %s: %w", e.Name(), err)
		}
		if maxE == 0 {
			return nil, fmt.Errorf("rapl: zone %s: max_energy_range_uj is 0", e.Name())
		}
		m.zones = append(m.zones, Zone{Dir: e.Name(), Name: strings.TrimSpace(string(name)), MaxEnergyUJ: maxE})
	}
	if len(m.zones) == 0 {
		return nil, fmt.Errorf("%w under %s", ErrNoZones, root)
	}
	slices.SortFunc(m.zones, func(a, b Zone) int { return zoneNum(a.Dir) - zoneNum(b.Dir) })
	return m, nil
}

func zoneNum(dir string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(dir, "intel-rapl:"))
	return n
}

// Zones are the package zones, in package order.
func (m *Meter) Zones() []Zone { return slices.Clone(m.zones) }

// Read reads every zone's counter at now and returns each zone's power
// since the previous Read.
func (m *Meter) Read(now time.Time) ([]Reading, error) {
	out := make([]Reading, len(m.zones))
	cur := make([]uint64, len(m.zones))
	for i, z := range m.zones {
		e, err := readUint(filepath.Join(m.root, z.Dir, "energy_uj"))
		if err != nil {
			return nil, fmt.Errorf("rapl: zone %s: %w", z.Dir, err)
		}
		cur[i] = e
		out[i] = Reading{Zone: z.Name, EnergyUJ: e}
		if m.prev != nil {
			if dt := now.Sub(m.at); dt > 0 {
				out[i].PowerW = float64(Delta(m.prev[i], e, z.MaxEnergyUJ)) / 1e6 / dt.Seconds()
				out[i].Valid = true
			}
		}
	}
	m.prev, m.at = cur, now
	return out, nil
}

// Delta is the energy used between two readings of a counter that wraps
// to 0 after maxRange (max_energy_range_uj): a counter that went down
// wrapped once.
func Delta(prev, cur, maxRange uint64) uint64 {
	if cur >= prev {
		return cur - prev
	}
	return maxRange - prev + cur
}

func readUint(file string) (uint64, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", filepath.Base(file), err)
	}
	return v, nil
}

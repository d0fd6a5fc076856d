package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// MilliCPU is an amount of CPU in thousandths of a core. It decodes from a
// number of cores (2, 0.5) or a string ("2", "500m", "1.5").
type MilliCPU int64

// ParseMilliCPU parses "2", "0.25", "500m".
func ParseMilliCPU(s string) (MilliCPU, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, errors.New("empty CPU quantity")
	}
	if m, ok := strings.CutSuffix(s, "m"); ok {
		v, err := strconv.ParseInt(m, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("invalid CPU quantity %q: want cores (2, 0.5) or millicores (500m)", s)
		}
		return MilliCPU(v), nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("invalid CPU quantity %q: want cores (2, 0.5) or millicores (500m)", s)
	}
	return coresToMilli(f)
}

func coresToMilli(f float64) (MilliCPU, error) {
	if math.Abs(f) > 1e9 {
		return 0, fmt.Errorf("CPU quantity %g is out of range", f)
	}
	m := f * 1000
	if m != math.Trunc(m) {
		return 0, fmt.Errorf("CPU quantity %g is finer than a millicore", f)
	}
	return MilliCPU(m), nil
}

// Cores returns the amount as a number of cores.
func (c MilliCPU) Cores() float64 { return float64(c) / 1000 }

func (c MilliCPU) String() string {
	if c%1000 == 0 {
		return strconv.FormatInt(int64(c)/1000, 10)
	}
	return strconv.FormatInt(int64(c), 10) + "m"
}

// MarshalJSON writes the canonical string form ("2", "500m").
func (c MilliCPU) MarshalJSON() ([]byte, error) { return json.Marshal(c.String()) }

// UnmarshalJSON accepts a number of cores or a quantity string.
func (c *MilliCPU) UnmarshalJSON(b []byte) error {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	switch x := v.(type) {
	case float64:
		m, err := coresToMilli(x)
		if err != nil {
			return err
		}
		*c = m
	case string:
		m, err := ParseMilliCPU(x)
		if err != nil {
			return err
		}
		*c = m
	default:
		return fmt.Errorf("invalid CPU quantity %s: want cores (2, 0.5) or millicores (\"500m\")", b)
	}
	return nil
}

// Bytes is an amount of memory. It decodes from a number of bytes or a
// string with a binary (Ki, Mi, Gi, Ti) or decimal (k, M, G, T) suffix.
type Bytes int64

var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"Pi", 1 << 50}, {"Ei", 1 << 60},
	{"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15}, {"E", 1e18},
}

// MiB is b in mebibytes rounded up, the placement engine's memory unit
// (sched.Node and sched.Request count MiB): a request never gets less than
// it asked for.
func (b Bytes) MiB() int64 { return (int64(b) + 1<<20 - 1) >> 20 }

// WholeMiB is b in whole mebibytes (rounded down): what a host or a recorded
// allocation offers the engine.
func (b Bytes) WholeMiB() int64 { return int64(b) >> 20 }

// BytesOfMiB is mib mebibytes.
func BytesOfMiB(mib int64) Bytes { return Bytes(mib << 20) }

// ParseBytes parses "4Gi", "512Mi", "1G", "1048576".
func ParseBytes(s string) (Bytes, error) {
	s = strings.TrimSpace(s)
	num, mult := s, int64(1)
	for _, u := range byteUnits {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, mult = n, u.mult
			break
		}
	}
	if num == "" {
		return 0, fmt.Errorf("invalid memory quantity %q: want bytes or a unit such as 512Mi, 4Gi, 1G", s)
	}
	if i, err := strconv.ParseInt(num, 10, 64); err == nil {
		if i != 0 && (i > math.MaxInt64/mult || i < math.MinInt64/mult) {
			return 0, fmt.Errorf("memory quantity %q is out of range", s)
		}
		return Bytes(i * mult), nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("invalid memory quantity %q: want bytes or a unit such as 512Mi, 4Gi, 1G", s)
	}
	v := f * float64(mult)
	if math.Abs(v) >= math.MaxInt64 {
		return 0, fmt.Errorf("memory quantity %q is out of range", s)
	}
	return Bytes(v), nil
}

func (b Bytes) String() string {
	for _, u := range []struct {
		s string
		m int64
	}{{"Ti", 1 << 40}, {"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}} {
		if b != 0 && int64(b)%u.m == 0 {
			return strconv.FormatInt(int64(b)/u.m, 10) + u.s
		}
	}
	return strconv.FormatInt(int64(b), 10)
}

// MarshalJSON writes the canonical string form ("4Gi").
func (b Bytes) MarshalJSON() ([]byte, error) { return json.Marshal(b.String()) }

// UnmarshalJSON accepts a number of bytes or a quantity string.
func (b *Bytes) UnmarshalJSON(data []byte) error {
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	switch x := v.(type) {
	case float64:
		if x != math.Trunc(x) || math.Abs(x) >= math.MaxInt64 {
			return fmt.Errorf("invalid memory quantity %s", data)
		}
		*b = Bytes(x)
	case string:
		q, err := ParseBytes(x)
		if err != nil {
			return err
		}
		*b = q
	default:
		return fmt.Errorf("invalid memory quantity %s: want bytes or a string such as \"4Gi\"", data)
	}
	return nil
}

// Human is a rounded, readable form for tables ("23.5Gi").
func (b Bytes) Human() string {
	v := float64(b)
	for _, u := range []string{"", "Ki", "Mi", "Gi", "Ti"} {
		if v < 1024 || u == "Ti" {
			if v == float64(int64(v)) {
				return fmt.Sprintf("%d%s", int64(v), u)
			}
			return fmt.Sprintf("%.1f%s", v, u)
		}
		v /= 1024
	}
	return b.String()
}

// Duration is a time span written as a Go duration string ("2ms",
// "500us", "1.5s").
type Duration time.Duration

// String formats the duration.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes the duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON parses a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string such as \"2ms\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

package profile

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"
)

// The file format: one JSON object naming itself, its version and every
// profile's state.
const (
	fileFormat  = "fusiond-profiles"
	fileVersion = 1
	// MaxFileBytes bounds what Load reads.
	MaxFileBytes = 256 << 20
)

type file struct {
	Format   string    `json:"format"`
	Version  int       `json:"version"`
	Saved    time.Time `json:"saved"`
	Profiles []*entry  `json:"profiles"`
}

// Save writes every profile to w, sorted by key.
func (b *Book) Save(w io.Writer) error {
	b.mu.Lock()
	f := file{Format: fileFormat, Version: fileVersion, Saved: b.o.Now().UTC()}
	for _, e := range b.m {
		c := *e
		c.Runtime = e.Runtime.clone()
		for i := range c.Typical {
			c.Typical[i] = e.Typical[i].clone()
			c.Peak[i] = e.Peak[i].clone()
		}
		f.Profiles = append(f.Profiles, &c)
	}
	b.mu.Unlock()
	slices.SortFunc(f.Profiles, func(x, y *entry) int { return x.Key.less(y.Key) })
	bw := bufio.NewWriter(w)
	if err := json.NewEncoder(bw).Encode(&f); err != nil {
		return fmt.Errorf("profile: save: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("profile: save: %w", err)
	}
	return nil
}

// Load reads a Book that Save wrote. A file that is not one, of another
// version, larger than MaxFileBytes, or with any profile out of bounds
// is an error and no Book. When it holds more than o's MaxPerOwner
// profiles of an owner, that owner's least recently seen are dropped;
// then, when it holds more than MaxProfiles, the least recently seen.
func Load(r io.Reader, o Options) (*Book, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("profile: load: %w", err)
	}
	lr := &io.LimitedReader{R: r, N: MaxFileBytes + 1}
	dec := json.NewDecoder(lr)
	dec.DisallowUnknownFields()
	var f file
	if err := dec.Decode(&f); err != nil {
		if lr.N <= 0 {
			return nil, fmt.Errorf("profile: load: larger than %d bytes", MaxFileBytes)
		}
		return nil, fmt.Errorf("profile: load: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("profile: load: data after the profiles")
	}
	if f.Format != fileFormat {
		return nil, fmt.Errorf("profile: load: format %q, want %q", f.Format, fileFormat)
	}
	if f.Version != fileVersion {
		return nil, fmt.Errorf("profile: load: version %d, this daemon reads %d", f.Version, fileVersion)
	}
	b := New(o)
	for i, e := range f.Profiles {
		if e == nil {
			return nil, fmt.Errorf("profile: load: profile %d: null", i)
		}
		if err := e.check(); err != nil {
			return nil, fmt.Errorf("profile: load: profile %d: %w", i, err)
		}
		if _, dup := b.m[e.Key]; dup {
			return nil, fmt.Errorf("profile: load: profile %d: key %q/%q/%q twice", i, e.Key.Owner, e.Key.Name, e.Key.Class)
		}
		b.putLocked(e)
	}
	for owner, n := range b.owners {
		b.evictLocked(n-b.o.MaxPerOwner, owner, true)
	}
	b.evictLocked(len(b.m)-b.o.MaxProfiles, "", false)
	return b, nil
}

// check is what Load asks of a stored profile.
func (e *entry) check() error {
	if err := e.Key.Validate(); err != nil {
		return err
	}
	switch {
	case e.Runs < 0 || e.SampledRuns < 0 || e.OKRuns < 0 || e.SampledRuns > e.Runs || e.OKRuns > e.Runs:
		return fmt.Errorf("run counts %d/%d/%d inconsistent", e.Runs, e.SampledRuns, e.OKRuns)
	case !finite(e.W) || !finite(e.FailW) || e.W < 0 || e.FailW < 0 || e.FailW > e.W*(1+1e-9):
		return fmt.Errorf("weights %v/%v inconsistent", e.W, e.FailW)
	case e.Ref.IsZero():
		return errors.New("no reference time")
	}
	if err := e.Requested.validate("requested"); err != nil {
		return err
	}
	if err := e.Runtime.check(); err != nil {
		return fmt.Errorf("runtime: %w", err)
	}
	for i := range e.Typical {
		if err := e.Typical[i].check(); err != nil {
			return fmt.Errorf("typical %s: %w", metricNames[i], err)
		}
		if err := e.Peak[i].check(); err != nil {
			return fmt.Errorf("peak %s: %w", metricNames[i], err)
		}
	}
	return nil
}

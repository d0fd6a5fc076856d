package fpga

import (
	"fmt"
	"slices"

	"github.com/fusiond/fusiond/devices/fpga/bitstream"
)

// Plan is the pure decision of what programming b into a region takes.
type Plan struct {
	Region    string `json:"region"`
	Bitstream string `json:"bitstream"`
	// AlreadyLoaded: the region holds b; nothing needs to be done.
	AlreadyLoaded bool `json:"already_loaded"`
}

// PlanProgram checks b against r without touching anything. loadedID is
// the library ID the region is known to hold ("" if unknown). It refuses
// a format the back end does not program, a bitstream built for another
// static region interface, and a DFL payload the PR engine cannot take.
func PlanProgram(r Region, loadedID string, b bitstream.Bitstream) (Plan, error) {
	h := b.Header
	p := Plan{Region: r.ID, Bitstream: b.ID}
	if !slices.Contains(r.Accepts, h.Format) {
		return p, fmt.Errorf("%w: region %s (%s) programs %v, bitstream %q is %s", ErrIncompatible, r.ID, r.Kind, r.Accepts, b.Name, h.Format)
	}
	if !h.InterfaceID.IsZero() && !r.InterfaceID.IsZero() && h.InterfaceID != r.InterfaceID {
		return p, fmt.Errorf("%w: bitstream %q was built for interface %s, but region %s's static region is %s; rebuild it against this shell or pick another card",
			ErrInterfaceMismatch, b.Name, h.InterfaceID, r.ID, r.InterfaceID)
	}
	if r.Kind == KindDFL && h.PayloadSize%4 != 0 {
		return p, fmt.Errorf("%w: bitstream %q PR payload is %d bytes, not a multiple of 4", ErrIncompatible, b.Name, h.PayloadSize)
	}
	switch {
	case loadedID != "":
		p.AlreadyLoaded = loadedID == b.ID
	case !r.Loaded.AFUID.IsZero():
		p.AlreadyLoaded = r.Loaded.AFUID == h.AFUID
	}
	return p, nil
}

// Package forge writes bitstream files in the real container formats
// (OPAE .gbs, XRT .xclbin, Xilinx .bit, raw .bin) byte by byte, with a
// deterministic pseudo-random payload of any size. Tests use it to build
// realistic files, and the simulated host uses it for its sample
// bitstreams. It never holds a whole payload in memory.
//
// It imports bitstream and the standard library.
package forge

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"

	"github.com/fusiond/fusiond/devices/fpga/bitstream"
)

// Payload writes n deterministic pseudo-random bytes derived from seed,
// starting with the Xilinx sync word so raw images look like real ones.
func Payload(w io.Writer, n int64, seed uint64) error {
	r := rand.New(rand.NewPCG(seed, 0x6670676140))
	buf := make([]byte, 64<<10)
	first := true
	for n > 0 {
		k := min(int64(len(buf)), n)
		for i := 0; i < len(buf); i += 8 {
			binary.LittleEndian.PutUint64(buf[i:], r.Uint64())
		}
		if first {
			copy(buf, []byte{0xff, 0xff, 0xff, 0xff, 0xaa, 0x99, 0x55, 0x66})
			first = false
		}
		if _, err := w.Write(buf[:k]); err != nil {
			return fmt.Errorf("forge payload: %w", err)
		}
		n -= k
	}
	return nil
}

// GBS describes an OPAE green bitstream.
type GBS struct {
	InterfaceID, AFUID bitstream.UUID
	AFUName            string
	Platform           string
	PayloadSize        int64
	Seed               uint64
}

// GBSHeader returns the GUID, length and JSON metadata that precede the payload.
func GBSHeader(g GBS) []byte {
	md := map[string]any{
		"version":       1,
		"platform-name": g.Platform,
		"afu-image": map[string]any{
			"magic-no":             bitstream.GBSMagic,
			"interface-uuid":       g.InterfaceID.String(),
			"clock-frequency-high": 312.5,
			"power":                25,
			"accelerator-clusters": []map[string]any{{
				"name":                  g.AFUName,
				"total-contexts":        1,
				"accelerator-type-uuid": g.AFUID.String(),
			}},
		},
	}
	js, _ := json.Marshal(md) // plain maps of strings and numbers always marshal
	out := append([]byte{}, bitstream.GBSGUID[:]...)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(js)))
	return append(out, js...)
}

// WriteGBS writes a whole .gbs file.
func WriteGBS(w io.Writer, g GBS) error {
	if _, err := w.Write(GBSHeader(g)); err != nil {
		return fmt.Errorf("forge gbs: %w", err)
	}
	return Payload(w, g.PayloadSize, g.Seed)
}

// Xclbin describes an XRT xclbin2 file with one BITSTREAM section.
type Xclbin struct {
	InterfaceID, UUID bitstream.UUID
	VBNV              string
	PayloadSize       int64
	Seed              uint64
}

// xclbin layout constants (struct axlf in XRT's xclbin.h).
const (
	axlfHeaderOff = 304
	axlfSections  = axlfHeaderOff + 152
	sectionSize   = 40
)

// XclbinHeader returns the axlf header and one section header; the
// section's data (PayloadSize bytes) follows it directly.
func XclbinHeader(x Xclbin) []byte {
	le := binary.LittleEndian
	h := make([]byte, axlfSections+sectionSize)
	copy(h, "xclbin2\x00")
	le.PutUint32(h[8:], 0xffffffff) // m_signature_length = -1: unsigned
	for i := 12; i < 40; i++ {
		h[i] = 0xff // reserved
	}
	le.PutUint64(h[296:], 0x1234) // m_uniqueId
	le.PutUint64(h[axlfHeaderOff:], uint64(len(h))+uint64(x.PayloadSize))
	le.PutUint64(h[axlfHeaderOff+8:], 1700000000)
	le.PutUint16(h[axlfHeaderOff+24:], 0) // patch
	h[axlfHeaderOff+26], h[axlfHeaderOff+27] = 2, 16
	copy(h[axlfHeaderOff+32:], x.InterfaceID[:])
	copy(h[axlfHeaderOff+48:axlfHeaderOff+112], x.VBNV)
	copy(h[axlfHeaderOff+112:], x.UUID[:])
	le.PutUint32(h[axlfHeaderOff+144:], 1)
	s := h[axlfSections:]
	le.PutUint32(s, 0) // BITSTREAM
	copy(s[4:20], "bitstream")
	le.PutUint64(s[24:], uint64(len(h)))
	le.PutUint64(s[32:], uint64(x.PayloadSize))
	return h
}

// WriteXclbin writes a whole .xclbin file.
func WriteXclbin(w io.Writer, x Xclbin) error {
	if _, err := w.Write(XclbinHeader(x)); err != nil {
		return fmt.Errorf("forge xclbin: %w", err)
	}
	return Payload(w, x.PayloadSize, x.Seed)
}

// Bit describes a Xilinx .bit file.
type Bit struct {
	Design, Part, Date, Time string
	PayloadSize              int64
	Seed                     uint64
}

// BitHeader returns the tagged .bit header up to and including the 'e'
// field's length.
func BitHeader(b Bit) []byte {
	h := []byte{0x00, 0x09, 0x0f, 0xf0, 0x0f, 0xf0, 0x0f, 0xf0, 0x0f, 0xf0, 0x00, 0x00, 0x01}
	for _, f := range []struct {
		tag byte
		v   string
	}{{'a', b.Design}, {'b', b.Part}, {'c', b.Date}, {'d', b.Time}} {
		h = append(h, f.tag)
		h = binary.BigEndian.AppendUint16(h, uint16(len(f.v)+1))
		h = append(append(h, f.v...), 0)
	}
	h = append(h, 'e')
	return binary.BigEndian.AppendUint32(h, uint32(b.PayloadSize))
}

// WriteBit writes a whole .bit file.
func WriteBit(w io.Writer, b Bit) error {
	if _, err := w.Write(BitHeader(b)); err != nil {
		return fmt.Errorf("forge bit: %w", err)
	}
	return Payload(w, b.PayloadSize, b.Seed)
}

// Package bitstream parses and validates FPGA bitstream headers (Intel
// OPAE .gbs, AMD/Xilinx XRT .xclbin, raw Xilinx .bit and .bin) and keeps a
// content-addressed (sha256) library of bitstreams in a directory.
//
// The parsers are pure: they take the first bytes of a file (at most
// HeadSize) and the file's total size, and never read the payload, so a
// 100 MB bitstream is hashed and validated in one streaming pass.
//
// It imports only the standard library.
package bitstream

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// HeadSize is the largest prefix of a file the parsers look at.
const HeadSize = 1 << 20

// Format names a bitstream container format.
type Format string

const (
	// FormatGBS is Intel OPAE's green bitstream: GUID, metadata length,
	// JSON metadata, then the partial-reconfiguration payload.
	FormatGBS Format = "gbs"
	// FormatXclbin is XRT's xclbin2 container (struct axlf).
	FormatXclbin Format = "xclbin"
	// FormatBit is a Xilinx .bit file: a tagged header then raw data.
	FormatBit Format = "bit"
	// FormatBin is a raw bitstream (Xilinx .bin or Intel .rbf) that the
	// kernel fpga_manager loads as is.
	FormatBin Format = "bin"
)

// Sentinel errors callers branch on.
var (
	// ErrUnknownFormat: the content matches none of the known formats.
	ErrUnknownFormat = errors.New("unknown bitstream format")
	// ErrMalformed: the content claims a format but violates it.
	ErrMalformed = errors.New("malformed bitstream")
)

// GBSGUID is the GUID that opens every .gbs file ("XeonFPGA\xb7GBSv001").
var GBSGUID = UUID{0x58, 0x65, 0x6f, 0x6e, 0x46, 0x50, 0x47, 0x41, 0xb7, 0x47, 0x42, 0x53, 0x76, 0x30, 0x30, 0x31}

// GBSMagic is the afu-image "magic-no" OPAE's packager writes.
const GBSMagic = 0x1d1f8680

// xclbinMagic opens every xclbin2 file.
var xclbinMagic = []byte("xclbin2\x00")

// bitPreamble is the fixed start of a Xilinx .bit header: a 2-byte length
// (9), nine bytes of 0f f0 ... 00, and a 2-byte length (1).
var bitPreamble = []byte{0x00, 0x09, 0x0f, 0xf0, 0x0f, 0xf0, 0x0f, 0xf0, 0x0f, 0xf0, 0x00, 0x00, 0x01}

// xilinxSync is the configuration sync word every Xilinx bitstream carries.
var xilinxSync = []byte{0xaa, 0x99, 0x55, 0x66}

// Header is what the parsers learn from a bitstream's header.
type Header struct {
	Format Format `json:"format"`
	// InterfaceID is the static region (FIU / shell) interface the image
	// was built against: GBS interface-uuid, xclbin m_interface_uuid.
	// Zero when the format carries none (.bit, .bin).
	InterfaceID UUID `json:"interface_id,omitzero"`
	// AFUID identifies the accelerator: GBS accelerator-type-uuid of the
	// first cluster, xclbin uuid. Zero for .bit/.bin.
	AFUID UUID `json:"afu_id,omitzero"`
	// Platform is the GBS platform-name or the xclbin platform VBNV.
	Platform string `json:"platform,omitempty"`
	// AFUName is the GBS accelerator cluster name.
	AFUName string `json:"afu_name,omitempty"`
	// Version is the container version (GBS "version", xclbin major.minor.patch).
	Version string `json:"version,omitempty"`
	// Sections is the number of xclbin sections.
	Sections int `json:"sections,omitempty"`
	// Design, Part, Date, Time are the Xilinx .bit header fields a-d.
	Design string `json:"design,omitempty"`
	Part   string `json:"part,omitempty"`
	Date   string `json:"date,omitempty"`
	Time   string `json:"time,omitempty"`
	// XilinxSync is set for a raw .bin whose first 4 KiB hold the Xilinx
	// configuration sync word AA995566.
	XilinxSync bool `json:"xilinx_sync,omitempty"`
	// PayloadOffset and PayloadSize locate the configuration data that
	// is handed to the device (after the GBS metadata, after the .bit
	// header; the whole file for xclbin and .bin).
	PayloadOffset int64 `json:"payload_offset"`
	PayloadSize   int64 `json:"payload_size"`
}

// Parse detects the format from the content and parses the header. head
// is the file's first bytes (at least min(size, HeadSize) of them); size
// is the file's total length. name is only used to admit a raw .bin/.rbf
// that carries no recognisable header.
func Parse(head []byte, size int64, name string) (Header, error) {
	switch {
	case len(head) >= 16 && bytes.Equal(head[:16], GBSGUID[:]):
		return ParseGBS(head, size)
	case bytes.HasPrefix(head, xclbinMagic[:7]):
		return ParseXclbin(head, size)
	case bytes.HasPrefix(head, bitPreamble):
		return ParseBit(head, size)
	}
	lower := strings.ToLower(name)
	if strings.HasSuffix(lower, ".bin") || strings.HasSuffix(lower, ".rbf") {
		return ParseBin(head, size)
	}
	return Header{}, fmt.Errorf("%w: not a .gbs, .xclbin or .bit file, and not named .bin/.rbf", ErrUnknownFormat)
}

func checkHead(head []byte, size int64) error {
	if size < int64(len(head)) {
		return fmt.Errorf("%w: size %d smaller than the %d header bytes read", ErrMalformed, size, len(head))
	}
	return nil
}

// gbsMetadata is the subset of OPAE's GBS JSON metadata we read.
type gbsMetadata struct {
	Version      json.Number `json:"version"`
	PlatformName string      `json:"platform-name"`
	AFUImage     struct {
		MagicNo       *uint64      `json:"magic-no"`
		InterfaceUUID string       `json:"interface-uuid"`
		Clusters      []gbsCluster `json:"accelerator-clusters"`
		// OldClusters is the pre-release spelling (afc-clusters, afc-type-uuid).
		OldClusters []gbsCluster `json:"afc-clusters"`
	} `json:"afu-image"`
}

type gbsCluster struct {
	Name        string `json:"name"`
	TypeUUID    string `json:"accelerator-type-uuid"`
	OldTypeUUID string `json:"afc-type-uuid"`
}

// ParseGBS parses an OPAE green bitstream: 16-byte GUID, little-endian
// uint32 metadata length, JSON metadata, PR payload.
func ParseGBS(head []byte, size int64) (Header, error) {
	h := Header{Format: FormatGBS}
	if err := checkHead(head, size); err != nil {
		return h, err
	}
	if len(head) < 20 || !bytes.Equal(head[:16], GBSGUID[:]) {
		return h, fmt.Errorf("%w: gbs: missing GUID %s", ErrMalformed, GBSGUID)
	}
	mlen := int64(binary.LittleEndian.Uint32(head[16:20]))
	if 20+mlen > int64(len(head)) {
		return h, fmt.Errorf("%w: gbs: metadata length %d exceeds the %d bytes available", ErrMalformed, mlen, int64(len(head))-20)
	}
	var md gbsMetadata
	dec := json.NewDecoder(bytes.NewReader(head[20 : 20+mlen]))
	dec.UseNumber()
	if err := dec.Decode(&md); err != nil {
		return h, fmt.Errorf("%w: gbs: metadata JSON: %v", ErrMalformed, err)
	}
	ai := md.AFUImage
	if ai.MagicNo == nil || *ai.MagicNo != GBSMagic {
		return h, fmt.Errorf("%w: gbs: afu-image magic-no is not %#x", ErrMalformed, GBSMagic)
	}
	var err error
	if h.InterfaceID, err = ParseUUID(ai.InterfaceUUID); err != nil {
		return h, fmt.Errorf("gbs: interface-uuid: %w", err)
	}
	clusters := append(ai.Clusters, ai.OldClusters...)
	if len(clusters) == 0 {
		return h, fmt.Errorf("%w: gbs: no accelerator-clusters", ErrMalformed)
	}
	c := clusters[0]
	if c.TypeUUID == "" {
		c.TypeUUID = c.OldTypeUUID
	}
	if h.AFUID, err = ParseUUID(c.TypeUUID); err != nil {
		return h, fmt.Errorf("gbs: accelerator-type-uuid: %w", err)
	}
	h.AFUName = c.Name
	h.Platform = md.PlatformName
	h.Version = md.Version.String()
	h.PayloadOffset = 20 + mlen
	h.PayloadSize = size - h.PayloadOffset
	if h.PayloadSize <= 0 {
		return h, fmt.Errorf("%w: gbs: no PR payload after the metadata", ErrMalformed)
	}
	return h, nil
}

// Offsets in XRT's struct axlf (xclbin.h), little endian.
const (
	axlfHeaderOff   = 304 // after magic, signature length, reserved, key block, unique id
	axlfLengthOff   = axlfHeaderOff + 0
	axlfVersionOff  = axlfHeaderOff + 24 // patch u16, major u8, minor u8
	axlfIfUUIDOff   = axlfHeaderOff + 32
	axlfVBNVOff     = axlfHeaderOff + 48
	axlfUUIDOff     = axlfHeaderOff + 112
	axlfNumSectOff  = axlfHeaderOff + 144
	axlfSectionsOff = axlfHeaderOff + 152
	axlfSectionSize = 40 // kind u32, name [16], pad, offset u64, size u64
	maxSections     = 4096
)

// ParseXclbin parses the axlf header of an xclbin2 file and checks that
// every section lies inside the file.
func ParseXclbin(head []byte, size int64) (Header, error) {
	h := Header{Format: FormatXclbin}
	if err := checkHead(head, size); err != nil {
		return h, err
	}
	if !bytes.HasPrefix(head, xclbinMagic) {
		return h, fmt.Errorf("%w: xclbin: magic is not \"xclbin2\"", ErrMalformed)
	}
	if len(head) < axlfSectionsOff {
		return h, fmt.Errorf("%w: xclbin: %d bytes, shorter than the axlf header", ErrMalformed, len(head))
	}
	le := binary.LittleEndian
	if l := le.Uint64(head[axlfLengthOff:]); l != uint64(size) {
		return h, fmt.Errorf("%w: xclbin: header length %d, file size %d", ErrMalformed, l, size)
	}
	h.Version = fmt.Sprintf("%d.%d.%d", head[axlfVersionOff+2], head[axlfVersionOff+3], le.Uint16(head[axlfVersionOff:]))
	copy(h.InterfaceID[:], head[axlfIfUUIDOff:axlfIfUUIDOff+16])
	copy(h.AFUID[:], head[axlfUUIDOff:axlfUUIDOff+16])
	h.Platform = cString(head[axlfVBNVOff : axlfVBNVOff+64])
	if h.AFUID.IsZero() {
		return h, fmt.Errorf("%w: xclbin: uuid is zero", ErrMalformed)
	}
	n := le.Uint32(head[axlfNumSectOff:])
	if n > maxSections {
		return h, fmt.Errorf("%w: xclbin: %d sections", ErrMalformed, n)
	}
	end := int64(axlfSectionsOff) + int64(n)*axlfSectionSize
	if end > int64(len(head)) {
		return h, fmt.Errorf("%w: xclbin: %d section headers do not fit in %d bytes", ErrMalformed, n, len(head))
	}
	for i := int64(0); i < int64(n); i++ {
		s := head[axlfSectionsOff+i*axlfSectionSize:]
		off, sz := le.Uint64(s[24:]), le.Uint64(s[32:])
		if off > uint64(size) || sz > uint64(size)-off {
			return h, fmt.Errorf("%w: xclbin: section %d (%q) [%d,+%d) outside the %d-byte file", ErrMalformed, i, cString(s[4:20]), off, sz, size)
		}
	}
	h.Sections = int(n)
	h.PayloadOffset, h.PayloadSize = 0, size
	return h, nil
}

// ParseBit parses a Xilinx .bit header: the fixed preamble, then fields
// tagged 'a' (design name), 'b' (part), 'c' (date), 'd' (time), each a
// big-endian uint16 length and a NUL-terminated string, then 'e' with a
// big-endian uint32 length of the raw configuration data that follows.
func ParseBit(head []byte, size int64) (Header, error) {
	h := Header{Format: FormatBit}
	if err := checkHead(head, size); err != nil {
		return h, err
	}
	if !bytes.HasPrefix(head, bitPreamble) {
		return h, fmt.Errorf("%w: bit: missing header preamble", ErrMalformed)
	}
	p := head[len(bitPreamble):]
	off := int64(len(bitPreamble))
	fields := map[byte]*string{'a': &h.Design, 'b': &h.Part, 'c': &h.Date, 'd': &h.Time}
	seen := map[byte]bool{}
	for {
		if len(p) < 1 {
			return h, fmt.Errorf("%w: bit: header ends before the 'e' field", ErrMalformed)
		}
		tag := p[0]
		if tag == 'e' {
			if len(p) < 5 {
				return h, fmt.Errorf("%w: bit: truncated 'e' field", ErrMalformed)
			}
			n := int64(binary.BigEndian.Uint32(p[1:5]))
			h.PayloadOffset = off + 5
			h.PayloadSize = n
			if h.PayloadOffset+n != size {
				return h, fmt.Errorf("%w: bit: data length %d at offset %d, file size %d", ErrMalformed, n, h.PayloadOffset, size)
			}
			break
		}
		dst, ok := fields[tag]
		if !ok {
			return h, fmt.Errorf("%w: bit: unexpected field tag %#x at offset %d", ErrMalformed, tag, off)
		}
		if seen[tag] {
			return h, fmt.Errorf("%w: bit: field %q repeated", ErrMalformed, tag)
		}
		seen[tag] = true
		if len(p) < 3 {
			return h, fmt.Errorf("%w: bit: truncated field %q", ErrMalformed, tag)
		}
		n := int(binary.BigEndian.Uint16(p[1:3]))
		if n == 0 || len(p) < 3+n {
			return h, fmt.Errorf("%w: bit: field %q length %d", ErrMalformed, tag, n)
		}
		*dst = strings.TrimSpace(cString(p[3 : 3+n]))
		p = p[3+n:]
		off += int64(3 + n)
	}
	if h.Part == "" {
		return h, fmt.Errorf("%w: bit: no part name ('b' field)", ErrMalformed)
	}
	return h, nil
}

// ParseBin admits a raw bitstream (.bin/.rbf): raw data carries no
// identity, so any non-empty content that is not a packaged format is
// admitted and only its size is recorded. XilinxSync tells whether the
// Xilinx configuration sync word appears near the start.
func ParseBin(head []byte, size int64) (Header, error) {
	h := Header{Format: FormatBin, PayloadSize: size, XilinxSync: HasXilinxSync(head)}
	if err := checkHead(head, size); err != nil {
		return h, err
	}
	if size == 0 {
		return h, fmt.Errorf("%w: bin: empty file", ErrMalformed)
	}
	if bytes.HasPrefix(head, xclbinMagic[:7]) || bytes.HasPrefix(head, bitPreamble) {
		return h, fmt.Errorf("%w: bin: content is a packaged bitstream, not raw data", ErrMalformed)
	}
	return h, nil
}

// HasXilinxSync reports whether the sync word appears in the first 4 KiB.
func HasXilinxSync(head []byte) bool {
	return bytes.Contains(head[:min(len(head), 4096)], xilinxSync)
}

func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

package bitstream_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/devices/fpga/bitstream"
	"github.com/fusiond/fusiond/devices/fpga/bitstream/forge"
)

var (
	ifA  = mustUUID("9346116d-a52d-5ca8-b06a-a9a389ef7c8d")
	ifB  = mustUUID("a5d72a3c-c8b0-4939-912c-f715e5dc10ca")
	afu1 = mustUUID("d8424dc4-a4a3-c413-f89e-433683f9040b")
)

func mustUUID(s string) bitstream.UUID {
	u, err := bitstream.ParseUUID(s)
	if err != nil {
		panic(err)
	}
	return u
}

func build(t testing.TB, write func(*bytes.Buffer) error) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := write(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func head(b []byte) []byte { return b[:min(len(b), bitstream.HeadSize)] }

func TestParseUUIDForms(t *testing.T) {
	for _, s := range []string{"d8424dc4-a4a3-c413-f89e-433683f9040b", "D8424DC4A4A3C413F89E433683F9040B\n", "0xd8424dc4a4a3c413f89e433683f9040b"} {
		u, err := bitstream.ParseUUID(s)
		if err != nil || u != afu1 {
			t.Errorf("ParseUUID(%q) = %v, %v; want %v", s, u, err, afu1)
		}
	}
	if _, err := bitstream.ParseUUID("d8424dc4"); !errors.Is(err, bitstream.ErrMalformed) {
		t.Errorf("short uuid: err %v, want ErrMalformed", err)
	}
	if afu1.Hex() != "d8424dc4a4a3c413f89e433683f9040b" {
		t.Errorf("Hex = %s", afu1.Hex())
	}
}

func TestParseGBS(t *testing.T) {
	g := forge.GBS{InterfaceID: ifA, AFUID: afu1, AFUName: "nlb_400", Platform: "a10_gx_pac", PayloadSize: 4096, Seed: 1}
	data := build(t, func(b *bytes.Buffer) error { return forge.WriteGBS(b, g) })
	h, err := bitstream.Parse(head(data), int64(len(data)), "x.gbs")
	if err != nil {
		t.Fatal(err)
	}
	if h.Format != bitstream.FormatGBS || h.InterfaceID != ifA || h.AFUID != afu1 || h.AFUName != "nlb_400" || h.Platform != "a10_gx_pac" {
		t.Errorf("header = %+v", h)
	}
	if h.PayloadSize != 4096 || h.PayloadOffset+h.PayloadSize != int64(len(data)) {
		t.Errorf("payload at %d size %d, file %d", h.PayloadOffset, h.PayloadSize, len(data))
	}
	if !bytes.Equal(data[h.PayloadOffset:h.PayloadOffset+8], []byte{0xff, 0xff, 0xff, 0xff, 0xaa, 0x99, 0x55, 0x66}) {
		t.Errorf("payload does not start where the parser says")
	}
}

// TestParseGBSOldSpelling accepts the pre-release afc-clusters/afc-type-uuid keys.
func TestParseGBSOldSpelling(t *testing.T) {
	js := `{"version": 1, "platform-name": "DCP", "afu-image": {"magic-no": 488605312,
	 "interface-uuid": "` + ifA.String() + `", "afc-clusters": [{"total-contexts": 1, "name": "nlb_400",
	 "afc-type-uuid": "` + strings.ToUpper(afu1.String()) + `"}]}}`
	data := append([]byte("XeonFPGA\xb7GBSv001"), byte(len(js)), byte(len(js)>>8), 0, 0)
	data = append(append(data, js...), 1, 2, 3, 4)
	h, err := bitstream.ParseGBS(data, int64(len(data)))
	if err != nil || h.AFUID != afu1 || h.InterfaceID != ifA || h.AFUName != "nlb_400" || h.PayloadSize != 4 {
		t.Fatalf("old spelling: %+v %v", h, err)
	}
}

func TestParseGBSRejects(t *testing.T) {
	good := forge.GBSHeader(forge.GBS{InterfaceID: ifA, AFUID: afu1, AFUName: "n"})
	cases := map[string][]byte{
		"metadata length past end": func() []byte {
			b := bytes.Clone(good)
			binary.LittleEndian.PutUint32(b[16:], 1<<30)
			return b
		}(),
		"wrong magic-no": bytes.Replace(bytes.Clone(good), []byte("488605312"), []byte("488605313"), 1),
		"bad interface":  bytes.Replace(bytes.Clone(good), []byte(ifA.String()), []byte("not-a-uuid-at-all-00000000000000000"), 1),
		"not json":       append(append(bytes.Clone(good[:16]), 3, 0, 0, 0), "{{{"...),
		"no payload":     good,
	}
	for name, b := range cases {
		if _, err := bitstream.ParseGBS(b, int64(len(b))); !errors.Is(err, bitstream.ErrMalformed) {
			t.Errorf("%s: err %v, want ErrMalformed", name, err)
		}
	}
}

func TestParseXclbin(t *testing.T) {
	x := forge.Xclbin{InterfaceID: ifB, UUID: afu1, VBNV: "xilinx_u250_gen3x16_xdma_shell_4_1", PayloadSize: 1000, Seed: 2}
	data := build(t, func(b *bytes.Buffer) error { return forge.WriteXclbin(b, x) })
	h, err := bitstream.Parse(head(data), int64(len(data)), "k.xclbin")
	if err != nil {
		t.Fatal(err)
	}
	if h.Format != bitstream.FormatXclbin || h.InterfaceID != ifB || h.AFUID != afu1 || h.Platform != x.VBNV || h.Sections != 1 || h.Version != "2.16.0" {
		t.Errorf("header = %+v", h)
	}
	// A truncated file no longer matches the header's m_length.
	if _, err := bitstream.ParseXclbin(head(data[:len(data)-1]), int64(len(data)-1)); !errors.Is(err, bitstream.ErrMalformed) {
		t.Errorf("truncated xclbin: err %v", err)
	}
	// A section pointing past the end is refused.
	bad := bytes.Clone(data)
	binary.LittleEndian.PutUint64(bad[304+152+32:], uint64(len(data)))
	if _, err := bitstream.ParseXclbin(bad, int64(len(bad))); !errors.Is(err, bitstream.ErrMalformed) {
		t.Errorf("section out of range: err %v", err)
	}
}

func TestParseBit(t *testing.T) {
	b := forge.Bit{Design: "top;UserID=0XFFFFFFFF;Version=2023.2", Part: "xczu9eg-ffvb1156-2-e", Date: "2026/11/30", Time: "01:02:03", PayloadSize: 2048, Seed: 3}
	data := build(t, func(w *bytes.Buffer) error { return forge.WriteBit(w, b) })
	h, err := bitstream.Parse(head(data), int64(len(data)), "top.bit")
	if err != nil {
		t.Fatal(err)
	}
	if h.Format != bitstream.FormatBit || h.Design != b.Design || h.Part != b.Part || h.Date != b.Date || h.Time != b.Time {
		t.Errorf("header = %+v", h)
	}
	if h.PayloadSize != 2048 || h.PayloadOffset != int64(len(data))-2048 {
		t.Errorf("payload %d at %d", h.PayloadSize, h.PayloadOffset)
	}
	if _, err := bitstream.ParseBit(data[:len(data)-5], int64(len(data)-5)); !errors.Is(err, bitstream.ErrMalformed) {
		t.Errorf("short .bit: err %v", err)
	}
	noPart := build(t, func(w *bytes.Buffer) error { return forge.WriteBit(w, forge.Bit{Design: "d", PayloadSize: 8}) })
	if _, err := bitstream.ParseBit(noPart, int64(len(noPart))); err == nil || !strings.Contains(err.Error(), "part") {
		t.Errorf("no part: err %v", err)
	}
}

func TestParseBinAndUnknown(t *testing.T) {
	data := build(t, func(w *bytes.Buffer) error { return forge.Payload(w, 512, 4) })
	h, err := bitstream.Parse(data, int64(len(data)), "design.bin")
	if err != nil || h.Format != bitstream.FormatBin || !h.XilinxSync || h.PayloadSize != 512 {
		t.Errorf("bin: %+v %v", h, err)
	}
	if _, err := bitstream.Parse(data, int64(len(data)), "design.txt"); !errors.Is(err, bitstream.ErrUnknownFormat) {
		t.Errorf("unknown: err %v", err)
	}
	if _, err := bitstream.Parse(nil, 0, "empty.bin"); !errors.Is(err, bitstream.ErrMalformed) {
		t.Errorf("empty bin: err %v", err)
	}
}

// fuzzSeeds returns a realistic file of each format for the seed corpora.
func fuzzSeeds(f *testing.F) [][]byte {
	return [][]byte{
		build(f, func(b *bytes.Buffer) error {
			return forge.WriteGBS(b, forge.GBS{InterfaceID: ifA, AFUID: afu1, AFUName: "a", PayloadSize: 64})
		}),
		build(f, func(b *bytes.Buffer) error {
			return forge.WriteXclbin(b, forge.Xclbin{InterfaceID: ifB, UUID: afu1, VBNV: "v", PayloadSize: 64})
		}),
		build(f, func(b *bytes.Buffer) error {
			return forge.WriteBit(b, forge.Bit{Design: "d", Part: "p", Date: "x", Time: "y", PayloadSize: 64})
		}),
		{}, {0}, []byte("xclbin2\x00"),
	}
}

// fuzzParser checks a parser never panics and that what it accepts is
// self-consistent.
func fuzzParser(f *testing.F, parse func([]byte, int64) (bitstream.Header, error)) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s, int64(0))
	}
	f.Fuzz(func(t *testing.T, data []byte, extra int64) {
		size := int64(len(data)) + max(0, extra%1024)
		h, err := parse(data, size)
		if err != nil {
			return
		}
		if h.PayloadOffset < 0 || h.PayloadSize < 0 || h.PayloadOffset+h.PayloadSize > size {
			t.Fatalf("accepted header with payload [%d,+%d) outside %d bytes", h.PayloadOffset, h.PayloadSize, size)
		}
	})
}

func FuzzParseGBS(f *testing.F)    { fuzzParser(f, bitstream.ParseGBS) }
func FuzzParseXclbin(f *testing.F) { fuzzParser(f, bitstream.ParseXclbin) }
func FuzzParseBit(f *testing.F)    { fuzzParser(f, bitstream.ParseBit) }
func FuzzParseBin(f *testing.F)    { fuzzParser(f, bitstream.ParseBin) }
func FuzzParse(f *testing.F) {
	fuzzParser(f, func(b []byte, n int64) (bitstream.Header, error) { return bitstream.Parse(b, n, "f.bin") })
}

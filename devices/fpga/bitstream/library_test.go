package bitstream_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/devices/fpga/bitstream"
	"github.com/fusiond/fusiond/devices/fpga/bitstream/forge"
)

func TestLibraryAddGetRemove(t *testing.T) {
	lib, err := bitstream.OpenLibrary(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	gbs := build(t, func(b *bytes.Buffer) error {
		return forge.WriteGBS(b, forge.GBS{InterfaceID: ifA, AFUID: afu1, AFUName: "nlb", PayloadSize: 3 << 20, Seed: 9})
	})
	src := filepath.Join(t.TempDir(), "nlb_mode_0.gbs")
	if err := os.WriteFile(src, gbs, 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := lib.AddFile(src, "")
	if err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256(gbs)
	if b.ID != hex.EncodeToString(want[:]) || b.Name != "nlb_mode_0" || b.Size != int64(len(gbs)) || b.Header.AFUID != afu1 {
		t.Errorf("added %+v", b)
	}
	stored, err := os.ReadFile(b.Path)
	if err != nil || !bytes.Equal(stored, gbs) {
		t.Fatalf("stored content differs (err %v)", err)
	}
	// Same content under the same name: the existing entry comes back.
	again, err := lib.Add(bytes.NewReader(gbs), "nlb_mode_0", "x.gbs")
	if err != nil || again.ID != b.ID || again.Name != "nlb_mode_0" {
		t.Errorf("re-add: %+v %v", again, err)
	}
	// Under another name: the existing entry, and an error naming it.
	again, err = lib.Add(bytes.NewReader(gbs), "other", "x.gbs")
	if !errors.Is(err, bitstream.ErrDuplicate) || !strings.Contains(err.Error(), `"nlb_mode_0"`) || again.Name != "nlb_mode_0" {
		t.Errorf("re-add under another name: %+v %v", again, err)
	}
	// Names a job spec could not reference are refused.
	for _, name := range []string{".hidden", "a b", "a/b", "", "-x", strings.Repeat("a", 129)} {
		if _, err := lib.Add(bytes.NewReader(gbs), name, "x.gbs"); !errors.Is(err, bitstream.ErrInvalidName) {
			t.Errorf("name %q: err %v, want ErrInvalidName", name, err)
		}
	}
	// Different content under a taken name is refused.
	bit := build(t, func(w *bytes.Buffer) error {
		return forge.WriteBit(w, forge.Bit{Design: "d", Part: "xc7z020", PayloadSize: 100})
	})
	if _, err := lib.Add(bytes.NewReader(bit), "nlb_mode_0", "d.bit"); !errors.Is(err, bitstream.ErrNameTaken) {
		t.Errorf("name clash: err %v", err)
	}
	// Garbage is refused and leaves nothing behind.
	if _, err := lib.Add(bytes.NewReader([]byte("hello")), "junk", "junk.gbs"); !errors.Is(err, bitstream.ErrUnknownFormat) {
		t.Errorf("junk: err %v", err)
	}
	list, err := lib.List()
	if err != nil || len(list) != 1 {
		t.Fatalf("list %v %v", list, err)
	}
	for _, ref := range []string{b.ID, b.ID[:10], "nlb_mode_0", afu1.String(), afu1.Hex()} {
		got, err := lib.Get(ref)
		if err != nil || got.ID != b.ID {
			t.Errorf("Get(%q) = %v, %v", ref, got.ID, err)
		}
	}
	if _, err := lib.Get("nope"); !errors.Is(err, bitstream.ErrNotFound) {
		t.Errorf("Get(nope): %v", err)
	}
	if _, err := lib.Remove("nlb_mode_0"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(b.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("blob still there: %v", err)
	}
	if list, _ := lib.List(); len(list) != 0 {
		t.Errorf("list after remove: %v", list)
	}
	tmp, _ := os.ReadDir(filepath.Join(filepath.Dir(filepath.Dir(b.Path)), "tmp"))
	if len(tmp) != 0 {
		t.Errorf("temporary files left: %v", tmp)
	}
}

func TestLibraryReopen(t *testing.T) {
	dir := t.TempDir()
	lib, err := bitstream.OpenLibrary(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	bit := build(t, func(w *bytes.Buffer) error {
		return forge.WriteBit(w, forge.Bit{Design: "d", Part: "xc7z020", PayloadSize: 100})
	})
	b, err := lib.Add(bytes.NewReader(bit), "blinky", "blinky.bit")
	if err != nil {
		t.Fatal(err)
	}
	again, err := bitstream.OpenLibrary(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := again.Get("blinky")
	if err != nil || got.ID != b.ID || got.Header.Part != "xc7z020" || got.Path != b.Path {
		t.Errorf("after reopen: %+v %v", got, err)
	}
}

func TestResolveAmbiguousAFU(t *testing.T) {
	all := []bitstream.Bitstream{
		{ID: "aa" + hex.EncodeToString(make([]byte, 31)), Name: "a", Header: bitstream.Header{AFUID: afu1}},
		{ID: "bb" + hex.EncodeToString(make([]byte, 31)), Name: "b", Header: bitstream.Header{AFUID: afu1}},
	}
	if _, err := bitstream.Resolve(all, afu1.String()); !errors.Is(err, bitstream.ErrAmbiguous) {
		t.Errorf("err %v, want ErrAmbiguous", err)
	}
}

// BenchmarkAddGBS100MB measures the one-pass copy+hash+parse of a 100 MB
// .gbs into the library (MB/s is reported by -benchmem's SetBytes).
func BenchmarkAddGBS100MB(b *testing.B) {
	const size = 100 << 20
	src := filepath.Join(b.TempDir(), "big.gbs")
	f, err := os.Create(src)
	if err != nil {
		b.Fatal(err)
	}
	if err := forge.WriteGBS(f, forge.GBS{InterfaceID: ifA, AFUID: afu1, AFUName: "big", PayloadSize: size, Seed: 1}); err != nil {
		b.Fatal(err)
	}
	f.Close()
	st, _ := os.Stat(src)
	b.SetBytes(st.Size())
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		lib, err := bitstream.OpenLibrary(b.TempDir(), nil)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if _, err := lib.AddFile(src, "big"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHashParse100MB measures hashing and parsing alone (no copy).
func BenchmarkHashParse100MB(b *testing.B) {
	const size = 100 << 20
	var hdr bytes.Buffer
	hdr.Write(forge.GBSHeader(forge.GBS{InterfaceID: ifA, AFUID: afu1, AFUName: "big"}))
	var payload bytes.Buffer
	if err := forge.Payload(&payload, size, 1); err != nil {
		b.Fatal(err)
	}
	total := int64(hdr.Len() + payload.Len())
	b.SetBytes(total)
	b.ResetTimer()
	for range b.N {
		h := sha256.New()
		r := io.MultiReader(bytes.NewReader(hdr.Bytes()), bytes.NewReader(payload.Bytes()))
		head := make([]byte, bitstream.HeadSize)
		n, _ := io.ReadFull(r, head)
		h.Write(head[:n])
		if _, err := io.Copy(h, r); err != nil {
			b.Fatal(err)
		}
		if _, err := bitstream.Parse(head[:n], total, "big.gbs"); err != nil {
			b.Fatal(err)
		}
		_ = h.Sum(nil)
	}
}

// TestAddStreams checks that adding a 64 MiB bitstream allocates a small,
// bounded amount (the 1 MiB header prefix and copy buffers), not the file.
func TestAddStreams(t *testing.T) {
	src := filepath.Join(t.TempDir(), "big.gbs")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := forge.WriteGBS(f, forge.GBS{InterfaceID: ifA, AFUID: afu1, AFUName: "big", PayloadSize: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	lib, err := bitstream.OpenLibrary(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b, err := lib.AddFile(src, "")
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if b.Size <= 64<<20 {
		t.Fatalf("size %d", b.Size)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 4<<20 {
		t.Errorf("adding a %d MiB file allocated %d MiB", b.Size>>20, alloc>>20)
	}
}

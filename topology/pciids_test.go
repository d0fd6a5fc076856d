package topology

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jaypipes/pcidb"
)

// pciIDsSample is a pci.ids excerpt in the pciutils format with the cases
// the scanner must get right: comments, subsystem lines (two tabs) that
// look like device lines, a vendor without devices, a device ID repeated
// under another vendor, classes with subclasses and programming
// interfaces, CRLF line ends and a last line without a newline.
const pciIDsSample = `#
#	List of PCI ID's
#
# Vendors, devices and subsystems. Please keep sorted.
0001  SafeNet (wrong ID)
10de  NVIDIA Corporation
	2335  GH100 [H200 SXM 141GB]
		10de 18be  H200 SXM
	2330  GH100 [H100 SXM5 80GB]
	1af1  nForce2 IGP2
# a comment inside a vendor
144d  Samsung Electronics Co Ltd
	a80a  NVMe SSD Controller PM9A1/PM9A3/980PRO
15b3  Mellanox Technologies` + "\r\n" + `	1021  MT2910 Family [ConnectX-7]` + "\r\n" + `1af4  Red Hat, Inc.
	1000  Virtio network device
	2335  Not the H200
8086  Intel Corporation
	09a2  Ice Lake Memory Map/VT-d
	352a  Ethernet? no: a made-up root port
ffff  Illegal Vendor ID


# List of known device classes, subclasses and programming interfaces
C 01  Mass storage controller
	08  Non-Volatile memory controller
		02  NVM Express
C 02  Network controller
	00  Ethernet controller
	07  Infiniband controller
C 03  Display controller
	00  VGA compatible controller
		00  VGA controller
	02  3D controller
C 06  Bridge
	04  PCI bridge
		00  Normal decode
C 12  Processing accelerators
C ff  Unassigned class`

// TestLookupPCINamesMatchesPcidb checks the one-pass scanner against
// github.com/jaypipes/pcidb (what Discover used before) on the sample,
// for every vendor, device and class ID in it and some that are not.
func TestLookupPCINamesMatchesPcidb(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pci.ids")
	if err := os.WriteFile(path, []byte(pciIDsSample), 0o644); err != nil {
		t.Fatal(err)
	}
	db, err := pcidb.New(pcidb.WithDirectPath(path), pcidb.WithCacheOnly())
	if err != nil {
		t.Fatal(err)
	}
	var devs []PCIDevice
	for _, v := range []uint16{0x0001, 0x10de, 0x144d, 0x15b3, 0x1af4, 0x8086, 0xffff, 0x1234} {
		for _, dv := range []uint16{0x2335, 0x2330, 0x1af1, 0xa80a, 0x1021, 0x1000, 0x09a2, 0x352a, 0x18be, 0xbeef} {
			for _, c := range []uint32{0x010802, 0x020000, 0x020700, 0x030000, 0x030200, 0x060400, 0x120000, 0x0c0330, 0xff0000, 0x070000} {
				devs = append(devs, PCIDevice{VendorID: v, DeviceID: dv, Class: c})
			}
		}
	}
	names := lookupPCINames([]byte(pciIDsSample), devs)
	named := 0
	for _, dev := range devs {
		got, want := dev, dev
		names.name(&got)
		pcidbName(&want, db)
		if got.VendorName != want.VendorName || got.DeviceName != want.DeviceName || got.ClassName != want.ClassName {
			t.Errorf("%04x:%04x class %06x: scanner %q/%q/%q, pcidb %q/%q/%q", dev.VendorID, dev.DeviceID, dev.Class,
				got.VendorName, got.DeviceName, got.ClassName, want.VendorName, want.DeviceName, want.ClassName)
		}
		if got.DeviceName != "" {
			named++
		}
	}
	// Not vacuous: the sample names devices, and the subsystem line
	// "10de 18be" is no device 18be.
	h200 := PCIDevice{VendorID: 0x10de, DeviceID: 0x2335, Class: 0x030200}
	names.name(&h200)
	if h200.VendorName != "NVIDIA Corporation" || h200.DeviceName != "GH100 [H200 SXM 141GB]" || h200.ClassName != "3D controller" || named == 0 {
		t.Errorf("H200: %+v (%d named)", h200, named)
	}
	cx7 := PCIDevice{VendorID: 0x15b3, DeviceID: 0x1021, Class: 0x020700}
	names.name(&cx7)
	if cx7.DeviceName != "MT2910 Family [ConnectX-7]" || strings.ContainsAny(cx7.VendorName+cx7.DeviceName, "\r\n") {
		t.Errorf("CRLF lines: %q %q", cx7.VendorName, cx7.DeviceName)
	}
	// A vendor on the first line, listed again later: the first name.
	first := lookupPCINames([]byte("10de  NVIDIA\n\t2335  H200\n\t2335  again\n10de  Dup\n\t2335  Dup H200\nC 03  Display\n\t02  3D\n"), []PCIDevice{h200})
	if g := (PCIDevice{VendorID: 0x10de, DeviceID: 0x2335, Class: 0x030200}); true {
		first.name(&g)
		if g.VendorName != "NVIDIA" || g.DeviceName != "H200" || g.ClassName != "3D" {
			t.Errorf("first-line vendor: %q %q %q", g.VendorName, g.DeviceName, g.ClassName)
		}
	}
	// A scan for one device keeps only what that device needs.
	one := lookupPCINames([]byte(pciIDsSample), []PCIDevice{h200})
	if len(one.vendors) != 1 || len(one.devices) != 1 || len(one.classes) != 1 || len(one.subclasses) != 1 {
		t.Errorf("scan for one device kept %+v", one)
	}
}

// pcidbName is the lookup Discover did with pcidb before the scanner.
func pcidbName(dev *PCIDevice, db *pcidb.PCIDB) {
	if v, ok := db.Vendors[strings.ToLower(hex4(dev.VendorID))]; ok {
		dev.VendorName = v.Name
		for _, p := range v.Products {
			if p.ID == hex4(dev.DeviceID) {
				dev.DeviceName = p.Name
				break
			}
		}
	}
	if c, ok := db.Classes[hex4(uint16(dev.Class >> 16))[2:]]; ok {
		dev.ClassName = c.Name
		for _, s := range c.Subclasses {
			if s.ID == hex4(uint16(dev.Class>>8) & 0xff)[2:] {
				dev.ClassName = s.Name
				break
			}
		}
	}
}

func hex4(v uint16) string { return fmtHex32(uint32(v))[4:] }

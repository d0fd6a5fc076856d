package topology

import "bytes"

// pciNames holds the pci.ids names of the vendors, devices, classes and
// subclasses one discovery needs. lookupPCINames fills it in one pass over
// the file, keeping only the wanted IDs: parsing the whole ~1.4 MB
// database into maps (as github.com/jaypipes/pcidb does) cost 30-100 ms
// per Discover, more than reading the rest of a small host's sysfs.
type pciNames struct {
	vendors    map[uint16]string
	devices    map[uint32]string // vendor<<16 | device
	classes    map[uint8]string
	subclasses map[uint16]string // class<<8 | subclass
}

// lookupPCINames scans pci.ids (the pciutils format: "vvvv  vendor",
// "\tdddd  device", "\t\tssss ssss  subsystem", then "C cc  class",
// "\tss  subclass", "\t\tpp  prog-if"; '#' starts a comment) for the
// names of devs' IDs. A vendor, device or class listed twice keeps its
// first name. Malformed lines are skipped.
func lookupPCINames(data []byte, devs []PCIDevice) pciNames {
	want := pciNames{vendors: map[uint16]string{}, devices: map[uint32]string{}, classes: map[uint8]string{}, subclasses: map[uint16]string{}}
	wantVendor := map[uint16]bool{}
	wantDevice := map[uint32]bool{}
	wantClass := map[uint8]bool{}
	wantSub := map[uint16]bool{}
	for _, d := range devs {
		wantVendor[d.VendorID] = true
		wantDevice[uint32(d.VendorID)<<16|uint32(d.DeviceID)] = true
		wantClass[uint8(d.Class>>16)] = true
		wantSub[uint16(d.Class>>8)] = true
	}
	inClasses := false
	var vendor uint16
	var class uint8
	inWanted := false // the current vendor or class block is wanted
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		line = bytes.TrimRight(line, "\r")
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		switch {
		case line[0] == 'C' && len(line) > 1 && line[1] == ' ':
			inClasses = true
			id, name, ok := idAndName(line[2:], 2)
			inWanted = ok && wantClass[uint8(id)]
			class = uint8(id)
			if inWanted {
				if _, dup := want.classes[class]; !dup {
					want.classes[class] = string(name)
				}
			}
		case line[0] != '\t':
			inClasses = false
			id, name, ok := idAndName(line, 4)
			inWanted = ok && wantVendor[uint16(id)]
			vendor = uint16(id)
			if inWanted {
				if _, dup := want.vendors[vendor]; !dup {
					want.vendors[vendor] = string(name)
				}
			}
		case !inWanted || len(line) > 1 && line[1] == '\t':
			// Not wanted, or a subsystem or programming interface line.
		case inClasses:
			if id, name, ok := idAndName(line[1:], 2); ok {
				key := uint16(class)<<8 | uint16(id)
				if _, dup := want.subclasses[key]; wantSub[key] && !dup {
					want.subclasses[key] = string(name)
				}
			}
		default:
			if id, name, ok := idAndName(line[1:], 4); ok {
				key := uint32(vendor)<<16 | uint32(id)
				if _, dup := want.devices[key]; wantDevice[key] && !dup {
					want.devices[key] = string(name)
				}
			}
		}
	}
	return want
}

// idAndName splits "hhhh  name" (digits hex digits, two spaces).
func idAndName(line []byte, digits int) (uint64, []byte, bool) {
	if len(line) < digits+2 || line[digits] != ' ' || line[digits+1] != ' ' {
		return 0, nil, false
	}
	var id uint64
	for _, c := range line[:digits] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, nil, false
		}
		id = id<<4 | uint64(c)
	}
	return id, line[digits+2:], true
}

// name sets dev's vendor, device and class names.
func (n pciNames) name(dev *PCIDevice) {
	dev.VendorName = n.vendors[dev.VendorID]
	if dev.VendorName != "" {
		dev.DeviceName = n.devices[uint32(dev.VendorID)<<16|uint32(dev.DeviceID)]
	}
	if c, ok := n.classes[uint8(dev.Class>>16)]; ok {
		dev.ClassName = c
		if s, ok := n.subclasses[uint16(dev.Class>>8)]; ok {
			dev.ClassName = s
		}
	}
}

package topology

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// EventKind names a change between two Host models.
type EventKind string

// Event kinds.
const (
	DeviceAdded   EventKind = "device-added"
	DeviceRemoved EventKind = "device-removed"
	DeviceChanged EventKind = "device-changed"
	CPUsOnline    EventKind = "cpus-online"
	CPUsOffline   EventKind = "cpus-offline"
	NodeAdded     EventKind = "node-added"
	NodeRemoved   EventKind = "node-removed"
	NodeChanged   EventKind = "node-changed"
	DieAdded      EventKind = "die-added"
	DieRemoved    EventKind = "die-removed"
	DieChanged    EventKind = "die-changed"
	LinkAdded     EventKind = "link-added"
	LinkRemoved   EventKind = "link-removed"
	LinkChanged   EventKind = "link-changed"
)

// Event is one change. Only the fields that matter for its Kind are set.
type Event struct {
	Kind   EventKind `json:"kind"`
	Device PCIAddr   `json:"device,omitempty"`
	Node   *NodeID   `json:"node,omitempty"`
	CPUs   CPUSet    `json:"cpus,omitzero"`
	// Detail says what changed, e.g. "link_width 16 -> 8".
	Detail string `json:"detail,omitempty"`
}

func (e Event) String() string {
	var sb strings.Builder
	sb.WriteString(string(e.Kind))
	if e.Device != "" {
		sb.WriteString(" " + string(e.Device))
	}
	if e.Node != nil {
		fmt.Fprintf(&sb, " node%d", *e.Node)
	}
	if !e.CPUs.IsEmpty() {
		sb.WriteString(" cpus " + e.CPUs.String())
	}
	if e.Detail != "" {
		sb.WriteString(": " + e.Detail)
	}
	return sb.String()
}

// Diff returns the changes that turn old into new, in a stable order
// (CPUs, nodes, dies, devices by address, links). A nil Host is empty.
func Diff(old, new *Host) []Event {
	if old == nil {
		old = &Host{}
	}
	if new == nil {
		new = &Host{}
	}
	var ev []Event
	if c := old.OnlineCPUs.Difference(new.OnlineCPUs); !c.IsEmpty() {
		ev = append(ev, Event{Kind: CPUsOffline, CPUs: c})
	}
	if c := new.OnlineCPUs.Difference(old.OnlineCPUs); !c.IsEmpty() {
		ev = append(ev, Event{Kind: CPUsOnline, CPUs: c})
	}
	ev = append(ev, diffNodes(old.Nodes, new.Nodes)...)
	ev = append(ev, diffDies(old.Dies, new.Dies)...)
	ev = append(ev, diffDevices(old.Devices, new.Devices)...)
	ev = append(ev, diffLinks(old, new)...)
	return ev
}

func nodeRef(id NodeID) *NodeID { return &id }

func diffNodes(old, new []Node) []Event {
	var ev []Event
	byID := make(map[NodeID]Node, len(old))
	for _, n := range old {
		byID[n.ID] = n
	}
	seen := map[NodeID]bool{}
	for _, n := range new {
		seen[n.ID] = true
		o, ok := byID[n.ID]
		if !ok {
			ev = append(ev, Event{Kind: NodeAdded, Node: nodeRef(n.ID), CPUs: n.CPUs})
			continue
		}
		var what []string
		if !o.CPUs.Equal(n.CPUs) {
			what = append(what, fmt.Sprintf("cpus %q -> %q", o.CPUs, n.CPUs))
		}
		if o.MemoryBytes != n.MemoryBytes {
			what = append(what, fmt.Sprintf("memory_bytes %d -> %d", o.MemoryBytes, n.MemoryBytes))
		}
		if o.BlockMemoryBytes != n.BlockMemoryBytes {
			what = append(what, fmt.Sprintf("block_memory_bytes %d -> %d", o.BlockMemoryBytes, n.BlockMemoryBytes))
		}
		if !slices.Equal(o.Distances, n.Distances) {
			what = append(what, fmt.Sprintf("distances %v -> %v", o.Distances, n.Distances))
		}
		if len(what) > 0 {
			ev = append(ev, Event{Kind: NodeChanged, Node: nodeRef(n.ID), Detail: strings.Join(what, ", ")})
		}
	}
	for _, o := range old {
		if !seen[o.ID] {
			ev = append(ev, Event{Kind: NodeRemoved, Node: nodeRef(o.ID), CPUs: o.CPUs})
		}
	}
	slices.SortStableFunc(ev, func(a, b Event) int { return cmp.Compare(*a.Node, *b.Node) })
	return ev
}

// dieKey identifies a die across readings: (socket, die_id); a die
// without a die_id (-1) by its CPUs, so that its change reads as one die
// removed and another added.
func dieKey(d Die) string {
	if d.ID < 0 {
		return fmt.Sprintf("socket %d die cpus %s", d.Socket, d.CPUs)
	}
	return fmt.Sprintf("socket %d die %d", d.Socket, d.ID)
}

// diffDies reports dies appearing, vanishing or changing CPUs (a die's
// CPUs going offline or online, a kernel update adding die files).
func diffDies(old, new []Die) []Event {
	byKey := make(map[string]Die, len(old))
	for _, d := range old {
		byKey[dieKey(d)] = d
	}
	var ev []Event
	seen := map[string]bool{}
	for _, n := range new {
		k := dieKey(n)
		seen[k] = true
		o, ok := byKey[k]
		switch {
		case !ok:
			ev = append(ev, Event{Kind: DieAdded, CPUs: n.CPUs, Detail: k})
		case !o.CPUs.Equal(n.CPUs):
			ev = append(ev, Event{Kind: DieChanged, CPUs: n.CPUs, Detail: fmt.Sprintf("%s: cpus %q -> %q", k, o.CPUs, n.CPUs)})
		}
	}
	for _, o := range old {
		if k := dieKey(o); !seen[k] {
			ev = append(ev, Event{Kind: DieRemoved, CPUs: o.CPUs, Detail: k})
		}
	}
	return ev
}

func diffDevices(old, new []PCIDevice) []Event {
	var ev []Event
	byAddr := make(map[PCIAddr]*PCIDevice, len(old))
	for i := range old {
		byAddr[old[i].Addr] = &old[i]
	}
	seen := map[PCIAddr]bool{}
	for i := range new {
		n := &new[i]
		seen[n.Addr] = true
		o, ok := byAddr[n.Addr]
		if !ok {
			ev = append(ev, Event{Kind: DeviceAdded, Device: n.Addr, Detail: string(n.Kind)})
			continue
		}
		if what := deviceChanges(o, n); what != "" {
			ev = append(ev, Event{Kind: DeviceChanged, Device: n.Addr, Detail: what})
		}
	}
	for i := range old {
		if !seen[old[i].Addr] {
			ev = append(ev, Event{Kind: DeviceRemoved, Device: old[i].Addr, Detail: string(old[i].Kind)})
		}
	}
	slices.SortStableFunc(ev, func(a, b Event) int { return cmp.Compare(a.Device, b.Device) })
	return ev
}

// deviceChanges describes what differs between two readings of a device;
// names are left out (they follow pci.ids, not the hardware).
func deviceChanges(o, n *PCIDevice) string {
	var what []string
	add := func(field string, a, b any) {
		if a != b {
			what = append(what, fmt.Sprintf("%s %v -> %v", field, a, b))
		}
	}
	add("class", o.Class, n.Class)
	add("vendor_id", o.VendorID, n.VendorID)
	add("device_id", o.DeviceID, n.DeviceID)
	add("node", o.Node, n.Node)
	add("local_cpus", o.LocalCPUs.String(), n.LocalCPUs.String())
	add("host_bridge", o.HostBridge, n.HostBridge)
	add("parent", o.Parent(), n.Parent())
	add("link_speed", o.LinkSpeed, n.LinkSpeed)
	add("link_width", o.LinkWidth, n.LinkWidth)
	return strings.Join(what, ", ")
}

func linkKey(a, b string, t string) string {
	if b < a {
		a, b = b, a
	}
	return a + "|" + b + "|" + t
}

func diffLinks(old, new *Host) []Event {
	count := func(h *Host) map[string]int {
		m := map[string]int{}
		for _, l := range h.Links {
			m[linkKey(l.A, l.B, string(l.Type))] += max(l.Lanes, 1)
		}
		return m
	}
	o, n := count(old), count(new)
	var ev []Event
	for k, lanes := range n {
		if o[k] != lanes {
			f := strings.Split(k, "|")
			kind := LinkChanged
			if o[k] == 0 {
				kind = LinkAdded
			}
			ev = append(ev, Event{Kind: kind, Device: PCIAddr(f[0]), Detail: fmt.Sprintf("%s %s lanes %d -> %d", f[2], f[1], o[k], lanes)})
		}
	}
	for k, lanes := range o {
		if _, ok := n[k]; !ok {
			f := strings.Split(k, "|")
			ev = append(ev, Event{Kind: LinkRemoved, Device: PCIAddr(f[0]), Detail: fmt.Sprintf("%s %s lanes %d -> 0", f[2], f[1], lanes)})
		}
	}
	slices.SortFunc(ev, func(a, b Event) int { return cmp.Or(cmp.Compare(a.Device, b.Device), cmp.Compare(a.Detail, b.Detail)) })
	return ev
}

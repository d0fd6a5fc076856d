// Package topology is fusiond's model of the host: sockets, NUMA nodes
// (CPU sets, memory, the kernel's distance matrix), cores with their SMT
// siblings, L3 cache groups and the PCIe tree with accelerators and NICs
// marked. Discover builds a Host from a sysfs/procfs tree (the live host or
// a fixture, see WithRoot) with its own sysfs reader (CPUs, cores,
// packages, caches, NUMA nodes, PCI functions; hwloc's choices are the
// reference; every read bounded by the context and refusing FIFOs and
// devices) and pci.ids names from one scan of the file for the IDs present;
// Locality answers "how far apart are these two devices" in nvidia-smi topo
// -m vocabulary (NV#, PIX, PXB, PHB, NODE, SYS); Diff and Watcher publish
// changes; WriteTree and WriteMatrix render a Host for the CLI.
//
// Everything but discovery is a pure function of a Host value.
//
// It owns reading the host's CPU, memory and PCIe layout and may import
// devices (links reported by drivers), golang.org/x/sys/unix and the
// standard library (ghw and pcidb only in tests: ghw's real-machine
// snapshots, pcidb as the oracle of the pci.ids scan); nothing of the
// daemon.
package topology

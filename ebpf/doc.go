// Package ebpf holds fusiond's in-kernel probes: run-queue latency per job
// cgroup, recorded by BPF programs on BTF tracepoints into per-CPU log2
// histograms. See docs/qos.md.
package ebpf

// SPDX-License-Identifier: GPL-2.0
//go:build ignore

/*
 * The floor of BenchmarkProbeCost: programs on the probe's three
 * tracepoints that do nothing, so the cost the kernel counts for them is
 * that of running a tp_btf program at all (the trampoline and the stats'
 * own clock reads), measured beside the probe on the same events.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

SEC("tp_btf/sched_wakeup")
int BPF_PROG(floor_wakeup, struct task_struct *p)
{
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(floor_wakeup_new, struct task_struct *p)
{
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(floor_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	return 0;
}

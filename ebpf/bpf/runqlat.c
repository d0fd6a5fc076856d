// SPDX-License-Identifier: GPL-2.0
//go:build ignore

/*
 * Run-queue latency per job cgroup: the time from a task becoming runnable
 * (sched_wakeup, sched_wakeup_new, or being switched out while still
 * runnable) to it running (sched_switch in), recorded into a log2
 * histogram per job. Only tasks whose cgroup userspace registered in `jobs`
 * are timed, so an unrelated task costs one cgroup walk and one hash lookup.
 *
 * The job key is the cgroup's kernfs id, which equals the inode number of
 * the cgroup directory on 64-bit kernels: on cgroup v2 the task's default
 * hierarchy cgroup, on v1 (cgroup_v1 set at load time) its cpu controller's
 * cgroup, read through CO-RE (task->cgroups->subsys[cpu]->cgroup->kn->id).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#define NBUCKETS 32
#define MAX_JOBS 1024
#define MAX_RUNNABLE 16384
#define TASK_RUNNING 0

char LICENSE[] SEC("license") = "GPL";

/* Set by the loader before load: read v1's cpu controller cgroup. */
const volatile bool cgroup_v1 = false;

struct job {
	__u32 slot; /* index into hists */
	__u32 tier; /* userspace's tier number; 0 is "not a job" */
};

struct hist {
	__u64 buckets[NBUCKETS]; /* bucket i counts latencies in [2^i, 2^(i+1)) ns; 0 holds [0, 2) */
	__u64 count;
	__u64 sum_ns;
	__u64 preempt_count; /* involuntary switches out in favour of another tier's task */
	__u64 preempt_ns;    /* the run-queue time those preemptions cost */
};

struct start {
	__u64 ts;
	__u32 preempted; /* switched out by a task of another tier */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_JOBS);
	__type(key, __u64);
	__type(value, struct job);
} jobs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_RUNNABLE);
	__type(key, __u32);
	__type(value, struct start);
} starts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_JOBS);
	__type(key, __u32);
	__type(value, struct hist);
} hists SEC(".maps");

static __always_inline __u64 task_cgroup_id(struct task_struct *t)
{
	if (cgroup_v1) {
		int cpu = bpf_core_enum_value(enum cgroup_subsys_id, cpu_cgrp_id);
		return t->cgroups->subsys[cpu]->cgroup->kn->id;
	}
	return t->cgroups->dfl_cgrp->kn->id;
}

static __always_inline struct job *task_job(struct task_struct *t)
{
	__u64 id = task_cgroup_id(t);
	return bpf_map_lookup_elem(&jobs, &id);
}

static __always_inline __u32 log2_u64(__u64 v)
{
	__u32 r = 0, shift;
	shift = (v > 0xFFFFFFFFULL) << 5; v >>= shift; r |= shift;
	shift = (v > 0xFFFF) << 4; v >>= shift; r |= shift;
	shift = (v > 0xFF) << 3; v >>= shift; r |= shift;
	shift = (v > 0xF) << 2; v >>= shift; r |= shift;
	shift = (v > 0x3) << 1; v >>= shift; r |= shift;
	r |= (v >> 1);
	return r;
}

static __always_inline void enqueue(struct task_struct *t, __u32 preempted)
{
	if (!task_job(t))
		return;
	__u32 pid = t->pid;
	struct start s = { .ts = bpf_ktime_get_ns(), .preempted = preempted };
	bpf_map_update_elem(&starts, &pid, &s, BPF_ANY);
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(sched_wakeup, struct task_struct *p)
{
	enqueue(p, 0);
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(sched_wakeup_new, struct task_struct *p)
{
	enqueue(p, 0);
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	/* A task switched out while runnable waits on the run queue again. */
	struct job *nj = 0;
	bool nj_known = false;
	/* The idle task (pid 0) is switched out runnable on every wake-up of
	 * an idle CPU and is never a job's: skip its cgroup walk. */
	if (prev->pid != 0 && (preempt || prev->__state == TASK_RUNNING)) {
		struct job *pj = task_job(prev);
		if (pj) {
			nj = task_job(next);
			nj_known = true;
			__u32 nt = nj ? nj->tier : 0;
			__u32 pid = prev->pid;
			struct start s = { .ts = bpf_ktime_get_ns(), .preempted = preempt && nt != pj->tier };
			bpf_map_update_elem(&starts, &pid, &s, BPF_ANY);
		}
	}

	__u32 pid = next->pid;
	if (pid == 0)
		return 0;
	struct start *s = bpf_map_lookup_elem(&starts, &pid);
	if (!s)
		return 0;
	__u64 delta = bpf_ktime_get_ns() - s->ts;
	__u32 preempted = s->preempted;
	bpf_map_delete_elem(&starts, &pid);

	if (!nj_known)
		nj = task_job(next);
	if (!nj)
		return 0;
	__u32 slot = nj->slot;
	struct hist *h = bpf_map_lookup_elem(&hists, &slot);
	if (!h)
		return 0;
	__u32 b = log2_u64(delta);
	if (b >= NBUCKETS)
		b = NBUCKETS - 1;
	/* Older verifiers (6.1) lose the clamp's bound (clang compares a copy
	 * of b); a mask the compiler cannot drop proves it. */
	asm volatile("" : "+r"(b));
	b &= NBUCKETS - 1;
	h->buckets[b]++;
	h->count++;
	h->sum_ns += delta;
	if (preempted) {
		h->preempt_count++;
		h->preempt_ns += delta;
	}
	return 0;
}

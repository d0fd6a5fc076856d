// SPDX-License-Identifier: GPL-2.0
//go:build ignore

/*
 * Run-queue latency per job cgroup, and who held the CPU meanwhile.
 *
 * Latency: the time from a task becoming runnable (sched_wakeup,
 * sched_wakeup_new, or being switched out while still runnable) to it
 * running (sched_switch in), recorded into a log2 histogram per job. Only
 * tasks whose cgroup userspace registered in `jobs` with a slot are timed.
 *
 * Attribution: every CPU keeps a clock per class of runner (idle, each
 * fusiond tier, a fusiond job of no tier, outside fusiond, kernel
 * threads): the nanoseconds that class has held the CPU since the probe
 * was attached. A timed task's wait is charged to each class by the growth
 * of the clocks of the CPU it was queued on, from when it was queued to
 * when it runs, so the shares sum to the wait. The outside share is also
 * charged to the last outside cgroup that ran on that CPU (`offenders`).
 *
 * Classification is cached per cgroup: the key is the task's cpu css
 * pointer (cgroup v1: task->cgroups->subsys[cpu]; v2: the default
 * hierarchy cgroup), two loads the scheduler has just made hot, and the
 * entry holds the class, the slot and the cgroup id, valid while the
 * generation userspace bumps on every registration change is unchanged. A
 * miss walks the cgroup and up to three ancestors through `jobs` (so a
 * task under a tier cgroup userspace registered without a slot gets that
 * tier).
 *
 * The cgroup id is the cgroup's kernfs id, the inode number of its
 * directory on 64-bit kernels.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#define NBUCKETS 32
#define MAX_JOBS 1024
#define START_SLOTS 65536 /* a power of two: a thread's slot is its id's low bits */
#define CLASS_SLOTS 4096 /* a power of two */
#define MAX_OFFENDERS 256
#define TASK_RUNNING 0
#define PF_KTHREAD 0x00200000
#define NOSLOT 0xffffffff
#define ANCESTORS 4

/* Runner classes; 1-4 are userspace's tier numbers. */
#define C_IDLE 0
#define C_OTHER_JOB 4
#define C_OUTSIDE 5
#define C_KERNEL 6
#define NCLASS 7

char LICENSE[] SEC("license") = "GPL";

/* Set by the loader before load: read v1's cpu controller cgroup. */
const volatile bool cgroup_v1 = false;

struct job {
	__u32 slot; /* index into hists; NOSLOT: classified, not timed */
	__u32 tier; /* userspace's tier number, 1-4 */
};

struct hist {
	__u64 buckets[NBUCKETS]; /* bucket i counts latencies in [2^i, 2^(i+1)) ns; 0 holds [0, 2) */
	__u64 count;
	__u64 sum_ns;
	__u64 preempt_count;     /* involuntary switches out in favour of another tier's task */
	__u64 preempt_ns;        /* the run-queue time those preemptions cost */
	__u64 blame_ns[NCLASS];  /* the waits, by the class that held the CPU */
};

struct start {
	__u64 ts;        /* 0: no wait pending */
	__u32 pid;       /* the thread the slot holds */
	__u32 cpu;       /* the CPU it was queued on */
	__u32 preempted; /* switched out by a task of another class */
	__u32 pad;
	__u64 snap[NCLASS];
};

/* What a CPU is running and its clocks. */
struct cpu_clock {
	__u64 since;     /* when the current runner got the CPU; 0 before the first switch seen */
	__u32 cls;       /* its class */
	__u32 tslot;     /* its slot + 1 when timed, else 0 */
	__u64 last_out;  /* the cgroup id of the last outside runner */
	__u64 run[NCLASS];
};

struct class_entry {
	__u64 key; /* the css's serial_nr + 1; 0: empty or being written */
	__u64 gen;
	__u64 cgid;
	__u32 cls;
	__u32 tslot;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_JOBS);
	__type(key, __u64);
	__type(value, struct job);
} jobs SEC(".maps");

/* Pending waits by thread id modulo START_SLOTS: an array, so a lookup
 * is a few instructions where a hash map's update and delete took most of
 * a timed event's cost. Two timed threads whose ids share a slot and wait
 * at once lose the first one's wait (counted in `lost`); a slot a thread
 * left (its job unregistered while it waited) is overwritten by the next
 * wait queued there. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, START_SLOTS);
	__type(key, __u32);
	__type(value, struct start);
} starts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_JOBS);
	__type(key, __u32);
	__type(value, struct hist);
} hists SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cpu_clock);
} clocks SEC(".maps");

/* The classification cache, direct-mapped by a hash of the css pointer:
 * an array, so a hit costs a multiply and a few loads where a hash map's
 * lookup cost most of an event; two cgroups sharing a slot only walk
 * more often. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CLASS_SLOTS);
	__type(key, __u32);
	__type(value, struct class_entry);
} classes SEC(".maps");

/* Bumped by userspace after every change to jobs. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} generation SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_OFFENDERS);
	__type(key, __u64);
	__type(value, __u64);
} offenders SEC(".maps");

struct runner {
	__u64 cgid;
	__u32 cls;
	__u32 tslot;
};

static __always_inline struct cgroup_subsys_state *task_css(struct task_struct *t)
{
	if (cgroup_v1) {
		int cpu = bpf_core_enum_value(enum cgroup_subsys_id, cpu_cgrp_id);
		return t->cgroups->subsys[cpu];
	}
	return &t->cgroups->dfl_cgrp->self;
}

static __always_inline void classify(struct task_struct *t, struct runner *r)
{
	r->cgid = 0;
	r->tslot = 0;
	if (t->pid == 0) {
		r->cls = C_IDLE;
		return;
	}
	if (t->flags & PF_KTHREAD) {
		r->cls = C_KERNEL;
		return;
	}
	__u32 zero = 0;
	__u64 *genp = bpf_map_lookup_elem(&generation, &zero);
	__u64 gen = genp ? *genp : 0;
	struct cgroup_subsys_state *css = task_css(t);
	/* The css's serial number: unique for the boot, never reused; + 1,
	 * as an empty slot's key is 0 (and a root's serial may be). */
	__u64 key = css->serial_nr + 1;
	/* Fibonacci hashing: the top bits of key × 2^64/φ. */
	__u32 idx = (__u32)((key * 0x9E3779B97F4A7C15ULL) >> 52) & (CLASS_SLOTS - 1);
	struct class_entry *e = bpf_map_lookup_elem(&classes, &idx);
	if (e && *(volatile __u64 *)&e->key == key && e->gen == gen) {
		r->cgid = e->cgid;
		r->cls = e->cls;
		r->tslot = e->tslot;
		return;
	}
	r->cls = C_OUTSIDE;
	for (int i = 0; i < ANCESTORS && css; i++) {
		__u64 id = css->cgroup->kn->id;
		if (i == 0)
			r->cgid = id;
		struct job *j = bpf_map_lookup_elem(&jobs, &id);
		if (j) {
			r->cls = j->tier;
			if (i == 0 && j->slot != NOSLOT)
				r->tslot = j->slot + 1;
			break;
		}
		css = css->parent;
	}
	if (!e)
		return;
	/* Emptied while written, so a reader on another CPU does not take
	 * half of it (a read racing the refill still can: one event). */
	*(volatile __u64 *)&e->key = 0;
	e->gen = gen;
	e->cgid = r->cgid;
	e->cls = r->cls;
	e->tslot = r->tslot;
	*(volatile __u64 *)&e->key = key;
}

static __always_inline __u32 task_cpu(struct task_struct *t)
{
	return t->thread_info.cpu;
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

/* The clocks of c read at now: the settled clocks plus the current
 * runner's time so far. */
static __always_inline void read_clocks(struct cpu_clock *c, __u64 now, __u64 *out)
{
	__u32 cls = c->cls;
	__u64 since = c->since;
	for (int k = 0; k < NCLASS; k++)
		out[k] = c->run[k];
	if (since && now > since && cls < NCLASS)
		out[cls] += now - since;
}

/* A wait pending longer than this (the last histogram bucket's start) is
 * taken for one its thread left behind (its job unregistered while it
 * waited), not for one lost when overwritten. */
#define STALE_NS (1ULL << (NBUCKETS - 1))

/* The slot of thread pid, holding a wait queued at now: a wait of another
 * thread still pending there is lost. */
static __always_inline struct start *start_slot(__u32 pid, __u64 now)
{
	__u32 idx = pid & (START_SLOTS - 1);
	struct start *s = bpf_map_lookup_elem(&starts, &idx);
	if (!s)
		return 0;
	if (s->ts && s->pid != pid && now - s->ts < STALE_NS) {
		__u32 zero = 0;
		__u64 *n = bpf_map_lookup_elem(&lost, &zero);
		if (n)
			__sync_fetch_and_add(n, 1);
	}
	s->pid = pid;
	s->ts = now;
	return s;
}

/* Queue timed task pid on cpu at now. */
static __always_inline void enqueue(__u32 pid, __u32 cpu, __u64 now, __u32 preempted)
{
	__u32 zero = 0;
	struct start *s = start_slot(pid, now);
	if (!s)
		return;
	s->preempted = preempted;
	s->cpu = cpu;
	struct cpu_clock *c = bpf_map_lookup_percpu_elem(&clocks, &zero, cpu);
	if (c)
		read_clocks(c, now, s->snap);
	else
		for (int k = 0; k < NCLASS; k++)
			s->snap[k] = 0;
}

static __always_inline void wakeup(struct task_struct *p)
{
	struct runner r;
	classify(p, &r);
	if (!r.tslot)
		return;
	enqueue(p->pid, task_cpu(p), bpf_ktime_get_ns(), 0);
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(sched_wakeup, struct task_struct *p)
{
	wakeup(p);
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(sched_wakeup_new, struct task_struct *p)
{
	wakeup(p);
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u32 zero = 0;
	struct cpu_clock *c = bpf_map_lookup_elem(&clocks, &zero);
	if (!c)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u32 cpu = bpf_get_smp_processor_id();

	/* Settle the leaving runner's time. Until the first switch seen on
	 * this CPU the leaving runner is unknown: it stays unclassified. */
	__u32 pcls = c->cls, ptslot = c->tslot;
	if (c->since && now > c->since && pcls < NCLASS)
		c->run[pcls] += now - c->since;

	struct runner r;
	classify(next, &r);
	c->since = now;
	c->cls = r.cls;
	c->tslot = r.tslot;
	if (r.cls == C_OUTSIDE)
		c->last_out = r.cgid;

	/* A timed task switched out while runnable waits on this CPU's run
	 * queue again. prev is the runner this CPU classified at its switch
	 * in (ptslot), unless that switch came before the probe. */
	if (ptslot && prev->pid != 0 && (preempt || prev->__state == TASK_RUNNING)) {
		struct start *s = start_slot(prev->pid, now);
		if (s) {
			s->preempted = preempt && r.cls != pcls;
			s->cpu = cpu;
			for (int k = 0; k < NCLASS; k++)
				s->snap[k] = c->run[k];
		}
	}

	if (!r.tslot)
		return 0;
	__u32 pid = next->pid;
	__u32 idx = pid & (START_SLOTS - 1);
	struct start *s = bpf_map_lookup_elem(&starts, &idx);
	if (!s || !s->ts || s->pid != pid)
		return 0;
	__u64 delta = now - s->ts;
	__u32 preempted = s->preempted;
	__u64 blame[NCLASS];
	struct cpu_clock *qc = c;
	if (s->cpu != cpu)
		qc = bpf_map_lookup_percpu_elem(&clocks, &zero, s->cpu);
	if (qc) {
		read_clocks(qc, now, blame);
		for (int k = 0; k < NCLASS; k++)
			blame[k] = blame[k] > s->snap[k] ? blame[k] - s->snap[k] : 0;
	} else {
		for (int k = 0; k < NCLASS; k++)
			blame[k] = 0;
	}
	__u64 out_cg = qc ? qc->last_out : 0;
	s->ts = 0;

	__u32 slot = r.tslot - 1;
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
	for (int k = 0; k < NCLASS; k++)
		h->blame_ns[k] += blame[k];
	if (blame[C_OUTSIDE] && out_cg) {
		__u64 *o = bpf_map_lookup_elem(&offenders, &out_cg);
		if (o) {
			__sync_fetch_and_add(o, blame[C_OUTSIDE]);
		} else {
			__u64 v = blame[C_OUTSIDE];
			bpf_map_update_elem(&offenders, &out_cg, &v, BPF_NOEXIST);
		}
	}
	return 0;
}

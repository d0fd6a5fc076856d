/* SPDX-License-Identifier: GPL-2.0 */
/*
 * A trimmed vmlinux.h: only the kernel types runqlat.c reads, with the
 * fields it reads. Every record is marked preserve_access_index, so clang
 * emits CO-RE relocations and libbpf/cilium/ebpf resolve the real offsets
 * against the running kernel's BTF (/sys/kernel/btf/vmlinux) at load time;
 * the layout below need not match any kernel. Kept by hand (instead of
 * `bpftool btf dump file /sys/kernel/btf/vmlinux format c`, 2.8 MB and
 * different on every kernel) so that regeneration is reproducible anywhere.
 */
#ifndef __VMLINUX_TRIMMED_H__
#define __VMLINUX_TRIMMED_H__

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed int __s32;
typedef signed long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef __u32 u32;
typedef __u64 u64;
typedef _Bool bool;
enum { false = 0, true = 1 };

enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_LRU_HASH = 9,
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
	BPF_EXIST = 2,
};

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)
struct kernfs_node {
	u64 id;
};
struct cgroup;
struct cgroup_subsys_state {
	struct cgroup *cgroup;
	struct cgroup_subsys_state *parent;
	u64 serial_nr;
};
struct cgroup {
	struct cgroup_subsys_state self;
	struct kernfs_node *kn;
};
/* The array length is irrelevant: CO-RE relocates the field's offset and
 * the index is a relocated enum value (bpf_core_enum_value). */
struct css_set {
	struct cgroup_subsys_state *subsys[16];
	struct cgroup *dfl_cgrp;
};
struct thread_info {
	u32 cpu;
};
struct task_struct {
	struct thread_info thread_info;
	unsigned int __state;
	unsigned int flags;
	int pid;
	struct css_set *cgroups;
};
#pragma clang attribute pop

enum cgroup_subsys_id {
	cpuset_cgrp_id = 0,
	cpu_cgrp_id = 1,
};

#endif /* __VMLINUX_TRIMMED_H__ */

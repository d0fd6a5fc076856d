package cgroups

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// HostCores reads the host's online CPUs from sysfs (sysRoot is normally
// "/sys") and groups them into physical cores (SMT siblings, from
// topology/core_cpus_list or thread_siblings_list) with their NUMA node
// (the cpuN/nodeM link; node 0 on hosts without NUMA information). The
// result feeds NewCPUAllocator.
func HostCores(sysRoot string) ([]Core, error) {
	cpuDir := filepath.Join(sysRoot, "devices", "system", "cpu")
	online, err := os.ReadFile(filepath.Join(cpuDir, "online"))
	if err != nil {
		return nil, fmt.Errorf("online cpus: %w", err)
	}
	cpus, err := ParseCPUList(strings.TrimSpace(string(online)))
	if err != nil {
		return nil, err
	}
	isOnline := map[int]bool{}
	for _, c := range cpus {
		isOnline[c] = true
	}
	seen := map[int]bool{}
	var cores []Core
	for _, cpu := range cpus {
		if seen[cpu] {
			continue
		}
		dir := filepath.Join(cpuDir, fmt.Sprintf("cpu%d", cpu))
		siblings := []int{cpu}
		for _, f := range []string{"core_cpus_list", "thread_siblings_list"} {
			b, err := os.ReadFile(filepath.Join(dir, "topology", f))
			if err != nil {
				continue
			}
			list, err := ParseCPUList(strings.TrimSpace(string(b)))
			if err != nil {
				return nil, fmt.Errorf("cpu%d %s: %w", cpu, f, err)
			}
			siblings = slices.DeleteFunc(list, func(c int) bool { return !isOnline[c] })
			break
		}
		if !slices.Contains(siblings, cpu) {
			siblings = append(siblings, cpu)
		}
		for _, s := range siblings {
			seen[s] = true
		}
		cores = append(cores, Core{Node: cpuNode(dir), CPUs: siblings})
	}
	return cores, nil
}

// cpuNode is the NUMA node of the CPU whose sysfs directory is dir.
func cpuNode(dir string) int {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	for _, e := range entries {
		if rest, ok := strings.CutPrefix(e.Name(), "node"); ok {
			if n, err := strconv.Atoi(rest); err == nil && n >= 0 {
				return n
			}
		}
	}
	return 0
}

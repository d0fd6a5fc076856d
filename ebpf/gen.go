package ebpf

// The BPF object and its Go bindings are generated and committed, so a
// machine without clang builds fusiond; `make ebpf-check` regenerates them
// where clang is installed and fails if the result differs.
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -D__TARGET_ARCH_x86" -target bpfel -type hist -type job runqlat bpf/runqlat.c -- -I./bpf

// The benchmark's floor is built the same way, into test files only.
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -D__TARGET_ARCH_x86" -target bpfel -output-suffix _test floor bpf/floor.c -- -I./bpf

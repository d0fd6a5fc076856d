// Package devicefilter builds and attaches the cgroup v2 device access
// program (BPF_PROG_TYPE_CGROUP_DEVICE) that replaces the v1 devices
// controller: the kernel runs it on every open/mknod of a device node by a
// task of the cgroup and denies access unless the program returns 1.
//
// The program is generated in Go with cilium/ebpf's asm package (no clang),
// from an allow list of Rules; anything not listed is denied. Programs are
// attached with BPF_PROG_ATTACH and BPF_F_ALLOW_MULTI rather than a bpf_link,
// like runc does, so that the filter stays in force when the process that
// attached it (fusiond) exits or restarts.
//
// It may import cilium/ebpf, golang.org/x/sys and the standard library.
package devicefilter

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Wildcard matches any major or minor number in a Rule.
const Wildcard int64 = -1

// Rule allows one kind of access to a range of device nodes.
type Rule struct {
	// Type is 'c' (character), 'b' (block) or 'a' (both).
	Type byte `json:"type"`
	// Major and Minor are the device numbers, or Wildcard.
	Major int64 `json:"major"`
	Minor int64 `json:"minor"`
	// Access is any non-empty combination of "r", "w", "m".
	Access string `json:"access"`
}

// String renders r the way the v1 devices.allow file expects: "c 1:3 rwm".
func (r Rule) String() string {
	num := func(n int64) string {
		if n == Wildcard {
			return "*"
		}
		return fmt.Sprint(n)
	}
	return fmt.Sprintf("%c %s:%s %s", r.Type, num(r.Major), num(r.Minor), r.Access)
}

// ErrInvalidRule is returned for a rule the kernel could not express.
var ErrInvalidRule = errors.New("devicefilter: invalid rule")

// Validate reports whether r is well formed.
func (r Rule) Validate() error {
	switch r.Type {
	case 'a', 'b', 'c':
	default:
		return fmt.Errorf("%w: type %q", ErrInvalidRule, r.Type)
	}
	for _, n := range []int64{r.Major, r.Minor} {
		if n != Wildcard && (n < 0 || n > math.MaxUint32) {
			return fmt.Errorf("%w: device number %d", ErrInvalidRule, n)
		}
	}
	if _, err := accessBits(r.Access); err != nil {
		return err
	}
	return nil
}

// Kernel constants from include/uapi/linux/bpf.h (bpf_cgroup_dev_ctx).
const (
	devcgBlock = 1
	devcgChar  = 2

	accMknod = 1
	accRead  = 2
	accWrite = 4
)

func accessBits(s string) (int32, error) {
	if s == "" {
		return 0, fmt.Errorf("%w: empty access", ErrInvalidRule)
	}
	var bits int32
	for _, c := range s {
		switch c {
		case 'r':
			bits |= accRead
		case 'w':
			bits |= accWrite
		case 'm':
			bits |= accMknod
		default:
			return 0, fmt.Errorf("%w: access %q", ErrInvalidRule, s)
		}
	}
	return bits, nil
}

// License is the license string the program is loaded with.
const License = "Apache-2.0"

// Program returns the instructions of a device program that allows exactly
// what rules allow and denies everything else.
//
// The context is struct bpf_cgroup_dev_ctx { u32 access_type; u32 major;
// u32 minor; } where access_type = access<<16 | type.
func Program(rules []Rule) (asm.Instructions, error) {
	insts := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // r2 = access_type
		asm.Mov.Reg32(asm.R3, asm.R2),
		asm.And.Imm32(asm.R2, 0xffff),            // r2 = type
		asm.RSh.Imm32(asm.R3, 16),                // r3 = requested access bits
		asm.LoadMem(asm.R4, asm.R1, 4, asm.Word), // r4 = major
		asm.LoadMem(asm.R5, asm.R1, 8, asm.Word), // r5 = minor
	}
	for i, r := range rules {
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("rule %d (%s): %w", i, r, err)
		}
		next := fmt.Sprintf("rule_%d", i+1)
		var block asm.Instructions
		switch r.Type {
		case 'c':
			block = append(block, asm.JNE.Imm32(asm.R2, devcgChar, next))
		case 'b':
			block = append(block, asm.JNE.Imm32(asm.R2, devcgBlock, next))
		}
		bits, _ := accessBits(r.Access) // validated above
		if bits != accMknod|accRead|accWrite {
			// Requested access must be a subset of the allowed bits.
			block = append(block,
				asm.Mov.Reg32(asm.R6, asm.R3),
				asm.And.Imm32(asm.R6, bits),
				asm.JNE.Reg32(asm.R6, asm.R3, next),
			)
		}
		if r.Major != Wildcard {
			block = append(block, asm.JNE.Imm32(asm.R4, int32(uint32(r.Major)), next))
		}
		if r.Minor != Wildcard {
			block = append(block, asm.JNE.Imm32(asm.R5, int32(uint32(r.Minor)), next))
		}
		block = append(block, asm.Mov.Imm(asm.R0, 1), asm.Return())
		if i > 0 {
			block[0] = block[0].WithSymbol(fmt.Sprintf("rule_%d", i))
		}
		insts = append(insts, block...)
	}
	deny := asm.Mov.Imm(asm.R0, 0)
	if len(rules) > 0 {
		deny = deny.WithSymbol(fmt.Sprintf("rule_%d", len(rules)))
	}
	return append(insts, deny, asm.Return()), nil
}

// New loads the device program for rules into the kernel. The caller closes
// the returned program (an attached program stays attached after Close).
func New(rules []Rule) (*ebpf.Program, error) {
	insts, err := Program(rules)
	if err != nil {
		return nil, err
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "fusiond_dev",
		Type:         ebpf.CGroupDevice,
		Instructions: insts,
		License:      License,
	})
	if err != nil {
		return nil, fmt.Errorf("load device program: %w", err)
	}
	return prog, nil
}

// Attach installs a device program for rules on the cgroup v2 directory
// cgroupDir and then detaches the programs that were attached there before,
// so calling it again with new rules replaces the filter (there is never a
// moment without one). It is idempotent.
func Attach(cgroupDir string, rules []Rule) error {
	prog, err := New(rules)
	if err != nil {
		return err
	}
	defer prog.Close()

	fd, err := unix.Open(cgroupDir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open cgroup %s: %w", cgroupDir, err)
	}
	defer unix.Close(fd)

	old, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: ebpf.AttachCGroupDevice})
	if err != nil {
		return fmt.Errorf("query device programs of %s: %w", cgroupDir, err)
	}
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{
		Target:  fd,
		Program: prog,
		Attach:  ebpf.AttachCGroupDevice,
		Flags:   unix.BPF_F_ALLOW_MULTI,
	}); err != nil {
		return fmt.Errorf("attach device program to %s: %w", cgroupDir, err)
	}
	var errs []error
	for _, ap := range old.Programs {
		if err := detachID(fd, ap.ID); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("replace device programs of %s: %w", cgroupDir, errors.Join(errs...))
	}
	return nil
}

// Attached returns the IDs of the device programs attached to cgroupDir.
func Attached(cgroupDir string) ([]ebpf.ProgramID, error) {
	fd, err := unix.Open(cgroupDir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open cgroup %s: %w", cgroupDir, err)
	}
	defer unix.Close(fd)
	res, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: ebpf.AttachCGroupDevice})
	if err != nil {
		return nil, fmt.Errorf("query device programs of %s: %w", cgroupDir, err)
	}
	ids := make([]ebpf.ProgramID, 0, len(res.Programs))
	for _, p := range res.Programs {
		ids = append(ids, p.ID)
	}
	return ids, nil
}

func detachID(fd int, id ebpf.ProgramID) error {
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return fmt.Errorf("program %d: %w", id, err)
	}
	defer p.Close()
	if err := link.RawDetachProgram(link.RawDetachProgramOptions{
		Target:  fd,
		Program: p,
		Attach:  ebpf.AttachCGroupDevice,
	}); err != nil {
		return fmt.Errorf("detach program %d: %w", id, err)
	}
	return nil
}

// ParseAccess normalises an access string ("wr" → "rw"), rejecting
// anything but r, w and m.
func ParseAccess(s string) (string, error) {
	bits, err := accessBits(s)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, x := range []struct {
		bit int32
		c   byte
	}{{accRead, 'r'}, {accWrite, 'w'}, {accMknod, 'm'}} {
		if bits&x.bit != 0 {
			b.WriteByte(x.c)
		}
	}
	return b.String(), nil
}

package devicefilter

import (
	"errors"
	"strings"
	"testing"

	"github.com/cilium/ebpf/asm"
)

var sample = []Rule{
	{Type: 'c', Major: 1, Minor: 3, Access: "rwm"},
	{Type: 'c', Major: 136, Minor: Wildcard, Access: "rw"},
	{Type: 'b', Major: 8, Minor: 0, Access: "r"},
	{Type: 'a', Major: Wildcard, Minor: Wildcard, Access: "m"},
}

func TestProgramShape(t *testing.T) {
	insts, err := Program(sample)
	if err != nil {
		t.Fatal(err)
	}
	// Every jump target must resolve: marshal fails on a dangling label.
	var sb strings.Builder
	if err := insts.Marshal(&nopWriter{&sb}, nativeEndian()); err != nil {
		t.Fatalf("marshal: %v", err)
	}
	returns := 0
	for _, ins := range insts {
		if ins.OpCode.JumpOp() == asm.Exit {
			returns++
		}
	}
	if returns != len(sample)+1 {
		t.Errorf("program has %d exits, want one per rule plus deny", returns)
	}
	empty, err := Program(nil)
	if err != nil || empty[len(empty)-2].Constant != 0 {
		t.Errorf("empty allow list must deny: %v %v", empty, err)
	}
}

func TestRuleValidation(t *testing.T) {
	for _, r := range []Rule{{Type: 'x', Access: "r"}, {Type: 'c', Access: ""}, {Type: 'c', Access: "rq"}, {Type: 'c', Major: 1 << 33, Access: "r"}, {Type: 'c', Minor: -2, Access: "r"}} {
		if _, err := Program([]Rule{r}); !errors.Is(err, ErrInvalidRule) {
			t.Errorf("rule %+v: err = %v", r, err)
		}
	}
	if s := (Rule{Type: 'c', Major: 136, Minor: Wildcard, Access: "rw"}).String(); s != "c 136:* rw" {
		t.Errorf("String = %q", s)
	}
	if a, err := ParseAccess("mwr"); err != nil || a != "rwm" {
		t.Errorf("ParseAccess = %q, %v", a, err)
	}
}

// TestLoadInKernel checks the verifier accepts the program; it needs root
// and a kernel with BPF (CI has both) and fails otherwise.
func TestLoadInKernel(t *testing.T) {
	prog, err := New(sample)
	if err != nil {
		t.Fatalf("kernel rejected the device program: %v", err)
	}
	prog.Close()
}

func FuzzProgram(f *testing.F) {
	f.Add(byte('c'), int64(1), int64(3), "rwm")
	f.Add(byte('b'), int64(-1), int64(0), "r")
	f.Add(byte('a'), int64(-1), int64(-1), "m")
	f.Fuzz(func(t *testing.T, typ byte, major, minor int64, access string) {
		r := Rule{Type: typ, Major: major, Minor: minor, Access: access}
		insts, err := Program([]Rule{r, r})
		if err != nil {
			if r.Validate() == nil {
				t.Fatalf("valid rule %+v rejected: %v", r, err)
			}
			return
		}
		var sb strings.Builder
		if err := insts.Marshal(&nopWriter{&sb}, nativeEndian()); err != nil {
			t.Fatalf("marshal %+v: %v", r, err)
		}
	})
}

package topology

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
)

func TestParseCPUList(t *testing.T) {
	tests := []struct {
		in      string
		want    []int
		wantErr bool
	}{
		{in: "", want: []int{}},
		{in: "\n", want: []int{}},
		{in: "0", want: []int{0}},
		{in: "0-3", want: []int{0, 1, 2, 3}},
		{in: "0-1,8,10-11\n", want: []int{0, 1, 8, 10, 11}},
		{in: "5,1,3", want: []int{1, 3, 5}},
		{in: "2-2", want: []int{2}},
		{in: "63-65", want: []int{63, 64, 65}},
		{in: "3-1", wantErr: true},
		{in: "a", wantErr: true},
		{in: "1,", wantErr: true},
		{in: ",1", wantErr: true},
		{in: "-1", wantErr: true},
		{in: "1-", wantErr: true},
		{in: "1--3", wantErr: true},
		{in: "+1", wantErr: true},
		{in: "0-16384", wantErr: true},
		{in: "99999999999999999999", wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseCPUList(tt.in)
		if tt.wantErr {
			if !errors.Is(err, ErrSyntax) {
				t.Errorf("ParseCPUList(%q) error = %v, want ErrSyntax", tt.in, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseCPUList(%q): %v", tt.in, err)
			continue
		}
		if !slices.Equal(got.List(), tt.want) {
			t.Errorf("ParseCPUList(%q) = %v, want %v", tt.in, got.List(), tt.want)
		}
	}
}

func TestParseCPUMask(t *testing.T) {
	tests := []struct {
		in      string
		want    []int
		wantErr bool
	}{
		{in: "", want: []int{}},
		{in: "00000000", want: []int{}},
		{in: "0000000f", want: []int{0, 1, 2, 3}},
		{in: "f", want: []int{0, 1, 2, 3}},
		{in: "00000001,00000000", want: []int{32}},
		{in: "80000000,00000001\n", want: []int{0, 63}},
		{in: "1,00000000,00000100", want: []int{8, 64}},
		{in: "g", wantErr: true},
		{in: "1,,1", wantErr: true},
		{in: "123456789", wantErr: true},
		{in: ",", wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseCPUMask(tt.in)
		if tt.wantErr {
			if !errors.Is(err, ErrSyntax) {
				t.Errorf("ParseCPUMask(%q) error = %v, want ErrSyntax", tt.in, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseCPUMask(%q): %v", tt.in, err)
			continue
		}
		if !slices.Equal(got.List(), tt.want) {
			t.Errorf("ParseCPUMask(%q) = %v, want %v", tt.in, got.List(), tt.want)
		}
	}
}

func TestCPUSetOps(t *testing.T) {
	a := NewCPUSet(0, 1, 2, 64, 100)
	b := NewCPUSet(2, 3, 100)
	tests := []struct {
		name string
		got  CPUSet
		want string
	}{
		{"union", a.Union(b), "0-3,64,100"},
		{"intersection", a.Intersection(b), "2,100"},
		{"difference", a.Difference(b), "0-1,64"},
		{"difference to empty", b.Difference(b.Union(a)), ""},
		{"drops out of range", NewCPUSet(-1, 1, MaxCPUs), "1"},
	}
	for _, tt := range tests {
		if tt.got.String() != tt.want {
			t.Errorf("%s = %q, want %q", tt.name, tt.got, tt.want)
		}
	}
	if !NewCPUSet(2).IsSubsetOf(a) || a.IsSubsetOf(b) || !a.Intersects(b) || NewCPUSet(5).Intersects(a) {
		t.Error("subset/intersects wrong")
	}
	if a.Len() != 5 || !a.Contains(64) || a.Contains(63) || a.Contains(-1) {
		t.Error("Len/Contains wrong")
	}
	if !a.Difference(a).Equal(CPUSet{}) || !a.Difference(a).IsEmpty() {
		t.Error("empty difference is not the zero set")
	}
}

func TestCPUSetJSON(t *testing.T) {
	in := struct {
		CPUs CPUSet `json:"cpus"`
	}{NewCPUSet(0, 1, 2, 7)}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"cpus":"0-2,7"}` {
		t.Fatalf("marshal = %s", b)
	}
	var out struct {
		CPUs CPUSet `json:"cpus"`
	}
	if err := json.Unmarshal(b, &out); err != nil || !out.CPUs.Equal(in.CPUs) {
		t.Fatalf("round trip = %v, %v", out.CPUs, err)
	}
	if err := json.Unmarshal([]byte(`{"cpus":"x"}`), &out); !errors.Is(err, ErrSyntax) {
		t.Fatalf("bad cpulist error = %v", err)
	}
}

// FuzzParseCPUList checks that any accepted list survives a round trip
// through its canonical form and that the mask parser agrees.
func FuzzParseCPUList(f *testing.F) {
	for _, s := range []string{"", "0", "0-3,8", "1,3,5-7\n", "63-65", "3-1", "a,b", "0-16383", "00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseCPUList(s)
		if err != nil {
			return
		}
		again, err := ParseCPUList(c.String())
		if err != nil || !again.Equal(c) {
			t.Fatalf("round trip of %q via %q: %v %v", s, c.String(), again, err)
		}
		list := c.List()
		if len(list) != c.Len() || !slices.IsSorted(list) {
			t.Fatalf("List/Len disagree for %q", s)
		}
	})
}

// FuzzParseCPUMask checks that the bitmap parser never panics and that
// what it accepts is a valid set.
func FuzzParseCPUMask(f *testing.F) {
	for _, s := range []string{"", "f", "00000001,00000000", "ffffffff,ffffffff", ",", "zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseCPUMask(s)
		if err != nil {
			return
		}
		again, err := ParseCPUList(c.String())
		if err != nil || !again.Equal(c) {
			t.Fatalf("mask %q: cpulist round trip failed: %v", s, err)
		}
	})
}

package api

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestDecodeSpec(t *testing.T) {
	const ok = `"command":["sleep","1"],"resources":{"cpu":1,"memory":"64Mi"}`
	tests := []struct {
		name      string
		body      string
		wantCode  string
		wantField string
		wantMsg   string
	}{
		{"minimal", `{` + ok + `}`, "", "", ""},
		{"cpu millicores", `{"command":["x"],"resources":{"cpu":"250m","memory":"1Gi"}}`, "", "", ""},
		{"cpu fractional cores", `{"command":["x"],"resources":{"cpu":0.5,"memory":1048576}}`, "", "", ""},
		{"empty body", ``, CodeBadRequest, "", "empty body"},
		{"malformed", `{"command":`, CodeBadRequest, "", "malformed JSON"},
		{"not an object", `["x"]`, CodeBadRequest, "", "want a JSON object"},
		{"trailing data", `{` + ok + `} {}`, CodeBadRequest, "", "after the top-level value"},
		{"unknown top-level field", `{` + ok + `,"nmae":"x"}`, CodeInvalid, "nmae", "unknown field"},
		{"unknown nested field", `{` + ok[:len(ok)-1] + `,"gpu":{"cnt":1}}}`, CodeInvalid, "resources.gpu.cnt", "unknown field"},
		{"case-mismatched field", `{` + ok + `,"Name":"x"}`, CodeInvalid, "Name", "unknown field"},
		{"wrong type", `{"command":"sleep 1","resources":{"cpu":1,"memory":"64Mi"}}`, CodeInvalid, "command", "want an array"},
		{"wrong element type", `{"command":["a",1],"resources":{"cpu":1,"memory":"64Mi"}}`, CodeInvalid, "command[1]", "want a string"},
		{"bad cpu string", `{"command":["x"],"resources":{"cpu":"lots","memory":"64Mi"}}`, CodeInvalid, "resources.cpu", "invalid CPU quantity"},
		{"negative cpu", `{"command":["x"],"resources":{"cpu":-1,"memory":"64Mi"}}`, CodeInvalid, "resources.cpu", "must be positive"},
		{"zero cpu", `{"command":["x"],"resources":{"cpu":0,"memory":"64Mi"}}`, CodeInvalid, "resources.cpu", "required"},
		{"sub-millicore cpu", `{"command":["x"],"resources":{"cpu":0.0001,"memory":"64Mi"}}`, CodeInvalid, "resources.cpu", "finer than a millicore"},
		{"missing memory", `{"command":["x"],"resources":{"cpu":1}}`, CodeInvalid, "resources.memory", "required"},
		{"negative memory", `{"command":["x"],"resources":{"cpu":1,"memory":"-1Gi"}}`, CodeInvalid, "resources.memory", "must be positive"},
		{"tiny memory", `{"command":["x"],"resources":{"cpu":1,"memory":"10Ki"}}`, CodeInvalid, "resources.memory", "at least"},
		{"bad memory unit", `{"command":["x"],"resources":{"cpu":1,"memory":"4GB"}}`, CodeInvalid, "resources.memory", "invalid memory quantity"},
		{"missing command", `{"resources":{"cpu":1,"memory":"64Mi"}}`, CodeInvalid, "command", "required"},
		{"empty program", `{"command":[""],"resources":{"cpu":1,"memory":"64Mi"}}`, CodeInvalid, "command", "required"},
		{"NUL in argument", `{"command":["a","b\u0000"],"resources":{"cpu":1,"memory":"64Mi"}}`, CodeInvalid, "command[1]", "NUL"},
		{"bad class", `{` + ok + `,"class":"gaming"}`, CodeInvalid, "class", "unknown class"},
		{"bad tier", `{` + ok + `,"tier":"gold"}`, CodeInvalid, "tier", "unknown tier"},
		{"priority too high", `{` + ok + `,"priority":1001}`, CodeInvalid, "priority", "between 0 and 1000"},
		{"priority negative", `{` + ok + `,"priority":-1}`, CodeInvalid, "priority", "between 0 and 1000"},
		{"bad name", `{` + ok + `,"name":"a b"}`, CodeInvalid, "name", "letters, digits"},
		{"bad env key", `{` + ok + `,"env":{"1X":"y"}}`, CodeInvalid, "env.1X", "invalid variable name"},
		{"reserved env job id", `{` + ok + `,"env":{"FUSIOND_JOB_ID":"7"}}`, CodeInvalid, "env.FUSIOND_JOB_ID", "set by fusiond"},
		{"reserved env prefix", `{` + ok + `,"env":{"FUSIOND_ANYTHING":"x"}}`, CodeInvalid, "env.FUSIOND_ANYTHING", "set by fusiond"},
		{"env value not string", `{` + ok + `,"env":{"X":1}}`, CodeInvalid, "env.X", "want a string"},
		{"relative workdir", `{` + ok + `,"workdir":"tmp"}`, CodeInvalid, "workdir", "absolute"},
		{"relative rootfs", `{` + ok + `,"rootfs":"img/root"}`, CodeInvalid, "rootfs", "absolute"},
		{"unclean rootfs", `{` + ok + `,"rootfs":"/img/../etc"}`, CodeInvalid, "rootfs", "clean"},
		{"qos slo", `{` + ok + `,"qos":{"runqueue_p99":"2ms","psi_some_avg10":5}}`, "", "", ""},
		{"qos bad duration", `{` + ok + `,"qos":{"runqueue_p99":"2 parsecs"}}`, CodeInvalid, "qos.runqueue_p99", "duration"},
		{"qos too small", `{` + ok + `,"qos":{"runqueue_p99":"1us"}}`, CodeInvalid, "qos.runqueue_p99", "between 10µs and 10s"},
		{"qos psi out of range", `{` + ok + `,"qos":{"psi_some_avg10":150}}`, CodeInvalid, "qos.psi_some_avg10", "percentage"},
		{"qos empty", `{` + ok + `,"qos":{}}`, CodeInvalid, "qos", "set runqueue_p99"},
		{"max runtime", `{` + ok + `,"max_runtime":"2h"}`, "", "", ""},
		{"max runtime at the bound", `{` + ok + `,"max_runtime":"8784h"}`, "", "", ""},
		{"max runtime zero is no limit", `{` + ok + `,"max_runtime":"0s"}`, "", "", ""},
		{"max runtime negative", `{` + ok + `,"max_runtime":"-1s"}`, CodeInvalid, "max_runtime", "must be 0 (no limit) or at least 1s"},
		{"max runtime under a second", `{` + ok + `,"max_runtime":"1ns"}`, CodeInvalid, "max_runtime", "must be 0 (no limit) or at least 1s (the limit is checked about once a second), got 1ns"},
		{"max runtime just under a second", `{` + ok + `,"max_runtime":"999ms"}`, CodeInvalid, "max_runtime", "at least 1s"},
		{"max runtime one second", `{` + ok + `,"max_runtime":"1s"}`, "", "", ""},
		{"max runtime too long", `{` + ok + `,"max_runtime":"8785h"}`, CodeInvalid, "max_runtime", "at most 8784h0m0s"},
		{"max runtime not a duration", `{` + ok + `,"max_runtime":"2 fortnights"}`, CodeInvalid, "max_runtime", "duration"},
		{"max runtime a number", `{` + ok + `,"max_runtime":90}`, CodeInvalid, "max_runtime", "duration string"},
		{"max runtime overflows", `{` + ok + `,"max_runtime":"9999999999h"}`, CodeInvalid, "max_runtime", "duration"},
		{"qos unknown field", `{` + ok + `,"qos":{"p99":"2ms"}}`, CodeInvalid, "qos.p99", "unknown field"},
		{"host root as rootfs", `{` + ok + `,"rootfs":"/"}`, CodeInvalid, "rootfs", "other than /"},
		{"gpu share and mig", `{"command":["x"],"resources":{"cpu":1,"memory":"64Mi","gpu":{"share":500,"mig":"1g.10gb"}}}`, CodeInvalid, "resources.gpu.share", "exclusive"},
		{"gpu share of a whole gpu", `{"command":["x"],"resources":{"cpu":1,"memory":"64Mi","gpu":{"share":1000}}}`, CodeInvalid, "resources.gpu.share", "1..999"},
		{"gpu share with count 2", `{"command":["x"],"resources":{"cpu":1,"memory":"64Mi","gpu":{"share":500,"count":2}}}`, CodeInvalid, "resources.gpu.count", "count must be 1"},
		{"gpu negative count", `{"command":["x"],"resources":{"cpu":1,"memory":"64Mi","gpu":{"count":-2}}}`, CodeInvalid, "resources.gpu.count", "between 1 and"},
		{"gpu bad mig name", `{"command":["x"],"resources":{"cpu":1,"memory":"64Mi","gpu":{"mig":"huge"}}}`, CodeInvalid, "resources.gpu.mig", "not a MIG profile"},
		{"gpu mig ok", `{"command":["x"],"resources":{"cpu":1,"memory":"64Mi","gpu":{"mig":"1g.18gb+me"}}}`, "", "", ""},
		{"fpga without bitstream", `{"command":["x"],"resources":{"cpu":1,"memory":"64Mi","fpga":{}}}`, CodeInvalid, "resources.fpga.bitstream", "required"},
		{"gang without size", `{` + ok + `,"gang":{"name":"g"}}`, CodeInvalid, "gang.size", "between 1 and"},
		{"gang without name", `{` + ok + `,"gang":{"size":2}}`, CodeInvalid, "gang.name", "required"},
		{"duplicate top-level key", `{` + ok + `,"name":"a","name":"b"}`, CodeInvalid, "name", "more than once"},
		{"duplicate nested key", `{"command":["x"],"resources":{"cpu":1,"cpu":2,"memory":"64Mi"}}`, CodeInvalid, "resources.cpu", "more than once"},
		{"duplicate env key", `{` + ok + `,"env":{"A":"1","A":"2"}}`, CodeInvalid, "env.A", "more than once"},
		{"invalid UTF-8 value", `{` + ok + `,"name":"a` + "\xff" + `"}`, CodeInvalid, "name", "UTF-8"},
		{"invalid UTF-8 env value", `{` + ok + `,"env":{"A":"` + "\xc3\x28" + `"}}`, CodeInvalid, "env.A", "UTF-8"},
		{"invalid UTF-8 key", `{` + ok + `,"env":{"A` + "\xff" + `":"1"}}`, CodeInvalid, "env.A?", "UTF-8"},
		{"memory out of range", `{"command":["x"],"resources":{"cpu":1,"memory":"8Ei"}}`, CodeInvalid, "resources.memory", "out of range"},
		{"bad restart policy", `{` + ok + `,"restart":{"policy":"always-and-forever"}}`, CodeInvalid, "restart.policy", "unknown policy"},
		{"retries with never", `{` + ok + `,"restart":{"policy":"never","max_retries":2}}`, CodeInvalid, "restart.max_retries", "on-failure"},
		{"gang member restarting alone", `{` + ok + `,"gang":{"name":"g","size":2},"restart":{"policy":"on-failure","max_retries":1}}`, CodeInvalid, "restart.policy", "gang"},
		{"gang member with its own max runtime", `{` + ok + `,"gang":{"name":"g","size":2},"max_runtime":"90s"}`, "", "", ""},
		{"movable gang member", `{` + ok + `,"gang":{"name":"g","size":2},"movable":true}`, CodeInvalid, "movable", "gang"},
		{"movable ok", `{` + ok + `,"movable":true}`, "", "", ""},
		{"bad topology", `{` + ok + `,"topology":"numa"}`, CodeInvalid, "topology", "unknown policy"},
		{"bad label", `{` + ok + `,"labels":{"-x":"y"}}`, CodeInvalid, "labels.-x", "invalid label key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := DecodeSpec([]byte(tt.body))
			if tt.wantCode == "" {
				if err != nil {
					t.Fatalf("DecodeSpec: %v", err)
				}
				if spec.Name == "" || spec.Class == "" || spec.Topology == "" {
					t.Errorf("defaults not applied: %+v", spec)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("want *Error with code %s, got %v", tt.wantCode, err)
			}
			if e.Code != tt.wantCode || e.Field != tt.wantField || !strings.Contains(e.Message, tt.wantMsg) {
				t.Errorf("got {code %q field %q message %q}, want {code %q field %q message containing %q}",
					e.Code, e.Field, e.Message, tt.wantCode, tt.wantField, tt.wantMsg)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	spec, err := DecodeSpec([]byte(`{"command":["/usr/bin/python3","x.py"],"resources":{"cpu":"500m","memory":"1Gi","gpu":{}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if spec.Name != "python3" || spec.Class != ClassBatch || spec.Topology != TopologyBestEffort ||
		spec.Resources.GPU.Count != 1 || spec.Restart.Policy != RestartNever {
		t.Errorf("unexpected defaults: %+v", spec)
	}
	if spec.Resources.CPU != 500 || spec.Resources.Memory != 1<<30 {
		t.Errorf("quantities: cpu %d memory %d", spec.Resources.CPU, spec.Resources.Memory)
	}
}

func TestQuantities(t *testing.T) {
	cpus := map[string]MilliCPU{"2": 2000, "0.5": 500, "500m": 500, "1.25": 1250, " 3 ": 3000}
	for in, want := range cpus {
		if got, err := ParseMilliCPU(in); err != nil || got != want {
			t.Errorf("ParseMilliCPU(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "m", "1.5m", "x", "NaN", "Inf", "1e30"} {
		if _, err := ParseMilliCPU(bad); err == nil {
			t.Errorf("ParseMilliCPU(%q) accepted", bad)
		}
	}
	bytes := map[string]Bytes{"1Ki": 1024, "4Gi": 4 << 30, "1G": 1e9, "512Mi": 512 << 20, "100": 100, "1.5Gi": 3 << 29}
	for in, want := range bytes {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "Gi", "4GB", "x", "9999999999Ti"} {
		if _, err := ParseBytes(bad); err == nil {
			t.Errorf("ParseBytes(%q) accepted", bad)
		}
	}
	for _, b := range []Bytes{1, 1024, 4 << 30, 3 << 29, 1e9} {
		back, err := ParseBytes(b.String())
		if err != nil || back != b {
			t.Errorf("round trip of %d via %q gave %d, %v", b, b.String(), back, err)
		}
	}
	for _, c := range []MilliCPU{1, 500, 1000, 2500} {
		back, err := ParseMilliCPU(c.String())
		if err != nil || back != c {
			t.Errorf("round trip of %d via %q gave %d, %v", c, c.String(), back, err)
		}
	}
}

// FuzzDecodeSpec: the decoder never panics; a JSON object that is rejected
// is rejected with the offending field named; an accepted spec validates
// again after a round trip through its own JSON encoding.
func FuzzDecodeSpec(f *testing.F) {
	for _, s := range []string{
		`{"command":["sleep","1"],"resources":{"cpu":1,"memory":"64Mi"}}`,
		`{"name":"t","class":"training","tier":"guaranteed","priority":5,"command":["x"],"env":{"A":"b"},"workdir":"/tmp","resources":{"cpu":"250m","memory":"1Gi","gpu":{"count":2,"model":"H200"}},"gang":{"name":"g","size":2},"restart":{"policy":"on-failure","max_retries":3},"labels":{"team":"ml"}}`,
		`{"command":["x"],"resources":{"cpu":1,"memory":"64Mi","gpu":{"share":250,"memory":"8Gi"},"fpga":{"bitstream":"gzip"}}}`,
		`{"command":["x"],"resources":{"cpu":-1}}`,
		`{"command":["x"],"resources":{"cpu":1,"memory":"64Mi"},"max_runtime":"1h30m"}`,
		`{"command":[1]}`,
		`{"resources":{"gpu":{"mig":"1g.10gb","x":1}}}`,
		`[]`, `null`, `{`, `"x"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		spec, err := DecodeSpec(data)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error is %T, not *Error: %v", err, err)
			}
			if e.Code == CodeInvalid && e.Field == "" {
				t.Fatalf("rejection without a field name: %v (input %q)", err, data)
			}
			if e.Code != CodeInvalid && e.Code != CodeBadRequest {
				t.Fatalf("unexpected code %q: %v", e.Code, err)
			}
			return
		}
		again, err := DecodeSpec(mustJSON(t, spec))
		if err != nil {
			t.Fatalf("accepted spec does not survive a round trip: %v", err)
		}
		if again.Name != spec.Name || again.Resources.CPU != spec.Resources.CPU || again.Resources.Memory != spec.Resources.Memory {
			t.Fatalf("round trip changed the spec: %+v vs %+v", spec, again)
		}
	})
}

// A pod's device hold: what the device plugin's Allocate made of kubelet's
// devices; no process, no CPU or memory, device IDs of every kind.
func TestValidatePodHold(t *testing.T) {
	hold := func(mut func(s *JobSpec)) *JobSpec {
		s := &JobSpec{Name: "pod-fpga-dma", Class: ClassService, Tier: TierGuaranteed,
			Resources: Resources{FPGA: &FPGARequest{Bitstream: "dma"}},
			Pod:       &PodHold{Resource: "fusiond.io/fpga-dma", Devices: []string{"dfl/0000:3b:00.0/0"}}}
		if mut != nil {
			mut(s)
		}
		s.ApplyDefaults()
		return s
	}
	for _, ok := range []*JobSpec{
		hold(nil),
		hold(func(s *JobSpec) {
			s.Resources = Resources{GPU: &GPURequest{Count: 1, MIG: "1g.18gb"}}
			s.Pod.Devices = []string{"GPU-84ee3d00-04c7-2017-2069-3028cc1def8e:1g.18gb:3"}
		}),
	} {
		if err := ok.Validate(); err != nil {
			t.Errorf("%+v: %v", ok.Pod, err)
		}
		if ok.Restart != nil {
			t.Errorf("a pod's hold got a restart policy %+v", ok.Restart)
		}
	}
	for name, c := range map[string]struct {
		spec  *JobSpec
		field string
	}{
		"a command":      {hold(func(s *JobSpec) { s.Command = []string{"sh"} }), "pod"},
		"CPU":            {hold(func(s *JobSpec) { s.Resources.CPU = 1000 }), "pod"},
		"a max runtime":  {hold(func(s *JobSpec) { s.MaxRuntime = Duration(time.Hour) }), "max_runtime"},
		"no resource":    {hold(func(s *JobSpec) { s.Pod.Resource = "" }), "pod.resource"},
		"no devices":     {hold(func(s *JobSpec) { s.Pod.Devices = nil }), "pod.devices"},
		"a device twice": {hold(func(s *JobSpec) { s.Pod.Devices = []string{"a", "a"} }), "pod.devices[1]"},
		"a space":        {hold(func(s *JobSpec) { s.Pod.Devices = []string{"GPU a"} }), "pod.devices[0]"},
		"no device kind": {hold(func(s *JobSpec) { s.Resources = Resources{} }), "pod.resource"},
		"movable":        {hold(func(s *JobSpec) { s.Movable = true }), "movable"},
	} {
		var e *Error
		if err := c.spec.Validate(); !errors.As(err, &e) || e.Field != c.field {
			t.Errorf("%s: %v, want refused on %s", name, err, c.field)
		}
	}
}

// A job is movable when it says so or is best-effort, never when it is a
// gang member or a pod's device hold.
func TestJobCanMove(t *testing.T) {
	for _, c := range []struct {
		name string
		job  Job
		want bool
	}{
		{"guaranteed, not movable", Job{Tier: TierGuaranteed}, false},
		{"guaranteed, movable", Job{Tier: TierGuaranteed, Spec: JobSpec{Movable: true}}, true},
		{"best-effort", Job{Tier: TierBestEffort}, true},
		{"best-effort gang member", Job{Tier: TierBestEffort, Spec: JobSpec{Gang: &Gang{Name: "g", Size: 2}}}, false},
		{"best-effort pod hold", Job{Tier: TierBestEffort, Spec: JobSpec{Pod: &PodHold{Resource: "r", Devices: []string{"d"}}}}, false},
	} {
		if got := c.job.CanMove(); got != c.want {
			t.Errorf("%s: CanMove %v, want %v", c.name, got, c.want)
		}
	}
}

package api

import (
	"encoding/json"
	"errors"
	"testing"
	"unicode/utf8"
)

type fuzzBody struct {
	Name  string            `json:"name"`
	N     int               `json:"n"`
	Mem   Bytes             `json:"mem"`
	CPU   MilliCPU          `json:"cpu"`
	List  []string          `json:"list"`
	Map   map[string]string `json:"map"`
	Any   any               `json:"any"`
	Inner *struct {
		B bool `json:"b"`
	} `json:"inner"`
}

// FuzzDecodeStrict: every API body goes through DecodeStrict. It never
// panics, fails only with *Error (invalid ones naming the field), and what
// it accepts is valid UTF-8 that encoding/json decodes to the same value.
func FuzzDecodeStrict(f *testing.F) {
	for _, s := range []string{
		`{"name":"a","n":1,"mem":"1Gi","cpu":"500m","list":["x"],"map":{"k":"v"},"any":{"a":[1,{"b":null}]},"inner":{"b":true}}`,
		`{"name":"a","name":"b"}`, `{"map":{"k":"v","k":"w"}}`, `{"any":{"x":1,"x":2}}`,
		"{\"name\":\"\xff\"}", `{"n":1e400}`, `{"mem":"8Ei"}`, `{} x`, `[]`, `{"Name":"x"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var v fuzzBody
		err := DecodeStrict(data, &v)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error is %T, not *Error: %v", err, err)
			}
			if e.Code != CodeInvalid && e.Code != CodeBadRequest {
				t.Fatalf("code %q: %v", e.Code, err)
			}
			return
		}
		if !utf8.Valid(data) {
			t.Fatalf("accepted invalid UTF-8 %q", data)
		}
		var plain fuzzBody
		if err := json.Unmarshal(data, &plain); err != nil {
			t.Fatalf("accepted what encoding/json refuses: %v", err)
		}
		a, _ := json.Marshal(v)
		b, _ := json.Marshal(plain)
		if string(a) != string(b) {
			t.Fatalf("DecodeStrict gave %s, encoding/json %s", a, b)
		}
	})
}

// FuzzDecodeBatch: a batch body is decoded strictly; refusals name the
// spec ("jobs[i]…") or the batch.
func FuzzDecodeBatch(f *testing.F) {
	ok := `{"command":["x"],"resources":{"cpu":1,"memory":"64Mi"}}`
	for _, s := range []string{`{"jobs":[` + ok + `]}`, `{"jobs":[` + ok + `,{"command":[]}]}`, `{"jobs":[]}`, `{"jobs":null}`, `{"jobs":[1]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		specs, err := DecodeBatch(data)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error is %T, not *Error: %v", err, err)
			}
			if e.Code == CodeInvalid && e.Field == "" {
				t.Fatalf("refusal without a field: %v", err)
			}
			return
		}
		if len(specs) == 0 || len(specs) > MaxBatch {
			t.Fatalf("accepted %d specs", len(specs))
		}
		for _, s := range specs {
			if err := s.Validate(); err != nil {
				t.Fatalf("accepted an invalid spec: %v", err)
			}
		}
	})
}

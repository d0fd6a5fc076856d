package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/devices"
)

// hostile are strings a user or a peer could put in a job name, a
// command, a workdir, a label or a peer name, each meant to drive the
// terminal that prints it or to forge what it shows.
var hostile = []string{
	"\x1b[31mred\x1b[0m", // CSI: colours
	"\x1b[2J\x1b[H",      // CSI: clear the screen
	"\x1b]0;owned\x07",   // OSC: window title, BEL-terminated
	"\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\", // OSC 8 hyperlink, ST-terminated
	"\x1bP+q\x1b\\",       // DCS
	"\u009b31mc1",         // C1 CSI, 8-bit form
	"\u009d0;c1osc\u009c", // C1 OSC ... ST
	"line\n  99  forged  batch  besteffort  running  root",
	"col\tshift\tcells",
	"over\rwrite",
	"bell\a bs\b nul\x00 del\x7f",
	"\u202eevil\u202c \u2066iso\u2069", // bidi override and isolate
	"\xff\xfe\xc0 invalid UTF-8",
}

// checkClean fails if out holds anything a terminal would act on: a
// control character other than newline and tab, a C1 control, a bidi
// formatting character, or invalid UTF-8.
func checkClean(t *testing.T, what, out string) {
	t.Helper()
	if !utf8.ValidString(out) {
		t.Errorf("%s: invalid UTF-8 in the output:\n%q", what, out)
	}
	for i, r := range out {
		if (r < 0x20 && r != '\n' && r != '\t') || r == 0x7f || isC1(r) || isBidi(r) {
			t.Errorf("%s: %U at byte %d reaches the terminal:\n%q", what, r, i, out)
			return
		}
	}
}

func TestEsc(t *testing.T) {
	for in, want := range map[string]string{
		"plain":             "plain",
		"été 名前 🙂 \uFFFD":   "été 名前 🙂 \uFFFD",
		"\x1b[31mred":       `\x1b[31mred`,
		"a\nb\tc\rd":        `a\nb\tc\rd`,
		"\x1b]0;t\x07":      `\x1b]0;t\x07`,
		"\u009b1m":          `\u009b1m`,
		"\u202eabc":         `\u202eabc`,
		"\xff!":             `\xff!`,
		"del\x7f":           `del\x7f`,
		"":                  "",
		"trailing \xe2\x82": `trailing \xe2\x82`,
	} {
		if got := esc(in); got != want {
			t.Errorf("esc(%q) = %q, want %q", in, got, want)
		}
	}
	for _, h := range hostile {
		e := esc(h)
		checkClean(t, "esc", e)
		if strings.ContainsAny(e, "\n\t") {
			t.Errorf("esc(%q) = %q keeps a newline or tab", h, e)
		}
	}
}

// TestEscapeWriter: newline and tab pass, every other control character
// is made visible, and valid UTF-8 cut anywhere between writes comes out
// as it went in.
func TestEscapeWriter(t *testing.T) {
	text := "ok: été, 名前 and 🙂\n\tnext\n"
	for cut := range len(text) + 1 {
		var b bytes.Buffer
		w := newEscapeWriter(&b)
		w.Write([]byte(text[:cut]))
		w.Write([]byte(text[cut:]))
		w.Flush()
		if b.String() != text {
			t.Fatalf("cut at %d: %q", cut, b.String())
		}
	}
	var b bytes.Buffer
	w := newEscapeWriter(&b)
	for _, h := range hostile {
		w.Write([]byte(h + "\n"))
	}
	w.Write([]byte("ends in half a rune \xe2\x82"))
	w.Flush()
	checkClean(t, "escapeWriter", b.String())
	if got := strings.Count(b.String(), "\n"); got != len(hostile)+strings.Count(strings.Join(hostile, ""), "\n") {
		t.Errorf("newlines: %d", got)
	}
	if !strings.HasSuffix(b.String(), `ends in half a rune \xe2\x82`) {
		t.Errorf("held bytes not flushed: %q", b.String())
	}
}

// hostileDaemon answers every read the human-readable commands make with
// the hostile strings in every field a user or a peer controls.
type hostileDaemon struct{}

func (hostileDaemon) job(i int) api.Job {
	h := hostile[i%len(hostile)]
	now := time.Now()
	return api.Job{
		ID:    "7",
		Owner: api.Owner{User: h, UID: 1000, GID: 1000},
		Spec: api.JobSpec{Name: h, Class: api.ClassBatch, Command: []string{"sh", "-c", h}, Workdir: "/home/" + h, Rootfs: "/srv/" + h,
			Labels: map[string]string{"team": h}, Env: map[string]string{"X": h},
			Resources: api.Resources{GPU: &api.GPURequest{Count: 1, Model: h}, FPGA: &api.FPGARequest{Bitstream: h}}},
		State: api.StateFailed, Reason: "workdir " + h + ": no such directory", CreatedAt: now,
		Allocation: &api.Allocation{Devices: []string{h}, Explain: "placed because " + h},
		Events:     []api.Event{{Time: now, JobID: "7", From: api.StatePending, To: api.StateFailed, Reason: h}},
	}
}

func (d hostileDaemon) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	enc := json.NewEncoder(w)
	switch {
	case r.URL.Path == "/v1/jobs":
		var jobs []api.Job
		for i := range hostile {
			jobs = append(jobs, d.job(i))
		}
		enc.Encode(jobs)
	case r.URL.Path == "/v1/jobs/7/logs":
		for _, h := range hostile {
			w.Write([]byte(h + "\n"))
		}
	case strings.HasPrefix(r.URL.Path, "/v1/jobs/"):
		enc.Encode(d.job(0))
	case r.URL.Path == "/v1/events":
		for i, h := range hostile {
			kind := []string{api.EventJob, api.EventDevice, api.EventQoS}[i%3]
			enc.Encode(api.Event{Kind: kind, Time: time.Now(), JobID: h, Device: h, To: api.StateRunning, Reason: h})
		}
	case r.URL.Path == "/v1/node":
		enc.Encode(api.NodeStatus{Hostname: hostile[0], Version: hostile[2], Notes: hostile,
			Devices: []api.DeviceStatus{{ID: hostile[3], Kind: "fpga", Model: hostile[5], Healthy: true, Detail: hostile[7]}}})
	case r.URL.Path == "/v1/gpus":
		enc.Encode(api.GPUList{})
	case r.URL.Path == "/v1/fpga/regions":
		enc.Encode([]api.FPGARegion{{ID: hostile[0], Name: hostile[3], LoadedName: hostile[6], Health: devices.Health{Healthy: false, Reason: hostile[9]}}})
	case r.URL.Path == "/v1/peers":
		var l api.PeerList
		l.Enabled, l.Self = true, hostile[1]
		for _, h := range hostile {
			l.Peers = append(l.Peers, api.Peer{Name: h, State: "alive", Address: h, APIAddress: h,
				Load: &api.PeerLoad{GPUs: map[string]int{h: 1}, Health: h}})
		}
		enc.Encode(l)
	default:
		w.WriteHeader(404)
		enc.Encode(api.Error{Code: api.CodeNotFound, Message: "no route " + hostile[0]})
	}
}

// TestHostileStringsReachNoTerminal runs the commands that print for
// people — list, show, events, status, peers, top --once, logs --escape,
// and an error — against a daemon that answers with the hostile strings,
// and checks that nothing in their output could drive a terminal, that
// no field forged a row, and that plain logs stay byte for byte.
func TestHostileStringsReachNoTerminal(t *testing.T) {
	sock := serveFake(t, hostileDaemon{})
	run := func(args ...string) (string, string, int) {
		var out, errb bytes.Buffer
		code := Execute(context.Background(), append([]string{"--socket", sock}, args...), strings.NewReader(""), &out, &errb)
		return out.String(), errb.String(), code
	}
	for _, args := range [][]string{{"list"}, {"show", "7"}, {"status"}, {"peers"}, {"top", "--once"}, {"logs", "--escape", "7"}} {
		out, errs, code := run(args...)
		if code != 0 {
			t.Errorf("%v: exit %d: %s", args, code, errs)
			continue
		}
		checkClean(t, strings.Join(args, " "), out)
	}
	out, _, _ := run("list")
	if rows := strings.Count(out, "\n"); rows != 1+len(hostile) {
		t.Errorf("list: %d lines for %d jobs: a field forged a row:\n%s", rows, len(hostile), out)
	}
	for _, want := range []string{`\x1b[31mred`, `\u202eevil`} {
		if !strings.Contains(out, want) {
			t.Errorf("list does not show %q visibly:\n%s", want, out)
		}
	}
	show, _, _ := run("show", "7")
	for _, want := range []string{"Workdir:", "Rootfs:", "Labels:", `team=\x1b[31mred\x1b[0m`} {
		if !strings.Contains(show, want) {
			t.Errorf("show lacks %q:\n%s", want, show)
		}
	}
	// events streams until the daemon ends the stream; the command opens it
	// again, so it runs under a deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var ev, everr bytes.Buffer
	Execute(ctx, []string{"--socket", sock, "events"}, strings.NewReader(""), &ev, &everr)
	checkClean(t, "events", ev.String())
	if n := strings.Count(ev.String(), "\n"); n < len(hostile) || n%len(hostile) != 0 {
		t.Errorf("events: %d lines for streams of %d events:\n%s", n, len(hostile), ev.String())
	}
	_, errs, code := run("fpga", "bitstream", "list")
	if code == 0 {
		t.Fatal("an unknown route answered")
	}
	checkClean(t, "error", errs)
	raw, _, _ := run("logs", "7")
	if raw != strings.Join(hostile, "\n")+"\n" {
		t.Errorf("logs without --escape changed the job's bytes: %q", raw)
	}
}

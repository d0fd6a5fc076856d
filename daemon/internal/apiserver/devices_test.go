package apiserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/apiserver"
	"github.com/fusiond/fusiond/daemon/internal/hardware"
	"github.com/fusiond/fusiond/daemon/internal/jobs/jobstest"
	"github.com/fusiond/fusiond/devices/fpga/bitstream"
	"github.com/fusiond/fusiond/devices/fpga/bitstream/forge"
	fpgasim "github.com/fusiond/fusiond/devices/fpga/simhost"
)

var (
	simOnce sync.Once
	simHost *hardware.Host
	simDir  string
	simErr  error
)

func TestMain(m *testing.M) {
	jobstest.Reexec() // the job monitors of startServer's runner
	code := m.Run()
	if simHost != nil {
		simHost.Close()
	}
	if simDir != "" {
		os.RemoveAll(simDir)
	}
	os.Exit(code)
}

// sharedSimHost opens the simulated dgxh200 host (8 GPUs, the FPGA
// simhost) once for the package: writing its topology tree takes seconds.
func sharedSimHost(t *testing.T) *hardware.Host {
	t.Helper()
	simOnce.Do(func() {
		simDir, simErr = os.MkdirTemp("", "fusiond-api-sim-")
		if simErr != nil {
			return
		}
		simHost, simErr = hardware.Open(context.Background(), hardware.Config{StateDir: simDir, Simulate: "dgxh200"}, nil)
	})
	if simErr != nil {
		t.Fatal(simErr)
	}
	return simHost
}

// held is a fixed set of devices that jobs hold.
type held map[string]bool

func (h held) HeldDevices() map[string]bool { return h }

// startDeviceServer serves the device routes for h on two Unix sockets:
// one whose callers are admins (the tests run as root) and one whose
// callers are an ordinary user.
func startDeviceServer(t *testing.T, dev apiserver.DeviceBackend, maxBitstream int64) (admin, user *http.Client) {
	t.Helper()
	srv := apiserver.New(backend{}, apiserver.Config{MaxBodyBytes: 64 << 10, Devices: dev, MaxBitstreamBytes: maxBitstream})
	dir := t.TempDir()
	serve := func(name string, asUser bool) *http.Client {
		sock := filepath.Join(dir, name)
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		hs := &http.Server{Handler: srv, ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if asUser {
				return apiserver.WithCaller(ctx, api.Caller{UID: 4242, GID: 4242}, nil)
			}
			return srv.ConnContext(ctx, c)
		}}
		go hs.Serve(ln)
		t.Cleanup(func() { hs.Shutdown(context.Background()) })
		return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
	}
	return serve("admin.sock", false), serve("user.sock", true)
}

func TestDeviceRoutes(t *testing.T) {
	h := sharedSimHost(t)
	gpu7 := h.GPUs().GPUs()[7].UUID
	admin, user := startDeviceServer(t, hardware.NewBackend(h, held{fpgasim.DFL1: true, gpu7: true}), 3<<20)

	layout, err := os.ReadFile("../../../examples/mig-layouts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	mig := func(config string) string {
		b, _ := json.Marshal(api.MIGRequest{Layout: string(layout), Config: config})
		return string(b)
	}
	samples := h.SampleBitstreams()
	sample := func(name string) string {
		b, err := os.ReadFile(filepath.Join(samples, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	region := func(id string) string { return "/v1/fpga/regions/" + url.PathEscape(id) + "/program" }
	tooMany := `{"config":"x","layout":"version: v1\nmig-configs:\n  x:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices: {\"1g.18gb\": 8}\n"}`
	unknownProfile := `{"config":"x","layout":"version: v1\nmig-configs:\n  x:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices: {\"1g.10gb\": 1}\n"}`

	tests := []struct {
		name                string
		asUser              bool
		method, path, body  string
		wantStatus          int
		wantCode, wantField string
		wantBody            string // regexp
	}{
		{"topology", false, "GET", "/v1/topology", "", 200, "", "", `"hostname": "sim-dgx-h200"[\s\S]*"0000:07:00.0"`},
		{"topology as user", true, "GET", "/v1/topology", "", 200, "", "", `"links"`},
		{"topology bad query", false, "GET", "/v1/topology?x=1", "", 400, api.CodeBadRequest, "x", ""},
		{"topology wrong method", false, "POST", "/v1/topology", "", 405, api.CodeMethodNotAllowed, "", ""},
		{"matrix", false, "GET", "/v1/topology/matrix", "", 200, "", "", `"label": "GPU7"[\s\S]*"NV2"[\s\S]*"PIX"`},
		{"gpus", true, "GET", "/v1/gpus", "", 200, "", "", `"simulated": "dgxh200"[\s\S]*"index": 7[\s\S]*"share_mode": "time-slicing"`},
		{"gpu processes as user", true, "POST", "/v1/gpus/1/processes", `{"processes":[]}`, 403, api.CodeForbidden, "", ""},
		{"gpu processes bad pid", false, "POST", "/v1/gpus/1/processes", `{"processes":[{"pid":0,"memory":"1Gi"}]}`, 422, api.CodeInvalid, "processes[0].pid", ""},
		{"gpu processes negative memory", false, "POST", "/v1/gpus/1/processes", `{"processes":[{"pid":5,"memory":-1}]}`, 422, api.CodeInvalid, "processes[0].memory", ""},
		{"gpu processes unknown field", false, "POST", "/v1/gpus/1/processes", `{"procs":[]}`, 422, api.CodeInvalid, "procs", ""},
		{"gpu processes unknown GPU", false, "POST", "/v1/gpus/99/processes", `{"processes":[]}`, 404, api.CodeNotFound, "", ""},
		{"gpu processes bad index", false, "POST", "/v1/gpus/x/processes", `{"processes":[]}`, 422, api.CodeInvalid, "index", ""},
		{"gpu processes set", false, "POST", "/v1/gpus/1/processes", `{"processes":[{"pid":4242,"memory":"2Gi"}]}`, 204, "", "", ""},
		{"gpu processes cleared", false, "POST", "/v1/gpus/1/processes", `{"processes":[]}`, 204, "", "", ""},
		{"mig plan", true, "POST", "/v1/mig/plan", mig("inference-split"), 200, "", "", `"config": "inference-split"[\s\S]*"kind": "set-mig-mode"[\s\S]*"profile": "3g.71gb"[\s\S]*"applied": false`},
		{"mig plan busy GPU", false, "POST", "/v1/mig/plan", mig("all-1g.18gb"), 409, api.CodeConflict, "", ""},
		{"mig plan malformed JSON", false, "POST", "/v1/mig/plan", `{"layout":`, 400, api.CodeBadRequest, "", ""},
		{"mig plan unknown field", false, "POST", "/v1/mig/plan", `{"layout":"x","config":"y","dry":true}`, 422, api.CodeInvalid, "dry", ""},
		{"mig plan no layout", false, "POST", "/v1/mig/plan", `{"config":"y"}`, 422, api.CodeInvalid, "layout", ""},
		{"mig plan no config", false, "POST", "/v1/mig/plan", `{"layout":"version: v1"}`, 422, api.CodeInvalid, "config", ""},
		{"mig plan unknown config", false, "POST", "/v1/mig/plan", mig("all-7g"), 422, api.CodeInvalid, "config", ""},
		{"mig plan bad layout", false, "POST", "/v1/mig/plan", `{"config":"x","layout":"version: v2\n"}`, 422, api.CodeInvalid, "layout", ""},
		{"mig plan too many slices", false, "POST", "/v1/mig/plan", tooMany, 422, api.CodeUnsatisfiable, "layout", ""},
		{"mig plan unknown profile", false, "POST", "/v1/mig/plan", unknownProfile, 422, api.CodeUnsatisfiable, "layout", ""},
		{"mig apply as user", true, "POST", "/v1/mig/apply", mig("inference-split"), 403, api.CodeForbidden, "", ""},
		{"mig apply busy GPU", false, "POST", "/v1/mig/apply", mig("all-1g.18gb"), 409, api.CodeConflict, "", ""},
		{"mig apply", false, "POST", "/v1/mig/apply", mig("inference-split"), 200, "", "", `"applied": true`},
		{"mig plan after apply is empty", false, "POST", "/v1/mig/plan", mig("inference-split"), 200, "", "", `"actions": \[\]`},
		{"gpus show MIG", false, "GET", "/v1/gpus", "", 200, "", "", `"mig_enabled": true[\s\S]*"profile": "3g.71gb"`},
		{"regions", true, "GET", "/v1/fpga/regions", "", 200, "", "", `"id": "dfl/0000:3b:00.0/0"[\s\S]*"held": true`},
		{"bitstreams empty", true, "GET", "/v1/fpga/bitstreams", "", 200, "", "", `^\[\]\s*$`},
		{"add as user", true, "POST", "/v1/fpga/bitstreams?name=dma", sample("dma.gbs"), 403, api.CodeForbidden, "", ""},
		{"add", false, "POST", "/v1/fpga/bitstreams?name=dma&file=dma.gbs", sample("dma.gbs"), 201, "", "", `"name": "dma"[\s\S]*"format": "gbs"`},
		{"add xclbin", false, "POST", "/v1/fpga/bitstreams?name=vadd&file=vadd.xclbin", sample("vadd.xclbin"), 201, "", "", `"format": "xclbin"`},
		{"add other shell", false, "POST", "/v1/fpga/bitstreams?name=gzip", sample("gzip-d5005.gbs"), 201, "", "", ``},
		{"add name taken", false, "POST", "/v1/fpga/bitstreams?name=dma", sample("nlb0.gbs"), 409, api.CodeConflict, "name", ""},
		{"add garbage", false, "POST", "/v1/fpga/bitstreams?name=junk", "not a bitstream at all", 422, api.CodeInvalid, "body", ""},
		{"add hidden name", false, "POST", "/v1/fpga/bitstreams?name=.hidden", sample("nlb0.gbs"), 422, api.CodeInvalid, "name", "invalid bitstream name"},
		{"add without a name", false, "POST", "/v1/fpga/bitstreams", sample("nlb0.gbs"), 422, api.CodeInvalid, "name", ""},
		{"add named after its file", false, "POST", "/v1/fpga/bitstreams?file=nlb0.gbs", sample("nlb0.gbs"), 201, "", "", `"name": "nlb0"`},
		{"add bad name", false, "POST", "/v1/fpga/bitstreams?name=a%20b", sample("nlb0.gbs"), 422, api.CodeInvalid, "name", ""},
		{"add known content under another name", false, "POST", "/v1/fpga/bitstreams?name=dma2", sample("dma.gbs"), 409, api.CodeConflict, "body", `already in the library as \\"dma\\"`},
		{"add too large", false, "POST", "/v1/fpga/bitstreams?name=big", strings.Repeat("x", 4<<20), 413, api.CodeTooLarge, "", ""},
		{"add bad query", false, "POST", "/v1/fpga/bitstreams?nmae=x", sample("dma.gbs"), 400, api.CodeBadRequest, "nmae", ""},
		{"bitstreams", true, "GET", "/v1/fpga/bitstreams", "", 200, "", "", `"name": "dma"`},
		{"program as user", true, "POST", region(fpgasim.DFL0), `{"bitstream":"dma"}`, 403, api.CodeForbidden, "", ""},
		{"program", false, "POST", region(fpgasim.DFL0), `{"bitstream":"dma"}`, 200, "", "", `"name": "dma"[\s\S]*"already_loaded": false`},
		{"program again", false, "POST", region(fpgasim.DFL0), `{"bitstream":"dma"}`, 200, "", "", `"already_loaded": true`},
		{"program held region", false, "POST", region(fpgasim.DFL1), `{"bitstream":"dma"}`, 409, api.CodeConflict, "", ""},
		{"program unknown region", false, "POST", region("dfl/0000:00:00.0/9"), `{"bitstream":"dma"}`, 404, api.CodeNotFound, "", ""},
		{"program unknown bitstream", false, "POST", region(fpgasim.DFL0), `{"bitstream":"nope"}`, 404, api.CodeNotFound, "bitstream", ""},
		{"program other shell", false, "POST", region(fpgasim.DFL0), `{"bitstream":"gzip"}`, 422, api.CodeInvalid, "bitstream", ""},
		{"program wrong format", false, "POST", region(fpgasim.DFL0), `{"bitstream":"vadd"}`, 422, api.CodeInvalid, "bitstream", ""},
		{"program no bitstream", false, "POST", region(fpgasim.DFL0), `{}`, 422, api.CodeInvalid, "bitstream", ""},
		{"regions show loaded", false, "GET", "/v1/fpga/regions", "", 200, "", "", `"loaded_name": "dma"`},
		{"remove as user", true, "DELETE", "/v1/fpga/bitstreams/vadd", "", 403, api.CodeForbidden, "", ""},
		{"remove", false, "DELETE", "/v1/fpga/bitstreams/vadd", "", 200, "", "", `"name": "vadd"`},
		{"remove again", false, "DELETE", "/v1/fpga/bitstreams/vadd", "", 404, api.CodeNotFound, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hc := admin
			if tt.asUser {
				hc = user
			}
			status, body := do(t, hc, tt.method, tt.path, tt.body)
			if status != tt.wantStatus {
				t.Fatalf("status %d, want %d; body %s", status, tt.wantStatus, body)
			}
			if tt.wantStatus >= 400 {
				var e api.Error
				if err := json.Unmarshal(body, &e); err != nil {
					t.Fatalf("error body is not JSON: %s", body)
				}
				if (tt.wantCode != "" && e.Code != tt.wantCode) || e.Field != tt.wantField || e.Message == "" {
					t.Errorf("error %+v, want code %q field %q and a message", e, tt.wantCode, tt.wantField)
				}
			}
			if tt.wantBody != "" && !regexp.MustCompile(tt.wantBody).Match(body) {
				t.Errorf("body does not match %q:\n%.3000s", tt.wantBody, body)
			}
		})
	}
}

// TestDeviceClient drives the device routes through the Go client.
func TestDeviceClient(t *testing.T) {
	h := sharedSimHost(t)
	srv := apiserver.New(backend{}, apiserver.Config{Devices: hardware.NewBackend(h, nil)})
	sock := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv, ConnContext: srv.ConnContext}
	go hs.Serve(ln)
	defer hs.Shutdown(context.Background())
	c := api.NewClient(sock)
	defer c.Close()
	ctx := context.Background()

	topo, err := c.Topology(ctx)
	if err != nil || len(topo.Accelerators()) != 8 || topo.OnlineCPUs.String() != "0-223" {
		t.Fatalf("topology: %v, %+v", err, topo)
	}
	m, err := c.TopologyMatrix(ctx)
	if err != nil || len(m.Devices) != 12 || len(m.Distances) != 12 || m.Distances[0][0].String() != "X" {
		t.Fatalf("matrix: %v %+v", err, m)
	}
	gl, err := c.GPUs(ctx)
	if err != nil || len(gl.GPUs) != 8 || gl.Simulated != "dgxh200" {
		t.Fatalf("gpus: %v %+v", err, gl)
	}
	_, err = c.PlanMIG(ctx, api.MIGRequest{Layout: "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\n", Config: "x"})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Field != "config" {
		t.Errorf("plan of a missing config: %v", err)
	}
	path := filepath.Join(h.SampleBitstreams(), "matmul.xclbin")
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	b, err := c.AddBitstream(ctx, f, fi.Size(), "matmul", "matmul.xclbin")
	if err != nil || b.Name != "matmul" || b.Size != fi.Size() || len(b.ID) != 64 {
		t.Fatalf("add: %v %+v", err, b)
	}
	res, err := c.ProgramFPGA(ctx, fpgasim.XRT0, api.FPGAProgramRequest{Bitstream: "matmul"})
	if err != nil || res.Bitstream != b.ID || res.AlreadyLoaded {
		t.Fatalf("program: %v %+v", err, res)
	}
	rs, err := c.FPGARegions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.ID == fpgasim.XRT0 && r.LoadedBitstream != b.ID {
			t.Errorf("region %s holds %q after programming %s", r.ID, r.LoadedBitstream, b.ID)
		}
	}
	list, err := c.Bitstreams(ctx)
	if err != nil || len(list) == 0 {
		t.Fatalf("list: %v %v", err, list)
	}
	if _, err := c.RemoveBitstream(ctx, "matmul"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RemoveBitstream(ctx, "matmul"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("second remove: %v, want not found", err)
	}
}

// TestDeviceRoutesWithoutBackend: a server without devices answers 503.
func TestDeviceRoutesWithoutBackend(t *testing.T) {
	srv := apiserver.New(backend{}, apiserver.Config{})
	for _, r := range apiserver.Routes {
		if !strings.Contains(r.Path, "/topology") && !strings.Contains(r.Path, "/gpus") && !strings.Contains(r.Path, "/mig/") && !strings.Contains(r.Path, "/fpga/") {
			continue
		}
		path := strings.NewReplacer("{id}", "x", "{ref}", "y").Replace(r.Path)
		req, _ := http.NewRequest(r.Method, "http://x"+path, strings.NewReader("{}"))
		req = req.WithContext(apiserver.WithCaller(req.Context(), api.Caller{Admin: true}, nil))
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, req)
		if w.Code != http.StatusServiceUnavailable {
			t.Errorf("%s %s without devices: %d, want 503", r.Method, path, w.Code)
		}
	}
}

// TestBitstreamUploadStreams uploads a 64 MiB bitstream of unknown length
// (chunked) and checks the server never holds it in memory, then that a
// chunked upload over max_bitstream_bytes is refused with 413.
func TestBitstreamUploadStreams(t *testing.T) {
	h := sharedSimHost(t)
	dev := hardware.NewBackend(h, nil)
	admin, _ := startDeviceServer(t, dev, 1<<30)
	const size = 64 << 20
	upload := func(hc *http.Client, name string, payload int64) (int, []byte) {
		pr, pw := io.Pipe()
		go func() {
			pw.CloseWithError(forge.WriteGBS(pw, forge.GBS{InterfaceID: fpgasim.DFLInterface, AFUID: fpgasim.AFUDMA,
				AFUName: name, PayloadSize: payload, Seed: 7}))
		}()
		// A reader of unknown length makes the request chunked.
		req, err := http.NewRequest("POST", "http://x/v1/fpga/bitstreams?name="+name, struct{ io.Reader }{pr})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, body
	}

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	status, body := upload(admin, "big", size)
	runtime.ReadMemStats(&after)
	if status != 201 {
		t.Fatalf("upload: %d %s", status, body)
	}
	var b bitstream.Bitstream
	if err := json.Unmarshal(body, &b); err != nil || b.Size < size {
		t.Fatalf("upload answered %s (%v)", body, err)
	}
	// Client, server and library together; the header prefix the parser
	// keeps is 1 MiB.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16<<20 {
		t.Errorf("a %d MiB upload allocated %d MiB: the body is being buffered", size>>20, alloc>>20)
	}
	if _, err := dev.RemoveBitstream(context.Background(), "big"); err != nil {
		t.Fatal(err)
	}

	small, _ := startDeviceServer(t, dev, 2<<20)
	status, body = upload(small, "toobig", 4<<20)
	if status != http.StatusRequestEntityTooLarge || !strings.Contains(string(body), "max_bitstream_bytes") {
		t.Errorf("chunked upload over the limit: %d %s", status, body)
	}
	if _, err := dev.RemoveBitstream(context.Background(), "toobig"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("a refused upload left an entry: %v", err)
	}
}

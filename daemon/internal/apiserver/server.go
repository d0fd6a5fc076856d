// Package apiserver is fusiond's HTTP server for the API that package api
// defines: the routes (Routes, which docs/api.md documents), their
// handlers over a Backend (the job manager and node status) and a
// DeviceBackend (the host's hardware), and the callers' identities read
// from each connection's peer credentials.
//
// It may import daemon/api, daemon/profile (the profiles it lists) and the standard library; the backends it serves are interfaces it defines, so it
// imports neither the job manager nor the hardware.
package apiserver

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/audit"
)

// Backend is what the API serves; the daemon's job manager implements it.
type Backend interface {
	Submit(ctx context.Context, c api.Caller, spec api.JobSpec) (api.Job, error)
	// SubmitAll queues every spec or none (one store transaction).
	SubmitAll(ctx context.Context, c api.Caller, specs []api.JobSpec) ([]api.Job, error)
	// ListPage is one page of a listing: the jobs, newest first, copied
	// in one snapshot (no device shows under two of them), and the next
	// page's token ("" on the last page).
	ListPage(ctx context.Context, c api.Caller, opts api.ListOptions) ([]api.Job, string, error)
	Get(ctx context.Context, c api.Caller, id string) (api.Job, error)
	Cancel(ctx context.Context, c api.Caller, id string) (api.Job, error)
	// LogPath is the job's log file and whether the job has finished.
	LogPath(c api.Caller, id string) (string, bool, error)
	// Subscribe streams the events c may see, of one job or all.
	Subscribe(c api.Caller, jobID string) (<-chan api.Event, func())
	Node(ctx context.Context, c api.Caller) (api.NodeStatus, error)
	SetCordoned(c api.Caller, on bool) error
	// Ready is nil when the daemon takes work.
	Ready() error
}

// Route is one API endpoint.
type Route struct {
	Method, Path, Summary string
}

// Routes lists every endpoint; docs/api.md must document exactly these.
var Routes = []Route{
	{"POST", "/v1/jobs", "submit a job (body: JobSpec); 201 with the Job once it is on disk"},
	{"POST", "/v1/batches", "submit several jobs at once (body: {\"jobs\": [JobSpec, ...]}); all are queued or none"},
	{"GET", "/v1/jobs", "list jobs, newest first, one page at a time (query: state, user, class, limit, continue; header Fusiond-Continue: the next page's token)"},
	{"GET", "/v1/jobs/{id}", "one job with its events, allocation and exit status"},
	{"POST", "/v1/jobs/{id}/cancel", "cancel a job (SIGTERM, grace period, SIGKILL)"},
	{"GET", "/v1/jobs/{id}/logs", "the job's output (query: follow=true streams until the job ends)"},
	{"GET", "/v1/events", "stream of job state changes and device health transitions as JSON lines (query: job)"},
	{"GET", "/v1/node", "node status: capacity, allocation, job counts, devices"},
	{"POST", "/v1/node/cordon", "stop placing new jobs (admin)"},
	{"POST", "/v1/node/uncordon", "resume placing new jobs (admin)"},
	{"GET", "/v1/healthz", "liveness: 200 while the daemon answers"},
	{"GET", "/v1/readyz", "readiness: 200 when the daemon takes work, else 503"},
	{"GET", "/v1/version", "daemon version, commit, build date, API version"},
	{"GET", "/v1/topology", "the host model: sockets, NUMA nodes, cores, PCIe tree, NVLinks"},
	{"GET", "/v1/topology/matrix", "distance matrix of accelerators and NICs (nvidia-smi topo -m classes)"},
	{"GET", "/v1/gpus", "GPU inventory with health (Xid, probation), sharing, MIG instances, telemetry and recent device events"},
	{"POST", "/v1/gpus/{index}/fault", "inject an Xid into, or reset, a GPU of a simulated host (admin; live hosts refuse)"},
	{"POST", "/v1/gpus/{index}/processes", "set the compute processes a GPU of a simulated host reports (body: GPUProcessesRequest; admin; live hosts refuse)"},
	{"POST", "/v1/mig/plan", "plan a mig-parted layout config (body: MIGRequest); nothing is applied"},
	{"POST", "/v1/mig/apply", "apply a mig-parted layout config; GPUs holding jobs are refused (admin)"},
	{"GET", "/v1/fpga/regions", "FPGA regions with loaded bitstream, health and busy state"},
	{"POST", "/v1/fpga/regions/{id}/program", "program a region with a library bitstream (admin)"},
	{"GET", "/v1/fpga/bitstreams", "the bitstream library"},
	{"POST", "/v1/fpga/bitstreams", "upload a bitstream (body: the file; query: name, file) (admin)"},
	{"DELETE", "/v1/fpga/bitstreams/{ref}", "remove a bitstream from the library (admin)"},
	{"GET", "/v1/peers", "the peers: members, addresses, gossiped load and its age, health, gossip keyring fingerprints"},
	{"POST", "/v1/peers/keyring", "install, use or remove a gossip encryption key (body: KeyringRequest) (admin)"},
	{"GET", "/v1/profiles", "task profiles learned from finished jobs: run time, CPU, memory, GPU and GPU memory use, failure rate (query: owner, name, class; non-admins see their own)"},
	{"GET", "/v1/jobs/{id}/recommendation", "the job's requests against its profile's observed use, with suggested requests"},
	{"GET", "/v1/recommend", "a profile's latest requests against its observed use, with suggested requests (query: name, owner, class)"},
}

// Config tunes the HTTP server.
type Config struct {
	// MaxBodyBytes caps request bodies (413 past it).
	MaxBodyBytes int64
	// AdminGID, when set, makes members of that group admins.
	AdminGID *uint32
	Version  api.Version
	Logger   *slog.Logger
	// LogPoll is how often a followed log is checked for new output.
	LogPoll time.Duration
	// Devices serves the device routes; nil answers them with 503.
	Devices DeviceBackend
	// MaxBitstreamBytes caps bitstream uploads (413 past it); separate
	// from MaxBodyBytes because uploads are streamed to disk.
	MaxBitstreamBytes int64
	// Audit, when set, records every privileged request (job submit and
	// cancel, the admin routes) and every refusal (any 4xx answer).
	Audit *audit.Log
	// MaxStreamsPerUser caps one user's open streams (GET /v1/events and
	// followed logs) at once: 429 past it (0: no limit). StreamsExemptRoot
	// exempts uid 0.
	MaxStreamsPerUser int
	StreamsExemptRoot bool
	// StreamIdleTimeout ends an event stream that has carried no event for
	// that long (0: never).
	StreamIdleTimeout time.Duration
	// Observer, if set, is told of every request once it is answered.
	Observer RequestObserver
	// Peers serves the peer routes; nil: the daemon runs without peers.
	Peers PeerBackend
	// Profiles serves the task profile routes; nil: the daemon learns
	// none (profiles.enabled false).
	Profiles ProfileBackend
}

// RequestObserver records answered requests (the daemon's metrics).
type RequestObserver interface {
	// ObserveRequest is called once per request with the route pattern
	// that served it ("GET /v1/jobs/{id}"; "unmatched" when none did), the
	// status code written and the time the handler took.
	ObserveRequest(route string, code int, took time.Duration)
}

// LimitStreams names the stream limit in errors, as the configuration
// spells it.
const LimitStreams = "limits.per_user.streams"

// Server serves the API for a Backend.
type Server struct {
	cfg     Config
	b       Backend
	log     *slog.Logger
	mux     *http.ServeMux
	names   userNames
	streams chan struct{}

	openMu sync.Mutex
	open   map[uint32]int
	// routes are the patterns of Routes ("GET /v1/jobs"): the observer's
	// route labels.
	routes map[string]bool
}

// DefaultMaxBodyBytes is the default request body limit.
const DefaultMaxBodyBytes = 1 << 20

// New returns the API handler.
func New(b Backend, cfg Config) *Server {
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.LogPoll <= 0 {
		cfg.LogPoll = 100 * time.Millisecond
	}
	if cfg.MaxBitstreamBytes <= 0 {
		cfg.MaxBitstreamBytes = DefaultMaxBitstreamBytes
	}
	s := &Server{cfg: cfg, b: b, log: cfg.Logger, mux: http.NewServeMux(), streams: make(chan struct{}), open: map[uint32]int{}, routes: map[string]bool{}}
	handlers := map[string]http.HandlerFunc{
		"POST /v1/jobs":             s.submit,
		"POST /v1/batches":          s.submitBatch,
		"GET /v1/jobs":              s.list,
		"GET /v1/jobs/{id}":         s.get,
		"POST /v1/jobs/{id}/cancel": s.cancel,
		"GET /v1/jobs/{id}/logs":    s.logs,
		"GET /v1/events":            s.events,
		"GET /v1/node":              s.node,
		"POST /v1/node/cordon":      s.cordon(true),
		"POST /v1/node/uncordon":    s.cordon(false),
		"GET /v1/healthz":           s.healthz,
		"GET /v1/readyz":            s.readyz,
		"GET /v1/version":           s.version,
	}
	maps.Copy(handlers, s.deviceHandlers())
	maps.Copy(handlers, s.peerHandlers())
	maps.Copy(handlers, s.profileHandlers())
	paths := map[string]bool{}
	for _, r := range Routes {
		h, ok := handlers[r.Method+" "+r.Path]
		if !ok {
			panic("api: no handler for route " + r.Method + " " + r.Path)
		}
		s.mux.Handle(r.Method+" "+r.Path, s.audited(r.Method+" "+r.Path, s.authenticated(h)))
		s.routes[r.Method+" "+r.Path] = true
		paths[r.Path] = true
	}
	for p := range paths {
		s.mux.Handle(p, s.audited(p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			writeError(w, api.Errorf(api.CodeMethodNotAllowed, "%s is not allowed on %s", r.Method, p))
		})))
	}
	s.mux.Handle("/", s.audited("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, api.Errorf(api.CodeNotFound, "no route %s %s (the API is under /v1)", r.Method, r.URL.Path))
	})))
	return s
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Observer == nil {
		s.mux.ServeHTTP(w, r)
		return
	}
	start := time.Now()
	sw := &statusWriter{ResponseWriter: w}
	s.mux.ServeHTTP(sw, r)
	route := r.Pattern // set by the mux on the request it was handed
	if !s.routes[route] {
		// The per-path 405 handlers and the catch-all: a bounded label
		// set whatever paths callers make up.
		route = "unmatched"
	}
	s.cfg.Observer.ObserveRequest(route, cmp.Or(sw.code, http.StatusOK), time.Since(start))
}

// statusWriter remembers the status code a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush keeps streamed responses (logs -f, events) streaming.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ConnContext is the http.Server hook that reads the peer's credentials
// once per connection (LimitListener read them already for its own).
func (s *Server) ConnContext(ctx context.Context, c net.Conn) context.Context {
	if caller, err, ok := identified(c); ok {
		return withCaller(ctx, caller, err)
	}
	caller, err := s.Identify(c)
	return withCaller(ctx, caller, err)
}

// Identify tells who is on the other end of a socket connection: its
// peer credentials, user name, and whether it administers the daemon.
func (s *Server) Identify(c net.Conn) (api.Caller, error) {
	caller, err := peerCredentials(c)
	if err != nil {
		return caller, err
	}
	caller.User = s.names.name(caller.UID)
	// root, and the daemon's own user (a development daemon that does not
	// run as root), administer it.
	caller.Admin = caller.UID == 0 || caller.UID == uint32(os.Geteuid())
	if g := s.cfg.AdminGID; g != nil && (caller.GID == *g || slices.Contains(caller.Groups, *g)) {
		caller.Admin = true
	}
	return caller, nil
}

// openStream counts a stream of c against the per-user limit; the returned
// func ends it.
func (s *Server) openStream(c api.Caller) (func(), error) {
	s.openMu.Lock()
	defer s.openMu.Unlock()
	n := s.cfg.MaxStreamsPerUser
	if n > 0 && !(s.cfg.StreamsExemptRoot && c.UID == 0) && s.open[c.UID] >= n {
		return nil, api.QuotaError(LimitStreams, "uid %d has %d streams open (events, logs -f), the most allowed", c.UID, s.open[c.UID])
	}
	s.open[c.UID]++
	return func() {
		s.openMu.Lock()
		defer s.openMu.Unlock()
		if s.open[c.UID]--; s.open[c.UID] <= 0 {
			delete(s.open, c.UID)
		}
	}, nil
}

// OpenStreams is the number of streams open per uid.
func (s *Server) OpenStreams() map[uint32]int {
	s.openMu.Lock()
	defer s.openMu.Unlock()
	return maps.Clone(s.open)
}

// CloseStreams ends every streaming response (logs -f, events), so that a
// graceful shutdown does not wait for them.
func (s *Server) CloseStreams() { close(s.streams) }

func (s *Server) authenticated(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := CallerFrom(r.Context()); err != nil {
			writeError(w, api.Errorf(api.CodeForbidden, "cannot identify the caller: %v", err))
			return
		}
		h(w, r)
	})
}

func caller(r *http.Request) api.Caller {
	c, _ := CallerFrom(r.Context())
	return c
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	var e *api.Error
	if !errors.As(err, &e) {
		e = &api.Error{Code: api.CodeInternal, Message: err.Error()}
	}
	writeJSON(w, e.HTTPStatus(), e)
}

func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &api.Error{Code: api.CodeTooLarge, Limit: "max_request_bytes", Message: fmt.Sprintf("request body larger than %d bytes (limit max_request_bytes)", s.cfg.MaxBodyBytes)}
		}
		return nil, api.Errorf(api.CodeBadRequest, "reading body: %v", err)
	}
	return body, nil
}

func (s *Server) submit(w http.ResponseWriter, r *http.Request) {
	body, err := s.readBody(w, r)
	if err != nil {
		writeError(w, err)
		return
	}
	spec, err := api.DecodeSpec(body)
	if err != nil {
		writeError(w, err)
		return
	}
	job, err := s.b.Submit(r.Context(), caller(r), spec)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Location", "/v1/jobs/"+job.ID)
	writeJSON(w, http.StatusCreated, job)
}

func (s *Server) submitBatch(w http.ResponseWriter, r *http.Request) {
	body, err := s.readBody(w, r)
	if err != nil {
		writeError(w, err)
		return
	}
	specs, err := api.DecodeBatch(body)
	if err != nil {
		writeError(w, err)
		return
	}
	jobs, err := s.b.SubmitAll(r.Context(), caller(r), specs)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, api.BatchResponse{Jobs: jobs})
}

func checkQuery(r *http.Request, allowed ...string) error {
	for k := range r.URL.Query() {
		if !slices.Contains(allowed, k) {
			return &api.Error{Code: api.CodeBadRequest, Field: k, Message: "unknown query parameter (allowed: " + strings.Join(allowed, ", ") + ")"}
		}
	}
	return nil
}

func parseBool(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, &api.Error{Code: api.CodeBadRequest, Field: name, Message: "want true or false, got " + strconv.Quote(v)}
	}
	return b, nil
}

// list writes one page of jobs, one snapshot the backend copied at once
// (the copies share the records' immutable specs, so a page of large specs
// costs little memory); the JSON is encoded job by job outside the
// backend's lock and streamed, never held whole.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	if err := checkQuery(r, "state", "user", "class", "limit", "continue"); err != nil {
		writeError(w, err)
		return
	}
	opts, err := api.ParseListQuery(r.URL.Query())
	if err != nil {
		writeError(w, err)
		return
	}
	c := caller(r)
	jobs, next, err := s.b.ListPage(r.Context(), c, opts)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if next != "" {
		w.Header().Set(api.ContinueHeader, next)
	}
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 64<<10)
	enc := json.NewEncoder(bw)
	enc.SetIndent("", "  ")
	bw.WriteString("[")
	for i := range jobs {
		if i > 0 {
			bw.WriteString(",")
		}
		if err := enc.Encode(&jobs[i]); err != nil {
			return
		}
	}
	bw.WriteString("]\n")
	_ = bw.Flush()
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	job, err := s.b.Get(r.Context(), caller(r), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, job)
}

func (s *Server) cancel(w http.ResponseWriter, r *http.Request) {
	job, err := s.b.Cancel(r.Context(), caller(r), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, job)
}

func (s *Server) logs(w http.ResponseWriter, r *http.Request) {
	if err := checkQuery(r, "follow"); err != nil {
		writeError(w, err)
		return
	}
	follow, err := parseBool(r, "follow")
	if err != nil {
		writeError(w, err)
		return
	}
	c, id := caller(r), r.PathValue("id")
	path, _, err := s.b.LogPath(c, id)
	if err != nil {
		writeError(w, err)
		return
	}
	if follow {
		done, err := s.openStream(c)
		if err != nil {
			writeError(w, err)
			return
		}
		defer done()
	}
	f, err := os.Open(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		writeError(w, api.Errorf(api.CodeInternal, "open log: %v", err))
		return
	}
	if f != nil {
		defer f.Close()
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	tick := time.NewTicker(s.cfg.LogPoll)
	defer tick.Stop()
	for {
		// Read whether the job is done *before* draining the file, so the
		// last output of a job that just ended is not missed.
		_, done, err := s.b.LogPath(c, id)
		if err != nil {
			return
		}
		if f == nil {
			if f, err = os.Open(path); err == nil {
				defer f.Close()
			}
		}
		if f != nil {
			if _, err := io.Copy(w, f); err != nil {
				return
			}
		}
		if flusher != nil {
			flusher.Flush()
		}
		if !follow || done {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-s.streams:
			return
		case <-tick.C:
		}
	}
}

func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	if err := checkQuery(r, "job"); err != nil {
		writeError(w, err)
		return
	}
	c := caller(r)
	jobID := r.URL.Query().Get("job")
	if jobID != "" {
		if _, err := s.b.Get(r.Context(), c, jobID); err != nil {
			writeError(w, err)
			return
		}
	}
	closeStream, err := s.openStream(c)
	if err != nil {
		writeError(w, err)
		return
	}
	defer closeStream()
	ch, cancel := s.b.Subscribe(c, jobID)
	defer cancel()
	var idle <-chan time.Time
	var idleTimer *time.Timer
	if d := s.cfg.StreamIdleTimeout; d > 0 {
		idleTimer = time.NewTimer(d)
		defer idleTimer.Stop()
		idle = idleTimer.C
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	if flusher != nil {
		flusher.Flush()
	}
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for {
		select {
		case <-r.Context().Done():
			return
		case <-s.streams:
			return
		case <-idle:
			s.log.Debug("event stream idle; closing", "uid", c.UID, "idle", s.cfg.StreamIdleTimeout)
			return
		case ev, ok := <-ch:
			if !ok {
				return
			}
			if idleTimer != nil {
				idleTimer.Reset(s.cfg.StreamIdleTimeout)
			}
			if err := enc.Encode(ev); err != nil {
				return
			}
			if bw.Flush() != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
	}
}

func (s *Server) node(w http.ResponseWriter, r *http.Request) {
	st, err := s.b.Node(r.Context(), caller(r))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (s *Server) cordon(on bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := s.b.SetCordoned(caller(r), on); err != nil {
			writeError(w, err)
			return
		}
		st, err := s.b.Node(r.Context(), caller(r))
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, st)
	}
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, api.Health{Status: "ok"})
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	if err := s.b.Ready(); err != nil {
		writeError(w, api.Errorf(api.CodeUnavailable, "not ready: %v", err))
		return
	}
	writeJSON(w, http.StatusOK, api.Health{Status: "ready"})
}

func (s *Server) version(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.cfg.Version)
}

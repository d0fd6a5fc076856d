package apiserver

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/admission"
	"github.com/fusiond/fusiond/daemon/internal/audit"
)

// privileged names the routes whose every use is audited, whatever the
// outcome, and the path value (or query parameter, for "?name") that is
// the action's target.
var privileged = map[string]struct{ action, target string }{
	"POST /v1/jobs":                      {"job.submit", ""},
	"POST /v1/batches":                   {"job.submit", ""},
	"POST /v1/peers/keyring":             {"peers.keyring", ""},
	"POST /v1/jobs/{id}/cancel":          {"job.cancel", "id"},
	"POST /v1/node/cordon":               {"node.cordon", ""},
	"POST /v1/node/uncordon":             {"node.uncordon", ""},
	"POST /v1/gpus/{index}/fault":        {"gpu.fault", "index"},
	"POST /v1/mig/apply":                 {"mig.apply", ""},
	"POST /v1/fpga/regions/{id}/program": {"fpga.program", "id"},
	"POST /v1/fpga/bitstreams":           {"bitstream.add", "?name"},
	"DELETE /v1/fpga/bitstreams/{ref}":   {"bitstream.remove", "ref"},
}

// submitSources are the admission sources of the submission routes.
var submitSources = map[string]string{"POST /v1/jobs": string(admission.Socket), "POST /v1/batches": string(admission.Batch)}

// audited wraps a route's handler: a privileged route's every request,
// and any request answered with a refusal (4xx), is recorded.
func (s *Server) audited(pattern string, h http.Handler) http.Handler {
	if s.cfg.Audit == nil {
		return h
	}
	p, isPrivileged := privileged[pattern]
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now().UTC()
		aw := &auditWriter{ResponseWriter: w}
		// A submission is audited by the job manager's admission (with
		// its source and the jobs it made); the request is recorded here
		// only when it never got there (a body that does not decode).
		ctx, recorded := audit.WithMark(r.Context())
		h.ServeHTTP(aw, r.WithContext(ctx))
		if recorded.Load() {
			return
		}
		status := aw.status
		if status == 0 {
			status = http.StatusOK
		}
		refused := status >= 400 && status < 500
		if !isPrivileged && !refused {
			return
		}
		rec := audit.Record{
			Time: start, UID: -1, GID: -1,
			Action: "request", Method: r.Method, Path: r.URL.Path, Status: status, Outcome: audit.OK,
		}
		if c, err := CallerFrom(r.Context()); err == nil {
			rec.UID, rec.GID, rec.PID, rec.User, rec.Admin = int64(c.UID), int64(c.GID), c.PID, c.User, c.Admin
		}
		if isPrivileged {
			rec.Action = p.action
			// A submission refused before the job manager's admission
			// (its body does not decode) is named by its source too.
			rec.Source = submitSources[pattern]
			switch {
			case p.target == "":
			case p.target[0] == '?':
				rec.Target = r.URL.Query().Get(p.target[1:])
			default:
				rec.Target = r.PathValue(p.target)
			}
		}
		switch {
		case refused:
			rec.Outcome = audit.Refused
		case status >= 500:
			rec.Outcome = audit.Failed
		}
		if status >= 400 {
			var e api.Error
			if json.Unmarshal(aw.body, &e) == nil {
				rec.Code, rec.Field, rec.Message = e.Code, e.Field, e.Message
			}
		} else if rec.Action == "job.submit" {
			if loc := w.Header().Get("Location"); len(loc) > len("/v1/jobs/") {
				rec.Target = loc[len("/v1/jobs/"):]
			}
		}
		s.cfg.Audit.Record(rec)
	})
}

// maxAuditedBody is how much of an error answer is kept for its record.
const maxAuditedBody = 4096

// auditWriter remembers a response's status and the start of an error
// body; it passes flushes on (streams).
type auditWriter struct {
	http.ResponseWriter
	status int
	body   []byte
}

func (w *auditWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *auditWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.status >= 400 && len(w.body) < maxAuditedBody {
		w.body = append(w.body, p[:min(len(p), maxAuditedBody-len(w.body))]...)
	}
	return w.ResponseWriter.Write(p)
}

func (w *auditWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap serves http.ResponseController.
func (w *auditWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

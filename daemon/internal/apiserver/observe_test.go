package apiserver_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/internal/apiserver"
)

type seen struct {
	route string
	code  int
}

type recorder struct {
	mu  sync.Mutex
	got []seen
}

func (r *recorder) ObserveRequest(route string, code int, took time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if took < 0 {
		code = -1
	}
	r.got = append(r.got, seen{route, code})
}

// The observer sees every request once, labelled by the route pattern that
// served it (never by the raw path), with the status code written.
func TestRequestObserver(t *testing.T) {
	rec := &recorder{}
	srv := apiserver.New(nil, apiserver.Config{Observer: rec})
	for _, r := range []struct{ method, path string }{
		{"GET", "/v1/jobs/j-123"}, // no peer credentials: 403 from the route
		{"GET", "/v1/nope/secret-path"},
		{"PUT", "/v1/jobs"},
		{"GET", "/v1/healthz"},
	} {
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, httptest.NewRequest(r.method, r.path, nil))
	}
	want := []seen{
		{"GET /v1/jobs/{id}", http.StatusForbidden},
		{"unmatched", http.StatusNotFound},
		{"unmatched", http.StatusMethodNotAllowed},
		{"GET /v1/healthz", http.StatusForbidden},
	}
	if !slices.Equal(rec.got, want) {
		t.Errorf("observed %v, want %v", rec.got, want)
	}
}

package apiserver

import (
	"context"
	"net/http"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/profile"
)

// ProfileBackend serves the task profiles (the daemon's profile learner).
// It applies who may see what: a non-admin caller only their own
// profiles, and only their own jobs' recommendations.
type ProfileBackend interface {
	Profiles(c api.Caller, q api.ProfileQuery) (api.ProfileList, error)
	Recommend(c api.Caller, q api.ProfileQuery) (api.Recommendation, error)
	JobRecommendation(ctx context.Context, c api.Caller, jobID string) (api.Recommendation, error)
}

// profileHandlers serve the profile routes (listed in Routes).
func (s *Server) profileHandlers() map[string]http.HandlerFunc {
	return map[string]http.HandlerFunc{
		"GET /v1/profiles":                 s.profiles,
		"GET /v1/recommend":                s.recommend,
		"GET /v1/jobs/{id}/recommendation": s.jobRecommendation,
	}
}

func profileQuery(r *http.Request) (api.ProfileQuery, error) {
	if err := checkQuery(r, "owner", "name", "class"); err != nil {
		return api.ProfileQuery{}, err
	}
	q := r.URL.Query()
	return api.ProfileQuery{Owner: q.Get("owner"), Name: q.Get("name"), Class: q.Get("class")}, nil
}

func (s *Server) profiles(w http.ResponseWriter, r *http.Request) {
	q, err := profileQuery(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if s.cfg.Profiles == nil {
		writeJSON(w, http.StatusOK, api.ProfileList{Profiles: []profile.Profile{}})
		return
	}
	out, err := s.cfg.Profiles.Profiles(caller(r), q)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) recommend(w http.ResponseWriter, r *http.Request) {
	q, err := profileQuery(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if q.Name == "" {
		writeError(w, &api.Error{Code: api.CodeBadRequest, Field: "name", Message: "name the profile (a job's name, or its labels as k=v,k=v)"})
		return
	}
	if s.cfg.Profiles == nil {
		writeError(w, api.Errorf(api.CodeConflict, "this daemon learns no task profiles (profiles.enabled is false)"))
		return
	}
	out, err := s.cfg.Profiles.Recommend(caller(r), q)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) jobRecommendation(w http.ResponseWriter, r *http.Request) {
	if err := checkQuery(r); err != nil {
		writeError(w, err)
		return
	}
	if s.cfg.Profiles == nil {
		writeError(w, api.Errorf(api.CodeConflict, "this daemon learns no task profiles (profiles.enabled is false)"))
		return
	}
	out, err := s.cfg.Profiles.JobRecommendation(r.Context(), caller(r), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

package api

import (
	"context"
	"net/http"
	"net/url"

	"github.com/fusiond/fusiond/daemon/profile"
)

// ProfileQuery selects profiles (GET /v1/profiles) or names the profile a
// recommendation is for (GET /v1/recommend): each field, when set, must
// match exactly. Non-admin callers see only their own profiles, whatever
// Owner says.
type ProfileQuery struct {
	Owner string `json:"owner,omitempty"`
	Name  string `json:"name,omitempty"`
	Class string `json:"class,omitempty"`
}

func (q ProfileQuery) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"owner": q.Owner, "name": q.Name, "class": q.Class} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

// ProfileList is GET /v1/profiles' answer: the task profiles the daemon
// learned from finished jobs (package profile), sorted by owner, name and
// class. Enabled is false when the daemon learns none (profiles.enabled).
type ProfileList struct {
	Enabled  bool              `json:"enabled"`
	Profiles []profile.Profile `json:"profiles"`
	// HalfLife is how long until a run weighs half (profiles.half_life).
	HalfLife Duration `json:"half_life"`
}

// Recommendation is the recommendation endpoints' answer: what a job of a
// profile's key asks for against what its runs used.
type Recommendation struct {
	// JobID is the job whose spec was compared (GET
	// /v1/jobs/{id}/recommendation); empty for GET /v1/recommend, which
	// compares the profile's latest request.
	JobID string `json:"job_id,omitempty"`
	// Ready is true when the profile has enough sampled runs
	// (profiles.min_runs) for a suggestion: Suggested, OverAsked and
	// Reasons are set. Otherwise Note says why not and Suggested is the
	// request.
	Ready bool `json:"ready"`
	profile.Recommendation
	Note string `json:"note,omitempty"`
	// Profile is the key's profile (the observed use), when there is one.
	Profile *profile.Profile `json:"profile,omitempty"`
}

// Profiles lists the task profiles q selects.
func (c *Client) Profiles(ctx context.Context, q ProfileQuery) (ProfileList, error) {
	var out ProfileList
	path := "/v1/profiles"
	if v := q.values(); len(v) > 0 {
		path += "?" + v.Encode()
	}
	err := c.do(ctx, http.MethodGet, path, nil, &out)
	return out, err
}

// JobRecommendation compares job id's requests with its key's profile.
func (c *Client) JobRecommendation(ctx context.Context, id string) (Recommendation, error) {
	var out Recommendation
	err := c.do(ctx, http.MethodGet, "/v1/jobs/"+url.PathEscape(id)+"/recommendation", nil, &out)
	return out, err
}

// Recommend compares a profile's latest request with its observed use; q
// names it (Name is required; Owner defaults to the caller; without
// Class, the owner's most recently seen profile of that name).
func (c *Client) Recommend(ctx context.Context, q ProfileQuery) (Recommendation, error) {
	var out Recommendation
	err := c.do(ctx, http.MethodGet, "/v1/recommend?"+q.values().Encode(), nil, &out)
	return out, err
}

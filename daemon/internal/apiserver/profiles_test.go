package apiserver_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/apiserver"
	"github.com/fusiond/fusiond/daemon/profile"
)

type fakeProfiles struct {
	queries []api.ProfileQuery
	jobs    []string
}

func (f *fakeProfiles) Profiles(_ api.Caller, q api.ProfileQuery) (api.ProfileList, error) {
	f.queries = append(f.queries, q)
	return api.ProfileList{Enabled: true, Profiles: []profile.Profile{{Key: profile.Key{Owner: "alice", Name: q.Name}, Runs: 2}}}, nil
}

func (f *fakeProfiles) Recommend(_ api.Caller, q api.ProfileQuery) (api.Recommendation, error) {
	f.queries = append(f.queries, q)
	return api.Recommendation{Ready: true, Recommendation: profile.Recommendation{Key: profile.Key{Name: q.Name}}}, nil
}

func (f *fakeProfiles) JobRecommendation(_ context.Context, _ api.Caller, id string) (api.Recommendation, error) {
	f.jobs = append(f.jobs, id)
	if id != "7" {
		return api.Recommendation{}, api.ErrNotFound
	}
	return api.Recommendation{JobID: id}, nil
}

func TestProfileRoutes(t *testing.T) {
	hc, _ := startServer(t)
	code, body := do(t, hc, "GET", "/v1/profiles", "")
	var l api.ProfileList
	if code != 200 || json.Unmarshal(body, &l) != nil || l.Enabled || l.Profiles == nil {
		t.Fatalf("without profiles: %d %s", code, body)
	}
	for _, path := range []string{"/v1/recommend?name=x", "/v1/jobs/7/recommendation"} {
		if code, body := do(t, hc, "GET", path, ""); code != 409 {
			t.Errorf("%s without profiles: %d %s", path, code, body)
		}
	}

	f := &fakeProfiles{}
	hc, _, _ = startServerWith(t, nil, func(c *apiserver.Config) { c.Profiles = f })
	code, body = do(t, hc, "GET", "/v1/profiles?owner=alice&name=a%3D1%2Cb%3D2&class=batch", "")
	if code != 200 || json.Unmarshal(body, &l) != nil || len(l.Profiles) != 1 || l.Profiles[0].Runs != 2 {
		t.Fatalf("profiles: %d %s", code, body)
	}
	if len(f.queries) != 1 || f.queries[0] != (api.ProfileQuery{Owner: "alice", Name: "a=1,b=2", Class: "batch"}) {
		t.Fatalf("query passed %+v", f.queries)
	}
	for path, field := range map[string]string{
		"/v1/profiles?user=alice":       "user",
		"/v1/recommend":                 "name",
		"/v1/recommend?owner=alice":     "name",
		"/v1/recommend?name=x&limit=3":  "limit",
		"/v1/jobs/7/recommendation?x=1": "x",
	} {
		code, body := do(t, hc, "GET", path, "")
		var e api.Error
		json.Unmarshal(body, &e)
		if code != 400 || e.Field != field {
			t.Errorf("%s: %d %s, want 400 about %s", path, code, body, field)
		}
	}
	if len(f.queries) != 1 || len(f.jobs) != 0 {
		t.Fatalf("bad requests reached the backend: %+v %+v", f.queries, f.jobs)
	}
	if code, body := do(t, hc, "GET", "/v1/recommend?name=train", ""); code != 200 || len(f.queries) != 2 || f.queries[1].Name != "train" {
		t.Errorf("recommend: %d %s", code, body)
	}
	if code, body := do(t, hc, "GET", "/v1/jobs/7/recommendation", ""); code != 200 {
		t.Errorf("job recommendation: %d %s", code, body)
	}
	if code, _ := do(t, hc, "GET", "/v1/jobs/8/recommendation", ""); code != 404 {
		t.Errorf("another's job: %d, want 404", code)
	}
}

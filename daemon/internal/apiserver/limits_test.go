package apiserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/apiserver"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
)

var root = api.Caller{UID: 0, Admin: true}

func wantError(t *testing.T, code int, body []byte, wantStatus int, wantCode, wantField, wantLimit string) {
	t.Helper()
	var e api.Error
	_ = json.Unmarshal(body, &e)
	if code != wantStatus || e.Code != wantCode || e.Field != wantField || e.Limit != wantLimit {
		t.Fatalf("got %d %s, want %d code %q field %q limit %q", code, body, wantStatus, wantCode, wantField, wantLimit)
	}
}

func countJobs(t *testing.T, hc *http.Client) int {
	t.Helper()
	code, body := do(t, hc, "GET", "/v1/jobs", "")
	var list []api.Job
	if code != 200 || json.Unmarshal(body, &list) != nil {
		t.Fatalf("list: %d %s", code, body)
	}
	return len(list)
}

func spec(name string) string {
	return `{"name":"` + name + `","command":["sleep","30"],"resources":{"cpu":"100m","memory":"16Mi"}}`
}

// TestPendingJobsQuota: a user's queued jobs stop at the limit with 429
// naming it, a batch past it is refused whole, and root is exempt only
// when configured.
func TestPendingJobsQuota(t *testing.T) {
	hc, mgr, _ := startServerWith(t, func(c *jobs.Config) { c.Limits.PendingJobs = 3 }, nil)
	if err := mgr.SetCordoned(root, true); err != nil { // keep them queued
		t.Fatal(err)
	}
	for i := range 2 {
		if code, body := do(t, hc, "POST", "/v1/jobs", spec(fmt.Sprint("j", i))); code != 201 {
			t.Fatalf("submit %d: %d %s", i, code, body)
		}
	}
	code, body := do(t, hc, "POST", "/v1/batches", `{"jobs":[`+spec("a")+`,`+spec("b")+`]}`)
	wantError(t, code, body, 429, api.CodeQuota, "", jobs.LimitPendingJobs)
	if n := countJobs(t, hc); n != 2 {
		t.Fatalf("a refused batch left %d jobs, want 2", n)
	}
	if code, body := do(t, hc, "POST", "/v1/jobs", spec("third")); code != 201 {
		t.Fatalf("third: %d %s", code, body)
	}
	code, body = do(t, hc, "POST", "/v1/jobs", spec("fourth"))
	wantError(t, code, body, 429, api.CodeQuota, "", jobs.LimitPendingJobs)
	if !strings.Contains(string(body), "limit of 3") {
		t.Errorf("message does not state the limit: %s", body)
	}
}

// TestSpecSizeLimits: one spec over max_spec_bytes is 413 naming the
// limit; a user's remembered specs over spec_bytes are 429.
func TestSpecSizeLimits(t *testing.T) {
	hc, mgr, _ := startServerWith(t, func(c *jobs.Config) {
		c.Limits.MaxSpecBytes = 2048
		c.Limits.SpecBytes = 4096
	}, func(c *apiserver.Config) { c.MaxBodyBytes = 64 << 10 })
	if err := mgr.SetCordoned(root, true); err != nil {
		t.Fatal(err)
	}
	big := `{"command":["true"],"env":{"BIG":"` + strings.Repeat("x", 3000) + `"},"resources":{"cpu":"100m","memory":"16Mi"}}`
	code, body := do(t, hc, "POST", "/v1/jobs", big)
	wantError(t, code, body, 413, api.CodeTooLarge, "", jobs.LimitMaxSpecBytes)
	mid := `{"command":["true"],"env":{"MID":"` + strings.Repeat("x", 1500) + `"},"resources":{"cpu":"100m","memory":"16Mi"}}`
	created := 0
	for range 5 {
		code, body = do(t, hc, "POST", "/v1/jobs", mid)
		if code != 201 {
			break
		}
		created++
	}
	wantError(t, code, body, 429, api.CodeQuota, "", jobs.LimitSpecBytes)
	if created != 2 {
		t.Errorf("%d specs of ~1.6 KiB fit in 4 KiB, want 2", created)
	}
}

// TestRunningJobsQuota: past the running limit jobs stay queued with the
// limit in their reason, and start when a slot frees.
func TestRunningJobsQuota(t *testing.T) {
	hc, mgr, _ := startServerWith(t, func(c *jobs.Config) { c.Limits.RunningJobs = 1 }, nil)
	for i := range 2 {
		if code, body := do(t, hc, "POST", "/v1/jobs", spec(fmt.Sprint("r", i))); code != 201 {
			t.Fatalf("submit: %d %s", code, body)
		}
	}
	waitState(t, hc, "1", api.StateRunning)
	deadline := time.Now().Add(5 * time.Second)
	for {
		j, err := mgr.Get(context.Background(), root, "2")
		if err != nil {
			t.Fatal(err)
		}
		if j.State != api.StatePending {
			t.Fatalf("job 2 is %s past the running limit", j.State)
		}
		if strings.Contains(j.Reason, jobs.LimitRunningJobs) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job 2 reason %q does not name %s", j.Reason, jobs.LimitRunningJobs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, body := do(t, hc, "POST", "/v1/jobs/1/cancel", ""); code != 200 {
		t.Fatalf("cancel: %d %s", code, body)
	}
	waitState(t, hc, "2", api.StateRunning)
}

// TestStreamLimitAndIdleTimeout: a user's streams stop at the limit with
// 429; closing one frees its slot; an idle event stream is closed.
func TestStreamLimitAndIdleTimeout(t *testing.T) {
	hc, _, srv := startServerWith(t, nil, func(c *apiserver.Config) {
		c.MaxStreamsPerUser = 2
		c.StreamIdleTimeout = 300 * time.Millisecond
	})
	open := func() (*http.Response, error) {
		req, _ := http.NewRequest("GET", "http://x/v1/events", nil)
		return hc.Do(req)
	}
	var resps []*http.Response
	for range 2 {
		resp, err := open()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("open stream: %v %v", resp, err)
		}
		resps = append(resps, resp)
	}
	resp, err := open()
	if err != nil {
		t.Fatal(err)
	}
	var e api.Error
	json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if resp.StatusCode != 429 || e.Limit != apiserver.LimitStreams {
		t.Fatalf("third stream: %d %+v, want 429 naming %s", resp.StatusCode, e, apiserver.LimitStreams)
	}
	// Idle streams end by themselves; their slots free.
	start := time.Now()
	for _, r := range resps {
		buf := make([]byte, 1)
		if _, err := r.Body.Read(buf); err == nil {
			t.Fatal("an idle stream carried data")
		}
		r.Body.Close()
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("idle streams took %s to close", d)
	}
	deadline := time.Now().Add(3 * time.Second)
	for len(srv.OpenStreams()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("streams still counted: %v", srv.OpenStreams())
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp, err = open()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("stream after the others closed: %v %v", resp, err)
	}
	resp.Body.Close()
}

// TestLogLimits: over the per-user log limit the user's finished logs are
// removed and, while running jobs alone exceed it, submissions are 429;
// the node's log budget refuses everyone, root included.
func TestLogLimits(t *testing.T) {
	for _, tc := range []struct {
		name  string
		set   func(*jobs.Limits)
		limit string
	}{
		{"per user", func(l *jobs.Limits) { l.LogBytes = 1000 }, jobs.LimitLogBytes},
		{"node budget", func(l *jobs.Limits) { l.LogBudget = 1000; l.ExemptRoot = true }, jobs.LimitLogBudget},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hc, mgr, _ := startServerWith(t, func(c *jobs.Config) {
				tc.set(&c.Limits)
				c.LogScanInterval = 20 * time.Millisecond
			}, nil)
			finished := `{"name":"chatty","command":["sh","-c","head -c 2000 /dev/zero"],"resources":{"cpu":"100m","memory":"16Mi"}}`
			running := `{"name":"writer","command":["sh","-c","head -c 5000 /dev/zero; exec sleep 30"],"resources":{"cpu":"100m","memory":"16Mi"}}`
			if code, body := do(t, hc, "POST", "/v1/jobs", finished); code != 201 {
				t.Fatalf("%d %s", code, body)
			}
			waitState(t, hc, "1", api.StateSucceeded)
			// Until the next measurement sees job 1 finished (and removes
			// its log), the user may still be over the limit.
			deadline := time.Now().Add(10 * time.Second)
			for {
				code, body := do(t, hc, "POST", "/v1/jobs", running)
				if code == 201 {
					if id := jobID(t, body); id != "2" {
						t.Fatalf("the writer is job %s, want 2", id)
					}
					break
				}
				if code != 429 || time.Now().After(deadline) {
					t.Fatalf("%d %s", code, body)
				}
				time.Sleep(10 * time.Millisecond)
			}
			waitState(t, hc, "2", api.StateRunning)
			var code int
			var body []byte
			deadline = time.Now().Add(10 * time.Second)
			for {
				code, body = do(t, hc, "POST", "/v1/jobs", spec("more"))
				if code == 429 || time.Now().After(deadline) {
					break
				}
				t.Logf("accepted while the log scan catches up: %s", body)
				do(t, hc, "POST", "/v1/jobs/"+jobID(t, body)+"/cancel", "")
				time.Sleep(20 * time.Millisecond)
			}
			wantError(t, code, body, 429, api.CodeQuota, "", tc.limit)
			// The finished job's log went to make room.
			if code, out := do(t, hc, "GET", "/v1/jobs/1/logs", ""); code != 200 || len(out) != 0 {
				t.Errorf("finished job's log: %d, %d bytes, want removed", code, len(out))
			}
			if _, total := mgr.LogUsage(); total < 5000 {
				t.Errorf("measured %d log bytes, want the running job's 5000", total)
			}
			// Once the running job ends its log goes too, and work is taken again.
			do(t, hc, "POST", "/v1/jobs/2/cancel", "")
			deadline = time.Now().Add(10 * time.Second)
			for {
				code, body = do(t, hc, "POST", "/v1/jobs", spec("after"))
				if code == 201 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("still refused after the job ended: %d %s", code, body)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

func jobID(t *testing.T, body []byte) string {
	var j api.Job
	if err := json.Unmarshal(body, &j); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	return j.ID
}

// TestListPages: pages follow one another newest first without gaps or
// repeats, the last has no token, and a bad token is 400 naming it.
func TestListPages(t *testing.T) {
	hc, mgr, _ := startServerWith(t, nil, nil)
	if err := mgr.SetCordoned(root, true); err != nil {
		t.Fatal(err)
	}
	for i := range 7 {
		if code, body := do(t, hc, "POST", "/v1/jobs", spec(fmt.Sprint("p", i))); code != 201 {
			t.Fatalf("%d %s", code, body)
		}
	}
	var ids []string
	token, pages := "", 0
	for {
		path := "/v1/jobs?limit=3"
		if token != "" {
			path += "&continue=" + token
		}
		req, _ := http.NewRequest("GET", "http://x"+path, nil)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var page []api.Job
		if err := json.NewDecoder(resp.Body).Decode(&page); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		pages++
		for _, j := range page {
			ids = append(ids, j.ID)
		}
		token = resp.Header.Get(api.ContinueHeader)
		if token == "" {
			break
		}
		if len(page) != 3 {
			t.Fatalf("a page with a next token has %d jobs, want 3", len(page))
		}
	}
	if want := []string{"7", "6", "5", "4", "3", "2", "1"}; !slices.Equal(ids, want) || pages != 3 {
		t.Fatalf("pages gave %v in %d pages, want %v in 3", ids, pages, want)
	}
	code, body := do(t, hc, "GET", "/v1/jobs?continue=abc", "")
	wantError(t, code, body, 400, api.CodeBadRequest, "continue", "")
}

// TestGangSizeConflict: a gang's members must agree on its size, across
// requests and within one batch.
func TestGangSizeConflict(t *testing.T) {
	hc, mgr, _ := startServerWith(t, nil, nil)
	if err := mgr.SetCordoned(root, true); err != nil {
		t.Fatal(err)
	}
	gang := func(size int) string {
		return fmt.Sprintf(`{"command":["true"],"gang":{"name":"g","size":%d},"resources":{"cpu":"100m","memory":"16Mi"}}`, size)
	}
	if code, body := do(t, hc, "POST", "/v1/jobs", gang(2)); code != 201 {
		t.Fatalf("%d %s", code, body)
	}
	code, body := do(t, hc, "POST", "/v1/jobs", gang(3))
	wantError(t, code, body, 422, api.CodeInvalid, "gang.size", "")
	code, body = do(t, hc, "POST", "/v1/batches", `{"jobs":[`+spec("x")+`,`+gang(3)+`]}`)
	wantError(t, code, body, 422, api.CodeInvalid, "jobs[1].gang.size", "")
	code, body = do(t, hc, "POST", "/v1/batches", `{"jobs":[`+strings.Replace(gang(4), `"g"`, `"h"`, 1)+`,`+strings.Replace(gang(5), `"g"`, `"h"`, 1)+`]}`)
	wantError(t, code, body, 422, api.CodeInvalid, "jobs[1].gang.size", "")
	if n := countJobs(t, hc); n != 1 {
		t.Fatalf("refused requests left %d jobs, want 1", n)
	}
}

// TestBatchSubmit: a batch is all or none: one invalid spec refuses the
// batch naming it, a valid one creates every job in order.
func TestBatchSubmit(t *testing.T) {
	hc, mgr, _ := startServerWith(t, nil, func(c *apiserver.Config) { c.MaxBodyBytes = 64 << 10 })
	if err := mgr.SetCordoned(root, true); err != nil {
		t.Fatal(err)
	}
	code, body := do(t, hc, "POST", "/v1/batches", `{"jobs":[`+spec("a")+`,{"command":["x"],"resources":{"cpu":1,"memory":"1Gi"},"colour":"red"}]}`)
	wantError(t, code, body, 422, api.CodeInvalid, "jobs[1].colour", "")
	code, body = do(t, hc, "POST", "/v1/batches", `{"jobs":[]}`)
	wantError(t, code, body, 422, api.CodeInvalid, "jobs", "")
	if n := countJobs(t, hc); n != 0 {
		t.Fatalf("refused batches left %d jobs", n)
	}
	code, body = do(t, hc, "POST", "/v1/batches", `{"jobs":[`+spec("a")+`,`+spec("b")+`,`+spec("c")+`]}`)
	var out api.BatchResponse
	if code != 201 || json.Unmarshal(body, &out) != nil || len(out.Jobs) != 3 {
		t.Fatalf("batch: %d %s", code, body)
	}
	for i, want := range []string{"a", "b", "c"} {
		if out.Jobs[i].Spec.Name != want || out.Jobs[i].State != api.StatePending {
			t.Errorf("job %d = %s %s, want %s pending", i, out.Jobs[i].Spec.Name, out.Jobs[i].State, want)
		}
	}
}

// TestFollowedLogCountsAsStream: a followed log holds one of the user's
// stream slots; a plain log read does not.
func TestFollowedLogCountsAsStream(t *testing.T) {
	hc, _, srv := startServerWith(t, nil, func(c *apiserver.Config) { c.MaxStreamsPerUser = 1 })
	if code, body := do(t, hc, "POST", "/v1/jobs", spec("follow-me")); code != 201 {
		t.Fatalf("%d %s", code, body)
	}
	waitState(t, hc, "1", api.StateRunning)
	if code, body := do(t, hc, "GET", "/v1/jobs/1/logs", ""); code != 200 {
		t.Fatalf("plain log read: %d %s", code, body)
	}
	req, _ := http.NewRequest("GET", "http://x/v1/jobs/1/logs?follow=true", nil)
	resp, err := hc.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("follow: %v %v", resp, err)
	}
	defer resp.Body.Close()
	deadline := time.Now().Add(3 * time.Second)
	for srv.OpenStreams()[0] != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("open streams %v, want uid 0: 1", srv.OpenStreams())
		}
		time.Sleep(10 * time.Millisecond)
	}
	code, body := do(t, hc, "GET", "/v1/events", "")
	wantError(t, code, body, 429, api.CodeQuota, "", apiserver.LimitStreams)
	code, body = do(t, hc, "GET", "/v1/jobs/1/logs?follow=true", "")
	wantError(t, code, body, 429, api.CodeQuota, "", apiserver.LimitStreams)
}

package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"
)

// Client talks to fusiond over its Unix socket.
type Client struct {
	socket string
	hc     *http.Client
}

// NewClient returns a client for the daemon listening on socket.
func NewClient(socket string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConnsPerHost: 16,
	}
	return &Client{socket: socket, hc: &http.Client{Transport: tr}}
}

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

func (c *Client) dialError(err error) error {
	switch {
	case errors.Is(err, os.ErrNotExist), errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("cannot reach fusiond at %s: %w (is it running? set --socket or FUSIOND_SOCKET)", c.socket, err)
	case errors.Is(err, os.ErrPermission):
		return fmt.Errorf("permission denied on %s: ask an administrator to add you to %s", c.socket, socketGroup(c.socket))
	}
	return fmt.Errorf("talking to fusiond at %s: %w", c.socket, err)
}

// socketGroup names the group that owns the socket, as the permission
// hint should: "the socket's group (fusiond)" when it can be read, "the
// group that may use it" when even the socket cannot be stat'ed.
func socketGroup(socket string) string {
	fi, err := os.Stat(socket)
	if err != nil {
		return "the socket's group"
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return "the socket's group"
	}
	gid := strconv.FormatUint(uint64(st.Gid), 10)
	if g, err := user.LookupGroupId(gid); err == nil {
		return fmt.Sprintf("the socket's group (%s, gid %s)", g.Name, gid)
	}
	return fmt.Sprintf("the socket's group (gid %s)", gid)
}

func (c *Client) do(ctx context.Context, method, path string, body []byte, out any) error {
	resp, err := c.send(ctx, method, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decoding %s %s response: %w", method, path, err)
	}
	return nil
}

// send performs a request and turns non-2xx answers into *Error.
func (c *Client) send(ctx context.Context, method, path string, body []byte) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://fusiond"+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return c.roundTrip(ctx, req)
}

// roundTrip performs req and turns non-2xx answers into *Error.
func (c *Client) roundTrip(ctx context.Context, req *http.Request) (*http.Response, error) {
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, c.dialError(err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		e := &Error{Status: resp.StatusCode}
		if json.Unmarshal(data, e) != nil || e.Code == "" {
			e.Code, e.Message = CodeInternal, fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(data)))
		}
		return nil, e
	}
	return resp, nil
}

// SubmitJSON submits a job spec given as JSON, as read from a file.
func (c *Client) SubmitJSON(ctx context.Context, spec []byte) (Job, error) {
	var j Job
	err := c.do(ctx, http.MethodPost, "/v1/jobs", spec, &j)
	return j, err
}

// Submit submits a job spec.
func (c *Client) Submit(ctx context.Context, spec JobSpec) (Job, error) {
	data, err := json.Marshal(spec)
	if err != nil {
		return Job{}, err
	}
	return c.SubmitJSON(ctx, data)
}

// List lists jobs, newest first, following the server's pages until
// o.Limit jobs (all when 0) are read.
func (c *Client) List(ctx context.Context, o ListOptions) ([]Job, error) {
	var out []Job
	for {
		page := o
		if o.Limit > 0 {
			page.Limit = o.Limit - len(out)
		}
		jobs, next, err := c.ListPage(ctx, page)
		if err != nil {
			return out, err
		}
		out = append(out, jobs...)
		if o.Limit > 0 && len(out) > o.Limit {
			out = out[:o.Limit]
		}
		if next == "" || (o.Limit > 0 && len(out) >= o.Limit) {
			return out, nil
		}
		o.Continue = next
	}
}

// ListPage reads one page of the listing and the token of the next one
// ("" on the last page).
func (c *Client) ListPage(ctx context.Context, o ListOptions) ([]Job, string, error) {
	q := url.Values{}
	for _, s := range o.State {
		q.Add("state", string(s))
	}
	if o.User != "" {
		q.Set("user", o.User)
	}
	if o.Class != "" {
		q.Set("class", string(o.Class))
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if o.Continue != "" {
		q.Set("continue", o.Continue)
	}
	path := "/v1/jobs"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	resp, err := c.send(ctx, http.MethodGet, path, nil)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	var jobs []Job
	if err := json.NewDecoder(resp.Body).Decode(&jobs); err != nil {
		return nil, "", fmt.Errorf("decoding GET %s response: %w", path, err)
	}
	return jobs, resp.Header.Get(ContinueHeader), nil
}

// SubmitAll submits several job specs (JSON each) in one request: all are
// queued or none is. An error about one of them names it in its field
// ("jobs[1].gang.size").
func (c *Client) SubmitAll(ctx context.Context, specs []json.RawMessage) ([]Job, error) {
	body, err := json.Marshal(BatchRequest{Jobs: specs})
	if err != nil {
		return nil, err
	}
	var out BatchResponse
	if err := c.do(ctx, http.MethodPost, "/v1/batches", body, &out); err != nil {
		return nil, err
	}
	return out.Jobs, nil
}

// Get returns one job.
func (c *Client) Get(ctx context.Context, id string) (Job, error) {
	var j Job
	err := c.do(ctx, http.MethodGet, "/v1/jobs/"+url.PathEscape(id), nil, &j)
	return j, err
}

// Cancel cancels a job.
func (c *Client) Cancel(ctx context.Context, id string) (Job, error) {
	var j Job
	err := c.do(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(id)+"/cancel", nil, &j)
	return j, err
}

// Logs copies a job's output to w; with follow it streams until the job
// ends or ctx is done.
func (c *Client) Logs(ctx context.Context, id string, follow bool, w io.Writer) error {
	path := "/v1/jobs/" + url.PathEscape(id) + "/logs"
	if follow {
		path += "?follow=true"
	}
	resp, err := c.send(ctx, http.MethodGet, path, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(w, resp.Body)
	if err != nil && ctx.Err() != nil {
		return nil
	}
	return err
}

// Events calls fn for each event until ctx ends, the stream ends, or fn
// returns an error (which Events returns, except io.EOF).
func (c *Client) Events(ctx context.Context, jobID string, fn func(Event) error) error {
	path := "/v1/events"
	if jobID != "" {
		path += "?job=" + url.QueryEscape(jobID)
	}
	resp, err := c.send(ctx, http.MethodGet, path, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var ev Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return fmt.Errorf("decoding event: %w", err)
		}
		if err := fn(ev); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return sc.Err()
}

// Node returns the node status.
func (c *Client) Node(ctx context.Context) (NodeStatus, error) {
	var n NodeStatus
	err := c.do(ctx, http.MethodGet, "/v1/node", nil, &n)
	return n, err
}

// SetCordoned cordons or uncordons the node.
func (c *Client) SetCordoned(ctx context.Context, on bool) (NodeStatus, error) {
	path := "/v1/node/uncordon"
	if on {
		path = "/v1/node/cordon"
	}
	var n NodeStatus
	err := c.do(ctx, http.MethodPost, path, nil, &n)
	return n, err
}

// Ready returns nil when the daemon is ready.
func (c *Client) Ready(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/v1/readyz", nil, nil)
}

// Version returns the daemon's version.
func (c *Client) Version(ctx context.Context) (Version, error) {
	var v Version
	err := c.do(ctx, http.MethodGet, "/v1/version", nil, &v)
	return v, err
}

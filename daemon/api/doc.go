// Package api is fusiond's public API surface over its Unix socket: the
// wire types (job specs, job records, events, node status, devices,
// errors), strict decoding and validation of job specs and of the other
// request bodies, the API's error type and codes, and the Go client that
// fusionctl uses. The daemon's HTTP server for these routes lives in
// daemon/internal/apiserver.
//
// The API is versioned under /v1 and is curl-able:
//
//	curl --unix-socket /run/fusiond/fusiond.sock http://fusiond/v1/jobs
//
// Every error is a JSON object {code, message, field?} with a matching HTTP
// status code. docs/api.md documents every route; a test of the server
// keeps it in step with apiserver.Routes.
//
// It owns the wire format and may import the standard library, devices,
// devices/fpga/bitstream (bitstream records), topology (the topology model
// the API returns) and daemon/sched (the scheduling vocabulary); never
// daemon/internal/... or the daemon.
package api

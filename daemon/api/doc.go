// Package api defines fusiond's HTTP/JSON API over its Unix socket: the
// wire types (job specs, job records, events, node status, errors), strict
// decoding and validation of job specs, the server-side handlers, and the Go
// client that fusionctl uses.
//
// The API is versioned under /v1 and is curl-able:
//
//	curl --unix-socket /run/fusiond/fusiond.sock http://fusiond/v1/jobs
//
// Every error is a JSON object {code, message, field?} with a matching HTTP
// status code. docs/api.md documents every route; a test keeps it in step
// with Routes.
package api

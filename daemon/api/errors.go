package api

import (
	"errors"
	"fmt"
	"net/http"
)

// Error codes carried in Error.Code.
const (
	CodeBadRequest    = "bad_request"
	CodeInvalid       = "invalid"
	CodeUnsatisfiable = "unsatisfiable"
	CodeNotFound      = "not_found"
	CodeForbidden     = "forbidden"
	CodeConflict      = "conflict"
	CodeTooLarge      = "payload_too_large"
	// CodeQuota is a per-user or node-wide limit reached (HTTP 429);
	// Error.Limit names the configuration key of the limit.
	CodeQuota            = "quota_exceeded"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeUnavailable      = "unavailable"
	CodeInternal         = "internal"
)

// Error is every API error, on the wire and in Go. Field names the offending
// spec field (dotted path, e.g. "resources.gpu.count") when there is one.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
	// Limit names the configured limit that refused the request
	// ("limits.per_user.pending_jobs") for quota_exceeded and
	// payload_too_large errors.
	Limit string `json:"limit,omitempty"`
	// Status is the HTTP status; not sent in the body.
	Status int `json:"-"`
}

func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s: %s", e.Field, e.Message)
	}
	return e.Message
}

// Is matches errors by code, so errors.Is(err, ErrNotFound) works across
// the wire.
func (e *Error) Is(target error) bool {
	var t *Error
	if errors.As(target, &t) {
		return t.Code == e.Code && t.Field == "" && t.Message == "" && t.Limit == ""
	}
	return false
}

// Sentinels for errors.Is; they match any Error with the same code.
var (
	ErrNotFound      = &Error{Code: CodeNotFound}
	ErrForbidden     = &Error{Code: CodeForbidden}
	ErrConflict      = &Error{Code: CodeConflict}
	ErrInvalid       = &Error{Code: CodeInvalid}
	ErrUnsatisfiable = &Error{Code: CodeUnsatisfiable}
	ErrUnavailable   = &Error{Code: CodeUnavailable}
	ErrQuota         = &Error{Code: CodeQuota}
)

var statusByCode = map[string]int{
	CodeBadRequest:       http.StatusBadRequest,
	CodeInvalid:          http.StatusUnprocessableEntity,
	CodeUnsatisfiable:    http.StatusUnprocessableEntity,
	CodeNotFound:         http.StatusNotFound,
	CodeForbidden:        http.StatusForbidden,
	CodeConflict:         http.StatusConflict,
	CodeTooLarge:         http.StatusRequestEntityTooLarge,
	CodeQuota:            http.StatusTooManyRequests,
	CodeMethodNotAllowed: http.StatusMethodNotAllowed,
	CodeUnavailable:      http.StatusServiceUnavailable,
	CodeInternal:         http.StatusInternalServerError,
}

// HTTPStatus is the status code an Error is sent with.
func (e *Error) HTTPStatus() int {
	if e.Status != 0 {
		return e.Status
	}
	if s, ok := statusByCode[e.Code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// FieldError is an invalid-input error naming the field.
func FieldError(field, format string, args ...any) *Error {
	return &Error{Code: CodeInvalid, Field: field, Message: fmt.Sprintf(format, args...)}
}

// Errorf builds an Error with the given code.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// QuotaError is a limit reached: HTTP 429 naming the limit's
// configuration key.
func QuotaError(limit, format string, args ...any) *Error {
	return &Error{Code: CodeQuota, Limit: limit, Message: fmt.Sprintf(format, args...) + " (limit " + limit + ")"}
}

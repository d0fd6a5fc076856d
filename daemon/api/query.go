package api

import (
	"slices"
	"strconv"
	"strings"
)

// ParseListQuery decodes list filters from a query string.
func ParseListQuery(q map[string][]string) (ListOptions, error) {
	var o ListOptions
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			if !slices.Contains(States, State(st)) {
				return o, &Error{Code: CodeBadRequest, Field: "state", Message: "unknown state " + strconv.Quote(st)}
			}
			o.State = append(o.State, State(st))
		}
	}
	if c := first(q["class"]); c != "" {
		if !slices.Contains(Classes, Class(c)) {
			return o, &Error{Code: CodeBadRequest, Field: "class", Message: "unknown class " + strconv.Quote(c)}
		}
		o.Class = Class(c)
	}
	o.User = first(q["user"])
	if l := first(q["limit"]); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 0 {
			return o, &Error{Code: CodeBadRequest, Field: "limit", Message: "want a non-negative integer, got " + strconv.Quote(l)}
		}
		o.Limit = n
	}
	if t := first(q["continue"]); t != "" {
		if n, err := strconv.ParseUint(t, 10, 64); err != nil || n == 0 {
			return o, &Error{Code: CodeBadRequest, Field: "continue", Message: "not a token a previous page returned: " + strconv.Quote(t)}
		}
		o.Continue = t
	}
	return o, nil
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// DecodeStrict decodes one JSON value from data into v (a pointer to a
// struct). Unlike encoding/json it rejects unknown fields, fields whose
// names differ in case from the declared name, and trailing data, and every
// error names the offending field by its full path ("resources.gpu.count").
// It also rejects an object key given twice (encoding/json keeps the last)
// and strings that are not valid UTF-8 (encoding/json replaces them with
// U+FFFD), naming the field.
// Errors are *Error with Code CodeInvalid (or CodeBadRequest for malformed
// JSON).
func DecodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return syntaxError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Errorf(CodeBadRequest, "malformed JSON: unexpected data after the top-level value")
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("DecodeStrict: target must be a non-nil pointer, got %T", v)
	}
	if k := jsonKind(raw); rv.Type().Elem().Kind() == reflect.Struct && k != "an object" {
		return Errorf(CodeBadRequest, "want a JSON object, got %s", k)
	}
	if err := checkValue(raw, rv.Type().Elem(), ""); err != nil {
		return err
	}
	if !utf8.Valid(raw) {
		// checkValue names the field in every place a string can be; this
		// is the backstop for anything it does not walk.
		return Errorf(CodeBadRequest, "the body is not valid UTF-8")
	}
	if err := json.Unmarshal(raw, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return FieldError(te.Field, "want %s, got JSON %s", te.Type, te.Value)
		}
		return Errorf(CodeInvalid, "%v", err)
	}
	return nil
}

func syntaxError(err error) error {
	if errors.Is(err, io.EOF) {
		return Errorf(CodeBadRequest, "malformed JSON: empty body")
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return Errorf(CodeBadRequest, "malformed JSON at byte %d: %v", se.Offset, se)
	}
	return Errorf(CodeBadRequest, "malformed JSON: %v", err)
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

func join(path, name string) string {
	if name == "" {
		name = `""` // an empty key still needs a visible name
	}
	if path == "" {
		return name
	}
	return path + "." + name
}

func jsonKind(raw json.RawMessage) string {
	switch b := bytes.TrimLeft(raw, " \t\r\n"); {
	case len(b) == 0:
		return "nothing"
	case b[0] == '{':
		return "an object"
	case b[0] == '[':
		return "an array"
	case b[0] == '"':
		return "a string"
	case b[0] == 't' || b[0] == 'f':
		return "a boolean"
	case b[0] == 'n':
		return "null"
	default:
		return "a number"
	}
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// checkValue walks raw against type t and reports the first unknown field or
// ill-typed value with its path.
func checkValue(raw json.RawMessage, t reflect.Type, path string) error {
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		if isNull(raw) {
			return nil
		}
		if !utf8.Valid(raw) {
			return FieldError(path, "not valid UTF-8")
		}
		u := reflect.New(t).Interface().(json.Unmarshaler)
		if err := u.UnmarshalJSON(raw); err != nil {
			return FieldError(path, "%v", err)
		}
		return nil
	}
	switch t.Kind() {
	case reflect.Pointer:
		if isNull(raw) {
			return nil
		}
		return checkValue(raw, t.Elem(), path)
	case reflect.Struct:
		if isNull(raw) {
			return nil
		}
		obj, err := objectMembers(raw, path)
		if err != nil {
			return err
		}
		fields := structFields(t)
		for _, k := range sortedKeys(obj) {
			f, ok := fields[k]
			if !ok {
				if len(fields) == 0 {
					return FieldError(join(path, k), "unknown field")
				}
				return FieldError(join(path, k), "unknown field (known: %s)", strings.Join(sortedKeys(fields), ", "))
			}
			if err := checkValue(obj[k], f.Type, join(path, k)); err != nil {
				return err
			}
		}
		return nil
	case reflect.Slice, reflect.Array:
		if isNull(raw) {
			return nil
		}
		var arr []json.RawMessage
		if err := json.Unmarshal(raw, &arr); err != nil {
			return FieldError(path, "want an array, got %s", jsonKind(raw))
		}
		for i, el := range arr {
			if err := checkValue(el, t.Elem(), path+"["+strconv.Itoa(i)+"]"); err != nil {
				return err
			}
		}
		return nil
	case reflect.Map:
		if isNull(raw) {
			return nil
		}
		obj, err := objectMembers(raw, path)
		if err != nil {
			return err
		}
		for _, k := range sortedKeys(obj) {
			if err := checkValue(obj[k], t.Elem(), join(path, k)); err != nil {
				return err
			}
		}
		return nil
	case reflect.Interface:
		return checkAny(raw, path)
	default:
		if !utf8.Valid(raw) {
			return FieldError(path, "not valid UTF-8")
		}
		v := reflect.New(t)
		if err := json.Unmarshal(raw, v.Interface()); err != nil {
			return FieldError(path, "want %s, got %s", kindName(t), jsonKind(raw))
		}
		return nil
	}
}

// checkAny walks a value of unknown type for duplicate keys and invalid
// UTF-8.
func checkAny(raw json.RawMessage, path string) error {
	switch jsonKind(raw) {
	case "an object":
		obj, err := objectMembers(raw, path)
		if err != nil {
			return err
		}
		for _, k := range sortedKeys(obj) {
			if err := checkAny(obj[k], join(path, k)); err != nil {
				return err
			}
		}
	case "an array":
		var arr []json.RawMessage
		if err := json.Unmarshal(raw, &arr); err != nil {
			return FieldError(path, "want an array, got %s", jsonKind(raw))
		}
		for i, el := range arr {
			if err := checkAny(el, path+"["+strconv.Itoa(i)+"]"); err != nil {
				return err
			}
		}
	default:
		if !utf8.Valid(raw) {
			return FieldError(path, "not valid UTF-8")
		}
	}
	return nil
}

// objectMembers splits a JSON object into its members, refusing a key
// given twice and keys that are not valid UTF-8.
func objectMembers(raw json.RawMessage, path string) (map[string]json.RawMessage, error) {
	if jsonKind(raw) != "an object" {
		return nil, FieldError(path, "want an object, got %s", jsonKind(raw))
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil { // {
		return nil, FieldError(path, "want an object, got %s", jsonKind(raw))
	}
	obj := map[string]json.RawMessage{}
	for dec.More() {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			return nil, FieldError(path, "malformed object: %v", err)
		}
		k, ok := tok.(string)
		if !ok {
			return nil, FieldError(path, "malformed object")
		}
		if !utf8.Valid(raw[start:dec.InputOffset()]) {
			return nil, FieldError(join(path, strings.ReplaceAll(k, "\uFFFD", "?")), "key is not valid UTF-8")
		}
		if _, dup := obj[k]; dup {
			return nil, FieldError(join(path, k), "key given more than once")
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, FieldError(join(path, k), "malformed value: %v", err)
		}
		obj[k] = v
	}
	return obj, nil
}

func kindName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer in range"
	case reflect.Float32, reflect.Float64:
		return "a number"
	}
	return t.String()
}

// structFields maps a struct's JSON names to its fields, following embedded
// structs as encoding/json does.
func structFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for k, v := range structFields(ft) {
					out[k] = v
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
)

// DecodeJSON reads the request body into v. A body that is not JSON gives
// Nova's 400 "Malformed request body"; a field of the wrong type gives a
// 400 naming the field; an over-long body gives 413.
func DecodeJSON(r *http.Request, v any) error {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return bodyError(err)
	}
	return Unmarshal(body, v)
}

// bodyError is the client's error for a body that could not be read: too
// long (413), too slow (408, see GuardBodies) or cut short (400).
func bodyError(err error) *Error {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return OverLimit("Request is too large.")
	case errors.Is(err, os.ErrDeadlineExceeded):
		return Errorf(http.StatusRequestTimeout, "The request body arrived too slowly.")
	}
	return BadRequest("Malformed request body")
}

// Unmarshal decodes JSON with DecodeJSON's error mapping.
func Unmarshal(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return BadRequest("Malformed request body")
	}
	if err := json.Unmarshal(body, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			field := te.Field
			if field == "" {
				field = "body"
			}
			return BadRequest("Invalid input for field/attribute %s. Value: %s. %s is not of type '%s'",
				lastSegment(field), te.Value, te.Value, jsonTypeName(te.Type.Kind().String()))
		}
		return BadRequest("Malformed request body")
	}
	return nil
}

// UnknownFields lists the keys of obj that are not in allowed, so that a
// handler can reject them as Nova's additionalProperties:false schemas do.
func UnknownFields(obj map[string]json.RawMessage, allowed ...string) error {
	var extra []string
	for k := range obj {
		ok := false
		for _, a := range allowed {
			if k == a {
				ok = true
				break
			}
		}
		if !ok {
			extra = append(extra, fmt.Sprintf("'%s'", k))
		}
	}
	if len(extra) == 0 {
		return nil
	}
	verb := "was"
	if len(extra) > 1 {
		verb = "were"
	}
	return BadRequest("Invalid input for field/attribute. Additional properties are not allowed (%s %s unexpected)",
		strings.Join(extra, ", "), verb)
}

func lastSegment(f string) string {
	if i := strings.LastIndexByte(f, '.'); i >= 0 {
		return f[i+1:]
	}
	return f
}

func jsonTypeName(kind string) string {
	switch kind {
	case "string":
		return "string"
	case "bool":
		return "boolean"
	case "map", "struct":
		return "object"
	case "slice", "array":
		return "array"
	case "int", "int64", "int32", "uint", "uint64", "uint32":
		return "integer"
	case "float64", "float32":
		return "number"
	}
	return kind
}

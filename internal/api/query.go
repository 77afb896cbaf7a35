package api

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// ParseBool is oslo's strutils.bool_from_string(strict=True): true, false,
// 1, 0, yes, no, on, off, t, f, y, n in any case, surrounding spaces
// ignored. ok is false for anything else.
func ParseBool(s string) (v, ok bool) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "1", "t", "true", "on", "y", "yes":
		return true, true
	case "0", "f", "false", "off", "n", "no":
		return false, true
	}
	return false, false
}

// IntRule is an integer query parameter: its default when absent, its
// bounds, and the service's own words for a bad value.
type IntRule struct {
	Default int
	Min     int
	// Max clamps larger values (a limit past the maximum is the maximum);
	// 0 for none.
	Max int
	// NotInt and TooSmall build the errors; TooSmall nil means NotInt's.
	NotInt, TooSmall func(raw string) error
}

// Parse reads raw; given says whether the client sent the parameter at
// all (services differ on whether "limit=" counts).
func (ir IntRule) Parse(raw string, given bool) (int, error) {
	if !given {
		return ir.Default, nil
	}
	n, err := strconv.Atoi(raw)
	if err != nil {
		return 0, ir.NotInt(raw)
	}
	if n < ir.Min {
		if ir.TooSmall == nil {
			return 0, ir.NotInt(raw)
		}
		return 0, ir.TooSmall(raw)
	}
	if ir.Max > 0 && n > ir.Max {
		n = ir.Max
	}
	return n, nil
}

// Placeholders is "?, ?, ?" for n values, for an IN list.
func Placeholders(n int) string { return strings.TrimSuffix(strings.Repeat("?, ", n), ", ") }

// InList is "IN (?, ?)" with its arguments, for any slice of values.
func InList[T any](vals []T) (string, []any) {
	args := make([]any, len(vals))
	for i, v := range vals {
		args[i] = v
	}
	return "IN (" + Placeholders(len(vals)) + ")", args
}

// SchemaError is the 400 of an OpenStack JSON-schema validation
// (nova/api/validation/validators.py): "Invalid input for field/attribute
// <field>. Value: <value>. <reason>", the value quoted by PyRepr.
func SchemaError(field string, value any, format string, args ...any) *Error {
	v, _ := json.Marshal(value)
	return BadRequest("Invalid input for field/attribute %s. Value: %s. %s", field, PyRepr(v), fmt.Sprintf(format, args...))
}

// PyRepr renders a JSON value roughly as Python prints it in messages: a
// string bare, true/false/null as True/False/None, anything else as JSON.
func PyRepr(raw []byte) string {
	s := string(raw)
	if len(s) >= 2 && s[0] == '"' {
		var str string
		if json.Unmarshal(raw, &str) == nil {
			return str
		}
	}
	switch s {
	case "true":
		return "True"
	case "false":
		return "False"
	case "null":
		return "None"
	}
	return s
}

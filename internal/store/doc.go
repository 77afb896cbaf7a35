package store

import (
	"encoding/json"
	"time"
)

// TimeFormat is how timestamps are stored: UTC, fixed width, so that they sort
// as text on both engines.
const TimeFormat = "2006-01-02T15:04:05.000000Z"

// FormatTime renders t for a timestamp column.
func FormatTime(t time.Time) string { return t.UTC().Format(TimeFormat) }

// ParseTime reads a timestamp column; an empty string gives the zero time.
func ParseTime(s string) time.Time {
	if s == "" {
		return time.Time{}
	}
	t, err := time.Parse(TimeFormat, s)
	if err != nil {
		t, _ = time.Parse(time.RFC3339Nano, s)
	}
	return t
}

// JSON encodes v for a document column. It panics only on values that
// cannot be encoded at all, which is a programming error.
func JSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic("store: JSON: " + err.Error())
	}
	return string(b)
}

// FromJSON decodes a document column into v.
func FromJSON(s string, v any) error {
	if s == "" {
		return nil
	}
	return json.Unmarshal([]byte(s), v)
}

package compute

import (
	"encoding/json"
	"sort"
	"strconv"
	"unicode/utf8"
)

// obj is a JSON object that keeps its keys in insertion order and encodes
// without reflection for the value types server views use: a page of 1000
// servers is encoded in a few milliseconds instead of tens.
type obj []kv

type kv struct {
	k string
	v any
}

// set replaces k's value or appends it.
func (o *obj) set(k string, v any) {
	for i := range *o {
		if (*o)[i].k == k {
			(*o)[i].v = v
			return
		}
	}
	*o = append(*o, kv{k, v})
}

// MarshalJSON encodes o.
func (o obj) MarshalJSON() ([]byte, error) { return o.appendJSON(make([]byte, 0, 1024)), nil }

func (o obj) appendJSON(b []byte) []byte {
	b = append(b, '{')
	for i, e := range o {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, e.k)
		b = append(b, ':')
		b = appendJSONValue(b, e.v)
	}
	return append(b, '}')
}

func appendJSONValue(b []byte, v any) []byte {
	switch t := v.(type) {
	case nil:
		return append(b, "null"...)
	case string:
		return appendJSONString(b, t)
	case *string:
		if t == nil {
			return append(b, "null"...)
		}
		return appendJSONString(b, *t)
	case int:
		return strconv.AppendInt(b, int64(t), 10)
	case int64:
		return strconv.AppendInt(b, t, 10)
	case bool:
		return strconv.AppendBool(b, t)
	case obj:
		return t.appendJSON(b)
	case []string:
		return appendArray(b, t, appendJSONString)
	case []any:
		return appendArray(b, t, appendJSONValue)
	case map[string]string:
		return appendObject(b, t, appendJSONString)
	case []map[string]string:
		return appendArray(b, t, func(b []byte, m map[string]string) []byte { return appendObject(b, m, appendJSONString) })
	case map[string]any:
		return appendObject(b, t, appendJSONValue)
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return append(b, "null"...)
	}
	return append(b, raw...)
}

// appendArray appends xs as a JSON array, each element by elem.
func appendArray[T any](b []byte, xs []T, elem func([]byte, T) []byte) []byte {
	b = append(b, '[')
	for i, x := range xs {
		if i > 0 {
			b = append(b, ',')
		}
		b = elem(b, x)
	}
	return append(b, ']')
}

// appendObject appends m as a JSON object with its keys sorted, as
// encoding/json does, each value by val.
func appendObject[V any](b []byte, m map[string]V, val func([]byte, V) []byte) []byte {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, k)
		b = append(b, ':')
		b = val(b, m[k])
	}
	return append(b, '}')
}

const hexDigits = "0123456789abcdef"

// appendJSONString quotes s as encoding/json does (HTML-safe escapes
// included, invalid UTF-8 replaced).
func appendJSONString(b []byte, s string) []byte {
	if !utf8.ValidString(s) {
		raw, _ := json.Marshal(s)
		return append(b, raw...)
	}
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

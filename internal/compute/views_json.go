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
		b = append(b, '[')
		for i, s := range t {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, s)
		}
		return append(b, ']')
	case []any:
		b = append(b, '[')
		for i, x := range t {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONValue(b, x)
		}
		return append(b, ']')
	case map[string]string:
		keys := make([]string, 0, len(t))
		for k := range t {
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
			b = appendJSONString(b, t[k])
		}
		return append(b, '}')
	case []map[string]string:
		b = append(b, '[')
		for i, m := range t {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONValue(b, m)
		}
		return append(b, ']')
	case map[string]any:
		keys := make([]string, 0, len(t))
		for k := range t {
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
			b = appendJSONValue(b, t[k])
		}
		return append(b, '}')
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return append(b, "null"...)
	}
	return append(b, raw...)
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

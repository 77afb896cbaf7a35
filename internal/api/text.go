package api

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"unicode/utf8"
)

// ValidText reports whether s can be stored as text on both engines:
// PostgreSQL refuses NUL characters and invalid UTF-8, so such input must be
// a client error before it reaches the store, never a 500.
func ValidText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// checkText rejects query parameters, and when checkBody is set JSON bodies,
// holding text the store cannot keep. Binary uploads (image data) are not
// checked: their routes raise MaxBody and the body never becomes text.
func checkText(r *http.Request, checkBody bool) *Error {
	for k, vs := range r.URL.Query() {
		for _, v := range append(vs, k) {
			if !ValidText(v) {
				return BadRequest("Invalid input for query parameters %s: NUL characters and invalid UTF-8 are not allowed.",
					strings.ToValidUTF8(strings.ReplaceAll(k, "\x00", ""), "?"))
			}
		}
	}
	if !checkBody || r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	b, err := io.ReadAll(r.Body)
	if err != nil {
		return bodyError(err)
	}
	if bytes.IndexByte(b, 0) >= 0 || bytes.Contains(bytes.ToLower(b), []byte(`\u0000`)) || !utf8.Valid(b) {
		return BadRequest("Invalid input: NUL characters and invalid UTF-8 are not allowed in the request body.")
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	return nil
}

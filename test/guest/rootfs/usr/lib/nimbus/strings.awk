# strings.awk: string helpers for json.awk and yaml.awk (busybox awk; load
# it first: awk -f strings.awk -f json.awk FILE).

# hexval: the value of hex digits H, or -1.
function hexval(h,   k, v, d) {
	v = 0
	for (k = 1; k <= length(h); k++) {
		d = index("0123456789abcdef", tolower(substr(h, k, 1)))
		if (d == 0)
			return -1
		v = v * 16 + d - 1
	}
	return v
}

# utf8: code point C in UTF-8 ("?" when invalid).
function utf8(c) {
	if (c < 0)
		return "?"
	if (c < 128)
		return sprintf("%c", c)
	if (c < 2048)
		return sprintf("%c%c", 192 + int(c / 64), 128 + c % 64)
	if (c < 65536)
		return sprintf("%c%c%c", 224 + int(c / 4096), 128 + int(c / 64) % 64, 128 + c % 64)
	return sprintf("%c%c%c%c", 240 + int(c / 262144), 128 + int(c / 4096) % 64, 128 + int(c / 64) % 64, 128 + c % 64)
}

# unescape: decode the backslash escapes of a JSON (or YAML double-quoted)
# string body: \" \\ \/ \uXXXX (surrogate pairs too); \n \r \t become
# spaces so that a value stays on one line; \b \f \0 are dropped.
function unescape(v,   out, p, c, u, lo) {
	out = ""
	while ((p = index(v, "\\")) > 0) {
		out = out substr(v, 1, p - 1)
		c = substr(v, p + 1, 1)
		v = substr(v, p + 2)
		if (c == "n" || c == "r" || c == "t")
			out = out " "
		else if (c == "b" || c == "f" || c == "0")
			continue
		else if (c == "u") {
			u = hexval(substr(v, 1, 4))
			v = substr(v, 5)
			if (u >= 55296 && u < 56320 && substr(v, 1, 2) == "\\u") {
				lo = hexval(substr(v, 3, 4))
				if (lo >= 56320 && lo < 57344) {
					u = 65536 + (u - 55296) * 1024 + (lo - 56320)
					v = substr(v, 7)
				}
			}
			out = out utf8(u)
		} else
			out = out c
	}
	out = out v
	gsub(/[\t\n\r]/, " ", out)
	return out
}

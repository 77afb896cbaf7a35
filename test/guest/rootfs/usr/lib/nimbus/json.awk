# json.awk: flatten one JSON document (one line or many) into
# "path<TAB>value" lines, one per scalar. Object keys are joined with ".",
# array elements are numbered from 0: {"a":{"b":"x"},"k":["y"]} gives
# "a.b<TAB>x" and "k.0<TAB>y". String escapes are decoded (\uXXXX to
# UTF-8, surrogate pairs included); tabs and newlines inside strings become
# spaces so every record stays on one line. Written for busybox awk; needs
# strings.awk: awk -f strings.awk -f json.awk FILE.
BEGIN { RS = "\001" }
{ s = s $0 "\n" }
END {
	n = length(s)
	i = 1
	value("")
}

function ws() {
	while (i <= n && index(" \t\r\n", substr(s, i, 1)) > 0)
		i++
}

# str: s[i] is a string's opening quote; returns the decoded string.
function str(   raw) {
	i++
	raw = ""
	while (i <= n) {
		if (match(substr(s, i, 256), /^[^"\\]+/)) {
			raw = raw substr(s, i, RLENGTH)
			i += RLENGTH
		} else if (substr(s, i, 1) == "\\") {
			raw = raw substr(s, i, 2)
			i += 2
		} else {
			i++
			break
		}
	}
	return unescape(raw)
}

function join(path, k) {
	return path == "" ? k : path "." k
}

function value(path,   c, k, idx) {
	ws()
	c = substr(s, i, 1)
	if (c == "{") {
		i++
		ws()
		if (substr(s, i, 1) == "}") {
			i++
			return
		}
		while (i <= n) {
			ws()
			if (substr(s, i, 1) != "\"") {
				i = n + 1
				return
			}
			k = str()
			ws()
			if (substr(s, i, 1) == ":")
				i++
			value(join(path, k))
			ws()
			c = substr(s, i, 1)
			i++
			if (c != ",")
				return
		}
	} else if (c == "[") {
		i++
		ws()
		if (substr(s, i, 1) == "]") {
			i++
			return
		}
		idx = 0
		while (i <= n) {
			value(join(path, idx))
			idx++
			ws()
			c = substr(s, i, 1)
			i++
			if (c != ",")
				return
		}
	} else if (c == "\"") {
		k = str()
		print path "\t" k
	} else if (match(substr(s, i, 64), /^[^],} \t\r\n]+/)) {
		print path "\t" substr(s, i, RLENGTH)
		i += RLENGTH
	} else
		i = n + 1
}

# yaml.awk: read the small YAML subset of NoCloud meta-data and
# #cloud-config user-data, printing "path<TAB>value" lines like json.awk:
#   key: value            at column 0     -> "key<TAB>value"
#   key:                  (any depth) followed by
#     - item                              -> "key.0<TAB>item", "key.1<TAB>item", ...
#   key: [a, "b"]         (flow list)     -> "key.0<TAB>a", "key.1<TAB>b"
# so "ssh_authorized_keys" lists are found at the top level and under
# users: alike. Quotes ('..' and "..") are removed; anything fancier
# (anchors, block scalars, nested maps in lists) is not understood. Needs
# strings.awk: awk -f strings.awk -f yaml.awk FILE.
function trim(v) {
	sub(/^[ \t]+/, "", v)
	sub(/[ \t]+$/, "", v)
	return v
}

function unquote(v) {
	v = trim(v)
	if (length(v) >= 2 && substr(v, 1, 1) == "\"" && substr(v, length(v), 1) == "\"") {
		v = unescape(substr(v, 2, length(v) - 2))
	} else if (length(v) >= 2 && substr(v, 1, 1) == "'" && substr(v, length(v), 1) == "'") {
		v = substr(v, 2, length(v) - 2)
		gsub(/''/, "'", v)
	}
	return v
}

function item(key, v) {
	print key "." (count[key] + 0) "\t" unquote(v)
	count[key]++
}

{
	sub(/\r$/, "")
	if ($0 ~ /^[ \t]*(#.*)?$/ || $0 ~ /^(---|\.\.\.)[ \t]*$/)
		next
	match($0, /^[ \t]*/)
	ind = RLENGTH
	line = substr($0, ind + 1)
	if (line ~ /^-([ \t]|$)/) {
		if (lkey != "" && ind >= lind)
			item(lkey, substr(line, 2))
		next
	}
	if (!match(line, /^[^ \t:]+:([ \t]|$)/))
		next
	key = unquote(substr(line, 1, index(line, ":") - 1))
	val = trim(substr(line, index(line, ":") + 1))
	if (val == "") {
		lkey = key
		lind = ind
		next
	}
	if (ind <= lind)
		lkey = ""
	if (val ~ /^\[.*\]$/) {
		val = substr(val, 2, length(val) - 2)
		nf = split(val, parts, ",")
		for (j = 1; j <= nf; j++)
			if (trim(parts[j]) != "")
				item(key, parts[j])
		next
	}
	if (ind == 0)
		print key "\t" unquote(val)
}

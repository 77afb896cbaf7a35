package testenv

import (
	"fmt"
	"strings"
)

// JSONList is a JSON array of n items, item(i) each: the long lists that
// bound tests send.
func JSONList(n int, item func(i int) string) string {
	items := make([]string, n)
	for i := range items {
		items[i] = item(i)
	}
	return "[" + strings.Join(items, ",") + "]"
}

// JSONObject is a JSON object of n string members "<prefix><i>": "v".
func JSONObject(prefix string, n int) string {
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprintf(`"%s%d":"v"`, prefix, i)
	}
	return "{" + strings.Join(items, ",") + "}"
}

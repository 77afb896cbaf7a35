package api

import (
	"context"
	"net/url"
	"strconv"
	"strings"

	"nimbus/internal/store"
)

// SortKey is one column, or SQL expression, a list is ordered by.
type SortKey struct {
	Col  string
	Desc bool
}

// Keyset pages a list in SQL: ORDER BY its keys and, after a marker,
// WHERE the row comes after the marker row's key values, so no list loads
// rows it does not answer. The last key must be unique (the id) so that a
// marker is exact.
type Keyset []SortKey

// OrderBy is "a DESC, id DESC".
func (k Keyset) OrderBy() string {
	parts := make([]string, len(k))
	for i, sk := range k {
		parts[i] = sk.Col + " ASC"
		if sk.Desc {
			parts[i] = sk.Col + " DESC"
		}
	}
	return strings.Join(parts, ", ")
}

// After is the condition for the rows that follow a row whose key values
// are vals: "((a < ?) OR (a = ? AND id < ?))". Each key's direction
// decides its comparison, so mixed directions page right, which a row
// value comparison cannot.
func (k Keyset) After(vals []any) (string, []any) {
	var ors []string
	var args []any
	for i, sk := range k {
		ands := make([]string, 0, i+1)
		for j := 0; j < i; j++ {
			ands = append(ands, k[j].Col+" = ?")
			args = append(args, vals[j])
		}
		op := " > ?"
		if sk.Desc {
			op = " < ?"
		}
		ands = append(ands, sk.Col+op)
		args = append(args, vals[i])
		ors = append(ors, "("+strings.Join(ands, " AND ")+")")
	}
	return "(" + strings.Join(ors, " OR ") + ")", args
}

// MarkerValues reads the key values of the marker row: SELECT <keys> FROM
// from WHERE where. No such row is store.ErrNotFound, which each service
// words its own way.
func (k Keyset) MarkerValues(ctx context.Context, q store.Querier, from, where string, args ...any) ([]any, error) {
	cols := make([]string, len(k))
	for i, sk := range k {
		cols[i] = sk.Col
	}
	vals := make([]any, len(k))
	ptrs := make([]any, len(k))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	err := q.QueryRow(ctx, "SELECT "+strings.Join(cols, ", ")+" FROM "+from+" WHERE "+where, args...).Scan(ptrs...)
	if store.IsNoRows(err) {
		return nil, store.ErrNotFound
	}
	return vals, err
}

// Page is a keyset page query's parts: the filter conditions (joined by
// AND), their arguments, the order and the row limit.
type Page struct {
	Where []string
	Args  []any
	Keys  Keyset
	// Limit is the rows to fetch; a service that must know whether more
	// follow asks for one more than it answers. Negative: no limit.
	Limit int
}

// Add appends one filter condition.
func (p *Page) Add(cond string, args ...any) {
	p.Where = append(p.Where, cond)
	p.Args = append(p.Args, args...)
}

// AfterMarker narrows the page to the rows after the marker row's values.
func (p *Page) AfterMarker(vals []any) {
	cond, args := p.Keys.After(vals)
	p.Add(cond, args...)
}

// SQL is "WHERE … ORDER BY … [LIMIT n]", to follow "SELECT … FROM t".
func (p *Page) SQL() string {
	s := ""
	if len(p.Where) > 0 {
		s = "WHERE " + strings.Join(p.Where, " AND ") + " "
	}
	s += "ORDER BY " + p.Keys.OrderBy()
	if p.Limit >= 0 {
		s += " LIMIT " + strconv.Itoa(p.Limit)
	}
	return s
}

// NextQuery is the query string of another page's link: q without the
// parameters in drop, with set's values replacing q's, encoded in sorted
// key order as the services' link builders do.
func NextQuery(q url.Values, set map[string]string, drop ...string) string {
	nq := url.Values{}
	for k, vs := range q {
		nq[k] = vs
	}
	for _, k := range drop {
		nq.Del(k)
	}
	for k, v := range set {
		nq.Set(k, v)
	}
	return nq.Encode()
}

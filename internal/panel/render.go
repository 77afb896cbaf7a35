package panel

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"html/template"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"nimbus/internal/billing"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// pageSet is every page's template: the shared layout and partials
// (templates/_*.html) with the page's own file, which defines "content".
type pageSet map[string]*template.Template

func parsePages(m Money) (pageSet, error) {
	funcs := template.FuncMap{
		"asset": assetURL,
		"money": m.Format,
		"rate":  m.Exact,
		"time":  timeText,
		"stamp": stamp,
		"mb2gb": func(mb int) string { return strconv.FormatFloat(float64(mb)/1024, 'f', -1, 64) },
		"add":   func(a, b int) int { return a + b },
		"deref": func(s *string) string {
			if s == nil {
				return ""
			}
			return *s
		},
		// del is a delete form's fields: {{template "delete" (del $ "/x/1/delete" "Delete")}}.
		"del": func(v *view, action, label string) deleteForm {
			return deleteForm{Action: action, Label: v.T(label), Confirm: v.T("Confirm"), CSRF: v.CSRF}
		},
		// groupTable and stateForm are the support partials' data.
		"groupTable": func(v *view, d groupsData) groupTable { return groupTable{View: v, groupsData: d} },
		"stateForm": func(v *view, action, state, project string) stateForm {
			return stateForm{View: v, Action: action, State: state, Project: project}
		},
		"navItem": func(v *view, href, text string) navLink {
			return navLink{Href: href, Text: v.T(text), Current: v.Path == href || strings.HasPrefix(v.Path, href+"/")}
		},
	}
	base, err := template.New("").Funcs(funcs).ParseFS(templateFS, "templates/_*.html")
	if err != nil {
		return nil, err
	}
	files, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	out := pageSet{}
	for _, f := range files {
		name := strings.TrimSuffix(path.Base(f), ".html")
		if strings.HasPrefix(name, "_") {
			continue
		}
		t, err := base.Clone()
		if err != nil {
			return nil, err
		}
		if _, err := t.ParseFS(templateFS, f); err != nil {
			return nil, err
		}
		out[name] = t
	}
	return out, nil
}

// view is what every page's template gets: the page's own Data, and what
// the layout shows around it. Templates translate with {{$.T "text"}}.
type view struct {
	Title   string
	Lang    string
	Session *Session
	CSRF    string
	// Flash and FlashError are one-time messages from the last form.
	Flash, FlashError string
	// Banners are the account's warnings (money running out, suspended),
	// on every page.
	Banners []Banner
	// Path is the page's path, for the navigation's current item.
	Path string
	Data any
}

// Banner is a warning shown on every page.
type Banner struct {
	Level string // "warn" or "danger"
	Text  string
	Link  string
}

// deleteForm is what the "delete" template needs.
type deleteForm struct {
	Action, Label, Confirm, CSRF string
}

// navLink is one item of the navigation.
type navLink struct {
	Href, Text string
	Current    bool
}

// T translates s into the page's language; args fill its verbs.
func (v *view) T(s string, args ...any) string { return translate(v.Lang, s, args...) }

// T translates for a page handler.
func (q *req) T(s string, args ...any) string { return translate(q.lang, s, args...) }

// render writes page name with status 200.
func (q *req) render(name, title string, data any) error {
	return q.renderStatus(http.StatusOK, name, title, data)
}

func (q *req) renderStatus(status int, name, title string, data any) error {
	t, ok := q.p.pages[name]
	if !ok {
		return fmt.Errorf("panel: no page %q", name)
	}
	v := &view{Title: title, Lang: q.lang, Session: q.s, CSRF: q.csrf, Path: q.r.URL.Path, Data: data}
	v.Flash, v.FlashError = q.takeFlash()
	if q.s != nil {
		v.Banners = q.p.banners(q)
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout", v); err != nil {
		return err
	}
	q.w.Header().Set("Content-Type", "text/html; charset=utf-8")
	q.w.WriteHeader(status)
	_, err := q.w.Write(buf.Bytes())
	return err
}

// Format writes minor units as the account currency, with the
// presentation currency beside it: "100.00 RUB (≈ 1.10 USD)".
func (m Money) Format(minor int64) string {
	s := m.major(minor) + " " + m.Currency
	if m.Presentation != "" && m.Rate != nil {
		if p, err := billing.Convert(minor, m.Rate); err == nil {
			s += " (≈ " + m.major(p) + " " + m.Presentation + ")"
		}
	}
	return s
}

// major writes minor units with two decimals.
func (Money) major(minor int64) string { return rateText(minor, 1) }

// Exact writes an hourly rate, or a rate times hours, in billing's rate
// units (billing.RateScale to a minor unit) as Format writes money, at the
// rate's own precision: the price list's 5000 is "0.005 RUB", never rounded
// to a minor unit. The presentation currency beside it is converted at
// the same precision.
func (m Money) Exact(units int64) string {
	s := rateText(units, billing.RateScale) + " " + m.Currency
	if m.Presentation != "" && m.Rate != nil {
		if p, err := billing.Convert(units, m.Rate); err == nil {
			s += " (≈ " + rateText(p, billing.RateScale) + " " + m.Presentation + ")"
		}
	}
	return s
}

// rateText writes n units, scale of them to a minor unit (a power of ten),
// in major units exactly: trailing zeros trimmed, at least the currency's
// two decimals kept.
func rateText(n, scale int64) string {
	sign := ""
	u := uint64(n)
	if n < 0 {
		sign, u = "-", uint64(-n) // two's complement: MinInt64 too
	}
	perMajor := uint64(scale) * 100
	frac := fmt.Sprintf("%0*d", len(strconv.FormatUint(perMajor, 10))-1, u%perMajor)
	if trimmed := strings.TrimRight(frac, "0"); len(trimmed) > 2 {
		frac = trimmed
	} else {
		frac = frac[:2]
	}
	return sign + strconv.FormatUint(u/perMajor, 10) + "." + frac
}

// timeText is how every page writes a moment: one format everywhere.
func timeText(t time.Time) string { return t.UTC().Format("2006-01-02 15:04 UTC") }

// stampLayouts are the forms the APIs write moments in: RFC 3339 (Glance,
// billing) and Nova's and Cinder's ISO 8601 without a zone, which is UTC.
var stampLayouts = []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999"}

// stamp writes an API's moment as timeText does; text it cannot read is
// shown as it is.
func stamp(s string) string {
	for _, l := range stampLayouts {
		if t, err := time.Parse(l, s); err == nil {
			return timeText(t)
		}
	}
	return s
}

// language is the visitor's choice (the lang cookie), else their
// browser's.
func language(r *http.Request) string {
	if c, err := r.Cookie("lang"); err == nil && (c.Value == "en" || c.Value == "ru") {
		return c.Value
	}
	if strings.HasPrefix(strings.ToLower(r.Header.Get("Accept-Language")), "ru") {
		return "ru"
	}
	return "en"
}

// asset is one embedded static file, kept plain and gzipped.
type asset struct {
	url, ctype string
	plain, gz  []byte
}

// assets are the static files by name, each with a URL that carries a
// content hash, so browsers keep it until it changes.
var assets = func() map[string]*asset {
	out := map[string]*asset{}
	fs.WalkDir(staticFS, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, _ := staticFS.ReadFile(p)
		h := sha256.Sum256(b)
		var gz bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&gz, gzip.BestCompression)
		zw.Write(b)
		zw.Close()
		ctype := mime.TypeByExtension(path.Ext(p))
		if ctype == "" {
			ctype = "application/octet-stream"
		}
		out[strings.TrimPrefix(p, "static/")] = &asset{url: "/" + p + "?v=" + hex.EncodeToString(h[:6]),
			ctype: ctype, plain: b, gz: gz.Bytes()}
		return nil
	})
	return out
}()

func assetURL(name string) string {
	if a, ok := assets[name]; ok {
		return a.url
	}
	return "/static/" + name
}

func staticHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, ok := assets[strings.TrimPrefix(r.URL.Path, "/static/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		h := w.Header()
		h.Set("Cache-Control", "public, max-age=31536000, immutable")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Content-Type", a.ctype)
		h.Add("Vary", "Accept-Encoding")
		body := a.plain
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			h.Set("Content-Encoding", "gzip")
			body = a.gz
		}
		h.Set("Content-Length", strconv.Itoa(len(body)))
		w.Write(body)
	})
}

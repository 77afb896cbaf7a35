package main

import (
	"context"
	"errors"
	"flag"

	"nimbus/internal/panel"
)

// supportCommands are "nimbus admin support …": the operator's contacts on
// the panel's support page, in the controller's database, as the panel's
// support settings page edits them.
var supportCommands = map[string]adminCommand{
	"show": {help: "Prints the operator's contacts shown on the panel's support page (empty: none saved yet, so the\n" +
		"panel shows those nimbus serve was started with).",
		setup: func(a *adminRun, _ *flag.FlagSet) func(context.Context, []string) error { return a.supportShow }},
	"set": {args: "[--messenger TEXT] [--email TEXT] [--phone TEXT] [--hours TEXT]",
		help: "Changes the contacts given; the others stay as they are. An empty value (--phone \"\") removes that\n" +
			"contact from the page. The panel shows the change on its next page.",
		setup: func(a *adminRun, fs *flag.FlagSet) func(context.Context, []string) error {
			var c supportChange
			fs.Var(&c.messenger, "messenger", "a messenger `link` or handle, e.g. https://t.me/yourcloud")
			fs.Var(&c.email, "email", "the support e-mail `address`")
			fs.Var(&c.phone, "phone", "the support telephone `number`")
			fs.Var(&c.hours, "hours", "`text` saying when support answers, e.g. \"24/7\" or \"Mon–Fri 9:00–18:00 MSK\"")
			return func(ctx context.Context, _ []string) error { return a.supportSet(ctx, c) }
		}},
}

// optString is a flag that remembers whether it was given, so that "set"
// changes only the contacts named.
type optString struct {
	value string
	set   bool
}

func (o *optString) String() string { return o.value }

func (o *optString) Set(v string) error { o.value, o.set = v, true; return nil }

type supportChange struct{ messenger, email, phone, hours optString }

// supportView is the contacts as "show" and "set" print them.
type supportView struct {
	Messenger string `json:"messenger"`
	Email     string `json:"email"`
	Phone     string `json:"phone"`
	Hours     string `json:"hours"`
}

func (a *adminRun) supportShow(ctx context.Context, _ []string) error {
	if err := a.open(ctx); err != nil {
		return err
	}
	s, err := panel.LoadSupport(ctx, a.db)
	if err != nil {
		return err
	}
	return a.printSupport(s)
}

func (a *adminRun) supportSet(ctx context.Context, c supportChange) error {
	if !c.messenger.set && !c.email.set && !c.phone.set && !c.hours.set {
		return errors.New("give at least one of --messenger, --email, --phone, --hours")
	}
	if err := a.open(ctx); err != nil {
		return err
	}
	s, err := panel.LoadSupport(ctx, a.db)
	if err != nil {
		return err
	}
	for _, f := range []struct {
		o   optString
		dst *string
	}{{c.messenger, &s.Messenger}, {c.email, &s.Email}, {c.phone, &s.Phone}, {c.hours, &s.Hours}} {
		if f.o.set {
			*f.dst = f.o.value
		}
	}
	if err := panel.SaveSupport(ctx, a.db, s); err != nil {
		var ae *panel.APIError
		if errors.As(err, &ae) {
			return errors.New(ae.Message) // the panel's check, without its HTTP status
		}
		return err
	}
	if s, err = panel.LoadSupport(ctx, a.db); err != nil {
		return err
	}
	return a.printSupport(s)
}

func (a *adminRun) printSupport(s panel.Support) error {
	v := supportView{Messenger: s.Messenger, Email: s.Email, Phone: s.Phone, Hours: s.Hours}
	if a.json {
		return a.printJSON(v)
	}
	return a.table([]string{"CONTACT", "VALUE"}, [][]string{
		{"messenger", v.Messenger}, {"email", v.Email}, {"phone", v.Phone}, {"hours", v.Hours}})
}

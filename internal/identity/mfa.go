package identity

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"nimbus/internal/api"
)

// Multi-factor authentication as Keystone has it
// (keystone/identity/backends/resource_options.py, keystone/auth/core.py
// UserMFARulesValidator): a user's options name rules, each a list of auth
// methods; a token is issued only when the methods that succeeded, with
// those of an auth receipt, cover one whole rule. Otherwise the answer is
// 401 with a receipt naming what succeeded (receipts.go).

// UserOptions are the user options Nimbus implements; a nil field is unset.
type UserOptions struct {
	MFARules   [][]string // multi_factor_auth_rules
	MFAEnabled *bool      // multi_factor_auth_enabled
}

const (
	optMFARules   = "multi_factor_auth_rules"
	optMFAEnabled = "multi_factor_auth_enabled"
)

// keystoneOnlyOptions are Keystone's other user options, which Nimbus does
// not implement: refused rather than stored without effect.
var keystoneOnlyOptions = []string{"ignore_change_password_upon_first_use", "ignore_password_expiry",
	"ignore_lockout_failure_attempts", "lock_password", "ignore_user_inactivity"}

// MarshalJSON writes the options that are set, as Keystone renders them.
func (o UserOptions) MarshalJSON() ([]byte, error) {
	m := map[string]any{}
	if o.MFARules != nil {
		m[optMFARules] = o.MFARules
	}
	if o.MFAEnabled != nil {
		m[optMFAEnabled] = *o.MFAEnabled
	}
	return json.Marshal(m)
}

// UnmarshalJSON reads options as stored (validated when written).
func (o *UserOptions) UnmarshalJSON(b []byte) error {
	var m struct {
		Rules   [][]string `json:"multi_factor_auth_rules"`
		Enabled *bool      `json:"multi_factor_auth_enabled"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	o.MFARules, o.MFAEnabled = m.Rules, m.Enabled
	return nil
}

// Bounds on rules: Keystone has none, but every number a client sends is
// bounded here.
const (
	maxMFARules       = 16
	maxMFARuleMethods = 8
	maxMethodName     = 64
)

// applyOptions merges the "options" of a user request into o: an option
// given as null is unset, as in Keystone's resource options.
func applyOptions(o *UserOptions, raw json.RawMessage) error {
	if len(raw) == 0 {
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return api.BadRequest("Invalid input for field 'options': %s is not of type 'object'", raw)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := m[k]
		null := string(bytes.TrimSpace(v)) == "null"
		switch {
		case k == optMFARules && null:
			o.MFARules = nil
		case k == optMFARules:
			rules, err := parseMFARules(v)
			if err != nil {
				return err
			}
			o.MFARules = rules
		case k == optMFAEnabled && null:
			o.MFAEnabled = nil
		case k == optMFAEnabled:
			var b bool
			if err := json.Unmarshal(v, &b); err != nil {
				return api.BadRequest("Invalid input for field 'options/%s': %s is not of type 'boolean'", k, v)
			}
			o.MFAEnabled = &b
		case slices.Contains(keystoneOnlyOptions, k):
			return api.BadRequest("The user option '%s' is not supported by this cloud.", k)
		default:
			return api.BadRequest("Invalid input for field 'options': Additional properties are not allowed ('%s' was unexpected)", k)
		}
	}
	return nil
}

// parseMFARules validates a rule list as Keystone's
// _mfa_rules_validator_list_of_lists_of_strings_no_duplicates does.
func parseMFARules(v json.RawMessage) ([][]string, error) {
	bad := api.BadRequest("Invalid input for field 'options/%s': Invalid data type, must be a list of lists comprised of strings. "+
		"Sub-lists may not be duplicated. Strings in sub-lists may not be duplicated.", optMFARules)
	var rules [][]string
	if err := json.Unmarshal(v, &rules); err != nil || rules == nil {
		return nil, bad
	}
	if len(rules) > maxMFARules {
		return nil, api.BadRequest("Invalid input for field 'options/%s': at most %d rules are allowed.", optMFARules, maxMFARules)
	}
	seen := map[string]bool{}
	for _, r := range rules {
		key := strings.Join(r, "\x00")
		if len(r) == 0 || seen[key] {
			return nil, bad
		}
		seen[key] = true
		if len(r) > maxMFARuleMethods {
			return nil, api.BadRequest("Invalid input for field 'options/%s': a rule names at most %d methods.", optMFARules, maxMFARuleMethods)
		}
		names := map[string]bool{}
		for _, m := range r {
			if names[m] || m == "" || utf8.RuneCountInString(m) > maxMethodName {
				return nil, bad
			}
			names[m] = true
		}
	}
	return rules, nil
}

// authMethods are the auth methods this identity service has: what
// Keystone's [auth] methods would list. Rules are read against them.
var authMethods = []string{"password", "token", "application_credential", "totp"}

// firstFactors are the methods that prove who the user is on their own. A
// passcode is six digits: it is only ever a second factor here, so that no
// one can guess passcodes (or lock a user's passcodes) without the password.
var firstFactors = []string{"password", "token", "application_credential"}

func hasFirstFactor(methods []string) bool {
	return slices.ContainsFunc(methods, func(m string) bool { return slices.Contains(firstFactors, m) })
}

// activeRules are the user's rules as they apply now: none when MFA is
// disabled (multi_factor_auth_enabled false; unset counts as enabled, as
// in Keystone's check), each rule cut to the methods this service has, and
// rules left empty dropped.
func (o UserOptions) activeRules() [][]string {
	if o.MFAEnabled != nil && !*o.MFAEnabled {
		return nil
	}
	var out [][]string
	for _, r := range o.MFARules {
		var kept []string
		for _, m := range r {
			if slices.Contains(authMethods, m) && !slices.Contains(kept, m) {
				kept = append(kept, m)
			}
		}
		if len(kept) > 0 {
			out = append(out, kept)
		}
	}
	return out
}

// satisfied reports whether methods cover a whole rule; no rules are
// satisfied by any method.
func satisfied(rules [][]string, methods []string) bool {
	if len(rules) == 0 {
		return true
	}
	for _, r := range rules {
		if !slices.ContainsFunc(r, func(m string) bool { return !slices.Contains(methods, m) }) {
			return true
		}
	}
	return false
}

// requiredMethods are the rules that share a method with methods: the
// receipt's required_auth_methods (keystone/models/receipt_model.py).
func requiredMethods(rules [][]string, methods []string) [][]string {
	out := [][]string{}
	for _, r := range rules {
		if slices.ContainsFunc(r, func(m string) bool { return slices.Contains(methods, m) }) {
			out = append(out, r)
		}
	}
	return out
}

// union is a and the members of b it lacks, in order.
func union(a, b []string) []string {
	out := slices.Clone(a)
	for _, m := range b {
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}

// PanelTOTPRules are the rules the panel sets when a user turns two-factor
// sign-in on: password and passcode together, or an application credential
// (which the user can only make with a token, so with both factors) for
// automation. Keystone applies rules to every method, application
// credentials included, so the second rule is what keeps them working.
var PanelTOTPRules = [][]string{{"password", "totp"}, {"application_credential"}}

// requiresTOTP reports whether any of the user's active rules names totp.
func (o UserOptions) requiresTOTP() bool {
	return slices.ContainsFunc(o.activeRules(), func(r []string) bool { return slices.Contains(r, "totp") })
}

// receiptBody is Keystone's 401 body for missing factors
// (keystone/receipt/handlers.py _render_receipt_response_from_model).
func receiptBody(e *ReceiptRequired) map[string]any {
	return map[string]any{
		"receipt": map[string]any{
			"methods": e.Methods,
			"user": map[string]any{
				"id": e.User.ID, "name": e.User.Name,
				"domain": map[string]any{"id": e.Domain.ID, "name": e.Domain.Name},
			},
			"expires_at": keystoneTime(e.ExpiresAt),
			"issued_at":  keystoneTime(e.IssuedAt),
		},
		"required_auth_methods": e.Required,
	}
}

// receiptResponse is the HTTP answer for e, with the receipt in
// Openstack-Auth-Receipt.
func receiptResponse(e *ReceiptRequired) *api.Response {
	return api.JSON(http.StatusUnauthorized, receiptBody(e)).WithHeader(ReceiptHeader, e.Receipt).
		WithHeader("Vary", "X-Auth-Token")
}

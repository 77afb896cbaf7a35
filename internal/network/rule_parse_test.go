package network

import (
	"encoding/json"
	"strings"
	"testing"

	"nimbus/internal/api"
)

// TestRuleProtocolAndPrefix: a security group rule's protocol (a name, a
// number 0-255, null or "any" for none) and remote_ip_prefix (a CIDR or an
// address of the rule's ethertype, stored as a CIDR), with Neutron's 400s.
func TestRuleProtocolAndPrefix(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		body, ethertype string
		proto, prefix   string // "" for none
		err             string
	}{
		{`{}`, "IPv4", "", "", ""},
		{`{"protocol": null}`, "IPv4", "", "", ""},
		{`{"protocol": "TCP"}`, "IPv4", "tcp", "", ""},
		{`{"protocol": 17}`, "IPv4", "17", "", ""},
		{`{"protocol": "any"}`, "IPv4", "", "", ""},
		{`{"protocol": 256}`, "IPv4", "", "", "protocol 256 not supported"},
		{`{"protocol": "smtp"}`, "IPv4", "", "", "protocol smtp not supported"},
		{`{"protocol": [1]}`, "IPv4", "", "", "protocol [1] not supported"},
		{`{"remote_ip_prefix": "10.0.0.7"}`, "IPv4", "", "10.0.0.7/32", ""},
		{`{"remote_ip_prefix": "2001:db8::/32"}`, "IPv6", "", "2001:db8::/32", ""},
		{`{"remote_ip_prefix": "2001:db8::/32"}`, "IPv4", "", "", "Conflicting value ethertype IPv4"},
		{`{"remote_ip_prefix": "nowhere"}`, "IPv4", "", "", "is not a valid IP subnet"},
	} {
		var b body
		if err := json.Unmarshal([]byte(tc.body), &b); err != nil {
			t.Fatal(err)
		}
		proto, err := ruleProtocol(b)
		var prefix *string
		if err == nil {
			prefix, err = rulePrefix(b, tc.ethertype)
		}
		if tc.err != "" {
			if ae, ok := err.(*api.Error); !ok || ae.Status != 400 || !strings.Contains(ae.Message, tc.err) {
				t.Errorf("%s: %v, want a 400 saying %q", tc.body, err, tc.err)
			}
			continue
		}
		deref := func(p *string) string {
			if p == nil {
				return ""
			}
			return *p
		}
		if err != nil || deref(proto) != tc.proto || deref(prefix) != tc.prefix {
			t.Errorf("%s: %q, %q, %v; want %q, %q", tc.body, deref(proto), deref(prefix), err, tc.proto, tc.prefix)
		}
	}
}

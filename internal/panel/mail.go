package panel

import (
	"crypto/tls"
	"fmt"
	"mime"
	"net"
	"net/mail"
	"net/smtp"
	"net/url"
	"strings"
	"time"

	"nimbus/internal/identity"
)

// sendMail sends a plain-text message through Config.SMTPURL
// (smtp://user:pass@host:port?from=noreply@example.com, STARTTLS when the
// server offers it), or writes it to the log when no SMTP server is set, so
// a cloud without mail still lets its operator hand out the links.
func (p *Panel) sendMail(to, subject, body string) error {
	if p.cfg.SMTPURL == "" {
		p.cfg.Log.Info("panel: e-mail (no --smtp-url set)", "to", to, "subject", subject, "body", body)
		return nil
	}
	u, err := url.Parse(p.cfg.SMTPURL)
	if err != nil || u.Host == "" {
		return fmt.Errorf("panel: bad SMTP URL: %v", err)
	}
	from := u.Query().Get("from")
	if from == "" {
		from = "noreply@" + u.Hostname()
	}
	// The header is built, not filtered: both addresses parsed as one bare
	// address each, the subject an RFC 2047 word (a line break or a
	// Russian letter in it is encoded, not sent raw).
	if !identity.ValidEmail(to) {
		return fmt.Errorf("panel: not an e-mail address: %q", to)
	}
	if a, err := mail.ParseAddress(from); err != nil || a.Address != from {
		return fmt.Errorf("panel: the SMTP URL's from is not an e-mail address: %q", from)
	}
	msg := "From: " + (&mail.Address{Address: from}).String() + "\r\nTo: " + (&mail.Address{Address: to}).String() +
		"\r\nSubject: " + mime.QEncoding.Encode("utf-8", subject) + "\r\nDate: " + time.Now().UTC().Format(time.RFC1123Z) +
		"\r\nMIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n\r\n" +
		strings.ReplaceAll(body, "\n", "\r\n")
	return deliver(u, from, to, []byte(msg))
}

// deliver speaks SMTP to u's server for one message.
func deliver(u *url.URL, from, to string, msg []byte) error {
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "25")
	}
	conn, err := net.DialTimeout("tcp", host, 10*time.Second)
	if err != nil {
		return err
	}
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	c, err := smtp.NewClient(conn, u.Hostname())
	if err != nil {
		conn.Close()
		return err
	}
	defer c.Close()
	if ok, _ := c.Extension("STARTTLS"); ok {
		if err := c.StartTLS(&tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12}); err != nil {
			return err
		}
	}
	if u.User != nil {
		pw, _ := u.User.Password()
		if err := c.Auth(smtp.PlainAuth("", u.User.Username(), pw, u.Hostname())); err != nil {
			return err
		}
	}
	if err := c.Mail(from); err != nil {
		return err
	}
	if err := c.Rcpt(to); err != nil {
		return err
	}
	w, err := c.Data()
	if err != nil {
		return err
	}
	if _, err := w.Write(msg); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	return c.Quit()
}

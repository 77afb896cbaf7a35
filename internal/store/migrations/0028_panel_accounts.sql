-- The web panel's accounts: sign-ups waiting for their e-mail to be
-- verified, password-reset links, the promotional e-mail choice and
-- two-factor secrets. Link tokens are stored as SHA-256 only; times are
-- Unix seconds.
CREATE TABLE panel_signups (
    token_hash    TEXT PRIMARY KEY,
    email         TEXT NOT NULL,
    password_hash TEXT NOT NULL,
    promo         INTEGER NOT NULL DEFAULT 0,
    next_path     TEXT NOT NULL DEFAULT '',
    created_at    BIGINT NOT NULL,
    expires_at    BIGINT NOT NULL
)
-- next
CREATE INDEX panel_signups_expires ON panel_signups (expires_at)
-- next
CREATE TABLE panel_resets (
    token_hash TEXT PRIMARY KEY,
    user_id    TEXT NOT NULL,
    expires_at BIGINT NOT NULL
)
-- next
CREATE INDEX panel_resets_user ON panel_resets (user_id)
-- next
CREATE TABLE panel_accounts (
    user_id     TEXT PRIMARY KEY,
    email       TEXT NOT NULL,
    promo       INTEGER NOT NULL DEFAULT 0,
    totp_secret TEXT NOT NULL DEFAULT '',
    created_at  BIGINT NOT NULL
)

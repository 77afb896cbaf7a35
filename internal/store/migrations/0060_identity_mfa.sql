-- Keystone's multi-factor authentication. Credentials
-- (keystone/credential/backends/sql.py): a user's secrets by type, of which
-- identity reads "totp" ones to check passcodes.
CREATE TABLE credentials (
	id TEXT PRIMARY KEY,
	user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
	project_id TEXT NOT NULL DEFAULT '',
	type TEXT NOT NULL,
	blob TEXT NOT NULL,
	created_at TEXT NOT NULL
)
-- next
CREATE INDEX credentials_user ON credentials (user_id, type)
-- next
-- A user's resource options (multi_factor_auth_rules and
-- multi_factor_auth_enabled), as a JSON object.
ALTER TABLE users ADD COLUMN options TEXT NOT NULL DEFAULT '{}'
-- next
-- The last TOTP time step a passcode of the user was accepted for: a
-- passcode of that step or an earlier one is refused, on every controller.
ALTER TABLE users ADD COLUMN totp_last_step BIGINT NOT NULL DEFAULT 0
-- next
-- Wrong passcodes in a row and the time of the last one.
ALTER TABLE users ADD COLUMN totp_failed_count INTEGER NOT NULL DEFAULT 0
-- next
ALTER TABLE users ADD COLUMN totp_failed_at TEXT NOT NULL DEFAULT ''
-- next
-- Auth receipts: a sign-in that proved some factors and waits for the
-- rest, behind a random id stored hashed. address is the client's, to bound
-- the live receipts one address holds.
CREATE TABLE auth_receipts (
	id_hash TEXT PRIMARY KEY,
	user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
	methods TEXT NOT NULL,
	address TEXT NOT NULL DEFAULT '',
	failures INTEGER NOT NULL DEFAULT 0,
	issued_at TEXT NOT NULL,
	expires_at TEXT NOT NULL
)
-- next
CREATE INDEX auth_receipts_user ON auth_receipts (user_id, issued_at)
-- next
CREATE INDEX auth_receipts_address ON auth_receipts (address, expires_at)
-- next
CREATE INDEX auth_receipts_expires ON auth_receipts (expires_at)

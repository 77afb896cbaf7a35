-- Keystone's application credentials (keystone/application_credential/
-- backends/sql.py): a secret, stored hashed, that authenticates as its
-- user on one project with a subset of the user's roles there.
CREATE TABLE application_credentials (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL,
	description TEXT NOT NULL DEFAULT '',
	secret_hash TEXT NOT NULL,
	user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
	project_id TEXT NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
	expires_at TEXT NOT NULL DEFAULT '',
	unrestricted INTEGER NOT NULL DEFAULT 0,
	created_at TEXT NOT NULL,
	UNIQUE (user_id, name)
)
-- next
CREATE TABLE application_credential_roles (
	application_credential_id TEXT NOT NULL REFERENCES application_credentials(id) ON DELETE CASCADE,
	role_id TEXT NOT NULL REFERENCES roles(id) ON DELETE CASCADE,
	PRIMARY KEY (application_credential_id, role_id)
)
-- next
-- The credential a token was issued for ('' for none): deleting the
-- credential revokes its tokens.
ALTER TABLE tokens ADD COLUMN app_cred_id TEXT NOT NULL DEFAULT ''
-- next
CREATE INDEX tokens_app_cred ON tokens (app_cred_id)

-- Keystone's account lockout (identity/backends/sql_model.py LocalUser):
-- failed password checks in a row and the time of the last one.
ALTER TABLE users ADD COLUMN failed_auth_count INTEGER NOT NULL DEFAULT 0
-- next
ALTER TABLE users ADD COLUMN failed_auth_at TEXT NOT NULL DEFAULT ''
-- next
-- A user's live tokens, newest first, for the per-user token cap.
CREATE INDEX tokens_user ON tokens (user_id, issued_at)

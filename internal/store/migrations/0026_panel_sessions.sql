-- The web panel's sign-in sessions. The cookie's value is never stored:
-- id_hash is its SHA-256, and the user's Keystone token is sealed with a
-- key derived from the cookie, so a copy of this table lets no one act as
-- a signed-in user. Times are Unix seconds.
CREATE TABLE panel_sessions (
    id_hash      TEXT PRIMARY KEY,
    user_id      TEXT NOT NULL,
    user_name    TEXT NOT NULL,
    project_id   TEXT NOT NULL,
    project_name TEXT NOT NULL,
    roles        TEXT NOT NULL DEFAULT '',
    token_sealed TEXT NOT NULL,
    csrf         TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL
)
-- next
CREATE INDEX panel_sessions_user ON panel_sessions (user_id)
-- next
CREATE INDEX panel_sessions_expires ON panel_sessions (expires_at)

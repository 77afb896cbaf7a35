-- A panel session's start in Unix nanoseconds, so that signing in past
-- the per-user bound ends exactly the oldest sessions even when several
-- began within one second (created_at is seconds); 0 for sessions made
-- before, which are then the oldest.
ALTER TABLE panel_sessions ADD COLUMN created_ns BIGINT NOT NULL DEFAULT 0
-- next
CREATE INDEX panel_sessions_user_created ON panel_sessions (user_id, created_ns)

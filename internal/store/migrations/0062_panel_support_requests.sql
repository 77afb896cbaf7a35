-- Support requests (panel_config_requests, 0027) get a state, open or
-- closed, so that the operator closes what is answered and a project's
-- open requests can be bounded; closed_at is when, 0 while open. The
-- operator's queue pages newest first within a state, of every project or
-- one; panel_support_locks has one row per project that a request's
-- insert bumps first, which on PostgreSQL counts one project's bounds one
-- request after another (as the quota lock tables do).
ALTER TABLE panel_config_requests ADD COLUMN state TEXT NOT NULL DEFAULT 'open'
-- next
ALTER TABLE panel_config_requests ADD COLUMN closed_at BIGINT NOT NULL DEFAULT 0
-- next
CREATE INDEX panel_config_requests_state ON panel_config_requests (state, created_at, id)
-- next
CREATE INDEX panel_config_requests_project_state ON panel_config_requests (project_id, state, created_at, id)
-- next
CREATE TABLE panel_support_locks (
    project_id TEXT PRIMARY KEY,
    serial     BIGINT NOT NULL
)

-- The web panel's support settings and customers' requests. panel_support
-- holds the operator's contacts as last changed in the panel (one row,
-- id 1; with none the panel shows those it was started with).
-- panel_config_requests are customers' requests for a configuration the
-- configurator does not offer, for the operator to answer. Times are Unix
-- seconds.
CREATE TABLE panel_support (
    id         INTEGER PRIMARY KEY,
    messenger  TEXT NOT NULL,
    email      TEXT NOT NULL,
    phone      TEXT NOT NULL,
    hours      TEXT NOT NULL,
    updated_at BIGINT NOT NULL
)
-- next
CREATE TABLE panel_config_requests (
    id           TEXT PRIMARY KEY,
    project_id   TEXT NOT NULL,
    project_name TEXT NOT NULL,
    user_id      TEXT NOT NULL,
    user_name    TEXT NOT NULL,
    body         TEXT NOT NULL,
    created_at   BIGINT NOT NULL
)
-- next
CREATE INDEX panel_config_requests_created ON panel_config_requests (created_at)
-- next
CREATE INDEX panel_config_requests_project ON panel_config_requests (project_id, created_at)

-- Compute groups: server groups (Nova's instance groups) with their members,
-- and host aggregates with their hosts and metadata (an aggregate's
-- "availability_zone" metadata makes its hosts an availability zone).
CREATE TABLE compute_server_groups (
    id           TEXT PRIMARY KEY,
    name         TEXT NOT NULL,
    project_id   TEXT NOT NULL,
    user_id      TEXT NOT NULL,
    policy       TEXT NOT NULL,
    max_per_host INTEGER NOT NULL DEFAULT 0,
    created_at   TEXT NOT NULL
)
-- next
CREATE INDEX compute_server_groups_project ON compute_server_groups (project_id, created_at, id)
-- next
CREATE INDEX compute_server_groups_created ON compute_server_groups (created_at, id)
-- next
-- A server is a member of at most one group.
CREATE TABLE compute_server_group_members (
    server_id  TEXT PRIMARY KEY,
    group_id   TEXT NOT NULL,
    created_at TEXT NOT NULL
)
-- next
CREATE INDEX compute_server_group_members_group ON compute_server_group_members (group_id)
-- next
CREATE TABLE compute_aggregates (
    id         BIGINT PRIMARY KEY,
    uuid       TEXT NOT NULL UNIQUE,
    name       TEXT NOT NULL UNIQUE,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL DEFAULT ''
)
-- next
-- The last aggregate id handed out (one row): ids are never reused, as
-- Nova's autoincrement ids are not, so a client waiting for a deleted
-- aggregate's 404 never sees a new one under its id.
CREATE TABLE compute_aggregate_ids (
    one     INTEGER PRIMARY KEY,
    last_id BIGINT NOT NULL
)
-- next
CREATE TABLE compute_aggregate_hosts (
    aggregate_id BIGINT NOT NULL,
    host         TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    PRIMARY KEY (aggregate_id, host)
)
-- next
CREATE INDEX compute_aggregate_hosts_host ON compute_aggregate_hosts (host)
-- next
CREATE TABLE compute_aggregate_metadata (
    aggregate_id BIGINT NOT NULL,
    meta_key     TEXT NOT NULL,
    value        TEXT NOT NULL,
    PRIMARY KEY (aggregate_id, meta_key)
)

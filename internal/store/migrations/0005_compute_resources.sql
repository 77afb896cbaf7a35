-- Compute resources: flavors with their extra specs and access lists, key
-- pairs, per-project quotas, and the compute services (one nova-compute per
-- hypervisor host, plus the controller's scheduler and conductor).
CREATE TABLE compute_flavors (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    vcpus       INTEGER NOT NULL,
    ram         INTEGER NOT NULL,
    disk        INTEGER NOT NULL,
    ephemeral   INTEGER NOT NULL DEFAULT 0,
    swap        INTEGER NOT NULL DEFAULT 0,
    rxtx_factor REAL NOT NULL DEFAULT 1,
    is_public   INTEGER NOT NULL DEFAULT 1,
    disabled    INTEGER NOT NULL DEFAULT 0,
    has_description INTEGER NOT NULL DEFAULT 0,
    description TEXT NOT NULL DEFAULT '',
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL
)
-- next
CREATE TABLE compute_flavor_extra_specs (
    flavor_id TEXT NOT NULL REFERENCES compute_flavors(id) ON DELETE CASCADE,
    spec_key  TEXT NOT NULL,
    value     TEXT NOT NULL,
    PRIMARY KEY (flavor_id, spec_key)
)
-- next
CREATE TABLE compute_flavor_projects (
    flavor_id  TEXT NOT NULL REFERENCES compute_flavors(id) ON DELETE CASCADE,
    project_id TEXT NOT NULL,
    PRIMARY KEY (flavor_id, project_id)
)
-- next
CREATE INDEX compute_flavor_projects_project ON compute_flavor_projects (project_id)
-- next
CREATE TABLE compute_keypairs (
    id          BIGINT PRIMARY KEY,
    user_id     TEXT NOT NULL,
    name        TEXT NOT NULL,
    type        TEXT NOT NULL,
    public_key  TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    UNIQUE (user_id, name)
)
-- next
CREATE TABLE compute_quotas (
    project_id  TEXT NOT NULL,
    resource    TEXT NOT NULL,
    hard_limit  BIGINT NOT NULL,
    PRIMARY KEY (project_id, resource)
)
-- next
CREATE TABLE compute_services (
    id              BIGINT PRIMARY KEY,
    uuid            TEXT NOT NULL UNIQUE,
    host            TEXT NOT NULL,
    binary_name     TEXT NOT NULL,
    zone            TEXT NOT NULL,
    disabled        INTEGER NOT NULL DEFAULT 0,
    disabled_reason TEXT,
    forced_down     INTEGER NOT NULL DEFAULT 0,
    deleted         INTEGER NOT NULL DEFAULT 0,
    node_id         BIGINT NOT NULL DEFAULT 0,
    node_uuid       TEXT NOT NULL DEFAULT '',
    created_at      TEXT NOT NULL,
    updated_at      TEXT NOT NULL,
    UNIQUE (host, binary_name)
)
-- next
CREATE TABLE compute_seeded (
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    PRIMARY KEY (kind, name)
)

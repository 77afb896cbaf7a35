-- Block storage (internal/volume, Cinder v3). A volume is a sparse raw
-- file <data dir>/volumes/<id>; its row says what it should be. name and
-- description are NULL when never given, as Cinder shows null. new_size is
-- the size an os-extend asked for while the volume is extending (0
-- otherwise), so that quota counts it at once. metadata and image_metadata
-- are JSON objects of strings; error is the reason a volume went to error.
CREATE TABLE volume_types (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    description TEXT,
    is_public   INTEGER NOT NULL DEFAULT 1,
    is_default  INTEGER NOT NULL DEFAULT 0,
    extra_specs TEXT NOT NULL DEFAULT '{}',
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL
)
-- next
CREATE TABLE volumes (
    id                TEXT PRIMARY KEY,
    project_id        TEXT NOT NULL,
    user_id           TEXT NOT NULL,
    name              TEXT,
    description       TEXT,
    size              BIGINT NOT NULL,
    new_size          BIGINT NOT NULL DEFAULT 0,
    status            TEXT NOT NULL,
    volume_type_id    TEXT NOT NULL REFERENCES volume_types(id),
    availability_zone TEXT NOT NULL,
    bootable          INTEGER NOT NULL DEFAULT 0,
    image_id          TEXT NOT NULL DEFAULT '',
    metadata          TEXT NOT NULL DEFAULT '{}',
    image_metadata    TEXT NOT NULL DEFAULT '{}',
    error             TEXT NOT NULL DEFAULT '',
    created_at        TEXT NOT NULL,
    updated_at        TEXT NOT NULL
)
-- next
CREATE INDEX volumes_project ON volumes (project_id, created_at)
-- next
CREATE INDEX volumes_status ON volumes (status)
-- next
-- Per-project limits an admin set (os-quota-sets); a resource without a row
-- has its default.
CREATE TABLE volume_quotas (
    project_id TEXT NOT NULL,
    resource   TEXT NOT NULL,
    hard_limit BIGINT NOT NULL,
    PRIMARY KEY (project_id, resource)
)
-- next
-- One row per project that ever made a volume: a create or extend updates
-- it first, which on PostgreSQL locks the project's quota check against
-- concurrent ones until the transaction ends (SQLite has one writer anyway).
CREATE TABLE volume_quota_locks (
    project_id TEXT PRIMARY KEY,
    serial     BIGINT NOT NULL DEFAULT 0
)

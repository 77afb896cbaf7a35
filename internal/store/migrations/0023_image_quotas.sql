-- Image quotas (internal/image): per-project limits an admin set, under
-- Glance's unified-limits names (image_count_total, image_size_total in MiB,
-- image_stage_total, image_count_uploading); a resource without a row has
-- its default.
CREATE TABLE image_quotas (
    project_id TEXT NOT NULL,
    resource   TEXT NOT NULL,
    hard_limit BIGINT NOT NULL,
    PRIMARY KEY (project_id, resource)
)
-- next
-- One row per project that a quota check bumps first, which on PostgreSQL
-- serialises the project's image quota checks until the transaction ends
-- (SQLite has one writer anyway).
CREATE TABLE image_quota_locks (
    project_id TEXT PRIMARY KEY,
    serial     BIGINT NOT NULL DEFAULT 0
)
-- next
-- Stored image data is charged per GB and hour at image_gb (backups keep
-- backup_gb); the default is backup_gb's, so a snapshot costs what a backup
-- does. An operator's later change stays.
INSERT INTO billing_prices (rate_key, rate) VALUES ('image_gb', 3000)
    ON CONFLICT (rate_key) DO NOTHING

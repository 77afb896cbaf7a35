-- Volume snapshots (internal/volume, Cinder v3 /snapshots). A snapshot is
-- a copy of its volume's file at the moment it was taken, kept as
-- <volumes dir>/snapshots/<id>; its row says what it should be. size,
-- volume_type_id, bootable and image_metadata are the volume's when the
-- snapshot was taken, so that a volume made from it carries them over as
-- Cinder does. error is the reason a snapshot went to error.
CREATE TABLE volume_snapshots (
    id             TEXT PRIMARY KEY,
    project_id     TEXT NOT NULL,
    user_id        TEXT NOT NULL,
    volume_id      TEXT NOT NULL,
    volume_type_id TEXT NOT NULL,
    name           TEXT,
    description    TEXT,
    size           BIGINT NOT NULL,
    status         TEXT NOT NULL,
    bootable       INTEGER NOT NULL DEFAULT 0,
    image_metadata TEXT NOT NULL DEFAULT '{}',
    metadata       TEXT NOT NULL DEFAULT '{}',
    error          TEXT NOT NULL DEFAULT '',
    created_at     TEXT NOT NULL,
    updated_at     TEXT NOT NULL
)
-- next
CREATE INDEX volume_snapshots_project ON volume_snapshots (project_id, created_at)
-- next
CREATE INDEX volume_snapshots_volume ON volume_snapshots (volume_id)
-- next
CREATE INDEX volume_snapshots_status ON volume_snapshots (status)
-- next
-- The snapshot or volume a volume was made from ('' for neither).
ALTER TABLE volumes ADD COLUMN snapshot_id TEXT NOT NULL DEFAULT ''
-- next
ALTER TABLE volumes ADD COLUMN source_volid TEXT NOT NULL DEFAULT ''
-- next
-- Snapshots are charged per GB-hour as snapshot_gb, priced at first like
-- the volumes they copy.
INSERT INTO billing_prices (rate_key, rate) SELECT 'snapshot_gb', rate FROM billing_prices WHERE rate_key = 'volume_gb'

-- Volume backups (internal/volume backups.go, Cinder's backups API). The
-- data lives in the backup store (backupstore.go), a directory apart from
-- the volumes; the row is what the API shows. parent_id is the backup an
-- incremental one builds on ('' for a full one); restore_volume_id the
-- volume a restore under way writes ('' otherwise); volume_status the
-- status the backed-up volume returns to when the copy ends (Cinder's
-- previous_status: available, or in-use with force). name, description and
-- container are NULL when never given, as Cinder shows null.
CREATE TABLE volume_backups (
    id                TEXT PRIMARY KEY,
    project_id        TEXT NOT NULL,
    user_id           TEXT NOT NULL,
    volume_id         TEXT NOT NULL,
    name              TEXT,
    description       TEXT,
    container         TEXT,
    size              BIGINT NOT NULL,
    status            TEXT NOT NULL,
    parent_id         TEXT NOT NULL DEFAULT '',
    restore_volume_id TEXT NOT NULL DEFAULT '',
    volume_status     TEXT NOT NULL DEFAULT '',
    object_count      BIGINT NOT NULL DEFAULT 0,
    metadata          TEXT NOT NULL DEFAULT '{}',
    fail_reason       TEXT NOT NULL DEFAULT '',
    data_timestamp    TEXT NOT NULL,
    created_at        TEXT NOT NULL,
    updated_at        TEXT NOT NULL
)
-- next
CREATE INDEX volume_backups_project ON volume_backups (project_id, created_at)
-- next
CREATE INDEX volume_backups_volume ON volume_backups (volume_id)
-- next
CREATE INDEX volume_backups_parent ON volume_backups (parent_id)
-- next
CREATE INDEX volume_backups_status ON volume_backups (status)

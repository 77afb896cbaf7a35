-- Volume transfers (internal/volume transfers.go, Cinder's transfers
-- table): a volume offered by its project to whichever project presents
-- the id and the auth key. Only a salted hash of the key is kept (salt,
-- crypt_hash). A cancelled or accepted transfer is kept as deleted = 1,
-- an accepted one with accepted = 1 and the project that took the volume
-- (destination_project_id), as Cinder keeps its history (3.57).
CREATE TABLE volume_transfers (
    id                     TEXT PRIMARY KEY,
    volume_id              TEXT NOT NULL,
    name                   TEXT,
    salt                   TEXT NOT NULL,
    crypt_hash             TEXT NOT NULL,
    no_snapshots           INTEGER NOT NULL DEFAULT 0,
    source_project_id      TEXT NOT NULL,
    destination_project_id TEXT NOT NULL DEFAULT '',
    accepted               INTEGER NOT NULL DEFAULT 0,
    deleted                INTEGER NOT NULL DEFAULT 0,
    created_at             TEXT NOT NULL,
    updated_at             TEXT NOT NULL,
    deleted_at             TEXT NOT NULL DEFAULT ''
)
-- next
CREATE INDEX volume_transfers_volume ON volume_transfers (volume_id, deleted)
-- next
CREATE INDEX volume_transfers_project ON volume_transfers (source_project_id, deleted, created_at)

-- Volume attachments (internal/volume attach.go, Cinder's
-- volume_attachment with Nova's block device mapping fields). origin says
-- who made the row: 'compute' (Nova's attach, which the VM's disks follow)
-- or 'api' (Cinder's attachments API and legacy os-attach, a record only).
-- host is the host a connection was made for ('' when none) and is only
-- ever written by the service; connector is the caller's as given.
CREATE TABLE volume_attachments (
    id                    TEXT PRIMARY KEY,
    volume_id             TEXT NOT NULL,
    project_id            TEXT NOT NULL,
    instance_uuid         TEXT NOT NULL DEFAULT '',
    host                  TEXT NOT NULL DEFAULT '',
    host_name             TEXT NOT NULL DEFAULT '',
    connector             TEXT NOT NULL DEFAULT '{}',
    attach_status         TEXT NOT NULL,
    attach_mode           TEXT NOT NULL DEFAULT 'rw',
    mountpoint            TEXT NOT NULL DEFAULT '',
    tag                   TEXT NOT NULL DEFAULT '',
    delete_on_termination INTEGER NOT NULL DEFAULT 0,
    origin                TEXT NOT NULL,
    attached_at           TEXT,
    detached_at           TEXT,
    created_at            TEXT NOT NULL,
    updated_at            TEXT NOT NULL
)
-- next
CREATE INDEX volume_attachments_volume ON volume_attachments (volume_id)
-- next
CREATE INDEX volume_attachments_server ON volume_attachments (instance_uuid, created_at)
-- next
CREATE INDEX volume_attachments_project ON volume_attachments (project_id, created_at)

-- Volume QoS specs (internal/volume, Cinder v3 /qos-specs): limits a volume
-- type's volumes get when attached. specs is a JSON object of strings (the
-- throttle keys qos.go accepts); consumer is Cinder's front-end, back-end
-- or both.
CREATE TABLE volume_qos_specs (
    id         TEXT PRIMARY KEY,
    name       TEXT NOT NULL UNIQUE,
    consumer   TEXT NOT NULL,
    specs      TEXT NOT NULL DEFAULT '{}',
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
)
-- next
-- The QoS spec of a type (NULL: none), as Cinder's volume_types.qos_specs_id.
ALTER TABLE volume_types ADD COLUMN qos_specs_id TEXT REFERENCES volume_qos_specs(id)
-- next
-- What Cinder keeps apart from the owner's metadata (readonly), a JSON
-- object of strings only the service writes.
ALTER TABLE volumes ADD COLUMN admin_metadata TEXT NOT NULL DEFAULT '{}'
-- next
-- One-time setup steps done (the network type's default QoS spec), so that
-- an operator's later change is not undone at the next start.
CREATE TABLE volume_settings (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
)

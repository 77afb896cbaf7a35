-- Cinder's user messages (internal/volume messages.go): why an
-- asynchronous operation on a volume failed, for its project to read
-- until expires_at.
CREATE TABLE volume_messages (
    id            TEXT PRIMARY KEY,
    project_id    TEXT NOT NULL,
    request_id    TEXT NOT NULL,
    resource_type TEXT NOT NULL,
    resource_uuid TEXT NOT NULL,
    event_id      TEXT NOT NULL,
    message_level TEXT NOT NULL,
    user_message  TEXT NOT NULL,
    created_at    TEXT NOT NULL,
    expires_at    TEXT NOT NULL
)
-- next
CREATE INDEX volume_messages_project ON volume_messages (project_id, created_at)

-- Private volume types' access lists (Cinder's volume_type_projects): a
-- project named here sees a private type and makes volumes of it; admins
-- see every type. The rows go with their type.
CREATE TABLE volume_type_projects (
    type_id    TEXT NOT NULL REFERENCES volume_types (id) ON DELETE CASCADE,
    project_id TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (type_id, project_id)
)

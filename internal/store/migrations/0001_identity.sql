CREATE TABLE domains (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL UNIQUE,
	description TEXT NOT NULL DEFAULT '',
	enabled INTEGER NOT NULL DEFAULT 1
)
-- next
CREATE TABLE projects (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL,
	domain_id TEXT NOT NULL REFERENCES domains(id),
	description TEXT NOT NULL DEFAULT '',
	enabled INTEGER NOT NULL DEFAULT 1,
	tags TEXT NOT NULL DEFAULT '[]',
	created_at TEXT NOT NULL,
	UNIQUE (domain_id, name)
)
-- next
CREATE TABLE users (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL,
	domain_id TEXT NOT NULL REFERENCES domains(id),
	password_hash TEXT NOT NULL DEFAULT '',
	enabled INTEGER NOT NULL DEFAULT 1,
	email TEXT NOT NULL DEFAULT '',
	description TEXT NOT NULL DEFAULT '',
	default_project_id TEXT NOT NULL DEFAULT '',
	created_at TEXT NOT NULL,
	UNIQUE (domain_id, name)
)
-- next
CREATE TABLE roles (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL UNIQUE,
	description TEXT NOT NULL DEFAULT ''
)
-- next
CREATE TABLE role_assignments (
	user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
	project_id TEXT NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
	role_id TEXT NOT NULL REFERENCES roles(id) ON DELETE CASCADE,
	PRIMARY KEY (user_id, project_id, role_id)
)
-- next
CREATE INDEX role_assignments_project ON role_assignments (project_id)
-- next
CREATE TABLE tokens (
	id_hash TEXT PRIMARY KEY,
	user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
	project_id TEXT NOT NULL DEFAULT '',
	methods TEXT NOT NULL,
	audit_id TEXT NOT NULL,
	issued_at TEXT NOT NULL,
	expires_at TEXT NOT NULL
)
-- next
CREATE INDEX tokens_expires ON tokens (expires_at)
-- next
CREATE TABLE settings (
	name TEXT PRIMARY KEY,
	value TEXT NOT NULL
)

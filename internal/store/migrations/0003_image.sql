CREATE TABLE images (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL DEFAULT '',
	status TEXT NOT NULL,
	visibility TEXT NOT NULL,
	owner TEXT NOT NULL DEFAULT '',
	protected INTEGER NOT NULL DEFAULT 0,
	os_hidden INTEGER NOT NULL DEFAULT 0,
	disk_format TEXT NOT NULL DEFAULT '',
	container_format TEXT NOT NULL DEFAULT '',
	size BIGINT NOT NULL DEFAULT 0,
	virtual_size BIGINT NOT NULL DEFAULT 0,
	checksum TEXT NOT NULL DEFAULT '',
	os_hash_algo TEXT NOT NULL DEFAULT '',
	os_hash_value TEXT NOT NULL DEFAULT '',
	min_disk INTEGER NOT NULL DEFAULT 0,
	min_ram INTEGER NOT NULL DEFAULT 0,
	tags TEXT NOT NULL DEFAULT '[]',
	properties TEXT NOT NULL DEFAULT '{}',
	created_at TEXT NOT NULL,
	updated_at TEXT NOT NULL
)
-- next
CREATE INDEX images_owner ON images (owner)
-- next
CREATE INDEX images_visibility ON images (visibility)
-- next
CREATE TABLE image_members (
	image_id TEXT NOT NULL REFERENCES images(id) ON DELETE CASCADE,
	member TEXT NOT NULL,
	status TEXT NOT NULL,
	created_at TEXT NOT NULL,
	updated_at TEXT NOT NULL,
	PRIMARY KEY (image_id, member)
)
-- next
CREATE INDEX image_members_member ON image_members (member)
-- next
CREATE TABLE image_settings (
	name TEXT PRIMARY KEY,
	value TEXT NOT NULL
)

-- Subnet pools (Neutron's subnet_allocation extension): a project's or a
-- shared set of prefixes that subnets are carved from. The pool's prefixes
-- are stored compacted as a JSON list of CIDRs; a subnet made from a pool
-- names it in subnets.subnetpool_id, and the pool's allocations are exactly
-- those subnets' CIDRs.
CREATE TABLE subnetpools (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL DEFAULT '',
	project_id TEXT NOT NULL DEFAULT '',
	description TEXT NOT NULL DEFAULT '',
	ip_version INTEGER NOT NULL,
	prefixes TEXT NOT NULL DEFAULT '[]',
	default_prefixlen INTEGER NOT NULL,
	min_prefixlen INTEGER NOT NULL,
	max_prefixlen INTEGER NOT NULL,
	default_quota INTEGER,
	shared INTEGER NOT NULL DEFAULT 0,
	is_default INTEGER NOT NULL DEFAULT 0,
	tags TEXT NOT NULL DEFAULT '[]',
	created_at TEXT NOT NULL,
	updated_at TEXT NOT NULL,
	revision_number BIGINT NOT NULL DEFAULT 0
)
-- next
CREATE INDEX subnetpools_project ON subnetpools (project_id)
-- next
ALTER TABLE subnets ADD COLUMN subnetpool_id TEXT
-- next
CREATE INDEX subnets_subnetpool ON subnets (subnetpool_id)
-- next
-- A router's extra routes (Neutron's extraroute extension), a JSON list of
-- {"destination", "nexthop"} in the order they were set.
ALTER TABLE routers ADD COLUMN routes TEXT NOT NULL DEFAULT '[]'

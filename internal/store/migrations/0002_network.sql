CREATE TABLE networks (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL DEFAULT '',
	project_id TEXT NOT NULL DEFAULT '',
	description TEXT NOT NULL DEFAULT '',
	admin_state_up INTEGER NOT NULL DEFAULT 1,
	shared INTEGER NOT NULL DEFAULT 0,
	external INTEGER NOT NULL DEFAULT 0,
	is_default INTEGER NOT NULL DEFAULT 0,
	mtu INTEGER NOT NULL DEFAULT 1450,
	port_security_enabled INTEGER NOT NULL DEFAULT 1,
	tags TEXT NOT NULL DEFAULT '[]',
	builtin TEXT UNIQUE,
	created_at TEXT NOT NULL,
	updated_at TEXT NOT NULL,
	revision_number BIGINT NOT NULL DEFAULT 0
)
-- next
CREATE INDEX networks_project ON networks (project_id)
-- next
CREATE TABLE subnets (
	id TEXT PRIMARY KEY,
	network_id TEXT NOT NULL REFERENCES networks(id),
	name TEXT NOT NULL DEFAULT '',
	project_id TEXT NOT NULL DEFAULT '',
	description TEXT NOT NULL DEFAULT '',
	ip_version INTEGER NOT NULL,
	cidr TEXT NOT NULL,
	gateway_ip TEXT,
	allocation_pools TEXT NOT NULL DEFAULT '[]',
	enable_dhcp INTEGER NOT NULL DEFAULT 1,
	dns_nameservers TEXT NOT NULL DEFAULT '[]',
	host_routes TEXT NOT NULL DEFAULT '[]',
	ipv6_ra_mode TEXT,
	ipv6_address_mode TEXT,
	tags TEXT NOT NULL DEFAULT '[]',
	created_at TEXT NOT NULL,
	updated_at TEXT NOT NULL,
	revision_number BIGINT NOT NULL DEFAULT 0
)
-- next
CREATE INDEX subnets_network ON subnets (network_id)
-- next
CREATE TABLE ports (
	id TEXT PRIMARY KEY,
	network_id TEXT NOT NULL REFERENCES networks(id),
	name TEXT NOT NULL DEFAULT '',
	project_id TEXT NOT NULL DEFAULT '',
	description TEXT NOT NULL DEFAULT '',
	mac_address TEXT NOT NULL,
	admin_state_up INTEGER NOT NULL DEFAULT 1,
	status TEXT NOT NULL DEFAULT 'DOWN',
	device_id TEXT NOT NULL DEFAULT '',
	device_owner TEXT NOT NULL DEFAULT '',
	port_security_enabled INTEGER NOT NULL DEFAULT 1,
	security_groups TEXT NOT NULL DEFAULT '[]',
	allowed_address_pairs TEXT NOT NULL DEFAULT '[]',
	vnic_type TEXT NOT NULL DEFAULT 'normal',
	server_owned INTEGER NOT NULL DEFAULT 0,
	tags TEXT NOT NULL DEFAULT '[]',
	created_at TEXT NOT NULL,
	updated_at TEXT NOT NULL,
	revision_number BIGINT NOT NULL DEFAULT 0,
	UNIQUE (network_id, mac_address)
)
-- next
CREATE INDEX ports_device ON ports (device_id)
-- next
CREATE INDEX ports_project ON ports (project_id)
-- next
CREATE TABLE ip_allocations (
	subnet_id TEXT NOT NULL REFERENCES subnets(id),
	ip_address TEXT NOT NULL,
	network_id TEXT NOT NULL,
	owner_id TEXT NOT NULL,
	seq BIGINT NOT NULL DEFAULT 0,
	PRIMARY KEY (subnet_id, ip_address)
)
-- next
CREATE INDEX ip_allocations_owner ON ip_allocations (owner_id)
-- next
CREATE TABLE port_security_groups (
	port_id TEXT NOT NULL,
	security_group_id TEXT NOT NULL,
	PRIMARY KEY (port_id, security_group_id)
)
-- next
CREATE INDEX port_security_groups_sg ON port_security_groups (security_group_id)
-- next
CREATE TABLE security_groups (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL DEFAULT '',
	project_id TEXT NOT NULL DEFAULT '',
	description TEXT NOT NULL DEFAULT '',
	stateful INTEGER NOT NULL DEFAULT 1,
	builtin TEXT UNIQUE,
	tags TEXT NOT NULL DEFAULT '[]',
	created_at TEXT NOT NULL,
	updated_at TEXT NOT NULL,
	revision_number BIGINT NOT NULL DEFAULT 0
)
-- next
CREATE INDEX security_groups_project ON security_groups (project_id)
-- next
CREATE TABLE security_group_rules (
	id TEXT PRIMARY KEY,
	security_group_id TEXT NOT NULL REFERENCES security_groups(id),
	project_id TEXT NOT NULL DEFAULT '',
	direction TEXT NOT NULL,
	ethertype TEXT NOT NULL,
	protocol TEXT,
	port_range_min INTEGER,
	port_range_max INTEGER,
	remote_ip_prefix TEXT,
	remote_group_id TEXT,
	description TEXT NOT NULL DEFAULT '',
	fingerprint TEXT NOT NULL,
	created_at TEXT NOT NULL,
	updated_at TEXT NOT NULL,
	revision_number BIGINT NOT NULL DEFAULT 0,
	UNIQUE (security_group_id, fingerprint)
)
-- next
CREATE TABLE floatingips (
	id TEXT PRIMARY KEY,
	project_id TEXT NOT NULL DEFAULT '',
	description TEXT NOT NULL DEFAULT '',
	floating_network_id TEXT NOT NULL REFERENCES networks(id),
	floating_subnet_id TEXT NOT NULL,
	floating_ip_address TEXT NOT NULL,
	port_id TEXT,
	fixed_ip_address TEXT,
	server_id TEXT,
	tags TEXT NOT NULL DEFAULT '[]',
	created_at TEXT NOT NULL,
	updated_at TEXT NOT NULL,
	revision_number BIGINT NOT NULL DEFAULT 0,
	UNIQUE (floating_network_id, floating_ip_address)
)
-- next
CREATE INDEX floatingips_port ON floatingips (port_id)
-- next
CREATE INDEX floatingips_project ON floatingips (project_id)
-- next
CREATE TABLE network_quotas (
	project_id TEXT NOT NULL,
	resource TEXT NOT NULL,
	hard_limit BIGINT NOT NULL,
	PRIMARY KEY (project_id, resource)
)
-- next
CREATE TABLE routers (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL DEFAULT '',
	project_id TEXT NOT NULL DEFAULT '',
	description TEXT NOT NULL DEFAULT '',
	admin_state_up INTEGER NOT NULL DEFAULT 1,
	gw_network_id TEXT,
	gw_port_id TEXT,
	enable_snat INTEGER NOT NULL DEFAULT 1,
	tags TEXT NOT NULL DEFAULT '[]',
	created_at TEXT NOT NULL,
	updated_at TEXT NOT NULL,
	revision_number BIGINT NOT NULL DEFAULT 0
)
-- next
CREATE INDEX routers_project ON routers (project_id)

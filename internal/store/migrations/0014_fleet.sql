-- The fleet (internal/fleet): host agents, the hosts they present, where
-- each server runs, and the work sent to them.
--
-- An agent enrols once with a one-time token and then authenticates with a
-- long-lived credential, of which only a hash is kept.
CREATE TABLE fleet_agents (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    secret_hash TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    seen_at     TEXT NOT NULL DEFAULT ''
)
-- next
-- Enrolment tokens made by "nimbus admin host token": kept as hashes,
-- used at most once (used_at, and the agent they made).
CREATE TABLE fleet_tokens (
    hash       TEXT PRIMARY KEY,
    expires_at TEXT NOT NULL,
    used_at    TEXT NOT NULL DEFAULT '',
    agent_id   TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL
)
-- next
-- Hypervisor hosts: the inventory their agent registered (a driver.Host
-- as JSON), the health it last reported and when (observed, the agent's
-- clock, orders reports; seen_at, the controller's, says whether it is
-- still alive). agent_id is '' for a host no agent presents any more.
-- Hosts are listed in the order they were registered (position: their
-- place in their agent's list), which gives compute's services their ids.
CREATE TABLE fleet_hosts (
    name          TEXT PRIMARY KEY,
    agent_id      TEXT NOT NULL,
    inventory     TEXT NOT NULL,
    up            INTEGER NOT NULL,
    health        TEXT NOT NULL DEFAULT '',
    observed      BIGINT NOT NULL DEFAULT 0,
    registered_at TEXT NOT NULL,
    position      INTEGER NOT NULL,
    seen_at       TEXT NOT NULL
)
-- next
CREATE INDEX fleet_hosts_agent ON fleet_hosts (agent_id)
-- next
-- Where each server's VM lives and its last reported power state. A row is
-- written before a spawn runs, so that later work (a destroy after a
-- failed spawn) finds the host; observed is the agent's clock (unix ns) of
-- the report the power state comes from, 0 before any; gone marks a VM
-- destroyed, kept for a while so that an older report cannot revive it.
CREATE TABLE fleet_instances (
    server_id  TEXT PRIMARY KEY,
    host       TEXT NOT NULL,
    power      INTEGER NOT NULL DEFAULT 0,
    observed   BIGINT NOT NULL DEFAULT 0,
    gone       INTEGER NOT NULL DEFAULT 0,
    updated_at TEXT NOT NULL
)
-- next
CREATE INDEX fleet_instances_host ON fleet_instances (host)
-- next
-- Work for an agent: one row per driver call. op_key is the caller's key
-- (driver.WithOpKey) with an attempt suffix after a failure, else the id,
-- so that the same step asked again finds its op instead of running twice.
-- args is cleared once the op is finished (it may hold a first-boot
-- password).
CREATE TABLE fleet_ops (
    id         TEXT PRIMARY KEY,
    op_key     TEXT NOT NULL UNIQUE,
    host       TEXT NOT NULL,
    server_id  TEXT NOT NULL,
    kind       TEXT NOT NULL,
    args       TEXT NOT NULL,
    state      TEXT NOT NULL,
    result     TEXT NOT NULL DEFAULT '',
    error      TEXT NOT NULL DEFAULT '',
    error_code TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL,
    done_at    TEXT NOT NULL DEFAULT ''
)
-- next
-- Pending work by age (delivery, sweeping); finished ops leave this part
-- of the index's key range at once.
CREATE INDEX fleet_ops_state ON fleet_ops (state, created_at)

-- Compute servers: indexed columns for what lists filter and sort on, and a
-- JSON document (doc) for the rest of the server record.
CREATE TABLE compute_servers (
    id            TEXT PRIMARY KEY,
    project_id    TEXT NOT NULL,
    user_id       TEXT NOT NULL,
    name          TEXT NOT NULL,
    vm_state      TEXT NOT NULL,
    task_state    TEXT NOT NULL DEFAULT '',
    power_state   INTEGER NOT NULL DEFAULT 0,
    host          TEXT NOT NULL DEFAULT '',
    flavor_id     TEXT NOT NULL,
    image_ref     TEXT NOT NULL DEFAULT '',
    reservation_id TEXT NOT NULL,
    launch_index  INTEGER NOT NULL DEFAULT 0,
    locked        INTEGER NOT NULL DEFAULT 0,
    availability_zone TEXT NOT NULL DEFAULT '',
    key_name      TEXT NOT NULL DEFAULT '',
    hostname      TEXT NOT NULL DEFAULT '',
    tags          TEXT NOT NULL DEFAULT '',
    vcpus         INTEGER NOT NULL DEFAULT 0,
    memory_mb     INTEGER NOT NULL DEFAULT 0,
    disk_gb       INTEGER NOT NULL DEFAULT 0,
    created_at    TEXT NOT NULL,
    updated_at    TEXT NOT NULL,
    launched_at   TEXT NOT NULL DEFAULT '',
    terminated_at TEXT NOT NULL DEFAULT '',
    deleted       INTEGER NOT NULL DEFAULT 0,
    doc           TEXT NOT NULL
)
-- next
CREATE INDEX compute_servers_project ON compute_servers (project_id, deleted, created_at, id)
-- next
CREATE INDEX compute_servers_created ON compute_servers (deleted, created_at, id)
-- next
CREATE INDEX compute_servers_host ON compute_servers (host, deleted)
-- next
CREATE INDEX compute_servers_task ON compute_servers (task_state)
-- next
CREATE INDEX compute_servers_reservation ON compute_servers (reservation_id)
-- next
CREATE TABLE compute_instance_actions (
    server_id   TEXT NOT NULL,
    request_id  TEXT NOT NULL,
    action      TEXT NOT NULL,
    project_id  TEXT NOT NULL,
    user_id     TEXT NOT NULL,
    start_time  TEXT NOT NULL,
    updated_at  TEXT NOT NULL,
    finish_time TEXT NOT NULL DEFAULT '',
    message     TEXT NOT NULL DEFAULT '',
    events      TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (server_id, request_id)
)
-- next
CREATE INDEX compute_instance_actions_server ON compute_instance_actions (server_id, start_time)
-- next
-- What the servers placed on each host hold, kept by every write of a
-- server row (server_store.go saveServer), so that placement reads one
-- small row per host instead of summing every server.
CREATE TABLE compute_host_usage (
    host      TEXT PRIMARY KEY,
    servers   INTEGER NOT NULL DEFAULT 0,
    vcpus     INTEGER NOT NULL DEFAULT 0,
    memory_mb INTEGER NOT NULL DEFAULT 0,
    disk_gb   INTEGER NOT NULL DEFAULT 0
)

-- Placement claims (internal/compute/claims.go): what each placed server
-- holds on its host. A claim's dedicated pCPUs and GPUs are rows of
-- compute_claim_items, whose primary key makes a pCPU or GPU held twice
-- impossible whatever the controllers do; memory per NUMA node and the
-- local disk pool are compute_host_capacity counters, taken by a
-- conditional UPDATE that fails rather than go over. Placement decides on
-- an in-memory snapshot and commits here, in the transaction that places
-- the server; a conflict makes it look again.
CREATE TABLE compute_claims (
    server_id  TEXT PRIMARY KEY,
    host       TEXT NOT NULL,
    cells      TEXT NOT NULL,
    gpus       TEXT NOT NULL,
    disk_gb    INTEGER NOT NULL,
    created_at TEXT NOT NULL
)
-- next
CREATE INDEX compute_claims_host ON compute_claims (host)
-- next
CREATE TABLE compute_claim_items (
    host      TEXT NOT NULL,
    item      TEXT NOT NULL,
    server_id TEXT NOT NULL,
    PRIMARY KEY (host, item)
)
-- next
CREATE INDEX compute_claim_items_server ON compute_claim_items (server_id)
-- next
-- node is a NUMA node id (total and used in MiB of RAM) or -1 for the
-- host's local disk pool (GiB).
CREATE TABLE compute_host_capacity (
    host  TEXT NOT NULL,
    node  INTEGER NOT NULL,
    total BIGINT NOT NULL,
    used  BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (host, node)
)

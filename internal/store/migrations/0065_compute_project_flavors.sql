-- Flavors the configurator made for one project (compute/project_flavors.go):
-- private, with only that project on their access list. slot is unique per
-- project and below compute.MaxProjectFlavors, so the bound holds when
-- orders race, on both engines. lease counts the orders that took the
-- flavor and handed_at is when the last did: an order whose server was
-- refused gives back only its own hand-out, and a flavor no server uses is
-- kept a while for an order still in flight. The row goes with its flavor.
CREATE TABLE compute_project_flavors (
    flavor_id  TEXT PRIMARY KEY REFERENCES compute_flavors (id) ON DELETE CASCADE,
    project_id TEXT NOT NULL,
    slot       INTEGER NOT NULL,
    lease      BIGINT NOT NULL,
    handed_at  TEXT NOT NULL,
    UNIQUE (project_id, slot)
)

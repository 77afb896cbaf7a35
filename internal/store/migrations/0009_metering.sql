-- Usage periods (internal/metering): what each billable resource was made
-- of, from when to when. Compute writes a server's periods in the same
-- transaction as the server row, so billing charges, and compute's usage
-- report counts, exactly the history that happened: a shelve closes the
-- open period, an unshelve or a resize opens a new one. ended_at is '' while
-- the period is open; changed_at is the later of the two, for the charging
-- pass's "unchanged since the last pass" skip.
CREATE TABLE metering_periods (
    id          TEXT PRIMARY KEY,
    resource_id TEXT NOT NULL,
    kind        TEXT NOT NULL,
    project_id  TEXT NOT NULL,
    spec        TEXT NOT NULL,
    started_at  TEXT NOT NULL,
    ended_at    TEXT NOT NULL DEFAULT '',
    changed_at  TEXT NOT NULL
)
-- next
-- A resource's periods in one seek, and the charging pass's order: by
-- resource, so that its charges reach the ledger's (kind, period_start,
-- resource_id) key in ascending order, and a resource's periods together.
CREATE INDEX metering_periods_resource ON metering_periods (resource_id, id)
-- next
CREATE INDEX metering_periods_project ON metering_periods (project_id, started_at)

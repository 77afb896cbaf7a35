-- Prepaid terms (internal/billing terms.go): a server rented for a number
-- of months, paid up front with one ledger charge whose period_start is the
-- term's start. The charging pass charges no hourly charge for hours a term
-- covers and, when a term ends, renews it (auto_renew and the balance
-- allows) or lets the server fall back to hourly or shelves it (on_end).
CREATE TABLE billing_terms (
    id          TEXT PRIMARY KEY,
    project_id  TEXT NOT NULL,
    resource_id TEXT NOT NULL,
    months      INTEGER NOT NULL,
    starts_at   TEXT NOT NULL,
    ends_at     TEXT NOT NULL,
    amount      BIGINT NOT NULL,
    auto_renew  INTEGER NOT NULL,
    on_end      TEXT NOT NULL,
    status      TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    UNIQUE (resource_id, starts_at)
)
-- next
CREATE INDEX billing_terms_project ON billing_terms (project_id, starts_at)
-- next
CREATE INDEX billing_terms_ends ON billing_terms (status, ends_at)
-- next
-- Discounts for prepaid terms, by months, in basis points (500 = 5%).
INSERT INTO billing_prices (rate_key, rate) VALUES
    ('term:1', 0),
    ('term:3', 500),
    ('term:6', 1000),
    ('term:12', 1500)
-- next
-- What the customer was told: running-dry warnings and suspensions, once
-- per account and level until the next payment (epoch: the id of the
-- latest credit to the ledger).
CREATE TABLE billing_notices (
    id         TEXT PRIMARY KEY,
    project_id TEXT NOT NULL,
    level      TEXT NOT NULL,
    epoch      TEXT NOT NULL,
    message    TEXT NOT NULL,
    created_at TEXT NOT NULL,
    UNIQUE (project_id, level, epoch)
)
-- next
-- The ledger again, with its one-charge-per-resource-and-hour key led by
-- the hour: each hourly pass then appends its charges at the end of the
-- index instead of touching one page per resource (the 100,000-resource
-- pass was bound by those writes). Rows are copied as they are.
CREATE TABLE billing_ledger_next (
    id           TEXT PRIMARY KEY,
    project_id   TEXT NOT NULL,
    kind         TEXT NOT NULL,
    amount       BIGINT NOT NULL,
    resource_id  TEXT,
    period_start TEXT,
    created_at   TEXT NOT NULL,
    reference    TEXT NOT NULL DEFAULT '',
    UNIQUE (kind, period_start, resource_id)
)
-- next
INSERT INTO billing_ledger_next (id, project_id, kind, amount, resource_id, period_start, created_at, reference)
SELECT id, project_id, kind, amount, resource_id, period_start, created_at, reference FROM billing_ledger
-- next
DROP TABLE billing_ledger
-- next
ALTER TABLE billing_ledger_next RENAME TO billing_ledger
-- next
-- One index serves both the ledger newest first per project and balances:
-- amount rides along so that a balance, one account's or every account's,
-- is read from the index alone.
CREATE INDEX billing_ledger_by_project ON billing_ledger (project_id, created_at, id, amount)

-- Billing (internal/billing): the price list, one account per project, the
-- append-only ledger and the charging job's progress.
--
-- Hourly rates in rate units: 1/10000 of a currency minor unit per hour, so
-- that per-GB rates below one minor unit stay exact integers.
CREATE TABLE billing_prices (
    rate_key TEXT PRIMARY KEY,
    rate     BIGINT NOT NULL
)
-- next
-- Defaults, seeded once by this migration; the operator edits them through
-- PUT /v1/prices afterwards.
INSERT INTO billing_prices (rate_key, rate) VALUES
    ('vcpu', 500000),
    ('ram_gb', 200000),
    ('disk_gb:local', 5000),
    ('disk_gb:network', 8000),
    ('gpu:A100 80GB', 15000000),
    ('gpu:L4', 4000000),
    ('public_ipv4', 250000),
    ('windows_vcpu', 600000),
    ('volume_gb', 8000),
    ('backup_gb', 3000)
-- next
CREATE TABLE billing_accounts (
    project_id   TEXT PRIMARY KEY,
    credit_limit BIGINT NOT NULL DEFAULT 0,
    created_at   TEXT NOT NULL
)
-- next
-- The ledger of record. The balance is SUM(amount); no total is kept beside
-- it. resource_id and period_start are NULL except for charges, so the
-- unique constraint only binds charges: one per (resource, hour), on both
-- engines, whoever inserts first.
CREATE TABLE billing_ledger (
    id           TEXT PRIMARY KEY,
    project_id   TEXT NOT NULL,
    kind         TEXT NOT NULL,
    amount       BIGINT NOT NULL,
    resource_id  TEXT,
    period_start TEXT,
    created_at   TEXT NOT NULL,
    reference    TEXT NOT NULL DEFAULT '',
    UNIQUE (kind, resource_id, period_start)
)
-- next
CREATE INDEX billing_ledger_project ON billing_ledger (project_id, created_at, id)
-- next
-- Named progress markers of the charging job, e.g. 'charged_through': the
-- start of the last hour whose charges are complete.
CREATE TABLE billing_state (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
)

-- Billing payments and free test access (internal/billing payments.go,
-- trials.go). Neither table holds money of record: the ledger does. A top-up
-- or trial row is the workflow around one ledger entry.
--
-- A top-up is recorded as pending before the provider is asked, so a payment
-- whose outcome is lost (crash, provider timeout) stays visible. Its ledger
-- row (ledger_id) is written in the same transaction that moves it from
-- pending to succeeded, so it is credited exactly once.
CREATE TABLE billing_topups (
    id             TEXT PRIMARY KEY,
    project_id     TEXT NOT NULL,
    provider       TEXT NOT NULL,
    amount         BIGINT NOT NULL,
    status         TEXT NOT NULL,
    reference      TEXT NOT NULL DEFAULT '',
    failure_reason TEXT NOT NULL DEFAULT '',
    ledger_id      TEXT,
    created_at     TEXT NOT NULL,
    completed_at   TEXT
)
-- next
CREATE INDEX billing_topups_project ON billing_topups (project_id, created_at)
-- next
-- A trial's credit and its expiry are ledger rows of kind 'trial' with
-- resource_id = the trial id; this table is the request and the decision.
CREATE TABLE billing_trials (
    id          TEXT PRIMARY KEY,
    project_id  TEXT NOT NULL,
    description TEXT NOT NULL,
    status      TEXT NOT NULL,
    credit      BIGINT NOT NULL DEFAULT 0,
    ends_at     TEXT,
    reason      TEXT NOT NULL DEFAULT '',
    created_at  TEXT NOT NULL,
    decided_at  TEXT
)
-- next
-- One open (pending or approved) trial per project, kept by the engine so two
-- concurrent requests cannot both win.
CREATE UNIQUE INDEX billing_trials_open ON billing_trials (project_id) WHERE status IN ('pending', 'approved')
-- next
CREATE INDEX billing_trials_status ON billing_trials (status, created_at)

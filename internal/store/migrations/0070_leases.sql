-- Leases (internal/lease): work that must happen once is owned through
-- the database by one controller at a time. A lease is a named row its
-- holder renews; one not renewed by expires_at is free for any controller
-- to take. Times are the holders' clocks (store.TimeFormat, sorting as
-- text); every commit of owned work checks in its own transaction that
-- the lease is still its holder's, so a clock that runs ahead costs a
-- wasted attempt, never a second commit.
CREATE TABLE leases (
    name        TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,
    expires_at  TEXT NOT NULL,
    acquired_at TEXT NOT NULL
)
-- next
CREATE INDEX leases_holder ON leases (holder)
-- next
-- Singleton periodic jobs (the charging pass, the power and orphan sweep,
-- housekeeping): when each last ran to the end, how many times it has,
-- and which controller ran it last. A controller runs a job only under
-- its lease and only when its last run is a period old, so the job runs
-- once per period whichever controllers are alive.
CREATE TABLE lease_jobs (
    name     TEXT PRIMARY KEY,
    last_run TEXT NOT NULL,
    runs     BIGINT NOT NULL,
    holder   TEXT NOT NULL
)

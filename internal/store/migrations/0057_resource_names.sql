-- A resource's name beside its usage periods, kept apart from the spec
-- (a rename changes no price), and in each charge it pays: the ledger
-- says what a charge was for.
ALTER TABLE metering_periods ADD COLUMN name TEXT NOT NULL DEFAULT ''
-- next
ALTER TABLE billing_ledger ADD COLUMN resource_name TEXT NOT NULL DEFAULT ''

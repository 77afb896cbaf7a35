-- The spec a prepaid term was bought for (internal/billing terms.go): the
-- term covers that spec's price, so a server resized during its term pays
-- the difference hourly. '' for terms from before: they cover the server
-- whole, as they did.
ALTER TABLE billing_terms ADD COLUMN spec TEXT NOT NULL DEFAULT ''

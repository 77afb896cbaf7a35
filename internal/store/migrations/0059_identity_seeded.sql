-- The accounts identity's bootstrap made once (the demo customer): one an
-- operator deleted is not made again at the next start.
CREATE TABLE identity_seeded (
    name TEXT PRIMARY KEY
)

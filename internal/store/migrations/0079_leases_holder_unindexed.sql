-- The leases table holds only work in flight (a server's step under way,
-- a running job), a few rows per controller even under load: the
-- statements by holder (renewal every TTL/3, the release at shutdown)
-- scan it for less than an index costs every lease taken and given back,
-- twice per server created.
DROP INDEX leases_holder

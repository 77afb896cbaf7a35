-- The controllers' role and database, made once on the primary after the
-- cluster first comes up (see docs/operator.md, "Running a region"):
--   psql "postgres://postgres:…@<primary>:5432/postgres" -v password="$NIMBUS_DB_PASSWORD" -f nimbus-db.sql
-- The controllers' migrations make the tables at their first start.
CREATE ROLE nimbus LOGIN PASSWORD :'password';
CREATE DATABASE nimbus OWNER nimbus;

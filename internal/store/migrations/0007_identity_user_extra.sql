-- Keystone keeps the attributes of a user it has no column for as "extra"
-- and returns them as top-level fields (keystone/identity/backends/sql_model.py).
ALTER TABLE users ADD COLUMN extra TEXT NOT NULL DEFAULT '{}'

-- What each project's live servers count against its quota (instances,
-- cores, RAM), kept by every write of a server row (compute server_store.go),
-- so that the quota check at create reads one row instead of summing every
-- server of the project.
CREATE TABLE compute_project_usage (
    project_id TEXT PRIMARY KEY,
    instances  INTEGER NOT NULL DEFAULT 0,
    cores      INTEGER NOT NULL DEFAULT 0,
    ram        INTEGER NOT NULL DEFAULT 0
)
-- next
INSERT INTO compute_project_usage (project_id, instances, cores, ram)
SELECT project_id, COUNT(*), COALESCE(SUM(vcpus), 0), COALESCE(SUM(memory_mb), 0)
FROM compute_servers WHERE deleted = 0 GROUP BY project_id

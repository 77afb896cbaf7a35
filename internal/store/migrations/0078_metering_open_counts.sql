-- How many open usage periods each project has of each kind and spec,
-- kept by internal/metering in the transaction that opens or ends a
-- period: billing's spending gate reads a project's few rows here on
-- every create instead of counting its open periods (0058's index still
-- grows with the project).
CREATE TABLE metering_open_counts (
    project_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    spec TEXT NOT NULL,
    open_count BIGINT NOT NULL,
    PRIMARY KEY (project_id, kind, spec)
)
-- next
INSERT INTO metering_open_counts (project_id, kind, spec, open_count)
 SELECT project_id, kind, spec, COUNT(*) FROM metering_periods WHERE ended_at = '' GROUP BY project_id, kind, spec
-- next
-- 0058's index of open periods by kind and spec served only the gate's
-- count, which reads the table above now; every period written paid it.
DROP INDEX metering_periods_project_open

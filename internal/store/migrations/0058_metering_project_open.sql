-- What a project's periods that touch the hour now running cost, read
-- from indexes alone: billing's spending gate asks on every create. Its
-- open periods by kind and spec, in the order a GROUP BY wants them ...
CREATE INDEX metering_periods_project_open ON metering_periods (project_id, kind, spec) WHERE ended_at = ''
-- next
-- ... and those that ended lately.
CREATE INDEX metering_periods_project_end ON metering_periods (project_id, ended_at)

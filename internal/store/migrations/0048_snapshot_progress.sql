-- A snapshot's progress as os-update_snapshot_status last set it ('' when
-- never: the view then derives it from the status).
ALTER TABLE volume_snapshots ADD COLUMN progress TEXT NOT NULL DEFAULT ''

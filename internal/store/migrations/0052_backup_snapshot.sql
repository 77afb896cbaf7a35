-- The snapshot a backup was made from (Cinder's backups.snapshot_id), ''
-- for a backup of the volume itself: its data is the snapshot's, its
-- data_timestamp the snapshot's created_at, and the snapshot is
-- backing-up, not the volume, while it is made.
ALTER TABLE volume_backups ADD COLUMN snapshot_id TEXT NOT NULL DEFAULT ''

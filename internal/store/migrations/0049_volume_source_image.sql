-- The image a volume's or snapshot's data came from (through clones and
-- snapshots), which decides the OS licence of an image uploaded from it.
-- Only the service writes it: the image metadata a volume shows is the
-- owner's to change (os-set_image_metadata). 0050 (Go) fills it in for
-- rows made before, from their image metadata, which no one but the
-- service could write then.
ALTER TABLE volumes ADD COLUMN source_image_id TEXT NOT NULL DEFAULT ''
-- next
ALTER TABLE volume_snapshots ADD COLUMN source_image_id TEXT NOT NULL DEFAULT ''

-- What a backup keeps of its volume besides the data, so that a restore
-- gives it back as Cinder does: the volume's metadata, image metadata and
-- bootable flag, and its service-written source image (0049), which the
-- licence of an image uploaded from a restored volume follows. Backups
-- made before take the source image and bootable flag of their volume if
-- it is still there.
ALTER TABLE volume_backups ADD COLUMN volume_metadata TEXT NOT NULL DEFAULT '{}'
-- next
ALTER TABLE volume_backups ADD COLUMN image_metadata TEXT NOT NULL DEFAULT '{}'
-- next
ALTER TABLE volume_backups ADD COLUMN bootable INTEGER NOT NULL DEFAULT 0
-- next
ALTER TABLE volume_backups ADD COLUMN source_image_id TEXT NOT NULL DEFAULT ''
-- next
UPDATE volume_backups SET
    source_image_id = COALESCE((SELECT v.source_image_id FROM volumes v WHERE v.id = volume_backups.volume_id), ''),
    bootable = COALESCE((SELECT v.bootable FROM volumes v WHERE v.id = volume_backups.volume_id), 0)

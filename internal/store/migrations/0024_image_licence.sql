-- The licence an image's data carries (Windows Server: the SPLA line on
-- every server booted from it). Only the image service writes it, from what
-- the operator published, the data's checksum, or the server a snapshot was
-- taken of; no image property a customer writes changes it.
ALTER TABLE images ADD COLUMN licence TEXT NOT NULL DEFAULT ''
-- next
CREATE INDEX images_hash ON images (os_hash_value)
-- next
UPDATE images SET licence = 'windows' WHERE visibility = 'public' AND properties LIKE '%"os_type":"windows"%'

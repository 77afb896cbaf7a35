-- Where an image's data is, as Glance's image_locations keep it: '' for
-- a file in the controller's images directory (every image stored before),
-- rbd://fsid/pool/image/snap for an RBD image in Ceph, which every
-- controller of a region reaches. Written by the image service alone.
ALTER TABLE images ADD COLUMN location TEXT NOT NULL DEFAULT ''

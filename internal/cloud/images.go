package cloud

import (
	"context"
	"io"

	"nimbus/internal/driver"
	"nimbus/internal/image"
)

// hostImages is what the agent API gives hosts of the image service.
// direct lets hosts read images in Ceph themselves: only in a cloud
// whose volumes are there too, whose hosts are given the Ceph client's
// key for them already.
type hostImages struct {
	s      *image.Service
	direct bool
}

func (h hostImages) Open(ctx context.Context, id string) (io.ReadCloser, int64, string, error) {
	rc, img, err := h.s.Open(ctx, id)
	if err != nil {
		return nil, 0, "", err
	}
	return rc, img.Size, img.DiskFormat, nil
}

func (h hostImages) Direct(ctx context.Context, id string) (*driver.ImageDirect, error) {
	if !h.direct {
		return nil, nil
	}
	return h.s.Direct(ctx, id)
}

func (h hostImages) SnapshotOf(ctx context.Context, id string) (string, error) {
	img, err := h.s.Get(ctx, "", true, id)
	if err != nil {
		return "", err
	}
	return img.Properties["instance_uuid"], nil
}

func (h hostImages) FinishSnapshot(ctx context.Context, id, diskFormat string, r io.Reader) error {
	return h.s.FinishSnapshot(ctx, id, diskFormat, r)
}

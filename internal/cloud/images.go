package cloud

import (
	"context"
	"io"

	"nimbus/internal/image"
)

// hostImages is what the agent API gives hosts of the image service.
type hostImages struct{ s *image.Service }

func (h hostImages) Open(ctx context.Context, id string) (io.ReadCloser, int64, string, error) {
	rc, img, err := h.s.Open(ctx, id)
	if err != nil {
		return nil, 0, "", err
	}
	return rc, img.Size, img.DiskFormat, nil
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

package volume

import "context"

// CopyFile copies the data file src to dst as the file backend copies
// volumes: dst appears whole or not at all (written beside it, flushed and
// renamed), as a reflink where the file system shares blocks, else as
// src's data extents with its holes left as holes, so a sparse 100 GB
// volume costs what it holds. nimbus admin backup copies data files with
// it.
func CopyFile(ctx context.Context, src, dst string) error { return copyFile(ctx, src, dst, 0) }

package volume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/store"
	"nimbus/internal/workqueue"
)

func (s *Service) dataPath(id string) string { return filepath.Join(s.dataDir, id) }

// Run resumes the data work a stopped controller left (volumes still
// creating, extending, deleting or uploading; snapshots and backups under
// way), then looks every scanPeriod for work a controller that died left
// (leases.go); when ctx ends it stops the work under way, which this or
// another controller resumes.
func (s *Service) Run(ctx context.Context) {
	s.scan(ctx, true)
	if err := s.resyncExports(ctx); err != nil && ctx.Err() == nil {
		s.log.Warn("volume: resyncing block exports failed", "error", err)
	}
	t := time.NewTicker(scanPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.Close()
			return
		case <-t.C:
			s.scan(ctx, false)
		}
	}
}

// The data work runs on a queue keyed by volume id (one worker per volume
// at a time, as compute's reconcile loop does per server). volumeWorkers
// bounds how many volumes are worked on at once; an outcome the store
// failed to record is retried after workRetry, doubled per failure in a
// row of the same volume up to workRetryMax.
const (
	volumeWorkers = 16
	workRetry     = 500 * time.Millisecond
	workRetryMax  = time.Minute
)

func (s *Service) startWorkers() {
	s.queue = workqueue.New(workqueue.Config{Backoff: workRetry, MaxBackoff: workRetryMax})
	s.queue.Work(volumeWorkers, func(key string) error {
		return s.owned(s.ctx, key, func(ctx context.Context) error { return s.process(ctx, key) })
	})
}

// Close stops the work under way and waits for it.
func (s *Service) Close() {
	s.stop()
	s.queue.Shutdown()
	s.backupQueue.Shutdown()
}

// kick runs the data work volume id's status asks for, in the background.
func (s *Service) kick(id string) { s.queue.Add(id) }

// process does what a volume's status asks: make its data (creating), grow
// it (extending) or remove it and the row (deleting) through the backend,
// then records the outcome in one transaction. It is idempotent; an error
// (the store failed) asks the queue to try again later.
func (s *Service) process(ctx context.Context, id string) error {
	if sid, ok := strings.CutPrefix(id, snapKey); ok {
		return s.processSnapshot(ctx, sid)
	}
	v, err := getVol(ctx, s.db, id)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) || ctx.Err() != nil {
			return nil
		}
		s.log.Warn("volume: reading volume failed", "volume", id, "error", err)
		return err
	}
	switch v.Status {
	case StatusCreating:
		werr := s.backend.makeVolume(ctx, v)
		if ctx.Err() != nil {
			return nil // stopped: the next start resumes it
		}
		return s.finish(ctx, v, werr, StatusCreating, func() { v.Status = StatusAvailable })
	case StatusExtending:
		return s.finishExtend(ctx, v, s.backend.extend(ctx, v.ID, v.NewSize)) // attach.go: in-use volumes stay in-use
	case StatusUploading:
		return s.finishUpload(ctx, v) // upload.go
	case StatusDeleting:
		err := s.removeSnapshotsOf(ctx, v.ID) // a cascade's
		if err == nil {
			err = s.backend.deleteVolume(ctx, v.ID)
		}
		if err != nil {
			s.log.Error("volume: removing data failed", "volume", v.ID, "error", err)
			return s.record(ctx, v, func(q store.Querier) error {
				_, err := s.setStatus(ctx, q, v, StatusErrorDeleting, err.Error(), StatusDeleting)
				return err
			})
		}
		return s.record(ctx, v, func(q store.Querier) error {
			_, err := q.Exec(ctx, "DELETE FROM volumes WHERE id = ? AND status = ?", v.ID, StatusDeleting)
			return err
		})
	}
	return nil
}

// finish records the end of a create or extend: available with the change
// applied, or the error status with the reason.
func (s *Service) finish(ctx context.Context, v *volRow, werr error, from string, apply func()) error {
	status, reason := StatusAvailable, ""
	if werr != nil {
		s.log.Error("volume: data work failed", "volume", v.ID, "status", from, "error", werr)
		status, reason = StatusError, werr.Error()
		if from == StatusExtending {
			status, v.NewSize = StatusErrorExtending, 0
		}
	} else {
		apply()
	}
	return s.record(ctx, v, func(q store.Querier) error {
		ok, err := s.setStatus(ctx, q, v, status, reason, from)
		if err != nil || !ok || werr == nil {
			return err
		}
		action := actionSchedule // creating (extends end in finishExtend)
		if v.ImageID != "" {
			action = actionFromImage
		}
		return s.addMessage(ctx, q, v.ProjectID, "", v.ID, action, detailUnknown)
	})
}

// record writes a step's outcome in one transaction; an error is returned
// for the queue to retry, unless the service is stopping.
func (s *Service) record(ctx context.Context, v *volRow, f func(q store.Querier) error) error {
	err := s.db.Tx(ctx, func(tx *store.Tx) error { return f(tx) })
	if err != nil && ctx.Err() == nil {
		s.log.Error("volume: recording status failed", "volume", v.ID, "error", err)
		return err
	}
	return nil
}

// makeData makes a volume's file: sparse of its size, or the image's data
// converted to raw and grown to the size. It writes a temporary file and
// renames it, so that a file at DataPath is always whole.
func (s *Service) makeData(ctx context.Context, v *volRow) error {
	path := s.dataPath(v.ID)
	if fi, err := os.Stat(path); err == nil && fi.Size() >= v.Size<<30 {
		return nil // made before a restart
	}
	if err := os.MkdirAll(s.dataDir, 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp-" + uuid.NewString()[:8]
	defer os.Remove(tmp)
	if src := s.sourcePath(v); src != "" {
		if err := copyFile(ctx, src, tmp, 0); err != nil {
			return err
		}
	} else if v.ImageID != "" {
		if err := s.copyImage(ctx, v, tmp); err != nil {
			return err
		}
	} else {
		f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return err
	}
	if err := s.growFile(tmp, v.Size); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// copyImage converts the image's data to a raw file at dst with qemu-img,
// reading it in the format its record names (never probing: a raw image
// that looks like qcow2 must not reach host files through a backing file).
func (s *Service) copyImage(ctx context.Context, v *volRow, dst string) error {
	bin, src, format, done, err := s.imageSource(ctx, v)
	if err != nil {
		return err
	}
	defer done()
	ctx, cancel := context.WithTimeout(ctx, convertTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "convert", "-f", format, "-O", "raw", "-t", "none", "-S", "4k", src, dst)
	out, err := cmd.CombinedOutput()
	if err != nil && strings.Contains(string(out), "cache mode") {
		// cache=none needs O_DIRECT, which some file systems (tmpfs) lack.
		cmd = exec.CommandContext(ctx, bin, "convert", "-f", format, "-O", "raw", "-S", "4k", src, dst)
		out, err = cmd.CombinedOutput()
	}
	if err != nil {
		return fmt.Errorf("copying image %s: %v: %s", v.ImageID, err, strings.TrimSpace(string(out)))
	}
	fi, err := os.Stat(dst)
	if err != nil {
		return err
	}
	if fi.Size() > v.Size<<30 {
		return fmt.Errorf("image %s is %d bytes, larger than the volume's %d GiB", v.ImageID, fi.Size(), v.Size)
	}
	return nil
}

// imageSource is a file holding volume v's image and its qemu-img
// format, once inspectImage has found it safe to convert and no larger
// than the volume; the qemu-img that inspected it; and what to call when
// done with the file (a copy, for an image whose data is not a file).
func (s *Service) imageSource(ctx context.Context, v *volRow) (bin, src, format string, done func(), err error) {
	if s.images == nil {
		return "", "", "", nil, errors.New("no image service")
	}
	// The format is the image record's, never the volume's image metadata,
	// which its owner may change (os-set_image_metadata).
	im, err := s.images.Get(ctx, v.ProjectID, true, v.ImageID)
	if err != nil {
		return "", "", "", nil, fmt.Errorf("image %s: %w", v.ImageID, err)
	}
	if format = qemuFormat(im.DiskFormat); format == "" {
		return "", "", "", nil, fmt.Errorf("image %s cannot be copied to a volume", v.ImageID)
	}
	if bin, err = s.qemuImgPath(); err != nil {
		return "", "", "", nil, fmt.Errorf("qemu-img: %w", err)
	}
	src, done, err = s.images.DataFile(ctx, v.ImageID, s.dataDir)
	if err != nil {
		return "", "", "", nil, fmt.Errorf("image %s cannot be copied to a volume: %w", v.ImageID, err)
	}
	vsize, err := inspectImage(ctx, bin, format, src)
	if err == nil && vsize > v.Size<<30 {
		err = fmt.Errorf("image %s is %d bytes, larger than the volume's %d GiB", v.ImageID, vsize, v.Size)
	} else if err != nil {
		err = fmt.Errorf("image %s cannot be copied to a volume: %w", v.ImageID, err)
	}
	if err != nil {
		done()
		return "", "", "", nil, err
	}
	return bin, src, format, done, nil
}

// inspectTimeout bounds reading an image's headers; convertTimeout a whole
// copy into a volume.
const (
	inspectTimeout = time.Minute
	convertTimeout = time.Hour
)

// inspectImage reads the headers of a customer's image, in the format its
// record names, before qemu-img converts it on this host: an image that
// names any other file (a qcow2 backing or data file, a VMDK extent) would
// have the controller copy that file, say its database, into the
// customer's volume. It returns the virtual size.
func inspectImage(ctx context.Context, bin, format, src string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, inspectTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "info", "--output=json", "-f", format, src).Output()
	if err != nil {
		return 0, fmt.Errorf("qemu-img info: %w", err)
	}
	var in struct {
		VirtualSize     int64  `json:"virtual-size"`
		BackingFilename string `json:"backing-filename"`
		FullBacking     string `json:"full-backing-filename"`
		FormatSpecific  struct {
			Data struct {
				DataFile string `json:"data-file"`
				Extents  []struct {
					Filename string `json:"filename"`
				} `json:"extents"`
			} `json:"data"`
		} `json:"format-specific"`
	}
	if err := json.Unmarshal(out, &in); err != nil {
		return 0, fmt.Errorf("qemu-img info: %w", err)
	}
	if in.BackingFilename != "" || in.FullBacking != "" {
		return 0, errors.New("it has a backing file")
	}
	if in.FormatSpecific.Data.DataFile != "" {
		return 0, errors.New("it has an external data file")
	}
	for _, e := range in.FormatSpecific.Data.Extents {
		if e.Filename != src {
			return 0, errors.New("it has an extent in another file")
		}
	}
	if in.VirtualSize < 0 {
		return 0, errors.New("it has no size")
	}
	return in.VirtualSize, nil
}

// qemuFormat is qemu-img's name for a Glance disk format, "" for those a
// volume cannot be made from.
func qemuFormat(diskFormat string) string {
	switch diskFormat {
	case "raw", "iso":
		return "raw"
	case "qcow2", "vmdk", "vdi", "vhdx":
		return diskFormat
	case "vhd":
		return "vpc"
	}
	return ""
}

// grow makes volume id's file sizeGB long, never shorter.
func (s *Service) grow(id string, sizeGB int64) error { return s.growFile(s.dataPath(id), sizeGB) }

func (s *Service) growFile(path string, sizeGB int64) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.Size() >= sizeGB<<30 {
		return nil
	}
	return os.Truncate(path, sizeGB<<30)
}

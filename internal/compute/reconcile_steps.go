package compute

import (
	"context"
	"errors"
	"slices"
	"time"

	"nimbus/internal/driver"
	"nimbus/internal/lease"
	"nimbus/internal/scheduler"
	"nimbus/internal/store"
	"nimbus/internal/volume"
)

// simpleStep runs one driver call and, on success, moves the server to vm
// with power p and no task.
func (s *Service) simpleStep(ctx context.Context, sv *server, started time.Time, event string, call func() error, vm string, p driver.PowerState) error {
	task := sv.TaskState
	if err := retry(ctx, call); err != nil {
		return s.fail(ctx, sv, task, event, started, err, false)
	}
	return s.commit(ctx, sv.ID, task, func(tx *store.Tx, cur *server) error {
		cur.VMState, cur.TaskState, cur.Power = vm, "", int(p)
		return s.finish(ctx, tx, cur, event, started, nil)
	})
}

// placed records claim c's host on a server being placed.
func placed(cur *server, c scheduler.Claim, zone string) {
	cur.Host, cur.AZ = c.Host, zone
	f := cur.Doc.Flavor
	cur.VCPUs, cur.MemoryMB, cur.DiskGB = f.VCPUs, f.RAM, f.diskGB()
}

// stepSchedule places a build that is still in scheduling: creates place
// at once, so only builds made by an older version arrive here.
func (s *Service) stepSchedule(ctx context.Context, sv *server, started time.Time) error {
	err := s.placeOne(ctx, sv, taskScheduling, func(tx *store.Tx, cur *server, c scheduler.Claim) error {
		zones, err := s.zonesOf(ctx, []scheduler.Claim{c})
		if err != nil {
			return err
		}
		placed(cur, c, zones[c.Host])
		cur.TaskState = taskSpawning
		return s.saveServer(ctx, tx, cur)
	})
	if errors.Is(err, errNoValidHost) {
		return s.fail(ctx, sv, taskScheduling, "conductor_schedule_and_build_instances", started, err, true)
	}
	return err
}

// stepSpawn boots a placed server (build, or unshelve of an offloaded one).
func (s *Service) stepSpawn(ctx context.Context, sv *server, started time.Time, event string) error {
	spec, err := s.spec(ctx, sv)
	if err != nil {
		return s.specFailed(ctx, sv, taskSpawning, event, started, err, sv.VMState == vmBuilding)
	}
	// The placement is committed: the host wires the ports while the
	// driver prepares the VM, which waits for them.
	s.networks.NetworkChanged()
	if err := retry(ctx, func() error { return s.driver.Spawn(ctx, spec) }); err != nil {
		if store.IsServiceFault(err) {
			// This controller's database, not the host: the step is tried
			// again after the server's backoff and finds its op by its
			// key. Destroying now would undo a spawn that went through.
			return err
		}
		if ctx.Err() == nil {
			_ = s.driver.Destroy(ctx, sv.ID)
		}
		return s.fail(ctx, sv, taskSpawning, event, started, err, sv.VMState == vmBuilding)
	}
	shelvedImage := ""
	err = s.commit(ctx, sv.ID, taskSpawning, func(tx *store.Tx, cur *server) error {
		if cur.VMState == vmBuilding {
			now := s.now()
			cur.LaunchedAt = &now
		}
		shelvedImage = cur.Doc.Shelved.ImageID
		cur.Doc.Shelved = shelveState{}
		cur.VMState, cur.TaskState, cur.Power = vmActive, "", int(driver.Running)
		cur.Doc.AdminPass, cur.Doc.RequestedHost = "", ""
		cur.Doc.Fault = nil
		return s.finish(ctx, tx, cur, event, started, nil)
	})
	if err == nil && shelvedImage != "" {
		// Nova deletes the shelved snapshot once the server is back.
		if derr := s.images.Delete(ctx, shelvedImage); derr != nil {
			s.log.Warn("reconcile: shelved image delete failed", "image", shelvedImage, "error", derr)
		}
	}
	return err
}

func (s *Service) stepDelete(ctx context.Context, sv *server, started time.Time) error {
	if s.volumesCreating(ctx, sv) {
		// A volume still being made for the server cannot be deleted yet:
		// the delete waits for it rather than leave it behind.
		return errWaitVolumes
	}
	if sv.Host != "" || sv.LaunchedAt != nil {
		// A server on a host that is down is deleted at once, as Nova's
		// local delete does; the VM is destroyed as an orphan when the
		// host's agent reports it again.
		if err := retry(ctx, func() error { return s.driver.Destroy(ctx, sv.ID) }); err != nil && !errors.Is(err, driver.ErrNotFound) && !errors.Is(err, driver.ErrHostDown) {
			return s.fail(ctx, sv, taskDeleting, "compute_terminate_instance", started, err, false)
		}
	}
	// The VM is gone: its volumes' connections end, and the attachments
	// go with the server (volume ops still owed are dropped with it).
	atts, err := s.disconnectVolumes(ctx, sv)
	if err != nil {
		return err
	}
	shelved := sv.Doc.Shelved.ImageID
	err = s.commit(ctx, sv.ID, taskDeleting, func(tx *store.Tx, cur *server) error {
		if err := s.removeVolumes(ctx, tx, atts); err != nil {
			return err
		}
		// Volumes made for the server that it never got attached.
		for _, bd := range cur.Doc.BlockDevices {
			if bd.DeleteOnTermination && bd.Source != "volume" && !slices.ContainsFunc(atts, func(a volume.Attachment) bool { return a.VolumeID == bd.VolumeID }) {
				if err := s.volumes.DeleteTerminated(ctx, tx, bd.VolumeID); err != nil && !errors.Is(err, store.ErrNotFound) {
					return err
				}
			}
		}
		cur.Doc.VolumeOps = nil
		if err := s.networks.ReleaseServer(ctx, tx, cur.ID); err != nil {
			return err
		}
		if err := s.releaseServer(ctx, tx, cur.ID); err != nil {
			return err
		}
		if err := s.removeGroupMember(ctx, tx, cur.ID); err != nil {
			return err
		}
		now := s.now()
		cur.VMState, cur.TaskState, cur.Power = vmDeleted, "", int(driver.NoState)
		cur.Deleted = true
		cur.TerminatedAt = &now
		if err := s.finish(ctx, tx, cur, "compute_terminate_instance", started, nil); err != nil {
			return err
		}
		// The configurator's flavor of the project's last server of its
		// size goes with it.
		return s.dropFlavorOf(ctx, tx, cur)
	})
	if err == nil && shelved != "" {
		_ = s.images.Delete(ctx, shelved)
	}
	return err
}

// snapshot copies a server's disk into image id: the driver uploads the
// data to the image service, which makes the image active.
func (s *Service) snapshot(ctx context.Context, sv *server, imageID string) error {
	_, err := s.driver.Snapshot(ctx, sv.ID, imageID)
	return err
}

func (s *Service) stepShelve(ctx context.Context, sv *server, started time.Time) error {
	// The shelved image is made in its own transaction; when the image
	// service cannot make one the server is shelved without it.
	imageID := sv.Doc.Shelved.ImageID
	// A server booted from a volume keeps its disk there: Nova uploads no
	// image and offloads it at once (shelve_offload of a volume-backed
	// instance).
	if imageID == "" && !sv.volumeBacked() {
		var base = s.imageBase(ctx, sv.ProjectID, sv.ImageRef)
		err := s.db.Tx(ctx, func(tx *store.Tx) error {
			if err := s.leases.Hold(ctx, tx, serverLease(sv.ID)); err != nil {
				return err
			}
			img, err := s.images.CreateShelveImage(ctx, tx, sv.ProjectID, sv.Name+"-shelved",
				map[string]string{"instance_uuid": sv.ID, "image_type": "snapshot", "base_image_ref": sv.ImageRef}, base, licenceOf(sv))
			if err != nil {
				return err
			}
			imageID = img.ID
			return nil
		})
		if errors.Is(err, lease.ErrLost) {
			return err
		}
		if err != nil {
			s.log.Warn("reconcile: shelve snapshot unavailable", "server", sv.ID, "error", err)
			imageID = ""
		} else if err := s.snapshot(ctx, sv, imageID); err != nil {
			s.log.Warn("reconcile: shelve snapshot failed", "server", sv.ID, "error", err)
			_ = s.images.Delete(ctx, imageID)
			imageID = ""
		}
	}
	if err := retry(ctx, func() error { return s.driver.PowerOff(ctx, sv.ID, true) }); err != nil {
		return s.fail(ctx, sv, taskShelving, "compute_shelve_instance", started, err, false)
	}
	return s.commit(ctx, sv.ID, taskShelving, func(tx *store.Tx, cur *server) error {
		cur.VMState, cur.TaskState, cur.Power = vmShelved, taskShelvingOffloading, int(driver.Shutdown)
		cur.Doc.Shelved = shelveState{ImageID: imageID, At: s.now(), Host: cur.Host}
		return s.saveServer(ctx, tx, cur)
	})
}

func (s *Service) stepOffload(ctx context.Context, sv *server, started time.Time) error {
	// A VM already gone (a retried step) is offloaded.
	if err := retry(ctx, func() error { return s.driver.Destroy(ctx, sv.ID) }); err != nil && !errors.Is(err, driver.ErrNotFound) {
		return s.fail(ctx, sv, taskShelvingOffloading, "compute_shelve_offload_instance", started, err, false)
	}
	// The volumes stay attached, with no host to connect them for until
	// unshelve's spawn.
	if _, err := s.disconnectVolumes(ctx, sv); err != nil {
		return err
	}
	err := s.commit(ctx, sv.ID, taskShelvingOffloading, func(tx *store.Tx, cur *server) error {
		cur.VMState, cur.TaskState, cur.Power = vmShelvedOffloaded, "", int(driver.Shutdown)
		cur.Host = ""
		if err := s.releaseServer(ctx, tx, cur.ID); err != nil {
			return err
		}
		return s.finish(ctx, tx, cur, "compute_shelve_offload_instance", started, nil)
	})
	if err == nil {
		s.networks.NetworkChanged() // its ports leave the host
	}
	return err
}

func (s *Service) stepUnshelve(ctx context.Context, sv *server, started time.Time) error {
	if sv.VMState == vmShelved {
		// Not offloaded yet: the VM is still on its host.
		return s.simpleStep(ctx, sv, started, "compute_unshelve_instance", func() error { return s.driver.PowerOn(ctx, sv.ID) }, vmActive, driver.Running)
	}
	err := s.placeOne(ctx, sv, taskUnshelving, func(tx *store.Tx, cur *server, c scheduler.Claim) error {
		zones, err := s.zonesOf(ctx, []scheduler.Claim{c})
		if err != nil {
			return err
		}
		placed(cur, c, zones[c.Host])
		cur.TaskState = taskSpawning
		cur.Doc.RequestedHost = ""
		return s.saveServer(ctx, tx, cur)
	})
	if errors.Is(err, errNoValidHost) {
		// Nova leaves the server shelved-offloaded when no host fits.
		return s.commit(ctx, sv.ID, taskUnshelving, func(tx *store.Tx, cur *server) error {
			cur.TaskState = ""
			return s.finish(ctx, tx, cur, "compute_unshelve_instance", started, err)
		})
	}
	return err
}

func (s *Service) stepResize(ctx context.Context, sv *server, started time.Time) error {
	spec, err := s.spec(ctx, sv)
	if err != nil {
		return s.specFailed(ctx, sv, taskResizeMigrating, "compute_resize_instance", started, err, false)
	}
	if err := retry(ctx, func() error { return s.driver.Resize(ctx, spec) }); err != nil {
		return s.fail(ctx, sv, taskResizeMigrating, "compute_resize_instance", started, err, false)
	}
	return s.commit(ctx, sv.ID, taskResizeMigrating, func(tx *store.Tx, cur *server) error {
		cur.TaskState = taskResizeFinish
		if p, err := s.driver.State(ctx, cur.ID); err == nil {
			cur.Power = int(p)
		}
		return s.saveServer(ctx, tx, cur)
	})
}

func (s *Service) stepRevert(ctx context.Context, sv *server, started time.Time) error {
	old := sv.Doc.Flavor
	if sv.Doc.OldFlavor != nil {
		old = *sv.Doc.OldFlavor
	}
	spec, err := s.spec(ctx, sv)
	if err != nil {
		return s.specFailed(ctx, sv, taskResizeReverting, "compute_revert_resize", started, err, false)
	}
	spec.VCPUs, spec.MemoryMB, spec.DiskGB = old.VCPUs, old.RAM, old.diskGB()
	spec.Revert = true // the driver brings back the disk it kept
	// The old flavor's pCPUs and GPUs are those kept under resize-source.
	if c, ok, err := loadClaim(ctx, s.db, resizeSourceKey(sv.ID)); err != nil {
		return err
	} else if ok {
		spec.Cells, spec.GPUs = nil, c.GPUs
		for _, cl := range c.Cells {
			spec.Cells = append(spec.Cells, driver.Cell{Node: cl.Node, CPUs: cl.CPUs, MemoryMB: cl.MemoryMB})
		}
	}
	if err := retry(ctx, func() error { return s.driver.Resize(ctx, spec) }); err != nil {
		return s.fail(ctx, sv, taskResizeReverting, "compute_revert_resize", started, err, false)
	}
	return s.commit(ctx, sv.ID, taskResizeReverting, func(tx *store.Tx, cur *server) error {
		// The old flavor's claim was kept through the resize: it is the
		// server's again, and the new one goes.
		if _, ok, err := loadClaim(ctx, tx, resizeSourceKey(cur.ID)); err != nil {
			return err
		} else if ok {
			if err := s.dropClaim(ctx, tx, cur.ID); err != nil {
				return err
			}
			if err := moveClaim(ctx, tx, resizeSourceKey(cur.ID), cur.ID); err != nil {
				return err
			}
		}
		cur.Doc.Flavor = old
		cur.Doc.OldFlavor = nil
		cur.FlavorID = old.ID
		cur.VCPUs, cur.MemoryMB, cur.DiskGB = old.VCPUs, old.RAM, old.diskGB()
		cur.VMState, cur.TaskState = vmActive, ""
		if cur.Doc.OldVMState == vmStopped {
			cur.VMState = vmStopped
		}
		cur.Doc.OldVMState = ""
		if p, err := s.driver.State(ctx, cur.ID); err == nil {
			cur.Power = int(p)
		}
		return s.finish(ctx, tx, cur, "compute_finish_revert_resize", started, nil)
	})
}

func (s *Service) stepRebuild(ctx context.Context, sv *server, started time.Time) error {
	if err := retry(ctx, func() error { return s.driver.Destroy(ctx, sv.ID) }); err != nil {
		return s.fail(ctx, sv, taskRebuilding, "compute_rebuild_instance", started, err, false)
	}
	return s.commit(ctx, sv.ID, taskRebuilding, func(tx *store.Tx, cur *server) error {
		cur.TaskState = taskRebuildSpawning
		return s.saveServer(ctx, tx, cur)
	})
}

func (s *Service) stepRebuildSpawn(ctx context.Context, sv *server, started time.Time) error {
	spec, err := s.spec(ctx, sv)
	if err != nil {
		return s.specFailed(ctx, sv, taskRebuildSpawning, "compute_rebuild_instance", started, err, false)
	}
	stopped := sv.Doc.OldVMState == vmStopped
	err = retry(ctx, func() error {
		if err := s.driver.Spawn(ctx, spec); err != nil {
			return err
		}
		if stopped {
			// A rebuilt stopped server stays stopped (nova rebuild_instance).
			return s.driver.PowerOff(ctx, sv.ID, false)
		}
		return nil
	})
	if err != nil {
		return s.fail(ctx, sv, taskRebuildSpawning, "compute_rebuild_instance", started, err, false)
	}
	return s.commit(ctx, sv.ID, taskRebuildSpawning, func(tx *store.Tx, cur *server) error {
		cur.VMState, cur.TaskState, cur.Power = vmActive, "", int(driver.Running)
		if stopped {
			cur.VMState, cur.Power = vmStopped, int(driver.Shutdown)
		}
		cur.Doc.OldVMState, cur.Doc.AdminPass, cur.Doc.Fault = "", "", nil
		return s.finish(ctx, tx, cur, "compute_rebuild_instance", started, nil)
	})
}

func (s *Service) stepSnapshot(ctx context.Context, sv *server, started time.Time, task string) error {
	event := "compute_snapshot_instance"
	if task == taskImageBackup {
		event = "compute_backup_instance"
	}
	imageID := sv.Doc.SnapshotID
	err := retry(ctx, func() error { return s.snapshot(ctx, sv, imageID) })
	if err != nil && ctx.Err() == nil {
		// A failed snapshot leaves the server as it was (nova
		// snapshot_instance reverts the task state); the image is removed.
		_ = s.images.Delete(ctx, imageID)
		return s.commit(ctx, sv.ID, task, func(tx *store.Tx, cur *server) error {
			cur.TaskState, cur.Doc.SnapshotID, cur.Doc.BackupRotation = "", "", 0
			return s.finish(ctx, tx, cur, event, started, err)
		})
	}
	if err != nil {
		return err
	}
	if task == taskImageBackup {
		s.rotateBackups(ctx, sv, imageID)
	}
	return s.commit(ctx, sv.ID, task, func(tx *store.Tx, cur *server) error {
		cur.TaskState, cur.Doc.SnapshotID, cur.Doc.BackupRotation = "", "", 0
		return s.finish(ctx, tx, cur, event, started, nil)
	})
}

// rotateBackups keeps the newest backups of the new backup's type, as many
// as its rotation says, the new one first; older ones are deleted.
func (s *Service) rotateBackups(ctx context.Context, sv *server, newest string) {
	img, err := s.images.Get(ctx, sv.ProjectID, true, newest)
	if err != nil {
		s.log.Warn("reconcile: backup to rotate not found", "image", newest, "error", err)
		return
	}
	keep := sv.Doc.BackupRotation
	all, err := s.images.Backups(ctx, sv.ProjectID, sv.ID, img.Properties["backup_type"])
	if err != nil {
		s.log.Warn("reconcile: listing backups failed", "server", sv.ID, "error", err)
		return
	}
	kept := 0
	if keep > 0 {
		kept = 1 // the new one
	}
	for _, b := range all {
		if b.ID == newest {
			if keep == 0 {
				_ = s.images.Delete(ctx, b.ID)
			}
			continue
		}
		if b.Protected {
			continue // Glance refuses to delete it: rotation leaves it be
		}
		if kept < keep {
			kept++
			continue
		}
		if err := s.images.Delete(ctx, b.ID); err != nil && err != store.ErrNotFound {
			s.log.Warn("reconcile: rotating a backup out failed", "image", b.ID, "error", err)
		}
	}
}

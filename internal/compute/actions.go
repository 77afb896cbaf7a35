package compute

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"nimbus/internal/image"
	"nimbus/internal/scheduler"

	"nimbus/internal/api"
	"nimbus/internal/driver"
	"nimbus/internal/store"
)

// simpleAction is an action that only moves a server to a task state for
// the reconcile loop: rule is the actionRules key, task the intent, record
// the instance action name.
type simpleAction struct {
	rule, task, record string
}

var simpleActions = map[string]simpleAction{
	"os-start":      {"start", taskPoweringOn, "start"},
	"os-stop":       {"stop", taskPoweringOff, "stop"},
	"pause":         {"pause", taskPausing, "pause"},
	"unpause":       {"unpause", taskUnpausing, "unpause"},
	"suspend":       {"suspend", taskSuspending, "suspend"},
	"resume":        {"resume", taskResuming, "resume"},
	"shelve":        {"shelve", taskShelving, "shelve"},
	"shelveOffload": {"shelve_offload", taskShelvingOffloading, "shelveOffload"},
	"revertResize":  {"revertResize", taskResizeReverting, "revertResize"},
}

// handleAction is POST /servers/{id}/action: a one-key body naming the action.
func (s *Service) handleAction(r *http.Request) (*api.Response, error) {
	var body map[string]json.RawMessage
	if err := api.DecodeJSON(r, &body); err != nil {
		return nil, err
	}
	if len(body) != 1 {
		return nil, api.BadRequest("Malformed request body")
	}
	var name string
	var arg json.RawMessage
	for k, v := range body {
		name, arg = k, v
	}
	if sa, ok := simpleActions[name]; ok {
		return s.intentAction(r, sa, func(*store.Tx, *server) error { return nil })
	}
	switch name {
	case "reboot":
		return s.actReboot(r, arg)
	case "unshelve":
		return s.actUnshelve(r, arg)
	case "resize":
		return s.actResize(r, arg)
	case "confirmResize":
		return s.actConfirmResize(r)
	case "rebuild":
		return s.actRebuild(r, arg)
	case "createImage":
		return s.actCreateImage(r, arg)
	case "createBackup":
		return s.actCreateBackup(r, arg)
	case "lock":
		return s.actLock(r, arg, true)
	case "unlock":
		return s.actLock(r, arg, false)
	case "os-getConsoleOutput":
		return s.actConsole(r, arg)
	case "os-getVNCConsole", "os-getSPICEConsole", "os-getRDPConsole", "os-getSerialConsole":
		return s.actGetConsole(r, name, arg)
	case "changePassword":
		return s.actChangePassword(r, arg)
	case "forceDelete":
		// Without soft delete (reclaim_instance_interval 0) force delete
		// is delete, answered 202 (nova deferred_delete.py).
		if _, err := s.handleDelete(r); err != nil {
			return nil, err
		}
		return api.Empty(http.StatusAccepted), nil
	case "restore":
		// Nothing is ever soft-deleted, so there is nothing to restore:
		// Nova's 409 for a server not in vm_state soft-delete.
		sv, err := s.visibleServer(r.Context(), s.db, r.PathValue("id"), false)
		if err != nil {
			return nil, err
		}
		return nil, api.Conflict("Cannot 'restore' instance %s while it is in vm_state %s", sv.ID, sv.VMState)
	}
	return nil, api.BadRequest("There is no such action: %s", name)
}

// intentAction runs one action's transaction: load the server, check the
// state table, apply mutate, set the task state, record the action and
// wake the reconcile loop.
func (s *Service) intentAction(r *http.Request, sa simpleAction, mutate func(tx *store.Tx, sv *server) error) (*api.Response, error) {
	_, err := s.intent(r, sa, mutate)
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

func (s *Service) intent(r *http.Request, sa simpleAction, mutate func(tx *store.Tx, sv *server) error) (*server, error) {
	ctx := r.Context()
	c := api.CallerFrom(ctx)
	var out *server
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		sv, err := s.visibleServer(ctx, tx, r.PathValue("id"), true)
		if err != nil {
			return err
		}
		if err := checkState(sv, sa.rule, c); err != nil {
			return err
		}
		if err := mutate(tx, sv); err != nil {
			return err
		}
		sv.TaskState = sa.task
		sv.Doc.RequestID = api.RequestID(ctx)
		sv.Doc.TaskID = newUUID()
		sv.Doc.Retries = 0
		if err := s.recordAction(ctx, tx, sv.ID, sa.record); err != nil {
			return err
		}
		if err := s.saveServer(ctx, tx, sv); err != nil {
			return err
		}
		out = sv
		return s.enqueueAfter(ctx, tx, sv.ID)
	})
	return out, err
}

// nullOrObject decodes an action argument that may be null or an object.
func nullOrObject(arg json.RawMessage, name string, allowed ...string) (map[string]json.RawMessage, error) {
	if len(arg) == 0 || string(arg) == "null" {
		return map[string]json.RawMessage{}, nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(arg, &obj); err != nil {
		return nil, badField(name, arg, fmt.Sprintf("%s is not of type 'object', 'null'", arg))
	}
	if obj == nil {
		obj = map[string]json.RawMessage{}
	}
	if err := api.UnknownFields(obj, allowed...); err != nil {
		return nil, err
	}
	return obj, nil
}

func (s *Service) actReboot(r *http.Request, arg json.RawMessage) (*api.Response, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(arg, &obj); err != nil || obj == nil {
		return nil, badField("reboot", arg, fmt.Sprintf("%s is not of type 'object'", arg))
	}
	if err := api.UnknownFields(obj, "type"); err != nil {
		return nil, err
	}
	t, err := strField(obj, "type")
	if err != nil {
		return nil, err
	}
	if t == nil {
		return nil, badField("reboot", arg, "'type' is a required property")
	}
	switch *t {
	case "SOFT", "soft":
		return s.intentAction(r, simpleAction{"reboot", taskRebooting, "reboot"}, func(*store.Tx, *server) error { return nil })
	case "HARD", "hard":
		return s.intentAction(r, simpleAction{"reboot_hard", taskRebootingHard, "reboot"}, func(tx *store.Tx, sv *server) error {
			sv.Doc.OldVMState = sv.VMState
			return nil
		})
	}
	return nil, api.BadRequest("Invalid input for field/attribute type. Value: %s. '%s' is not one of ['HARD', 'Hard', 'hard', 'SOFT', 'Soft', 'soft']", *t, *t)
}

func (s *Service) actUnshelve(r *http.Request, arg json.RawMessage) (*api.Response, error) {
	v := VersionFrom(r.Context())
	allowed := []string{}
	if v.AtLeast(77) {
		allowed = append(allowed, "availability_zone")
	}
	if v.AtLeast(91) {
		allowed = append(allowed, "host")
	}
	obj, err := nullOrObject(arg, "unshelve", allowed...)
	if err != nil {
		return nil, err
	}
	// From 2.91 availability_zone may be null: unpin the server.
	unpin := v.AtLeast(91) && string(obj["availability_zone"]) == "null"
	var az *string
	if !unpin {
		if az, err = strField(obj, "availability_zone"); err != nil {
			return nil, err
		}
	}
	host, err := strField(obj, "host")
	if err != nil {
		return nil, err
	}
	if host != nil && !api.CallerFrom(r.Context()).IsAdmin() {
		return nil, api.PolicyForbidden("os_compute_api:os-shelve:unshelve_to_host")
	}
	if az != nil || host != nil {
		hosts, err := s.enabledHosts(r.Context())
		if err != nil {
			return nil, err
		}
		zones, err := s.hostZones(r.Context())
		if err != nil {
			return nil, err
		}
		zoneOK, hostOK := az == nil, host == nil
		for _, h := range hosts {
			zoneOK = zoneOK || zoneIn(h, zones) == *az
			hostOK = hostOK || (h.Name == *host && (az == nil || zoneIn(h, zones) == *az))
		}
		if !zoneOK {
			return nil, api.BadRequest("The requested availability zone is not available")
		}
		if !hostOK {
			return nil, api.BadRequest("Compute host %s could not be found.", *host)
		}
	}
	// The server's project pays for it running again, whoever asks.
	pre, err := s.visibleServer(r.Context(), s.db, r.PathValue("id"), false)
	if err != nil {
		return nil, err
	}
	if err := s.checkUnshelve(r.Context(), pre); err != nil {
		return nil, err
	}
	return s.intentAction(r, simpleAction{"unshelve", taskUnshelving, "unshelve"}, func(tx *store.Tx, sv *server) error {
		if (az != nil || unpin || host != nil) && sv.VMState != vmShelvedOffloaded {
			return api.Conflict("The server status must be SHELVED_OFFLOADED to unshelve it to another availability zone or host.")
		}
		if az != nil {
			sv.AZ = *az
			sv.Doc.PinnedAZ = az
		}
		if unpin {
			sv.Doc.PinnedAZ = nil
		}
		if host != nil {
			sv.Doc.RequestedHost = *host
		}
		return nil
	})
}

// parseResize reads resize's argument: the flavor's ref (a string or a
// number) and the optional OS-DCF:diskConfig.
func parseResize(arg json.RawMessage) (ref string, dc *string, err error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(arg, &obj); err != nil || obj == nil {
		return "", nil, badField("resize", arg, fmt.Sprintf("%s is not of type 'object'", arg))
	}
	if err := api.UnknownFields(obj, "flavorRef", "OS-DCF:diskConfig"); err != nil {
		return "", nil, err
	}
	raw, ok := obj["flavorRef"]
	if !ok {
		return "", nil, badField("resize", arg, "'flavorRef' is a required property")
	}
	var fr any
	_ = json.Unmarshal(raw, &fr)
	switch f := fr.(type) {
	case string:
		ref = f
	case float64:
		ref = strconv.FormatFloat(f, 'f', -1, 64)
	default:
		return "", nil, badField("flavorRef", raw, fmt.Sprintf("%s is not of type 'string', 'integer'", raw))
	}
	if ref == "" {
		return "", nil, badField("flavorRef", raw, "'' is too short")
	}
	if dc, err = strField(obj, "OS-DCF:diskConfig"); err != nil {
		return "", nil, err
	}
	if dc != nil && *dc != "AUTO" && *dc != "MANUAL" {
		return "", nil, api.BadRequest("Invalid input for field/attribute OS-DCF:diskConfig. Value: %s. '%s' is not one of ['AUTO', 'MANUAL']", *dc, *dc)
	}
	return ref, dc, nil
}

// resizeDisk is Nova's rule on a resize's disk: a server's own root disk
// does not shrink, nor go to a flavor of none. A volume-backed server's
// root disk is its volume, which a resize keeps: the flavor's disk does
// not apply (compute/api.py resize). A network-disk flavor's root volume
// is the flavor's disk, which does not shrink either.
func resizeDisk(sv *server, old flavorSnap, nf *Flavor) error {
	ownVolume := sv.volumeBacked() && !sv.bootDevice().FlavorDisk
	if nf.Disk < old.Disk && nf.Disk != 0 && !ownVolume {
		return api.BadRequest("Resize to a disk smaller than the current one is not possible.")
	}
	if nf.Disk == 0 && old.Disk != 0 && !ownVolume {
		return api.BadRequest("Resize to zero disk flavor is not allowed.")
	}
	return nil
}

// resizeQuota checks, in tx under the project's quota lock, that the
// cores and RAM a resize from old to nf adds fit project's quota.
func (s *Service) resizeQuota(ctx context.Context, tx *store.Tx, project string, old flavorSnap, nf *Flavor) error {
	if err := lockProjectQuota(ctx, tx, project); err != nil {
		return err
	}
	quota, err := s.quotaFor(ctx, tx, project)
	if err != nil {
		return err
	}
	_, cores, ram, err := s.projectUsage(ctx, tx, project)
	if err != nil {
		return err
	}
	if dv := nf.VCPUs - old.VCPUs; dv > 0 && quota.Cores >= 0 && cores+dv > quota.Cores {
		return api.Forbidden("Quota exceeded for cores: Requested %d, but already used %d of %d cores", dv, cores, quota.Cores)
	}
	if dr := nf.RAM - old.RAM; dr > 0 && quota.RAM >= 0 && ram+dr > quota.RAM {
		return api.Forbidden("Quota exceeded for ram: Requested %d, but already used %d of %d ram", dr, ram, quota.RAM)
	}
	return nil
}

func (s *Service) actResize(r *http.Request, arg json.RawMessage) (*api.Response, error) {
	ctx := r.Context()
	c := api.CallerFrom(ctx)
	ref, dc, err := parseResize(arg)
	if err != nil {
		return nil, err
	}
	nf, err := s.getFlavor(ctx, s.db, ref)
	if err != nil {
		return nil, notFoundAs(err, api.BadRequest("Unable to locate requested flavor."))
	}
	if ok, err := s.flavorAccessible(ctx, s.db, nf, c.ProjectID); err != nil {
		return nil, err
	} else if !ok || nf.Disabled {
		return nil, api.BadRequest("Unable to locate requested flavor.")
	}
	pre, err := s.visibleServer(ctx, s.db, r.PathValue("id"), false)
	if err != nil {
		return nil, err
	}
	if err := s.checkResize(ctx, pre, nf); err != nil {
		return nil, err
	}
	st, err := s.schedState(ctx)
	if err != nil {
		return nil, err
	}
	// The new flavor is claimed on the server's host next to the old claim,
	// which stays under the resize-source key until confirm or revert (nova
	// keeps both allocations). The claim is reserved inside the
	// transaction, which may run more than once.
	var claimed *scheduler.Claim
	resp, err := s.intentAction(r, simpleAction{"resize", taskResizePrep, "resize"}, func(tx *store.Tx, sv *server) error {
		old := sv.Doc.Flavor
		if old.ID == nf.ID {
			return api.BadRequest("When resizing, instances must change flavor!")
		}
		if err := resizeDisk(sv, old, nf); err != nil {
			return err
		}
		if err := s.resizeQuota(ctx, tx, sv.ProjectID, old, nf); err != nil {
			return err
		}
		// The target must fit on the server's host next to what it holds
		// now (nova keeps both allocations until confirm or revert).
		snap := snapOf(nf)
		if claimed != nil {
			st.Release(*claimed)
			claimed = nil
		}
		req := serverRequest(snap, sv.volumeBacked())
		req.OnlyHosts = []string{sv.Host}
		c, err := st.Reserve(req)
		if err != nil {
			return api.BadRequest("%s", errNoValidHost)
		}
		claimed = &c
		if err := moveClaim(ctx, tx, sv.ID, resizeSourceKey(sv.ID)); err != nil {
			return err
		}
		if err := writeClaim(ctx, tx, sv.ID, c, s.now()); err != nil {
			if errors.Is(err, errClaimConflict) {
				// Another controller placed on this host since the
				// snapshot was taken: look again on the next try.
				go s.reloadSched(context.WithoutCancel(ctx))
				return api.Conflict("The host's resources changed while resizing; please try again.")
			}
			return err
		}
		sv.Doc.OldFlavor = &old
		sv.Doc.OldVMState = sv.VMState
		sv.Doc.Flavor = snap
		sv.FlavorID = nf.ID
		sv.VCPUs, sv.MemoryMB, sv.DiskGB = max(sv.VCPUs, snap.VCPUs), max(sv.MemoryMB, snap.RAM), max(sv.DiskGB, snap.diskGB())
		if dc != nil {
			sv.Doc.DiskConfig = *dc
		}
		return nil
	})
	if err != nil && claimed != nil {
		st.Release(*claimed)
	} else if claimed != nil {
		s.keepAll(st, []scheduler.Claim{*claimed})
	}
	return resp, err
}

// actConfirmResize frees the old flavor at once: Nova answers 204 and the
// server leaves VERIFY_RESIZE without driver work.
func (s *Service) actConfirmResize(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	c := api.CallerFrom(ctx)
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		sv, err := s.visibleServer(ctx, tx, r.PathValue("id"), true)
		if err != nil {
			return err
		}
		if err := checkState(sv, "confirmResize", c); err != nil {
			return err
		}
		sv.VMState = vmActive
		if sv.Doc.OldVMState == vmStopped {
			sv.VMState = vmStopped
		}
		sv.Doc.OldFlavor, sv.Doc.OldVMState = nil, ""
		f := sv.Doc.Flavor
		sv.VCPUs, sv.MemoryMB, sv.DiskGB = f.VCPUs, f.RAM, f.diskGB()
		if err := s.dropClaim(ctx, tx, resizeSourceKey(sv.ID)); err != nil {
			return err
		}
		if err := s.recordAction(ctx, tx, sv.ID, "confirmResize"); err != nil {
			return err
		}
		if err := s.finishAction(ctx, tx, sv.ID, api.RequestID(ctx), "compute_confirm_resize", sv.Host, s.now(), nil); err != nil {
			return err
		}
		return s.saveServer(ctx, tx, sv)
	})
	if err != nil {
		return nil, err
	}
	go s.dropKeptDisk(context.WithoutCancel(ctx), r.PathValue("id"))
	return api.Empty(http.StatusNoContent), nil
}

// dropKeptDisk asks the driver, after a confirm, to delete the disk the
// resize kept for a revert. It is best effort: a disk it leaves (the host
// was down) goes with the server's next resize or its delete.
func (s *Service) dropKeptDisk(ctx context.Context, id string) {
	ctx = driver.WithOpKey(ctx, id+"/confirmResize/"+api.RequestID(ctx))
	if err := s.driver.ConfirmResize(ctx, id); err != nil && !errors.Is(err, driver.ErrNotFound) {
		s.log.Warn("confirm resize: the kept disk stays until the next resize or delete", "server", id, "error", err)
	}
}

func (s *Service) actRebuild(r *http.Request, arg json.RawMessage) (*api.Response, error) {
	ctx := r.Context()
	c := api.CallerFrom(ctx)
	b, err := parseServerBody(opRebuild, VersionFrom(ctx), "rebuild", arg)
	if err != nil {
		return nil, err
	}
	var kp *Keypair
	if b.KeyName != "" {
		if kp, err = s.getKeypair(ctx, s.db, c.UserID, b.KeyName); err != nil {
			return nil, notFoundAs(err, api.BadRequest("Invalid key_name provided."))
		}
	}
	img, err := s.images.Get(ctx, c.ProjectID, c.IsAdmin(), b.ImageRef)
	if err != nil {
		return nil, notFoundAs(err, api.BadRequest("Image %s could not be found.", b.ImageRef))
	}
	if img.Status != "active" {
		return nil, api.BadRequest("Image %s is not active.", img.ID)
	}
	newPass := b.AdminPass
	if !b.has("adminPass") {
		newPass = randomString(12, passChars)
	}
	sv, err := s.intent(r, simpleAction{"rebuild", taskRebuilding, "rebuild"}, func(tx *store.Tx, sv *server) error {
		if sv.volumeBacked() {
			// compute/api.py rebuild before 2.93 (Nimbus does not reimage
			// a boot volume): the volume keeps its data, so only the image
			// it came from may be named.
			if img.ID != sv.ImageRef && img.ID != sv.Doc.BootImage {
				return api.BadRequest("Image %s is unacceptable: Unable to rebuild with a different image for a volume-backed server.", img.ID)
			}
		} else if err := imageFits(img, sv.Doc.Flavor.RAM, sv.Doc.Flavor.Disk); err != nil {
			return err
		}
		if !sv.volumeBacked() {
			sv.ImageRef = img.ID
		}
		sv.Doc.OSType = osTypeOf(img)
		sv.Doc.AdminPass = newPass
		sv.Doc.OldVMState = sv.VMState
		if b.has("metadata") {
			q, err := s.quotaFor(ctx, tx, sv.ProjectID)
			if err != nil {
				return err
			}
			if err := checkMetadataCount(q.MetadataItems, len(b.Metadata)); err != nil {
				return err
			}
		}
		rebuildFields(sv, b, kp)
		return nil
	})
	if err != nil {
		return nil, err
	}
	vc, err := s.newViewCtx(r, []*server{sv})
	if err != nil {
		return nil, err
	}
	view := vc.updateView(sv, true)
	view.set("adminPass", newPass)
	return api.JSON(http.StatusAccepted, map[string]any{"server": view}), nil
}

// rebuildFields sets on sv the fields a rebuild body carried; a null
// description, user_data or key_name clears it.
func rebuildFields(sv *server, b *serverBody, kp *Keypair) {
	if b.has("name") {
		sv.Name = b.Name
	}
	if b.has("metadata") {
		sv.Doc.Metadata = b.Metadata
	}
	if b.has("OS-DCF:diskConfig") {
		sv.Doc.DiskConfig = b.DiskConfig
	}
	if b.has("accessIPv4") {
		sv.Doc.AccessIPv4 = b.AccessIPv4
	}
	if b.has("accessIPv6") {
		sv.Doc.AccessIPv6 = canonicalIP(b.AccessIPv6)
	}
	if b.has("description") {
		sv.Doc.Description = b.Description
	}
	if b.has("user_data") {
		sv.Doc.UserData = b.UserData
	}
	if b.has("key_name") {
		sv.KeyName, sv.Doc.PublicKey = "", ""
		if kp != nil {
			sv.KeyName, sv.Doc.PublicKey = kp.Name, kp.PublicKey
		}
	}
	if b.has("hostname") {
		sv.Hostname = b.Hostname
	}
}

func (s *Service) actCreateImage(r *http.Request, arg json.RawMessage) (*api.Response, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(arg, &obj); err != nil || obj == nil {
		return nil, badField("createImage", arg, fmt.Sprintf("%s is not of type 'object'", arg))
	}
	if err := api.UnknownFields(obj, "name", "metadata"); err != nil {
		return nil, err
	}
	name, err := strField(obj, "name")
	if err != nil {
		return nil, err
	}
	if name == nil {
		return nil, badField("createImage", arg, "'name' is a required property")
	}
	if err := checkName("name", *name); err != nil {
		return nil, err
	}
	meta, err := metadataField(obj, "metadata")
	if err != nil {
		return nil, err
	}
	if sv, err := s.visibleServer(r.Context(), s.db, r.PathValue("id"), false); err == nil && sv.volumeBacked() && s.volumes != nil {
		return s.volumeBackedImage(r, *name, meta)
	}
	return s.imageAction(r, simpleAction{"createImage", taskImageSnapshot, "createImage"}, *name, meta,
		map[string]string{"image_type": "snapshot"}, 0)
}

// imageAction starts createImage or createBackup: an image of the server,
// queued in the transaction that sets the task, with Nova's properties
// plus extra and the caller's metadata. The answer names the image: in a
// Location header before 2.45, in the body from 2.45.
func (s *Service) imageAction(r *http.Request, sa simpleAction, name string, meta, extra map[string]string, rotation int) (*api.Response, error) {
	ctx := r.Context()
	c := api.CallerFrom(ctx)
	// The base image is read before the transaction (the image service
	// uses its own connection).
	pre, err := s.visibleServer(ctx, s.db, r.PathValue("id"), false)
	if err != nil {
		return nil, err
	}
	// A snapshot or backup is a new charge on the server's account.
	if err := s.checkSpend(ctx, pre.ProjectID); err != nil {
		return nil, err
	}
	base := s.imageBase(ctx, pre.ProjectID, pre.ImageRef)
	var imageID string
	_, err = s.intent(r, sa, func(tx *store.Tx, sv *server) error {
		// As Nova's _create_image: the customer's metadata may set
		// image_type, but the server the image is of (instance_uuid,
		// user_id, base_image_ref) and a backup's backup_type are
		// compute's.
		props := map[string]string{"image_type": extra["image_type"]}
		for k, v := range meta {
			props[k] = v
		}
		for k, v := range extra {
			if k != "image_type" {
				props[k] = v
			}
		}
		props["instance_uuid"], props["user_id"] = sv.ID, c.UserID
		if sv.ImageRef != "" {
			props["base_image_ref"] = sv.ImageRef
		}
		img, err := s.images.CreateSnapshot(ctx, tx, sv.ProjectID, name, props, base, licenceOf(sv))
		if err != nil {
			return err
		}
		imageID = img.ID
		sv.Doc.SnapshotID, sv.Doc.BackupRotation = img.ID, rotation
		return nil
	})
	if err != nil {
		return nil, err
	}
	if VersionFrom(ctx).AtLeast(45) {
		return api.JSON(http.StatusAccepted, map[string]any{"image_id": imageID}), nil
	}
	return api.Empty(http.StatusAccepted).WithHeader("Location", imageURL(r, imageID)), nil
}

// actCreateBackup is Nova's createBackup: a snapshot image of type backup;
// once it is stored, the server keeps only the newest `rotation` backups of
// that backup_type (nova compute manager _rotate_backups).
func (s *Service) actCreateBackup(r *http.Request, arg json.RawMessage) (*api.Response, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(arg, &obj); err != nil || obj == nil {
		return nil, badField("createBackup", arg, fmt.Sprintf("%s is not of type 'object'", arg))
	}
	if err := api.UnknownFields(obj, "name", "backup_type", "rotation", "metadata"); err != nil {
		return nil, err
	}
	for _, k := range []string{"name", "backup_type", "rotation"} {
		if _, ok := obj[k]; !ok {
			return nil, badField("createBackup", arg, fmt.Sprintf("'%s' is a required property", k))
		}
	}
	name, err := strField(obj, "name")
	if err != nil {
		return nil, err
	}
	if err := checkName("name", *name); err != nil {
		return nil, err
	}
	backupType, err := strField(obj, "backup_type")
	if err != nil {
		return nil, err
	}
	var rotation int
	if err := json.Unmarshal(obj["rotation"], &rotation); err != nil || rotation < 0 || strings.ContainsAny(string(obj["rotation"]), ".eE\"") {
		return nil, api.BadRequest("Invalid input for field/attribute rotation. Value: %s. %s is not a non-negative integer", obj["rotation"], obj["rotation"])
	}
	meta, err := metadataField(obj, "metadata")
	if err != nil {
		return nil, err
	}
	return s.imageAction(r, simpleAction{"createBackup", taskImageBackup, "createBackup"}, *name, meta,
		map[string]string{"image_type": "backup", "backup_type": *backupType}, rotation)
}

func (s *Service) actLock(r *http.Request, arg json.RawMessage, lock bool) (*api.Response, error) {
	ctx := r.Context()
	v := VersionFrom(ctx)
	c := api.CallerFrom(ctx)
	var reason *string
	if lock {
		allowed := []string{}
		if v.AtLeast(73) {
			allowed = append(allowed, "locked_reason")
		}
		obj, err := nullOrObject(arg, "lock", allowed...)
		if err != nil {
			return nil, err
		}
		if reason, err = strField(obj, "locked_reason"); err != nil {
			return nil, err
		}
		if reason != nil && len(*reason) > 255 {
			return nil, api.BadRequest("Invalid input for field/attribute locked_reason. Value: %s. '%s' is too long", *reason, *reason)
		}
	} else if _, err := nullOrObject(arg, "unlock"); err != nil {
		return nil, err
	}
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		sv, err := s.visibleServer(ctx, tx, r.PathValue("id"), true)
		if err != nil {
			return err
		}
		if !lock && sv.Locked && sv.Doc.LockedBy == "admin" && !c.IsAdmin() {
			return api.PolicyForbidden("os_compute_api:os-lock-server:unlock:unlock_override")
		}
		sv.Locked = lock
		sv.Doc.LockedReason = nil
		sv.Doc.LockedBy = ""
		action := "unlock"
		if lock {
			action = "lock"
			sv.Doc.LockedReason = reason
			sv.Doc.LockedBy = "owner"
			if c.IsAdmin() && c.ProjectID != sv.ProjectID {
				sv.Doc.LockedBy = "admin"
			}
		}
		if err := s.recordAction(ctx, tx, sv.ID, action); err != nil {
			return err
		}
		if err := s.finishAction(ctx, tx, sv.ID, api.RequestID(ctx), "api_"+action, "", s.now(), nil); err != nil {
			return err
		}
		return s.saveServer(ctx, tx, sv)
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

func (s *Service) actConsole(r *http.Request, arg json.RawMessage) (*api.Response, error) {
	ctx := r.Context()
	obj, err := nullOrObject(arg, "os-getConsoleOutput", "length")
	if err != nil {
		return nil, err
	}
	lines := -1
	if raw, ok := obj["length"]; ok && string(raw) != "null" {
		var x any
		_ = json.Unmarshal(raw, &x)
		switch t := x.(type) {
		case float64:
			lines = int(t)
			if float64(lines) != t {
				return nil, badField("length", raw, fmt.Sprintf("%s is not of type 'integer', 'string', 'null'", raw))
			}
		case string:
			n, err := strconv.Atoi(t)
			if err != nil {
				return nil, badField("length", raw, fmt.Sprintf("%s does not match '^-?[0-9]+$'", raw))
			}
			lines = n
		default:
			return nil, badField("length", raw, fmt.Sprintf("%s is not of type 'integer', 'string', 'null'", raw))
		}
		if lines < -1 {
			return nil, badField("length", raw, fmt.Sprintf("%d is less than the minimum of -1", lines))
		}
	}
	sv, err := s.visibleServer(ctx, s.db, r.PathValue("id"), false)
	if err != nil {
		return nil, err
	}
	if sv.Host == "" || sv.VMState == vmBuilding {
		return nil, api.Conflict("Instance %s is not ready", sv.ID)
	}
	out, err := s.driver.ConsoleOutput(ctx, sv.ID, 0)
	if err == driver.ErrNotFound {
		return nil, api.NotFound("Guest does not have a console available.")
	}
	if errors.Is(err, driver.ErrHostDown) {
		// nova.exception.ComputeServiceUnavailable's words.
		return nil, api.Conflict("Compute service of %s is unavailable at this time.", sv.Host)
	}
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"output": tailLog(out, lines)}), nil
}

func (s *Service) actChangePassword(r *http.Request, arg json.RawMessage) (*api.Response, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(arg, &obj); err != nil || obj == nil {
		return nil, badField("changePassword", arg, fmt.Sprintf("%s is not of type 'object'", arg))
	}
	if err := api.UnknownFields(obj, "adminPass"); err != nil {
		return nil, err
	}
	p, err := strField(obj, "adminPass")
	if err != nil {
		return nil, err
	}
	if p == nil {
		return nil, badField("changePassword", arg, "'adminPass' is a required property")
	}
	ctx := r.Context()
	c := api.CallerFrom(ctx)
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		sv, err := s.visibleServer(ctx, tx, r.PathValue("id"), true)
		if err != nil {
			return err
		}
		if err := checkState(sv, "changePassword", c); err != nil {
			return err
		}
		sv.Doc.AdminPass = *p
		if err := s.recordAction(ctx, tx, sv.ID, "changePassword"); err != nil {
			return err
		}
		if err := s.finishAction(ctx, tx, sv.ID, api.RequestID(ctx), "compute_set_admin_password", sv.Host, s.now(), nil); err != nil {
			return err
		}
		return s.saveServer(ctx, tx, sv)
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

// imageFits is Nova's _validate_flavor_image_nostatus, for create and
// rebuild alike: an image's min_ram, then size, virtual size and min_disk
// (Nova's order and messages) against a flavor's RAM (MiB) and root disk
// (GiB; 0 takes the image's).
// The virtual size is the qcow2 header's, which the image's owner writes:
// unchecked, a tiny image would give a root disk of any size.
func imageFits(img *image.Image, ramMB, diskGB int) error {
	if img.MinRAM > ramMB {
		return api.BadRequest("Flavor's memory is too small for requested image.")
	}
	if diskGB <= 0 {
		return nil
	}
	limit := int64(diskGB) << 30
	for _, size := range []int64{img.Size, img.VirtualSize} {
		if size > limit {
			return api.BadRequest("Flavor's disk is too small for requested image. Flavor disk is %d bytes, image is %d bytes.", limit, size)
		}
	}
	if minDisk := int64(img.MinDisk) << 30; minDisk > limit {
		return api.BadRequest("Flavor's disk is smaller than the minimum size specified in image metadata. "+
			"Flavor disk is %d bytes, minimum size is %d bytes.", limit, minDisk)
	}
	return nil
}

// osTypeOf is the OS a server booted from img runs: the licence its data
// carries, which no customer writes, else the image's os_type.
func osTypeOf(img *image.Image) string {
	if img.Licence != "" {
		return img.Licence
	}
	return img.Properties["os_type"]
}

// licenceOf is the licence an image of sv's disk carries.
func licenceOf(sv *server) string {
	if sv.Doc.OSType == image.LicenceWindows {
		return image.LicenceWindows
	}
	return ""
}

// imageBase is the image a server was built from, for the snapshot's
// formats and OS properties; nil when it is gone or no longer the
// server's project's to read.
func (s *Service) imageBase(ctx context.Context, project, id string) *image.Image {
	if id == "" {
		return nil
	}
	img, err := s.images.Get(ctx, project, false, id)
	if err != nil {
		return nil
	}
	return img
}

// imageURL is the Location of a createImage answer before 2.45
// (nova/api/openstack/compute/servers.py _action_create_image).
func imageURL(r *http.Request, id string) string {
	p := ""
	if pid := projectInURL(r.Context()); pid != "" {
		p = "/" + pid
	}
	return api.BaseURL(r) + "/v2.1" + p + "/images/" + id
}

func base64Decode(s string) ([]byte, error) { return base64.StdEncoding.DecodeString(s) }

// tailLog keeps the last length lines of a console log as nova's compute
// manager _tail_log does: split on newlines (a trailing newline makes an
// empty last line, which counts) and join the last length pieces.
func tailLog(log string, length int) string {
	if length < 0 {
		return log
	}
	lines := strings.Split(log, "\n")
	if length < len(lines) {
		lines = lines[len(lines)-length:]
	}
	return strings.Join(lines, "\n")
}

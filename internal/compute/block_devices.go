package compute

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/driver"
	"nimbus/internal/store"
	"nimbus/internal/volume"
)

// Boot from volume (Nova's block_device_mapping_v2 with destination_type
// volume) and the network disk. A create names volumes to make (from an
// image, a snapshot, or blank) or to use (an existing volume of the
// caller's); a flavor whose nimbus:disk_type is network gives a server
// booted from an image a root volume made from that image, of the
// flavor's disk size, deleted with the server.
//
// The create's transaction makes the new volumes (as the caller, in the
// caller's project and quota) and reserves the existing ones, and keeps
// the server's block devices in its document, which only compute writes.
// The build's first step waits until every new volume is available,
// attaches them all (compute attachments, the boot volume as /dev/vda),
// and the spawn gives the driver the boot volume first with Boot set and
// no local root disk.

// blockDevice is one volume of a server's block device mapping.
type blockDevice struct {
	VolumeID string `json:"volume_id"`
	// BootIndex is Nova's boot_index: 0 for the boot volume, -1 for none.
	BootIndex int `json:"boot_index"`
	// Source is the mapping's source_type: image, volume, snapshot or blank.
	Source string `json:"source"`
	// Device is the device name asked for ("" : the next free one).
	Device              string `json:"device,omitempty"`
	Tag                 string `json:"tag,omitempty"`
	DeleteOnTermination bool   `json:"delete_on_termination,omitempty"`
	// AttachmentID is the server's attachment of the volume, once made
	// (reserved), and Attached says the build completed it.
	AttachmentID string `json:"attachment_id,omitempty"`
	Attached     bool   `json:"attached,omitempty"`
	// FlavorDisk marks the root volume a network-disk flavor pays for.
	FlavorDisk bool `json:"flavor_disk,omitempty"`
}

// bootDevice is sv's boot volume, nil for a server booted from an image
// onto its host's disk.
func (sv *server) bootDevice() *blockDevice {
	for i := range sv.Doc.BlockDevices {
		if sv.Doc.BlockDevices[i].BootIndex == 0 {
			return &sv.Doc.BlockDevices[i]
		}
	}
	return nil
}

// volumeBacked reports whether sv boots from a volume.
func (sv *server) volumeBacked() bool { return sv.bootDevice() != nil }

// bdmReq is one validated entry of a create's block_device_mapping_v2.
type bdmReq struct {
	Source, Dest, UUID  string
	BootIndex           int // -1: none
	VolumeSize          int64
	DeleteOnTermination bool
	Device, Tag, Type   string
}

// Nova's block device mapping errors (nova/exception.py).
func errBootSequence() error {
	return api.BadRequest("Block Device Mapping is Invalid: Boot sequence for the instance and image/block device mapping combination is not valid.")
}

func errBDMFormat(details string) error {
	return api.BadRequest("Block Device Mapping is Invalid: %s", details)
}

var (
	bdmUUIDPattern   = regexp.MustCompile(`^[a-zA-Z0-9._-]*$`)
	bdmDevicePattern = regexp.MustCompile(`^[a-zA-Z0-9._/-]*$`)
	bdmIntPattern    = regexp.MustCompile(`^-?[0-9]+$`)
	bdmTagPattern    = regexp.MustCompile(`^[^,/]*$`)
)

// parseBDMv2 is the block_device_mapping_v2 schema (nova/api/openstack/
// compute/schemas/servers.py block_device_mapping_v2_new_item, tag from
// 2.42, volume_type from 2.67) and BlockDeviceDict.from_api.
func parseBDMv2(v Version, raw json.RawMessage) ([]bdmReq, error) {
	var items []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, badField("block_device_mapping_v2", raw, fmt.Sprintf("%s is not of type 'array'", raw))
	}
	allowed := []string{"source_type", "destination_type", "uuid", "image_id", "boot_index", "volume_size",
		"delete_on_termination", "device_name", "device_type", "disk_bus", "guest_format", "no_device",
		"volume_id", "snapshot_id", "connection_info"}
	if v.AtLeast(42) {
		allowed = append(allowed, "tag")
	}
	if v.AtLeast(67) {
		allowed = append(allowed, "volume_type")
	}
	var out []bdmReq
	for _, item := range items {
		if item == nil {
			return nil, badField("block_device_mapping_v2", raw, "None is not of type 'object'")
		}
		if err := api.UnknownFields(item, allowed...); err != nil {
			return nil, err
		}
		b, noDevice, err := parseBDMItem(item)
		if err != nil {
			return nil, err
		}
		if !noDevice {
			out = append(out, b)
		}
	}
	return out, nil
}

// parseBDMItem reads one mapping of block_device_mapping_v2 whose fields
// are known. noDevice is a mapping that removes a device the image names:
// nothing to make.
func parseBDMItem(item map[string]json.RawMessage) (b bdmReq, noDevice bool, err error) {
	b = bdmReq{BootIndex: -1}
	for _, f := range []struct {
		dst     *string
		name    string
		max     int
		pattern *regexp.Regexp
		enum    []string
	}{
		{&b.Source, "source_type", 255, nil, []string{"volume", "image", "snapshot", "blank"}},
		{&b.Dest, "destination_type", 255, nil, []string{"local", "volume"}},
		{&b.UUID, "uuid", 255, bdmUUIDPattern, nil},
		{&b.Device, "device_name", 255, bdmDevicePattern, nil},
		{&b.Type, "volume_type", 255, nil, nil},
		{&b.Tag, "tag", 60, bdmTagPattern, nil},
	} {
		if *f.dst, err = bdmString(item, f.name, f.max, f.pattern, f.enum...); err != nil {
			return b, false, err
		}
	}
	if _, ok := item["device_name"]; ok && b.Device == "" {
		return b, false, errBDMFormat("Device name empty or too long.")
	}
	if fv, ok := item["boot_index"]; ok && string(fv) != "null" {
		n, err := intOrString(fv)
		if err != nil {
			return b, false, api.BadRequest("Invalid input for field/attribute boot_index. Value: %s. %s is not valid under any of the given schemas", fv, fv)
		}
		b.BootIndex = max(n, -1)
	}
	if fv, ok := item["volume_size"]; ok && string(fv) != "null" {
		n, err := intOrString(fv)
		if err != nil || n < 0 {
			return b, false, api.BadRequest("Invalid input for field/attribute volume_size. Value: %s. %s is not valid under any of the given schemas", fv, fv)
		}
		b.VolumeSize = int64(n)
	}
	if fv, ok := item["delete_on_termination"]; ok {
		if b.DeleteOnTermination, err = rawBool("delete_on_termination", fv); err != nil {
			return b, false, err
		}
	}
	if nd, ok := item["no_device"]; ok && string(nd) != "null" && string(nd) != "false" {
		return b, true, nil
	}
	// block_device.py BlockDeviceDict.from_api
	if b.Source == "" {
		return b, false, errBDMFormat("Invalid source_type field.")
	}
	if b.Source != "blank" && b.UUID == "" {
		return b, false, errBDMFormat("Missing device UUID.")
	}
	if b.Dest == "" {
		b.Dest = "local"
		if b.Source == "volume" || b.Source == "snapshot" {
			b.Dest = "volume"
		}
	}
	if b.Dest == "local" && b.Type != "" {
		return b, false, api.BadRequest("Specifying a volume_type with destination_type=local is not supported.")
	}
	return b, false, nil
}

// bdmString reads a mapping's string field name: at most max long, one of
// enum when given, matching pattern when given; "" when absent or null.
func bdmString(item map[string]json.RawMessage, name string, max int, pattern *regexp.Regexp, enum ...string) (string, error) {
	fv, ok := item[name]
	if !ok || string(fv) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(fv, &s); err != nil {
		return "", badField(name, fv, fmt.Sprintf("%s is not of type 'string'", fv))
	}
	if len(enum) > 0 && !slices.Contains(enum, s) {
		return "", api.BadRequest("Invalid input for field/attribute %s. Value: %s. '%s' is not one of ['%s']", name, s, s, strings.Join(enum, "', '"))
	}
	if len(s) > max {
		return "", api.BadRequest("Invalid input for field/attribute %s. Value: %s. '%s' is too long", name, s, s)
	}
	if pattern != nil && !pattern.MatchString(s) {
		return "", api.BadRequest("Invalid input for field/attribute %s. Value: %s. '%s' does not match '%s'", name, s, s, pattern.String())
	}
	return s, nil
}

// intOrString is an integer given as a number or as a string of digits.
func intOrString(raw json.RawMessage) (int, error) {
	var n int
	if err := json.Unmarshal(raw, &n); err == nil {
		return n, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil || !bdmIntPattern.MatchString(s) {
		return 0, errors.New("not an integer")
	}
	return strconv.Atoi(s)
}

// checkLegacyBDM reads the legacy block_device_mapping (nova/api/
// openstack/compute/schemas/block_device_mapping_v1.py and
// block_device.py BlockDeviceDict.from_legacy): volumes and snapshots by
// id, mapped to volumes.
func checkLegacyBDM(b *serverBody, field string, raw json.RawMessage) error {
	var items []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return badField(field, raw, fmt.Sprintf("%s is not of type 'array'", raw))
	}
	for _, item := range items {
		if item == nil {
			return badField(field, raw, "None is not of type 'object'")
		}
		if err := api.UnknownFields(item, "virtual_name", "volume_id", "snapshot_id", "volume_size", "device_name",
			"delete_on_termination", "no_device", "connection_info"); err != nil {
			return err
		}
		if nd, ok := item["no_device"]; ok && string(nd) != "null" && string(nd) != "false" {
			continue
		}
		bd := bdmReq{BootIndex: -1, Dest: "volume"}
		for _, f := range []struct {
			name string
			dst  *string
		}{{"volume_id", &bd.UUID}, {"device_name", &bd.Device}} {
			if p, err := strField(item, f.name); err != nil {
				return err
			} else if p != nil {
				*f.dst = *p
			}
		}
		snap, err := strField(item, "snapshot_id")
		if err != nil {
			return err
		}
		switch {
		case snap != nil && *snap != "":
			bd.Source, bd.UUID = "snapshot", *snap
		case bd.UUID != "":
			bd.Source = "volume"
		default:
			if vn, _ := strField(item, "virtual_name"); vn != nil && *vn != "" {
				return errBDMFormat("Ephemeral and swap disks are given by the flavor on this cloud.")
			}
			return errBDMFormat("Unrecognized legacy format.")
		}
		if !uuidRE.MatchString(bd.UUID) {
			return api.BadRequest("Invalid input for field/attribute %s_id. Value: %s. '%s' is not a 'uuid'", bd.Source, bd.UUID, bd.UUID)
		}
		if fv, ok := item["volume_size"]; ok && string(fv) != "null" {
			n, err := intOrString(fv)
			if err != nil || n < 1 {
				return api.BadRequest("Invalid input for field/attribute volume_size. Value: %s. %s is not valid under any of the given schemas", fv, fv)
			}
			bd.VolumeSize = int64(n)
		}
		if fv, ok := item["delete_on_termination"]; ok {
			if bd.DeleteOnTermination, err = rawBool("delete_on_termination", fv); err != nil {
				return err
			}
		}
		b.BDMs = append(b.BDMs, bd)
	}
	b.LegacyBDM = true
	return nil
}

// checkBootSequence is compute/api.py _validate_bdm's boot order and
// _check_and_transform_bdm's: boot indexes count 0, 1, … without gaps,
// and a server has something to boot. An image mapped to the local disk
// as boot index 0 is the imageRef; other local mappings are refused.
func checkBootSequence(req *createReq) error {
	if req.LegacyBDM && req.ImageRef == "" && len(req.BDMs) > 0 {
		// block_device.py from_legacy_mapping: without an image the
		// first mapping boots.
		req.BDMs[0].BootIndex = 0
	}
	var idx []int
	for _, b := range req.BDMs {
		if b.BootIndex >= 0 {
			idx = append(idx, b.BootIndex)
		}
		if b.Dest == "local" {
			switch {
			case b.Source == "image" && b.BootIndex == 0:
				req.ImageRef = b.UUID
			case b.Source == "image":
				return errBDMFormat("Mapping image to local is not supported.")
			case b.Source == "blank":
				return errBDMFormat("Ephemeral and swap disks are given by the flavor on this cloud.")
			default:
				return errBDMFormat("Mapping a volume to the local disk is not supported.")
			}
		}
		if b.Dest == "volume" && b.Source == "blank" && b.VolumeSize == 0 {
			return api.BadRequest("Blank volumes (source: 'blank', dest: 'volume') need to have non-zero size")
		}
		if b.Dest == "volume" && b.Source == "blank" && b.BootIndex == 0 {
			return errBootSequence()
		}
	}
	sort.Ints(idx)
	for i, n := range idx {
		if n != i {
			return errBootSequence()
		}
	}
	if req.ImageRef == "" && len(idx) == 0 {
		return errBootSequence()
	}
	if req.MaxCount > 1 && slices.ContainsFunc(req.BDMs, func(b bdmReq) bool { return b.Source == "volume" }) {
		return api.BadRequest("Cannot attach one or more volumes to multiple instances")
	}
	return nil
}

// bootVolumeReq is the create's boot volume mapping, nil when it boots an
// image onto the host's disk.
func (req *createReq) bootVolumeReq() *bdmReq {
	for i := range req.BDMs {
		if req.BDMs[i].BootIndex == 0 && req.BDMs[i].Dest == "volume" {
			return &req.BDMs[i]
		}
	}
	return nil
}

// volumeBDMs are the create's mappings to volumes.
// newVolumesGB is what the volumes a create makes for each server (from an
// image, a snapshot or blank) are asked to hold; a size left to the
// source counts nothing here.
func (req *createReq) newVolumesGB() int64 {
	var gb int64
	for _, b := range req.volumeBDMs() {
		if b.Source != "volume" {
			gb += b.VolumeSize
		}
	}
	return gb
}

func (req *createReq) volumeBDMs() []bdmReq {
	var out []bdmReq
	for _, b := range req.BDMs {
		if b.Dest == "volume" {
			out = append(out, b)
		}
	}
	return out
}

// checkBDMSources looks up, as the caller, what the create's volume
// mappings name (compute/api.py _validate_bdm): a volume must be theirs
// and available, a snapshot theirs and available, an image one they may
// see and active. It answers the image the boot volume's data comes from,
// nil when none is known.
func (s *Service) checkBDMSources(ctx context.Context, c *api.Caller, req *createReq) (bootImage string, err error) {
	if s.volumes == nil {
		for _, b := range req.volumeBDMs() {
			return "", errBDMFormat(fmt.Sprintf("failed to get volume %s.", b.UUID))
		}
		return "", nil
	}
	for _, b := range req.volumeBDMs() {
		imageID := ""
		switch b.Source {
		case "volume":
			v, err := s.volumes.VolumeForServer(ctx, s.db, c, b.UUID)
			if err != nil {
				return "", notFoundAsAPI(err, errBDMFormat(fmt.Sprintf("failed to get volume %s.", b.UUID)))
			}
			if v.Status != volume.StatusAvailable {
				return "", api.BadRequest("Invalid volume: volume '%s' status must be 'available'. Currently in '%s'", v.ID, v.Status)
			}
			imageID = v.ImageID
		case "snapshot":
			size, img, err := s.volumes.SnapshotForServer(ctx, s.db, c, b.UUID)
			if err != nil {
				return "", notFoundAsAPI(err, errBDMFormat(fmt.Sprintf("failed to get snapshot %s.", b.UUID)))
			}
			if b.VolumeSize > 0 && b.VolumeSize < size {
				return "", api.BadRequest("Volume size '%d'GB cannot be smaller than the snapshot size %dGB. They must be >= original snapshot size.", b.VolumeSize, size)
			}
			imageID = img
		case "image":
			img, err := s.images.Get(ctx, c.ProjectID, c.IsAdmin(), b.UUID)
			if err != nil {
				return "", notFoundAsAPI(err, errBDMFormat(fmt.Sprintf("failed to get image %s.", b.UUID)))
			}
			if img.Status != "active" {
				return "", api.BadRequest("Image %s is not active.", img.ID)
			}
			if b.VolumeSize > 0 && int64(img.MinDisk) > b.VolumeSize {
				return "", api.BadRequest("Volume is smaller than the minimum size specified in image metadata. "+
					"Volume size is %d bytes, minimum size is %d bytes.", b.VolumeSize<<30, int64(img.MinDisk)<<30)
			}
			imageID = img.ID
		}
		if b.BootIndex == 0 {
			bootImage = imageID
		}
	}
	return bootImage, nil
}

// notFoundAsAPI is err, or instead when err says what was looked for does
// not exist (a 404 of another service, or the store's).
func notFoundAsAPI(err error, instead error) error {
	var ae *api.Error
	if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
		return instead
	}
	return notFoundAs(err, instead)
}

// makeBlockDevices makes, in a create's transaction, the volumes of one
// new placed server and reserves the existing ones, as the caller, and
// records them in the server's document.
func (s *Service) makeBlockDevices(ctx context.Context, tx *store.Tx, p *createPlan, sv *server) error {
	c := p.caller
	var bds []blockDevice
	for _, b := range p.volumeBDMs {
		bd := blockDevice{BootIndex: b.BootIndex, Source: b.Source, Device: b.Device, Tag: b.Tag,
			DeleteOnTermination: b.DeleteOnTermination}
		if b.Source == "volume" {
			req := volume.ReserveRequest{ProjectID: c.ProjectID, Admin: c.IsAdmin(), VolumeID: b.UUID, ServerID: sv.ID,
				Tag: b.Tag, DeleteOnTermination: b.DeleteOnTermination}
			if b.BootIndex != 0 {
				req.Device = b.Device
			}
			att, err := s.volumes.Reserve(ctx, tx, req)
			if err != nil {
				return notFoundAsAPI(err, errBDMFormat(fmt.Sprintf("failed to get volume %s.", b.UUID)))
			}
			if b.BootIndex == 0 {
				if err := s.volumes.SetDevice(ctx, tx, att.ID, rootDevice); err != nil {
					return err
				}
			}
			bd.VolumeID, bd.AttachmentID = b.UUID, att.ID
		} else {
			req := volume.ServerVolumeRequest{Caller: c, SizeGB: b.VolumeSize, Type: b.Type}
			switch b.Source {
			case "image":
				req.ImageID = b.UUID
			case "snapshot":
				req.SnapshotID = b.UUID
			}
			id, err := s.volumes.CreateForServer(ctx, tx, req)
			if err != nil {
				return volumeQuotaAsNova(err)
			}
			bd.VolumeID = id
		}
		bds = append(bds, bd)
	}
	if p.networkDisk {
		// The flavor's disk is this volume: its price is the server's.
		req := volume.ServerVolumeRequest{Caller: c, SizeGB: int64(p.flavor.Disk), ImageID: p.req.ImageRef,
			FlavorDisk: true, FlavorDiskGB: int64(p.flavor.Disk)}
		id, err := s.volumes.CreateForServer(ctx, tx, req)
		if err != nil {
			return volumeQuotaAsNova(err)
		}
		bds = append(bds, blockDevice{VolumeID: id, BootIndex: 0, Source: "image", DeleteOnTermination: true, FlavorDisk: true})
	}
	sv.Doc.BlockDevices = bds
	return nil
}

// rootDevice is the boot volume's device name (Nova's root_device_name
// for virtio disks).
const rootDevice = "/dev/vda"

// volumeQuotaAsNova is a volume create's refusal as Nova answers it: the
// block storage quota is Nova's 403 VolumeLimitExceeded. A volume type or source not found is a 400 (the API-WG rule Nova
// follows for what a body names: VolumeTypeNotFound is a 400).
func volumeQuotaAsNova(err error) error {
	var ae *api.Error
	if errors.As(err, &ae) && ae.Status == http.StatusRequestEntityTooLarge {
		return api.Forbidden("Volume resource quota exceeded: %s", ae.Message)
	}
	if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
		return api.BadRequest("%s", ae.Message)
	}
	return err
}

// errWaitVolumes stops a build (or a delete) whose new volumes are still
// being made: the server is tried again through the queue's backoff.
var errWaitVolumes = errors.New("volumes not ready")

// needsAttach reports whether sv has block devices not attached yet.
func (sv *server) needsAttach() bool {
	return slices.ContainsFunc(sv.Doc.BlockDevices, func(b blockDevice) bool { return !b.Attached })
}

// stepBlockDevices attaches a build's volumes once every new one is
// available (nova/compute/manager.py _prep_block_device and
// _await_block_device_map_created), with the rights of the server's
// owner: a volume that failed, or that someone took meanwhile, fails the
// build.
func (s *Service) stepBlockDevices(ctx context.Context, sv *server, started time.Time) error {
	owner := &api.Caller{ProjectID: sv.ProjectID, UserID: sv.UserID}
	event := "compute_build_and_run_instance"
	buildFailed := func(format string, args ...any) error {
		cause := fmt.Errorf("Build of instance %s aborted: "+format, append([]any{sv.ID}, args...)...)
		return s.fail(ctx, sv, taskSpawning, event, started, cause, true)
	}
	if s.volumes == nil {
		return buildFailed("no block storage")
	}
	for _, bd := range sv.Doc.BlockDevices {
		if bd.AttachmentID != "" {
			continue
		}
		v, err := s.volumes.VolumeForServer(ctx, s.db, owner, bd.VolumeID)
		if err != nil {
			var ae *api.Error
			if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
				return buildFailed("Volume %s could not be found.", bd.VolumeID)
			}
			return err
		}
		switch v.Status {
		case volume.StatusCreating:
			return errWaitVolumes
		case volume.StatusAvailable:
		default:
			// exception.VolumeNotCreated
			return buildFailed("Volume %s did not finish being created even after we waited 0 seconds or 1 attempts. And its status is %s.", v.ID, v.Status)
		}
	}
	var refused error
	err := s.commit(ctx, sv.ID, taskSpawning, func(tx *store.Tx, cur *server) error {
		refused = nil
		for i := range cur.Doc.BlockDevices {
			bd := &cur.Doc.BlockDevices[i]
			if bd.AttachmentID == "" {
				req := volume.ReserveRequest{ProjectID: owner.ProjectID, VolumeID: bd.VolumeID, ServerID: cur.ID,
					Tag: bd.Tag, DeleteOnTermination: bd.DeleteOnTermination}
				if bd.BootIndex != 0 {
					req.Device = bd.Device
				}
				att, err := s.volumes.Reserve(ctx, tx, req)
				var ae *api.Error
				if errors.As(err, &ae) {
					refused = err
					return nil
				}
				if err != nil {
					return err
				}
				if bd.BootIndex == 0 {
					if err := s.volumes.SetDevice(ctx, tx, att.ID, rootDevice); err != nil {
						return err
					}
				}
				bd.AttachmentID = att.ID
			}
		}
		for i := range cur.Doc.BlockDevices {
			// Not yet connected: the spawn connects them for the host.
			bd := &cur.Doc.BlockDevices[i]
			if err := s.volumes.Complete(ctx, tx, bd.AttachmentID); err != nil {
				return err
			}
			bd.Attached = true
		}
		return s.saveServer(ctx, tx, cur)
	})
	if err == nil && refused != nil {
		return buildFailed("%v", refused)
	}
	return err
}

// bootSpec puts sv's boot volume first in sp's volumes, marked Boot, and
// leaves sp without a local root disk: a driver boots the volume and
// fetches no image (sp.Image only describes the guest).
func bootSpec(sv *server, sp *driver.Spec) error {
	bd := sv.bootDevice()
	if bd == nil {
		return nil
	}
	k := slices.IndexFunc(sp.Volumes, func(v driver.Volume) bool { return v.ID == bd.VolumeID })
	if k < 0 {
		return fmt.Errorf("%w: the boot volume %s is not attached", errImageUnusable, bd.VolumeID)
	}
	boot := sp.Volumes[k]
	boot.Boot, boot.Device = true, rootDevice
	rest := slices.Delete(slices.Clone(sp.Volumes), k, k+1)
	sp.Volumes = append([]driver.Volume{boot}, rest...)
	f := sv.Doc.Flavor
	sp.DiskGB = f.Ephemeral + (f.Swap+1023)/1024
	return nil
}

// meteredDiskGB is the disk a server is billed for with its flavor: a
// server booted from a volume it asked for is billed for the volume
// instead (by block storage), and keeps only its ephemeral and swap
// disks; a network-disk flavor's root volume is the flavor's disk.
func meteredDiskGB(sv *server) int {
	bd := sv.bootDevice()
	return meteredDisk(sv.Doc.Flavor, bd != nil && !bd.FlavorDisk)
}

// meteredDisk is meteredDiskGB for a server of flavor f that boots, or
// not, from a volume it asked for.
func meteredDisk(f flavorSnap, ownBootVolume bool) int {
	if ownBootVolume {
		return f.Ephemeral + (f.Swap+1023)/1024
	}
	return f.diskGB()
}

// volumesCreating reports whether a volume made for sv, to be deleted with
// it and not attached yet, is still being made.
func (s *Service) volumesCreating(ctx context.Context, sv *server) bool {
	if s.volumes == nil {
		return false
	}
	owner := &api.Caller{ProjectID: sv.ProjectID, UserID: sv.UserID}
	for _, bd := range sv.Doc.BlockDevices {
		if bd.AttachmentID != "" || bd.Source == "volume" || !bd.DeleteOnTermination {
			continue
		}
		if v, err := s.volumes.VolumeForServer(ctx, s.db, owner, bd.VolumeID); err == nil && v.Status == volume.StatusCreating {
			return true
		}
	}
	return false
}

package doctor

import (
	"context"
	"fmt"
)

// What a deleted server leaves bound: compute's delete releases, in the
// transaction that deletes the server (network ReleaseServer, volume
// Remove), the ports it bound (ports.bound_by 'compute', bound_device the
// server), the public addresses its flavor gave it (floatingips.server_id)
// and the volumes compute attached (volume_attachments origin 'compute').
// Attachments made through Cinder's API are the caller's records, as in
// Cinder, and are not checked.

// deadBinding is one row bound to a server that is not live.
type deadBinding struct {
	id, server, project, extra string
	flag                       bool
}

// eachDeadBinding pages through query (its first argument the key to
// start after, its last the page size; columns: key, server id, project,
// extra text, a flag) and calls f for each row whose server is deleted or
// missing, with why.
func (r *run) eachDeadBinding(ctx context.Context, query string, f func(b deadBinding, why string)) error {
	for after := ""; ; {
		rows, err := r.q.Query(ctx, query, after, r.cfg.PageSize)
		if err != nil {
			return err
		}
		var page []deadBinding
		var ids []string
		for rows.Next() {
			var b deadBinding
			if err := rows.Scan(&b.id, &b.server, &b.project, &b.extra, &b.flag); err != nil {
				rows.Close()
				return err
			}
			page = append(page, b)
			ids = append(ids, b.server)
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(page) == 0 {
			return err
		}
		after = page[len(page)-1].id
		servers, err := r.servers(ctx, ids)
		if err != nil {
			return err
		}
		for _, b := range page {
			s, ok := servers[b.server]
			if why := gone(b.server, s, ok); why != "" {
				f(b, why)
			}
		}
	}
}

// portsOfDeletedServers: a port still bound to a deleted server keeps its
// addresses and holds its security groups (deleting one meets
// SecurityGroupInUse).
func portsOfDeletedServers(ctx context.Context, r *run) error {
	return r.eachDeadBinding(ctx, `SELECT id, bound_device, project_id, network_id, server_owned = 1 FROM ports
 WHERE id > ? AND bound_by = 'compute' ORDER BY id LIMIT ?`, func(b deadBinding, why string) {
		repair := "delete it, as compute's delete does with a port it made: openstack port delete " + b.id
		if !b.flag {
			repair = "the customer brought this port: unbind it as compute's delete does, keeping it: " +
				fmt.Sprintf("UPDATE ports SET device_id = '', device_owner = '', bound_by = '', bound_device = '', status = 'DOWN', "+
					"revision_number = revision_number + 1 WHERE id = %s; UPDATE floatingips SET port_id = NULL, fixed_ip_address = NULL WHERE port_id = %s;",
					sqlString(b.id), sqlString(b.id))
		}
		r.emit("port "+b.id+" of project "+b.project,
			fmt.Sprintf("bound to a server, but %s: it keeps its addresses on network %s and holds its security groups", why, b.extra), repair)
	})
}

// addressesOfDeletedServers: a public address a server's flavor gave it
// stays allocated, and billed, after the server is gone.
func addressesOfDeletedServers(ctx context.Context, r *run) error {
	return r.eachDeadBinding(ctx, `SELECT id, server_id, project_id, floating_ip_address, port_id IS NULL FROM floatingips
 WHERE id > ? AND server_id IS NOT NULL ORDER BY id LIMIT ?`, func(b deadBinding, why string) {
		r.emit("floating IP "+b.id+" ("+b.extra+") of project "+b.project,
			"it came with a server's flavor, but "+why+": the address stays allocated to the project",
			"release it, as compute's delete does: openstack floating ip delete "+b.id)
	})
}

// volumesOfDeletedServers: a volume compute attached stays in-use, and
// cannot be deleted or attached elsewhere, while its server is gone.
func volumesOfDeletedServers(ctx context.Context, r *run) error {
	return r.eachDeadBinding(ctx, `SELECT id, instance_uuid, project_id, volume_id, delete_on_termination = 1 FROM volume_attachments
 WHERE id > ? AND origin = 'compute' ORDER BY id LIMIT ?`, func(b deadBinding, why string) {
		repair := fmt.Sprintf("as an admin, detach it (Cinder's admin action; the openstack CLI has no command for it): "+
			`POST /v3/%s/volumes/%s/action {"os-force_detach": {"attachment_id": "%s"}}`, b.project, b.extra, b.id)
		if b.flag {
			repair += "; it was to be deleted with the server (delete_on_termination): then openstack volume delete " + b.extra
		}
		r.emit("volume "+b.extra+" of project "+b.project+" (attachment "+b.id+")",
			"attached by compute to a server, but "+why+": the volume stays in use, and can be neither deleted nor attached elsewhere", repair)
	})
}

package network

import (
	"context"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// publicRouterName names the router Nimbus makes for a project whose
// server gets a public IPv4 address with its flavor on a subnet that no
// router connects to the public network.
const publicRouterName = "public-router"

// ensurePublicPath, in q, makes sure subnetID reaches the public network
// through one of the project's routers, as a floating IP on it needs (its
// 1:1 NAT lives in that router). A customer's own floating IP needs a
// router the customer made (Neutron refuses it otherwise); the address a
// flavor gives is Nimbus's doing, so Nimbus makes the path: a router of
// the project already on the subnet gets its gateway on public, else a
// new router named public-router gets the subnet. It acts as the
// project's own member would, within its quota.
func ensurePublicPath(ctx context.Context, q store.Querier, projectID, subnetID, publicNetID string) error {
	c := &api.Caller{ProjectID: projectID, Roles: []string{"member"}}
	rows, err := q.Query(ctx, `SELECT DISTINCT p.bound_device FROM ports p JOIN ip_allocations a ON a.owner_id = p.id
		WHERE p.bound_by = ? AND p.device_owner = ? AND a.subnet_id = ?`, bindRouter, ownerRouterInterface, subnetID)
	if err != nil {
		return err
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return err
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, id := range ids {
		rts, err := loadRouters(ctx, q, "id = ?", id)
		if err != nil || len(rts) == 0 {
			return err
		}
		rt := rts[0]
		if rt.GwNetworkID != nil && *rt.GwNetworkID == publicNetID {
			return nil
		}
		if rt.ProjectID == projectID && rt.GwNetworkID == nil {
			if err := setGateway(ctx, q, c, rt, &gatewayInfo{NetworkID: publicNetID}); err != nil {
				return err
			}
			rt.UpdatedAt, rt.Revision = now(), rt.Revision+1
			return saveRouter(ctx, q, rt, false)
		}
	}
	if err := checkQuota(ctx, q, projectID, "router"); err != nil {
		return err
	}
	t := now()
	rt := &routerRow{ID: newID(), Name: publicRouterName, ProjectID: projectID, AdminStateUp: true, EnableSNAT: true,
		Tags: []string{}, CreatedAt: t, UpdatedAt: t,
		Description: "Made by Nimbus for the public IPv4 address of a server's flavor"}
	if err := setGateway(ctx, q, c, rt, &gatewayInfo{NetworkID: publicNetID}); err != nil {
		return err
	}
	if err := saveRouter(ctx, q, rt, true); err != nil {
		return err
	}
	_, err = addInterface(ctx, q, c, rt, subnetID, "")
	return err
}

package panel

import (
	"net/http"
	"net/netip"
	"net/url"
	"slices"
)

// publicRouterName is the router the panel makes for a subnet that no
// router of the member's joins to the public network, named as the one
// network makes for a flavor's public address.
const publicRouterName = "public-router"

// routeToPublic makes the path a floating IP on port needs, as Neutron
// refuses the address otherwise (ExternalGatewayForFloatingIPNotFound):
// a router of the project already on the subnet of the port's first IPv4
// address gets its gateway on the address's network, else a new router
// with that gateway gets the subnet. It acts through the API as the
// member, as the member would with the CLI; a router half made is
// deleted.
func (p *Panel) routeToPublic(q *req, fipID, portID string) error {
	ctx := q.r.Context()
	var fip struct {
		FloatingIP struct {
			NetworkID string `json:"floating_network_id"`
		} `json:"floatingip"`
	}
	if err := q.api.Get(ctx, Network, "/v2.0/floatingips/"+url.PathEscape(fipID), &fip); err != nil {
		return err
	}
	type fixedIP struct {
		SubnetID string `json:"subnet_id"`
		IP       string `json:"ip_address"`
	}
	var port struct {
		Port struct {
			FixedIPs []fixedIP `json:"fixed_ips"`
		} `json:"port"`
	}
	if err := q.api.Get(ctx, Network, "/v2.0/ports/"+url.PathEscape(portID), &port); err != nil {
		return err
	}
	subnet := ""
	for _, f := range port.Port.FixedIPs {
		if a, err := netip.ParseAddr(f.IP); err == nil && a.Is4() {
			subnet = f.SubnetID
			break
		}
	}
	if subnet == "" {
		return nil // the API answers why
	}
	project := url.QueryEscape(q.s.ProjectID)
	var ifs struct {
		Ports []struct {
			DeviceID string    `json:"device_id"`
			FixedIPs []fixedIP `json:"fixed_ips"`
		} `json:"ports"`
	}
	if err := q.api.Get(ctx, Network, "/v2.0/ports?device_owner=network%3Arouter_interface&project_id="+project, &ifs); err != nil {
		return err
	}
	var onSubnet []string // routers with an interface on the subnet
	for _, itf := range ifs.Ports {
		if slices.ContainsFunc(itf.FixedIPs, func(f fixedIP) bool { return f.SubnetID == subnet }) {
			onSubnet = append(onSubnet, itf.DeviceID)
		}
	}
	var rts struct {
		Routers []struct {
			ID      string `json:"id"`
			Gateway *struct {
				NetworkID string `json:"network_id"`
			} `json:"external_gateway_info"`
		} `json:"routers"`
	}
	if err := q.api.Get(ctx, Network, "/v2.0/routers?project_id="+project, &rts); err != nil {
		return err
	}
	gateway := map[string]any{"external_gateway_info": map[string]any{"network_id": fip.FloatingIP.NetworkID}}
	for _, r := range rts.Routers {
		if slices.Contains(onSubnet, r.ID) && r.Gateway == nil {
			return q.api.Do(ctx, http.MethodPut, Network, "/v2.0/routers/"+url.PathEscape(r.ID), map[string]any{"router": gateway}, nil)
		}
	}
	made := map[string]any{"name": publicRouterName, "description": "Made by the panel for a floating IP"}
	for k, v := range gateway {
		made[k] = v
	}
	var rt struct {
		Router struct {
			ID string `json:"id"`
		} `json:"router"`
	}
	if err := q.api.Post(ctx, Network, "/v2.0/routers", map[string]any{"router": made}, &rt); err != nil {
		return err
	}
	path := "/v2.0/routers/" + url.PathEscape(rt.Router.ID)
	if err := q.api.Do(ctx, http.MethodPut, Network, path+"/add_router_interface", map[string]any{"subnet_id": subnet}, nil); err != nil {
		_ = q.api.Delete(ctx, Network, path)
		return err
	}
	return nil
}

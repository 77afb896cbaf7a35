-- Port bindings (internal/network): which service attached a port to which
-- device. device_id and device_owner are customer-writable, as in Neutron,
-- so what compute and the router code trust lives here instead, written
-- only by the service: bound_by is 'compute' (a server's NIC) or 'router'
-- (a router's interface or gateway), bound_device the server or router id.
ALTER TABLE ports ADD COLUMN bound_by TEXT NOT NULL DEFAULT ''
-- next
ALTER TABLE ports ADD COLUMN bound_device TEXT NOT NULL DEFAULT ''
-- next
CREATE INDEX ports_bound_device ON ports (bound_device)
-- next
-- Existing bindings: ports compute made, and compute-owned ports of a live
-- server of the port's own project (a port brought with --nic port-id).
UPDATE ports SET bound_by = 'compute', bound_device = device_id
WHERE device_id <> '' AND (server_owned = 1 OR (device_owner LIKE 'compute:%' AND device_id IN
	(SELECT s.id FROM compute_servers s WHERE s.project_id = ports.project_id AND s.deleted = 0)))
-- next
-- Router gateways, and interfaces of a router of the port's own project.
UPDATE ports SET bound_by = 'router', bound_device = device_id
WHERE id IN (SELECT gw_port_id FROM routers WHERE gw_port_id IS NOT NULL)
	OR (device_owner = 'network:router_interface'
		AND device_id IN (SELECT r.id FROM routers r WHERE r.project_id = ports.project_id))

-- Bridged data plane (issue 13). Each tenant network is a VXLAN segment:
-- segmentation_id is its VNI (Neutron's provider:segmentation_id), NULL
-- for the flat public network. network_vni_counter hands out new VNIs
-- from 1000 upward; its one row serialises concurrent creates.
ALTER TABLE networks ADD COLUMN segmentation_id BIGINT
-- next
UPDATE networks SET segmentation_id = 999 + (SELECT COUNT(*) FROM networks o
	WHERE (o.builtin IS NULL OR o.builtin <> 'public')
		AND (o.created_at < networks.created_at OR (o.created_at = networks.created_at AND o.id <= networks.id)))
WHERE builtin IS NULL OR builtin <> 'public'
-- next
CREATE UNIQUE INDEX networks_segmentation ON networks (segmentation_id)
-- next
CREATE TABLE network_vni_counter (
	id INTEGER PRIMARY KEY,
	next_vni BIGINT NOT NULL
)
-- next
INSERT INTO network_vni_counter (id, next_vni) SELECT 1, COALESCE(MAX(segmentation_id) + 1, 1000) FROM networks
-- next
-- The gateway host a router is placed on ('' for none): system state,
-- never written through the API.
ALTER TABLE routers ADD COLUMN host TEXT NOT NULL DEFAULT ''
-- next
CREATE INDEX routers_host ON routers (host)
-- next
-- One DHCP port per network (bound_by 'dhcp'), made lazily by the
-- controller: the key makes a concurrent second one fail.
CREATE UNIQUE INDEX ports_dhcp_network ON ports (network_id) WHERE bound_by = 'dhcp'
-- next
CREATE INDEX ports_network ON ports (network_id, bound_by)

#!/usr/bin/env bash
# The integration suite's second pass: Tempest with instance validation
# against a bridged cloud booting the test guest. run.sh calls it at its end
# (NIMBUS_IT_VALIDATION=0 skips it); it also runs alone:
#
#   test/integration/validation.sh [NIMBUS-BINARY]
#   NIMBUS_IT_VALIDATION_REGEX='tempest.scenario' test/integration/validation.sh
#   NIMBUS_IT_KEEP=1 ...     # keep the work directory and the namespace
#
# The cloud (`nimbus serve --driver qemu --network-mode bridged`, whose
# local agent is the gateway host) and Tempest run in a network namespace of
# their own, so the pass takes no port and no device of this machine's: in
# it a bridge holding 192.0.2.10 is the underlay (where VXLAN tunnels end)
# and a bridge holding the provider gateway's address 198.51.100.1 is the
# provider network, given as --provider-bridge. Two more hosts (`nimbus
# agent`, compute only) run in namespaces on the underlay, as
# test/e2e/netlab_test.go's do. Tempest reaches the floating IPs
# (198.51.100.100-199) through the provider bridge, as a host on the
# provider network would, and SSHes into the test guest there. Needs root
# (namespaces, taps, nftables).
#
# The last line is "validation: N passed, M failed".
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"

LIST="$HERE/tempest-validation.txt"
TEMPEST_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/nimbus/tempest-validation"
RAND=$(od -An -N2 -tx2 /dev/urandom | tr -d ' ')
NS="nimbus-itv-$RAND"    # the cloud's and Tempest's namespace
NSPREFIX="nitv$RAND-"    # the agent's DHCP and router namespaces
CTL_HOST=10
CTL_IP=192.0.2.$CTL_HOST # the controller and its local agent on the underlay
# Each host pins one CPU per vCPU: hosts beyond the controller's own local
# agent (each a namespace of this machine) let Tempest's classes that boot
# three servers at once, at concurrency 2, find room.
EXTRA_HOSTS=${NIMBUS_IT_VALIDATION_HOSTS:-2}
AGENT_PIDS=()
PUB_BRIDGE=nimbus-it-pub # the provider network, 198.51.100.1/24 on it
WORK=$(mktemp -d "${TMPDIR:-/tmp}/nimbus-validation.XXXXXX")
LOG="$WORK/nimbus.log"
NIMBUS_PID=""
PASSED=0
FAILED=0
START=$SECONDS

finish() {
	echo "  validation pass took $((SECONDS - START)) s"
	echo "validation: $PASSED passed, $FAILED failed"
}

cleanup() {
	local rc=$?
	local pid
	for pid in "${AGENT_PIDS[@]}" $NIMBUS_PID; do
		kill -0 "$pid" 2>/dev/null || continue
		kill "$pid" 2>/dev/null || true
		for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	if [[ "${NIMBUS_IT_KEEP:-0}" == 1 ]]; then
		echo "work directory kept: $WORK; namespace $NS" >&2
		exit "$rc"
	fi
	# What is left in our namespaces (QEMU, servers of the agent) is ours.
	local n p
	for n in $(ip netns list 2>/dev/null | awk -v a="$NS" -v b="$NSPREFIX" 'index($1, a) == 1 || index($1, b) == 1 {print $1}'); do
		for p in $(ip netns pids "$n" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
		ip netns del "$n" 2>/dev/null || true
	done
	rm -rf "$WORK"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

die() {
	echo "validation: FATAL: $*" >&2
	if [[ -f "$LOG" ]]; then tail -n 40 "$LOG" >&2; fi
	FAILED=$((FAILED + 1))
	finish
	exit 1
}
step() { echo "== $*"; }
inns() { nsenter --net="/run/netns/$NS" "$@"; }

step "validation: packages and guest"
[[ $(id -u) -eq 0 ]] || die "needs root: network namespaces, taps and nftables"
for c in ip nsenter ping curl qemu-system-x86_64 tempest openstack; do
	command -v "$c" >/dev/null || die "$c missing (scripts/test-all installs it)"
done
GUEST=$(test/guest/build.sh) || die "test/guest/build.sh failed"
for f in vmlinuz initrd.img guest.qcow2 cmdline; do
	[[ -s "$GUEST/$f" ]] || die "no $GUEST/$f"
done

if [[ -n "${1:-}" ]]; then
	cp "$1" "$WORK/nimbus" || die "cannot copy $1"
else
	go build -o "$WORK/nimbus" ./cmd/nimbus || die "go build failed"
fi

step "validation: namespaces ${NS}* (underlay 192.0.2.0/24, provider bridge $PUB_BRIDGE 198.51.100.1/24)"
# The controller's namespace: the underlay bridge holds its address (and
# its local agent's --host-ip), the provider bridge the provider's gateway.
ip netns add "$NS" || die "cannot make namespace $NS"
ip -n "$NS" link set lo up
ip -n "$NS" link add ul-br type bridge
ip -n "$NS" addr add "$CTL_IP/24" dev ul-br
ip -n "$NS" link set ul-br up
ip -n "$NS" link add "$PUB_BRIDGE" type bridge
ip -n "$NS" addr add 198.51.100.1/24 dev "$PUB_BRIDGE"
ip -n "$NS" link set "$PUB_BRIDGE" up
# Compute-only hosts, each a namespace on the underlay bridge.
for i in $(seq "$EXTRA_HOSTS"); do
	ip netns add "$NS-h$i" || die "cannot make namespace $NS-h$i"
	ip -n "$NS-h$i" link set lo up
	ip -n "$NS" link add "ul-h$i" type veth peer name eth0 netns "$NS-h$i"
	ip -n "$NS" link set "ul-h$i" master ul-br up
	ip -n "$NS-h$i" addr add "192.0.2.$((CTL_HOST + i))/24" dev eth0
	ip -n "$NS-h$i" link set eth0 up
done

QEMU_FLAGS=(--driver qemu --accel auto --reserved-cpus none --reserved-memory-mb -1 --network-mode bridged)
step "validation: start nimbus (qemu, bridged) and $EXTRA_HOSTS more hosts"
# The namespaces are ours alone: the default ports are free in them.
inns "$WORK/nimbus" serve --data-dir "$WORK/data" --listen "$CTL_IP" --public-host "$CTL_IP" \
	"${QEMU_FLAGS[@]}" --host-ip "$CTL_IP" --provider-bridge "$PUB_BRIDGE" --netns-prefix "${NSPREFIX}c-" \
	--public-cidr 198.51.100.0/24 --public-gateway 198.51.100.1 --public-pool 198.51.100.100-198.51.100.199 \
	--billing-credit-limit 1000000000000 --heartbeat 2s >>"$LOG" 2>&1 &
NIMBUS_PID=$!
healthy() {
	local p
	for p in 5000 8774 9292 9696 8790; do
		inns curl -fsk --max-time 2 "https://$CTL_IP:$p/healthz" >/dev/null 2>&1 || return 1
	done
}
up=0
for _ in $(seq 300); do
	kill -0 "$NIMBUS_PID" 2>/dev/null || die "nimbus exited"
	if healthy; then
		up=1
		break
	fi
	sleep 0.2
done
[[ $up == 1 ]] || die "nimbus did not become healthy"
for i in $(seq "$EXTRA_HOSTS"); do
	token=$("$WORK/nimbus" admin host token --data-dir "$WORK/data") || die "admin host token"
	mkdir -p "$WORK/h$i"
	NIMBUS_AGENT_TOKEN=$token NIMBUS_DATABASE_URL= NIMBUS_DATA_DIR= nsenter --net="/run/netns/$NS-h$i" \
		"$WORK/nimbus" agent --controller "https://$CTL_IP:8790" --ca-cert "$WORK/data/ca.pem" \
		--data-dir "$WORK/h$i" --name "itv-h$i" --heartbeat 2s "${QEMU_FLAGS[@]}" \
		--host-ip "192.0.2.$((CTL_HOST + i))" --netns-prefix "${NSPREFIX}h$i-" >>"$WORK/agent-h$i.log" 2>&1 &
	AGENT_PIDS+=($!)
done

export OS_CLIENT_CONFIG_FILE="$WORK/data/clouds.yaml"
for v in $(env | awk -F= '/^OS_/ && $1 != "OS_CLIENT_CONFIG_FILE" {print $1}'); do unset "$v"; done
admin() { inns openstack --os-cloud nimbus-admin "$@"; }

step "validation: the test guest and its flavors"
# As test/e2e's uploadGuest: a kernel, a ramdisk and the disk naming them.
image() { # name file disk-format [props...]
	local name=$1 file=$2 fmt=$3
	shift 3
	admin image create --public --disk-format "$fmt" --container-format "$([[ $fmt == qcow2 ]] && echo bare || echo "$fmt")" \
		--file "$file" "$@" "$name" -f value -c id
}
KERNEL=$(image guest-kernel "$GUEST/vmlinuz" aki) || die "kernel upload"
RAMDISK=$(image guest-initrd "$GUEST/initrd.img" ari) || die "ramdisk upload"
guest_disk() {
	image "$1" "$GUEST/guest.qcow2" qcow2 --property kernel_id="$KERNEL" --property ramdisk_id="$RAMDISK" \
		--property os_command_line="$(cat "$GUEST/cmdline")" --property os_type=linux --property login_user=root
}
# Two images of the same guest: Tempest's image filters need distinct ones.
IMAGE_ID=$(guest_disk guest) || die "guest upload"
IMAGE_ALT_ID=$(guest_disk guest-alt) || die "guest upload (alt)"
FLAVOR_ID=$(admin flavor create --vcpus 1 --ram 256 --disk 1 guest.tiny -f value -c id) || die "flavor"
FLAVOR_ALT_ID=$(admin flavor create --vcpus 1 --ram 256 --disk 1 guest.tiny_alt -f value -c id) || die "flavor alt"
PUBLIC_ID=$(admin network show public -f value -c id) || die "no public network"
echo "  images $IMAGE_ID $IMAGE_ALT_ID, flavors $FLAVOR_ID $FLAVOR_ALT_ID, public network $PUBLIC_ID"
hosts=0
for _ in $(seq 60); do
	hosts=$(admin hypervisor list -f value -c State | grep -c '^up$' || true)
	((hosts < EXTRA_HOSTS + 1)) || break
	sleep 1
done
((hosts == EXTRA_HOSTS + 1)) || die "$hosts of $((EXTRA_HOSTS + 1)) hosts up"
echo "  $hosts hosts up"

tempest_conf() {
	local admin_pw compute_max compute_min extensions
	admin_pw=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["admin_password"])' "$WORK/data/secrets.json")
	read -r compute_min compute_max < <(inns curl -fsk https://$CTL_IP:8774/v2.1/ |
		python3 -c 'import json,sys; v=json.load(sys.stdin)["version"]; print(v["min_version"], v["version"])')
	extensions=$(admin extension list --network -f value -c Alias | paste -sd, -)
	cat <<EOF
# Written by test/integration/validation.sh; rewritten every run.
[DEFAULT]
log_file = tempest.log
debug = false

[oslo_concurrency]
lock_path = $TEMPEST_DIR/locks

[auth]
use_dynamic_credentials = true
create_isolated_networks = true
admin_username = admin
admin_password = $admin_pw
admin_project_name = admin
admin_domain_name = Default
default_credentials_domain_name = Default

[identity]
auth_version = v3
uri_v3 = https://$CTL_IP:5000/v3
region = RegionOne
v3_endpoint_type = public
ca_certificates_file = $WORK/data/ca.pem
default_domain_id = default
admin_role = admin

[identity-feature-enabled]
api_v2 = false
api_v3 = true
trust = false
application_credentials = false
project_tags = false

[service_available]
nova = true
glance = true
neutron = true
cinder = true
swift = false
heat = false
horizon = false
placement = false

[compute]
region = RegionOne
endpoint_type = publicURL
image_ref = $IMAGE_ID
image_ref_alt = $IMAGE_ALT_ID
flavor_ref = $FLAVOR_ID
flavor_ref_alt = $FLAVOR_ALT_ID
fixed_network_name = private
min_microversion = $compute_min
max_microversion = $compute_max
build_timeout = 300
build_interval = 1
min_compute_nodes = 1

[compute-feature-enabled]
console_output = true
resize = true
cold_migration = false
live_migration = false
change_password = false
rescue = false
suspend = false
pause = true
shelve = false
snapshot = true
# NICs hot-plug over QMP on a bridged cloud (os-interface): test_hotplug_nic and
# test_port_security_macspoofing_port run.
interface_attach = true
metadata_service = true
config_drive = false
personality = false
disk_config = false
hostname_fqdn_sanitization = false
vnc_console = false
# Tempest 33 runs its server metadata write tests (interop's
# compute-servers-metadata-*) only with this; nimbus's metadata API is
# writable like Nova's.
xenapi_apis = true

[image]
region = RegionOne
endpoint_type = publicURL
build_timeout = 120
build_interval = 1

[image-feature-enabled]
api_v2 = true
api_v1 = false
import_image = false

[network]
region = RegionOne
endpoint_type = publicURL
public_network_id = $PUBLIC_ID
floating_network_name = public
project_networks_reachable = false
build_timeout = 120

[network-feature-enabled]
ipv6 = false
port_security = $([[ ",$extensions," == *,port-security,* ]] && echo true || echo false)
floating_ips = true
api_extensions = $extensions

[validation]
run_validation = true
connect_method = floating
auth_method = keypair
image_ssh_user = root
ip_version_for_ssh = 4
ssh_timeout = 300
ping_timeout = 120
connect_timeout = 60
network_for_ssh = private

[scenario]
dhcp_client = udhcpc
img_file = $GUEST/guest.qcow2
img_disk_format = qcow2
img_container_format = bare

# Block storage: the compute volume tests attach volumes to the test guest and count
# its disks over SSH (the guest's lsblk shim); on the controller's own host the guest's
# QEMU opens the volume's file, on the other hosts it reaches it over NBD.
[volume]
region = RegionOne
endpoint_type = publicURL
catalog_type = volumev3
build_timeout = 120
build_interval = 1
volume_size = 1

[volume-feature-enabled]
api_v3 = true
api_v2 = false
backup = true
snapshot = true
extend_attached_volume = true
EOF
}

step "validation: Tempest (run_validation = True)"
mkdir -p "$(dirname "$TEMPEST_DIR")"
if [[ ! -d "$TEMPEST_DIR/etc" ]]; then
	# Registered beside the workspace, not in ~/.tempest (see run.sh).
	(cd "$(dirname "$TEMPEST_DIR")" && tempest init --workspace-path "$TEMPEST_DIR.workspaces.yaml" "$(basename "$TEMPEST_DIR")") >/dev/null ||
		die "tempest init failed"
fi
mkdir -p "$TEMPEST_DIR/etc" "$TEMPEST_DIR/locks"
tempest_conf >"$TEMPEST_DIR/etc/tempest.conf" || die "could not write tempest.conf"
selection=(--include-list "$LIST")
[[ -z "${NIMBUS_IT_VALIDATION_REGEX:-}" ]] || selection=(--regex "$NIMBUS_IT_VALIDATION_REGEX")
want=$(grep -cvE '^\s*(#|$)' "$LIST")
declared=$(sed -n 's/^# count: *\([0-9]*\).*/\1/p' "$LIST" | head -n1)
if [[ "$want" != "$declared" ]]; then
	echo "  FAIL tempest-validation.txt says count $declared but has $want entries" >&2
	FAILED=$((FAILED + 1))
fi
echo "  workspace $TEMPEST_DIR; ${NIMBUS_IT_VALIDATION_REGEX:-$want entries from $LIST}"
rc=0
(cd "$TEMPEST_DIR" && inns timeout "${NIMBUS_IT_VALIDATION_TIMEOUT:-900}" \
	tempest run --concurrency "${NIMBUS_IT_TEMPEST_CONCURRENCY:-2}" "${selection[@]}") >"$WORK/tempest.out" 2>&1 || rc=$?
cp "$WORK/tempest.out" "$TEMPEST_DIR/last-run.out" 2>/dev/null || true
tp=$(grep -cE '\.\.\. ok$' "$WORK/tempest.out" || true)
tf=$(grep -cE '\.\.\. FAILED$' "$WORK/tempest.out" || true)
ts=$(grep -cE '\.\.\. SKIPPED' "$WORK/tempest.out" || true)
grep -E '\.\.\. (ok|FAILED|SKIPPED)' "$WORK/tempest.out" | sed 's/^{[0-9]*} /  /' || true
PASSED=$((PASSED + tp))
echo "  tempest (validation): $tp passed, $tf failed, $ts skipped (exit $rc)"
short=0
if [[ -z "${NIMBUS_IT_VALIDATION_REGEX:-}" && $tp -ne $want ]]; then
	short=1
	echo "  tempest (validation): $want tests listed but $tp passed (skipped or not found count as failures)" >&2
fi
if [[ $rc -ne 0 || $tf -ne 0 || $tp -eq 0 || $short -ne 0 ]]; then
	FAILED=$((FAILED + (tf > 0 ? tf : 1)))
	echo "---- tempest output (failures) ----" >&2
	sed -n '/^===*$/,$p' "$WORK/tempest.out" | head -n 400 >&2
	tail -n 30 "$WORK/tempest.out" >&2
	echo "  full output: $TEMPEST_DIR/last-run.out; log: $TEMPEST_DIR/tempest.log" >&2
	tail -n 60 "$LOG" >&2
fi
finish
((FAILED == 0))

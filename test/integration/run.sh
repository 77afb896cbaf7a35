#!/usr/bin/env bash
# Integration suite: drives a fresh `nimbus serve` with the stock `openstack`
# CLI (Debian python3-openstackclient) and with Tempest (Debian tempest),
# exactly as a customer and an operator would. See README.md beside this file.
#
#   test/integration/run.sh            # everything
#   NIMBUS_IT_TEMPEST=0 test/integration/run.sh     # CLI checks only
#   NIMBUS_IT_CLI=0 test/integration/run.sh         # Tempest only
#   NIMBUS_IT_TEMPEST_REGEX='tempest.api.compute.flavors' test/integration/run.sh
#                                      # Tempest with a regex instead of the list
#   NIMBUS_IT_KEEP=1 ...               # keep the work directory for debugging
#   NIMBUS_IT_BIN=/path/to/nimbus ...  # use a prebuilt binary instead of go build
#   NIMBUS_IT_VALIDATION=0 ...         # skip the second pass (validation.sh; default: as NIMBUS_IT_TEMPEST)
#   NIMBUS_IT_INTEROP=0 ...            # skip the interop 2020.06 pass (certification's configuration)
#   NIMBUS_IT_CURATED=0 ...            # skip the pass of our own list (tempest-tests.txt)
#
# Exit status is non-zero on any failure; the last line is
# "integration: N passed, M failed".
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"

RUN_CLI=${NIMBUS_IT_CLI:-1}
RUN_TEMPEST=${NIMBUS_IT_TEMPEST:-1}
# Tempest's service_available.cinder (block storage tests; false skips them).
CINDER=${NIMBUS_IT_CINDER:-true}
TEMPEST_LIST="$HERE/tempest-tests.txt"
TEMPEST_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/nimbus/tempest"
# Per-state timeout (seconds) when waiting for a server to reach a status.
WAIT=${NIMBUS_IT_WAIT:-120}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/nimbus-integration.XXXXXX")
LOG="$WORK/nimbus.log"
NIMBUS_PID=""
PASSED=0
FAILED=0
FAILURES=()

log_tail() {
	if [[ -f "$LOG" ]]; then
		echo "---- nimbus log (last 60 lines of $LOG) ----" >&2
		tail -n 60 "$LOG" >&2 || true
		echo "---- end of nimbus log ----" >&2
	fi
}

cleanup() {
	local rc=$?
	# A validation pass still running beside a run cut short stops too
	# (its own trap removes its namespaces).
	if [[ -n "${VALIDATION_PID:-}" ]] && kill -0 "$VALIDATION_PID" 2>/dev/null; then
		kill -TERM -- "-$VALIDATION_PID" 2>/dev/null || true
		wait "$VALIDATION_PID" 2>/dev/null || true
	fi
	stop_nimbus
	if [[ $rc -ne 0 || $FAILED -ne 0 ]]; then
		log_tail
	fi
	if [[ "${NIMBUS_IT_KEEP:-0}" == 1 ]]; then
		echo "work directory kept: $WORK" >&2
	else
		rm -rf "$WORK"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

die() {
	echo "integration: FATAL: $*" >&2
	echo "integration: $PASSED passed, $((FAILED + 1)) failed"
	exit 1
}

# ---------------------------------------------------------------- checks ---

pass() {
	PASSED=$((PASSED + 1))
	echo "  ok   $1"
}

fail() { # name command expected actual
	FAILED=$((FAILED + 1))
	FAILURES+=("$1")
	{
		echo "  FAIL $1"
		echo "       command:  $2"
		echo "       expected: $3"
		echo "       actual:   $(printf '%s' "$4" | head -c 2000)"
	} >&2
}

OUT=""
# ok NAME CMD... — the command must succeed; its output is left in $OUT.
ok() {
	local name=$1
	shift
	if OUT=$("$@" 2>"$WORK/stderr"); then
		pass "$name"
		return 0
	fi
	fail "$name" "$*" "exit status 0" "exit $?: $(cat "$WORK/stderr") $OUT"
	return 1
}

# fails_with NAME REGEX CMD... — the command must fail and print a match of
# the extended regular expression REGEX.
fails_with() {
	local name=$1 want=$2
	shift 2
	local out
	if out=$("$@" 2>&1); then
		fail "$name" "$*" "failure with \"$want\"" "success: $out"
		return 1
	fi
	if [[ "$out" =~ $want ]]; then
		pass "$name"
		return 0
	fi
	fail "$name" "$*" "failure with \"$want\"" "$out"
	return 1
}

# eq NAME CMD-DESCRIPTION EXPECTED ACTUAL
eq() {
	if [[ "$3" == "$4" ]]; then
		pass "$1"
		return 0
	fi
	fail "$1" "$2" "$3" "$4"
	return 1
}

# py EXPR — evaluates a Python expression over the JSON document on stdin
# (bound to d) and prints the result; jq is not assumed.
py() {
	python3 -c '
import json, re, sys
d = json.load(sys.stdin)
r = eval(sys.argv[1])
print(json.dumps(r) if isinstance(r, (dict, list)) else r)' "$1"
}

# jcheck NAME EXPR — evaluates EXPR over $OUT (JSON); must be True.
jcheck() {
	local got
	if got=$(printf '%s' "$OUT" | py "$2" 2>&1) && [[ "$got" == True ]]; then
		pass "$1"
		return 0
	fi
	fail "$1" "python: $2" "True" "$got; output was: $OUT"
	return 1
}

# -------------------------------------------------------------- set-up ---

step() { echo "== $*"; }

step "packages"
if ! command -v openstack >/dev/null || ! command -v tempest >/dev/null; then
	SUDO=""
	[[ $(id -u) -eq 0 ]] || SUDO=sudo
	$SUDO apt-get update
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y python3-openstackclient tempest
fi
command -v openstack >/dev/null || die "openstack CLI missing after install"
command -v tempest >/dev/null || die "tempest missing after install"
echo "  $(openstack --version 2>&1), tempest $(tempest --version 2>&1 | tail -n1 | awk '{print $NF}')"

step "build"
if [[ -n "${NIMBUS_IT_BIN:-}" ]]; then
	cp "$NIMBUS_IT_BIN" "$WORK/nimbus" || die "cannot copy $NIMBUS_IT_BIN"
else
	go build -o "$WORK/nimbus" ./cmd/nimbus || die "go build failed"
fi

# The second pass (validation.sh): Tempest with instance validation on a
# bridged qemu cloud of its own, in a network namespace of its own. It runs
# beside this pass, from here to the end: its time goes mostly to guests
# booting under TCG, this pass's mostly to waiting on the API, so together
# they take little more than the longer of the two. Its output is shown at
# the end and its counts join this run's.
VALIDATION_PID=""
if [[ "${NIMBUS_IT_VALIDATION:-$RUN_TEMPEST}" == 1 ]]; then
	# In a session of its own, so that a run cut short stops all of it.
	setsid "$HERE/validation.sh" "$WORK/nimbus" >"$WORK/validation.out" 2>&1 &
	VALIDATION_PID=$!
fi

# stop_nimbus stops the nimbus this run started, if it runs.
stop_nimbus() {
	if [[ -n "$NIMBUS_PID" ]] && kill -0 "$NIMBUS_PID" 2>/dev/null; then
		kill "$NIMBUS_PID" 2>/dev/null || true
		for _ in $(seq 50); do kill -0 "$NIMBUS_PID" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$NIMBUS_PID" 2>/dev/null || true
		wait "$NIMBUS_PID" 2>/dev/null || true
	fi
	NIMBUS_PID=""
}

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

start_nimbus() {
	local tries
	for tries in 1 2 3; do
		ID_PORT=$(free_port) CO_PORT=$(free_port) IM_PORT=$(free_port) NE_PORT=$(free_port) BI_PORT=$(free_port)
		VO_PORT=$(free_port)
		if [[ $(printf '%s\n' "$ID_PORT" "$CO_PORT" "$IM_PORT" "$NE_PORT" "$BI_PORT" "$VO_PORT" | sort -u | wc -l) -ne 6 ]]; then
			continue
		fi
		"$WORK/nimbus" serve --data-dir "$WORK/data" --listen 127.0.0.1 \
			--identity-port "$ID_PORT" --compute-port "$CO_PORT" \
			--image-port "$IM_PORT" --network-port "$NE_PORT" --billing-port "$BI_PORT" \
			--volume-port "$VO_PORT" \
			--fake-delay "${NIMBUS_IT_FAKE_DELAY:-200ms}" \
			--billing-credit-limit 1000000000000 --billing-test-payments >>"$LOG" 2>&1 &
		NIMBUS_PID=$!
		local i
		for i in $(seq 100); do
			if ! kill -0 "$NIMBUS_PID" 2>/dev/null; then
				break
			fi
			local up=0 p
			for p in "$ID_PORT" "$CO_PORT" "$IM_PORT" "$NE_PORT" "$BI_PORT" "$VO_PORT"; do
				if curl -fsk --max-time 2 "https://127.0.0.1:$p/healthz" >/dev/null 2>&1; then
					up=$((up + 1))
				fi
			done
			if [[ $up -eq 6 ]]; then
				return 0
			fi
			sleep 0.2
		done
		kill "$NIMBUS_PID" 2>/dev/null || true
		wait "$NIMBUS_PID" 2>/dev/null || true
		NIMBUS_PID=""
		echo "  nimbus did not become healthy (try $tries); retrying on other ports" >&2
	done
	die "nimbus did not start"
}

step "start nimbus"
command -v curl >/dev/null || die "curl is required"
start_nimbus
echo "  pid $NIMBUS_PID, identity :$ID_PORT compute :$CO_PORT image :$IM_PORT network :$NE_PORT billing :$BI_PORT volume :$VO_PORT"
for p in "$ID_PORT" "$CO_PORT" "$IM_PORT" "$NE_PORT" "$BI_PORT" "$VO_PORT"; do
	ok "healthz on :$p" curl -fsk "https://127.0.0.1:$p/healthz" || true
done

export OS_CLIENT_CONFIG_FILE="$WORK/data/clouds.yaml"
[[ -f "$OS_CLIENT_CONFIG_FILE" ]] || die "nimbus wrote no clouds.yaml"
# Never pick up a developer's OS_* settings.
for v in $(env | awk -F= '/^OS_/ && $1 != "OS_CLIENT_CONFIG_FILE" {print $1}'); do unset "$v"; done

demo() { openstack --os-cloud nimbus-demo "$@"; }
admin() { openstack --os-cloud nimbus-admin "$@"; }

# wait_status NAME SERVER STATUS [api-args...] — poll server show until
# STATUS (fails early on ERROR).
wait_status() {
	local name=$1 server=$2 want=$3
	shift 3
	local deadline=$((SECONDS + WAIT)) got=""
	while ((SECONDS < deadline)); do
		got=$(demo "$@" server show "$server" -f value -c status 2>&1) || true
		if [[ "$got" == "$want" ]]; then
			pass "$name"
			return 0
		fi
		if [[ "$got" == ERROR ]]; then
			break
		fi
		sleep 1
	done
	fail "$name" "openstack --os-cloud nimbus-demo $* server show $server -c status (polled ${WAIT}s)" "$want" "$got"
	return 1
}

# ----------------------------------------------------------------- CLI ---

IMAGE_ID="" FLAVOR_ID="" FLAVOR_ALT_ID="" IMAGE_ALT_ID=""
# The plain base systems (a name starting "Ubuntu"/"Debian"), not marketplace
# images built on them.
PICK_UBUNTU='[i["ID"] for i in sorted(d, key=lambda i: (not i["Name"].lower().startswith("ubuntu"), i["Name"])) if "ubuntu" in i["Name"].lower()][0]'
PICK_DEBIAN='[i["ID"] for i in sorted(d, key=lambda i: (not i["Name"].lower().startswith("debian"), i["Name"])) if "debian" in i["Name"].lower()][0]'

cli_basics() {
	step "CLI: identity and discovery (demo)"
	ok "token issue" demo token issue -f json &&
		jcheck "token issue: id, expires, project_id, user_id" \
			'all(d.get(k) for k in ("id","expires","project_id","user_id"))'
	ok "catalog list" demo catalog list -f json &&
		jcheck "catalog has identity, compute, image, network, billing" \
			'{"identity","compute","image","network","billing"} <= {s["Type"] for s in d}' &&
		jcheck "catalog endpoints are in RegionOne" \
			'all(e["region"]=="RegionOne" for s in d for e in s["Endpoints"])'

	# The web panel answers on its port over the same TLS, and is in the catalog.
	ok "catalog list" demo catalog list -f json &&
		jcheck "catalog lists the panel" '"dashboard" in {s["Type"] for s in d}'
	ok "panel landing page" curl -fsS --cacert "$WORK/data/ca.pem" "https://127.0.0.1:8443/" &&
		eq "panel landing page names Nimbus" "grep Nimbus" "yes" "$([[ "$OUT" == *"<title>Nimbus"* ]] && echo yes || echo no)"
	# The billing API takes the same Keystone tokens (its URL is in the catalog).
	if ok "token for billing" demo token issue -f value -c id; then
		BTOKEN=$OUT
		bcurl() { curl -s --cacert "$WORK/data/ca.pem" -H "X-Auth-Token: $BTOKEN" -H "Content-Type: application/json" "$@"; }
		ok "billing account" bcurl -f "https://127.0.0.1:$BI_PORT/v1/account" &&
			jcheck "account has balance, credit_limit and currency" \
				'{"balance","credit_limit","currency"} <= set(d["account"])'
		ok "top-up under the minimum" bcurl -o /dev/null -w '%{http_code}' -X POST \
			-d '{"topup":{"amount":99,"provider":"test"}}' "https://127.0.0.1:$BI_PORT/v1/topups" &&
			jcheck "top-up under the minimum is 400" 'd == 400'
		ok "top-up of 100.00" bcurl -o /dev/null -w '%{http_code}' -X POST \
			-d '{"topup":{"amount":10000,"provider":"test"}}' "https://127.0.0.1:$BI_PORT/v1/topups" &&
			jcheck "top-up of 100.00 is 201" 'd == 201'
		ok "usage this month" bcurl -f "https://127.0.0.1:$BI_PORT/v1/usage" &&
			jcheck "usage has month, currency, total and resources" \
				'{"month","currency","total","resources"} <= set(d["usage"])'
		ok "notices" bcurl -f "https://127.0.0.1:$BI_PORT/v1/notices" &&
			jcheck "notices is a list" 'isinstance(d["notices"], list)'
		ok "a term for no server" bcurl -o /dev/null -w '%{http_code}' -X POST \
			-d '{"term":{"server_id":"no-such-server","months":1}}' "https://127.0.0.1:$BI_PORT/v1/terms" &&
			jcheck "a term for no server is 409" 'd == 409'
	fi

	ok "flavor list" demo flavor list -f json &&
		jcheck "flavor list is not empty" 'len(d) > 0' &&
		jcheck "flavors have ID, Name, RAM, Disk, VCPUs" \
			'all({"ID","Name","RAM","Disk","VCPUs"} <= set(f) for f in d)'
	if [[ $? -eq 0 ]]; then
		# the smallest flavor named like "small" (else the smallest), and the
		# next one with at least its disk (Tempest boots base images on both)
		FLAVOR_ID=$(printf '%s' "$OUT" | py '[f["ID"] for f in sorted(d, key=lambda f: (("small" not in f["Name"].lower()), f["RAM"], f["VCPUs"], f["Disk"]))][0]')
		FLAVOR_ALT_ID=$(printf '%s' "$OUT" | py '([f["ID"] for f in sorted(d, key=lambda f: (f["RAM"], f["VCPUs"], f["Disk"])) if f["ID"] != "'"$FLAVOR_ID"'" and f["Disk"] >= [g["Disk"] for g in d if g["ID"] == "'"$FLAVOR_ID"'"][0]] + ["'"$FLAVOR_ID"'"])[0]')
		ok "flavor show $FLAVOR_ID" demo flavor show "$FLAVOR_ID" -f json &&
			jcheck "flavor show: id matches" "d['id'] == '$FLAVOR_ID'"
	fi

	ok "image list" demo image list -f json &&
		jcheck "base images present (Ubuntu, Debian, CentOS, Fedora, openSUSE, Windows Server 2019/2022)" \
			'all(any(re.search(p, i["Name"], re.I) for i in d) for p in ("ubuntu","debian","centos","fedora","opensuse","windows.*2019","windows.*2022"))' &&
		jcheck "images are active" 'all(i["Status"] == "active" for i in d)'
	if [[ $? -eq 0 ]]; then
		IMAGE_ID=$(printf '%s' "$OUT" | py "$PICK_UBUNTU")
		IMAGE_ALT_ID=$(printf '%s' "$OUT" | py "$PICK_DEBIAN")
		ok "image show (ubuntu)" demo image show "$IMAGE_ID" -f json &&
			jcheck "image show: os_type linux" '(d.get("properties") or {}).get("os_type", d.get("os_type")) == "linux"'
	fi

	ok "network list" demo network list -f json &&
		jcheck "network list shows private" 'any(n["Name"] == "private" for n in d)'
	ok "subnet list" demo subnet list -f json &&
		jcheck "subnet list is not empty" 'len(d) > 0'
}

# life TAG [api-args...] — one customer's server life.
life() {
	local tag=$1
	shift
	local api=("$@") name="it-$tag-$RANDOM" key="k-$tag"
	step "CLI: server life (${api[*]:-default microversion})"
	local generated=1
	if [[ " ${api[*]} " == *" 2.92 "* ]]; then
		generated=0
	fi
	if [[ $generated == 1 ]]; then
		ok "keypair create (generated)" demo "${api[@]}" keypair create "$key-gen" &&
			eq "keypair create prints a private key" "openstack keypair create $key-gen" "-----BEGIN" "$(printf '%s' "$OUT" | head -c 10)"
		ok "keypair delete (generated)" demo "${api[@]}" keypair delete "$key-gen"
	else
		# 2.92 removed server-side generation: public_key is required.
		fails_with "keypair create without public key rejected at 2.92" "public_key" \
			demo "${api[@]}" keypair create "$key-gen"
	fi
	ok "keypair create --public-key (import)" demo "${api[@]}" keypair create --public-key "$WORK/id.pub" "$key" -f json &&
		jcheck "imported keypair fingerprint" 'd.get("fingerprint","").count(":") == 15'
	ok "keypair list" demo "${api[@]}" keypair list -f json &&
		jcheck "keypair list has $key" "any(k['Name'] == '$key' for k in d)"
	ok "keypair show" demo "${api[@]}" keypair show "$key" -f json &&
		jcheck "keypair show: name" "d['name'] == '$key'"

	ok "server create --min 2 --max 2 --wait" demo "${api[@]}" server create \
		--image "$IMAGE_ID" --flavor "$FLAVOR_ID" --network private --key-name "$key" \
		--min 2 --max 2 --wait "$name" -f json &&
		jcheck "server create: ACTIVE" 'd["status"] == "ACTIVE"'
	ok "server list" demo "${api[@]}" server list --name "^$name-" -f json &&
		jcheck "server list: $name-1 and $name-2" "sorted(s['Name'] for s in d) == ['$name-1', '$name-2']" &&
		jcheck "server list: both ACTIVE" 'all(s["Status"] == "ACTIVE" for s in d)'
	wait_status "$name-2 ACTIVE" "$name-2" ACTIVE "${api[@]}"

	local s="$name-1"
	ok "server show" demo "${api[@]}" server show "$s" -f json &&
		jcheck "server show: status ACTIVE" 'd["status"] == "ACTIVE"' &&
		jcheck "server show: addresses on private" '"private" in str(d["addresses"])' &&
		jcheck "server show: key_name" "d['key_name'] == '$key'" &&
		jcheck "server show: image" "'$IMAGE_ID' in str(d['image'])" &&
		if [[ $generated == 1 ]]; then
			jcheck "server show: flavor by id (2.1 shape)" "'($FLAVOR_ID)' in str(d['flavor'])" &&
				jcheck "server show: no 2.73 locked_reason" '"locked_reason" not in d'
		else
			jcheck "server show: embedded flavor with original_name (2.47+ shape)" \
				'isinstance(d["flavor"], dict) and "original_name" in d["flavor"] and "vcpus" in d["flavor"]' &&
				jcheck "server show: locked, locked_reason, tags, server_groups, hostname (2.9x shape)" \
					'all(k in d for k in ("locked","locked_reason","tags","server_groups","OS-EXT-SRV-ATTR:hostname"))'
		fi &&
		jcheck "server show: power_state Running" 'str(d.get("OS-EXT-STS:power_state")) in ("Running", "1")'

	ok "server stop" demo "${api[@]}" server stop "$s"
	wait_status "server stop -> SHUTOFF" "$s" SHUTOFF "${api[@]}"
	fails_with "server stop when SHUTOFF -> 409" "HTTP 409|409: Client Error|[Cc]onflict" demo "${api[@]}" server stop "$s"
	ok "server start" demo "${api[@]}" server start "$s"
	wait_status "server start -> ACTIVE" "$s" ACTIVE "${api[@]}"
	ok "server reboot --soft --wait" demo "${api[@]}" server reboot --soft --wait "$s"
	wait_status "soft reboot -> ACTIVE" "$s" ACTIVE "${api[@]}"
	ok "server reboot --hard --wait" demo "${api[@]}" server reboot --hard --wait "$s"
	wait_status "hard reboot -> ACTIVE" "$s" ACTIVE "${api[@]}"
	ok "server shelve" demo "${api[@]}" server shelve "$s"
	wait_status "server shelve -> SHELVED_OFFLOADED" "$s" SHELVED_OFFLOADED "${api[@]}"
	ok "server unshelve" demo "${api[@]}" server unshelve "$s"
	wait_status "server unshelve -> ACTIVE" "$s" ACTIVE "${api[@]}"
	ok "server event list" demo "${api[@]}" server event list "$s" -f json &&
		jcheck "instance actions recorded (create, stop, start, reboot, shelve, unshelve)" \
			'{"create","stop","start","reboot","shelve","unshelve"} <= {a["Action"] for a in d}'

	# NIC hot-plug (os-interface): add and remove a port and a network.
	local nic=""
	ok "port create (to attach)" demo port create --network private "$name-nic" -f value -c id && nic=$OUT
	ok "server add port" demo "${api[@]}" server add port "$s" "$nic"
	ok "server add network" demo "${api[@]}" server add network "$s" private
	ok "port list --server after adds" demo port list --server "$s" -f json &&
		jcheck "server add port/network: three ports" "len(d) == 3 and '$nic' in str(d)"
	ok "server remove port" demo "${api[@]}" server remove port "$s" "$nic"
	ok "port list --server after remove port" demo port list --server "$s" -f json &&
		jcheck "server remove port: two ports left" "len(d) == 2 and '$nic' not in str(d)"
	ok "server remove network" demo "${api[@]}" server remove network "$s" private
	ok "port list --server after remove network" demo port list --server "$s" -f json &&
		jcheck "server remove network: no port left" 'd == []'
	ok "port delete (detached)" demo port delete "$nic"

	ok "server delete --wait (both)" demo "${api[@]}" server delete --wait "$name-1" "$name-2"
	fails_with "server show after delete" "No server with a name or ID" demo "${api[@]}" server show "$s"
	ok "server list after delete" demo "${api[@]}" server list --name "^$name-" -f json &&
		jcheck "server list after delete is empty" 'd == []'
	ok "keypair delete" demo "${api[@]}" keypair delete "$key"
}

# wait_volume NAME VOLUME STATUS — poll volume show until STATUS (fails
# early on error).
wait_volume() {
	local name=$1 vol=$2 want=$3
	local deadline=$((SECONDS + WAIT)) got=""
	while ((SECONDS < deadline)); do
		got=$(demo volume show "$vol" -f value -c status 2>&1) || true
		if [[ "$got" == "$want" ]]; then
			pass "$name"
			return 0
		fi
		if [[ "$got" == error* ]]; then
			break
		fi
		sleep 0.5
	done
	fail "$name" "openstack --os-cloud nimbus-demo volume show $vol -c status (polled ${WAIT}s)" "$want" "$got"
	return 1
}

cli_volumes() {
	step "CLI: volumes (demo)"
	local v="it-vol-$RANDOM"
	ok "volume type list" demo volume type list -f json &&
		jcheck "volume type network" 'any(t["Name"] == "network" for t in d)'
	ok "volume create" demo volume create --size 1 --property purpose=it "$v" -f json &&
		jcheck "volume create: size 1, type network" 'd["size"] == 1 and d["type"] == "network"'
	wait_volume "volume -> available" "$v" available
	ok "volume list" demo volume list -f json &&
		jcheck "volume list has $v" "any(x['Name'] == '$v' and x['Size'] == 1 for x in d)"
	ok "volume set --name --property" demo volume set --name "$v-b" --property tier=gold "$v"
	ok "volume show" demo volume show "$v-b" -f json &&
		jcheck "volume show: renamed, properties" "d['name'] == '$v-b' and d['properties'] in ({'purpose': 'it', 'tier': 'gold'}, \"purpose='it', tier='gold'\")"
	ok "volume set --size 2 (extend)" demo volume set --size 2 "$v-b"
	wait_volume "extended volume -> available" "$v-b" available
	ok "volume show after extend" demo volume show "$v-b" -f json &&
		jcheck "volume size 2" 'd["size"] == 2'
	fails_with "volume set --size smaller rejected" "HTTP 400|must be greater than" demo volume set --size 1 "$v-b"
	ok "limits show --absolute (volumes)" demo limits show --absolute -f json &&
		jcheck "limits: maxTotalVolumes, totalGigabytesUsed" \
			'{"maxTotalVolumes","totalGigabytesUsed"} <= {x["Name"] for x in d}'
	ok "volume delete" demo volume delete "$v-b"
	local deadline=$((SECONDS + WAIT))
	while ((SECONDS < deadline)) && demo volume show "$v-b" >/dev/null 2>&1; do sleep 0.5; done
	fails_with "volume show after delete" "No volume with a name or ID" demo volume show "$v-b"

	# A private type: hidden from demo until an admin gives demo access.
	local t="it-private-$RANDOM"
	ok "volume type create --private (admin)" admin volume type create --private "$t" -f json &&
		jcheck "the type is private" 'd["is_public"] in (False, "False")'
	fails_with "demo cannot use the private type" "HTTP 404|could not be found|No volumetype" \
		demo volume create --size 1 --type "$t" "$v-p"
	ok "volume type set --project demo (admin)" admin volume type set --project demo "$t"
	ok "volume type show (admin)" admin volume type show "$t" -f json &&
		jcheck "access lists demo's project" "'$(admin project show demo -f value -c id)' in str(d.get('access_project_ids'))"
	ok "volume type list (demo)" demo volume type list -f json &&
		jcheck "demo lists the private type" "any(x['Name'] == '$t' for x in d)"
	ok "volume type unset --project demo (admin)" admin volume type unset --project demo "$t"
	ok "volume type list after unset (demo)" demo volume type list -f json &&
		jcheck "demo no longer lists it" "not any(x['Name'] == '$t' for x in d)"
	ok "volume type delete (admin)" admin volume type delete "$t"
}

cli_admin() {
	step "CLI: operator (admin)"
	ok "hypervisor list" admin hypervisor list -f json &&
		jcheck "hypervisors present" 'len(d) > 0'
	ok "compute service list" admin compute service list -f json &&
		jcheck "nova-compute services up" 'any(s["Binary"] == "nova-compute" and s["State"] == "up" for s in d)'
	ok "project list" admin project list -f json &&
		jcheck "projects admin and demo" '{"admin","demo"} <= {p["Name"] for p in d}'
	ok "user list" admin user list -f json &&
		jcheck "users admin and demo" '{"admin","demo"} <= {u["Name"] for u in d}'
	ok "quota show demo" admin quota show demo -f json &&
		jcheck "quota show has instances, cores, ram" 'all(k in str(d) for k in ("instances","cores","ram"))'
	ok "limits show --absolute (admin)" admin limits show --absolute -f json &&
		jcheck "admin limits: maxTotalCores" 'any(x["Name"] == "maxTotalCores" for x in d)'
	ok "limits show --absolute" demo limits show --absolute -f json &&
		jcheck "limits: maxTotalInstances, totalInstancesUsed" \
			'{"maxTotalInstances","totalInstancesUsed"} <= {x["Name"] for x in d}'
	ok "availability zone list (admin)" admin availability zone list --compute -f json &&
		jcheck "admin sees zone nova" 'any(z["Zone Name"] == "nova" for z in d)'
	ok "availability zone list" demo availability zone list --compute -f json &&
		jcheck "availability zone nova available" \
			'any(z["Zone Name"] == "nova" and z["Zone Status"] == "available" for z in d)'
	ok "usage list" admin usage list -f json
	fails_with "demo cannot list hypervisors" "HTTP 403|403: Client Error|[Ff]orbidden" demo hypervisor list
}

# ------------------------------------------------- CLI: two-factor ---
# cli_mfa: a user with a TOTP credential and the rule [password, totp] gets
# no token for the password alone, gets one with password and passcode
# (keystoneauth's v3multifactor), and cannot spend that passcode twice.
# OSC 6.0 reads --os-auth-methods as a string ("The plugin v could not be
# found"), so the methods are a list in a clouds.yaml entry of their own.
cli_mfa() {
	step "CLI: two-factor sign-in (v3multifactor)"
	local secret=GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ pw="mfa-$RANDOM-password" conf="$WORK/mfa-clouds.yaml" passcode
	ok "user create mfa-it" admin user create --password "$pw" --project demo mfa-it &&
		ok "role add member" admin role add --user mfa-it --project demo member &&
		ok "credential create --type totp" admin credential create --type totp mfa-it "$secret" &&
		ok "user set --multi-factor-auth-rule password,totp" admin user set \
			--multi-factor-auth-rule password,totp --enable-multi-factor-auth mfa-it || return 1
	fails_with "password alone is refused" "auth rules were satisfied|HTTP 401" \
		openstack --os-cloud nimbus-demo --os-username mfa-it --os-password "$pw" token issue
	python3 - "$OS_CLIENT_CONFIG_FILE" "$pw" >"$conf" <<'PY'
import re, sys
text, pw = open(sys.argv[1]).read(), sys.argv[2]
demo = text[text.index("  nimbus-demo:"):]
demo = demo.replace("nimbus-demo:", "nimbus-mfa:").replace("username: demo", "username: mfa-it")
demo = re.sub(r'password: "[^"]*"', 'password: "%s"' % pw, demo)
demo = demo.replace("    auth:\n", "    auth_type: v3multifactor\n    auth:\n      auth_methods: [v3password, v3totp]\n", 1)
print("clouds:\n" + demo)
PY
	passcode=$(python3 -c '
import base64, hashlib, hmac, struct, sys, time
h = hmac.new(base64.b32decode(sys.argv[1]), struct.pack(">Q", int(time.time()) // 30), hashlib.sha1).digest()
print("%06d" % ((struct.unpack(">I", h[h[-1] & 15:][:4])[0] & 0x7fffffff) % 1000000))' "$secret")
	ok "token issue with password and passcode" env OS_CLIENT_CONFIG_FILE="$conf" \
		openstack --os-cloud nimbus-mfa --os-passcode "$passcode" token issue -f value -c id
	fails_with "a passcode is spent once" "HTTP 401" env OS_CLIENT_CONFIG_FILE="$conf" \
		openstack --os-cloud nimbus-mfa --os-passcode "$passcode" token issue
}

# doc_block FILE MARKER — the shell block of FILE (relative to the
# repository root) after "<!-- walk-through: MARKER -->", with the default
# ports changed to this run's.
doc_block() {
	python3 - "$ROOT/$1" "$1" "$2" "5000=$ID_PORT" "8774=$CO_PORT" "8889=$BI_PORT" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"<!-- walk-through: " + re.escape(sys.argv[3]) + r" -->\n```sh\n(.*?)```", text, re.S)
if not m:
    sys.exit(sys.argv[2] + " has no walk-through block " + sys.argv[3])
block = m.group(1)
for pair in sys.argv[4:]:
    old, new = pair.split("=")
    block = block.replace("https://127.0.0.1:%s/" % old, "https://127.0.0.1:%s/" % new)
sys.stdout.write(block)
PY
}

# cli_walkthrough runs the documentation's walk-through as written, on the
# fresh data directory: the operator makes a project and a user with the
# CLI (docs/operator.md, "A first cloud"), and that customer follows the
# steps from login to delete (docs/user.md, "Your first server").
cli_walkthrough() {
	step "CLI: the walk-through of docs/operator.md and docs/user.md (a freshly made project)"
	local dir="$WORK/walk" script out
	mkdir -p "$dir" && ln -s "$WORK/data" "$dir/nimbus-data" || return 1
	script=$(doc_block docs/operator.md operator && doc_block docs/user.md "customer login" &&
		doc_block docs/user.md customer) ||
		{ fail "walk-through blocks of docs/operator.md and docs/user.md" "doc_block" "three blocks" "$script"; return 1; }
	if out=$(cd "$dir" && timeout $((WAIT * 4)) bash -e -o pipefail -c "$script" 2>&1); then
		pass "walk-through (docs/operator.md, docs/user.md) runs as written"
	else
		# the end of the output, where the failing command's error is
		fail "walk-through (docs/operator.md, docs/user.md) runs as written" "bash -e (the walk-through blocks of docs/operator.md and docs/user.md)" "exit 0" "… $(tail -c 1500 <<<"$out")"
		return 1
	fi
	eq "walk-through: the new project's private network is listed" "openstack network list" 1 \
		"$(grep -cE '\| private +\|' <<<"$out")"
	eq "walk-through: the new project's default security group is listed" "openstack security group list" 1 \
		"$(grep -cE '\| default +\| Default security group' <<<"$out")"
	eq "walk-through: the top-up succeeds" "POST /v1/topups" 1 "$(grep -c '"status": *"succeeded"' <<<"$out")"
	eq "walk-through: /access says how to log in" "GET /servers/{id}/access" 1 \
		"$(grep -cE '"access":\[\{.*"port":[0-9]+.*"protocol":"ssh"' <<<"$out")"
}

if [[ "$RUN_CLI" == 1 ]]; then
	cat >"$WORK/id.pub" <<'EOF'
ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIF5H51Un1TItWfK+t1rZJ6U5CttmKkG5+XE2t6IrQlby nimbus-integration
EOF
	cli_walkthrough || true
	cli_basics || true
	if [[ -n "$IMAGE_ID" && -n "$FLAVOR_ID" ]]; then
		life default || true
		life 292 --os-compute-api-version 2.92 || true
	else
		fail "server life" "(needs an image and a flavor)" "image and flavor found" "image='$IMAGE_ID' flavor='$FLAVOR_ID'"
	fi
	cli_volumes || true
	cli_admin || true
	cli_mfa || true
fi

# ------------------------------------------------------------- Tempest ---

tempest_conf() {
	local conf=$1 admin_pw network_id compute_max compute_min extensions volume_max volume_extensions
	admin_pw=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["admin_password"])' "$WORK/data/secrets.json")
	compute_min=$(curl -fsk "https://127.0.0.1:$CO_PORT/v2.1/" | py 'd["version"]["min_version"]')
	compute_max=$(curl -fsk "https://127.0.0.1:$CO_PORT/v2.1/" | py 'd["version"]["version"]')
	[[ -n "$IMAGE_ID" ]] || IMAGE_ID=$(demo image list -f json | py "$PICK_UBUNTU")
	[[ -n "$IMAGE_ALT_ID" ]] || IMAGE_ALT_ID=$(demo image list -f json | py "$PICK_DEBIAN")
	# Tempest's own image, as devstack's cirros: the catalog's Ubuntu
	# asks for a 10 GB disk (min_disk), which the 1 GB volumes Tempest
	# boots from ([volume] volume_size) cannot hold, as Nova says too.
	local tempest_image
	tempest_image=$(admin image list --name tempest-linux -f value -c ID | head -n1)
	if [[ -z "$tempest_image" ]]; then
		local fmt
		fmt=$(admin image show "$IMAGE_ID" -f json | py 'd["disk_format"]') &&
			admin image save --file "$WORK/tempest-image" "$IMAGE_ID" &&
			tempest_image=$(admin image create --public --disk-format "$fmt" --container-format bare \
				--property os_type=linux --file "$WORK/tempest-image" tempest-linux -f value -c id) ||
			die "could not make Tempest's image"
	fi
	IMAGE_ID=$tempest_image
	if [[ -z "$FLAVOR_ID" ]]; then
		local fl
		fl=$(demo flavor list -f json)
		FLAVOR_ID=$(printf '%s' "$fl" | py '[f["ID"] for f in sorted(d, key=lambda f: (("small" not in f["Name"].lower()), f["RAM"], f["VCPUs"], f["Disk"]))][0]')
		FLAVOR_ALT_ID=$(printf '%s' "$fl" | py '([f["ID"] for f in sorted(d, key=lambda f: (f["RAM"], f["VCPUs"], f["Disk"])) if f["ID"] != "'"$FLAVOR_ID"'" and f["Disk"] >= [g["Disk"] for g in d if g["ID"] == "'"$FLAVOR_ID"'"][0]] + ["'"$FLAVOR_ID"'"])[0]')
	fi
	network_id=$(admin network list --external -f value -c ID 2>/dev/null | head -n1) || network_id=""
	# The extensions nimbus's network API lists, so that Tempest gates its
	# tests on what is really served.
	extensions=$(admin extension list --network -f value -c Alias 2>/dev/null | paste -sd, -) || extensions=""
	[[ "${CERTIFY:-0}" == 1 ]] && extensions=all # a certification run claims every extension
	# Block storage: the max microversion and the extensions nimbus's
	# volume API serves, as for the network's.
	volume_max=$(curl -fsk "https://127.0.0.1:$VO_PORT/v3/" | py 'd["versions"][0]["version"]') || volume_max=3.0
	volume_extensions=$(curl -fsk -H "X-Auth-Token: $(admin token issue -f value -c id)" "https://127.0.0.1:$VO_PORT/v3/extensions" |
		py '",".join(e["alias"] for e in d["extensions"])') || volume_extensions=""
	[[ "${CERTIFY:-0}" == 1 ]] && volume_extensions=all
	cat >"$conf" <<EOF
# Written by test/integration/run.sh for a nimbus on these ports; rewritten every run.
[DEFAULT]
log_file = tempest.log
debug = false

[oslo_concurrency]
lock_path = $TEMPEST_DIR/locks

[auth]
use_dynamic_credentials = true
create_isolated_networks = false
admin_username = admin
admin_password = $admin_pw
admin_project_name = admin
admin_domain_name = Default
default_credentials_domain_name = Default

[identity]
auth_version = v3
uri_v3 = https://127.0.0.1:$ID_PORT/v3
region = RegionOne
v3_endpoint_type = public
ca_certificates_file = $WORK/data/ca.pem
disable_ssl_certificate_validation = false
default_domain_id = default
admin_role = admin

[identity-feature-enabled]
api_v2 = false
api_v3 = true
trust = false
federation = false
access_rules = false
application_credentials = false
security_compliance = false
project_tags = false
domain_specific_drivers = false
external_idp = false

[service_available]
nova = true
glance = true
neutron = true
cinder = $CINDER
swift = false
heat = false
horizon = false
ceilometer = false
aodh = false
gnocchi = false
ironic = false
designate = false
octavia = false
barbican = false
manila = false
placement = false
zaqar = false
trove = false
sahara = false

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
build_timeout = 120
build_interval = 1
min_compute_nodes = 2

[compute-feature-enabled]
console_output = true
vnc_console = false
spice_console = false
serial_console = false
rdp_console = false
resize = true
cold_migration = false
live_migration = false
live_block_migration = false
block_migrate_cinder_iscsi = false
change_password = true
rescue = false
suspend = true
pause = true
shelve = true
shelve_migrate = false
snapshot = true
interface_attach = false
metadata_service = false
config_drive = false
personality = false
attach_encrypted_volume = false
swap_volume = true
volume_multiattach = false
disk_config = false
hostname_fqdn_sanitization = false
stable_rescue = false
unified_limits = false
# Tempest 33 runs its server metadata write tests (interop's
# compute-servers-metadata-*) only with this; nimbus's metadata API is
# writable like Nova's.
xenapi_apis = true
scheduler_enabled_filters = AvailabilityZoneFilter,ComputeFilter,ComputeCapabilitiesFilter,ImagePropertiesFilter,ServerGroupAffinityFilter,ServerGroupAntiAffinityFilter,SameHostFilter,DifferentHostFilter

[image]
region = RegionOne
endpoint_type = publicURL
build_timeout = 60
build_interval = 1

[image-feature-enabled]
api_v2 = true
api_v1 = false
import_image = false
os_glance_reserved = false
manage_locations = false

[network]
region = RegionOne
endpoint_type = publicURL
public_network_id = $network_id
floating_network_name = public
project_networks_reachable = false
shared_physical_network = false

[network-feature-enabled]
ipv6 = $([[ "${CERTIFY:-0}" == 1 ]] && echo true || echo false)
ipv6_subnet_attributes = false
port_security = $([[ ",$extensions," == *,port-security,* ]] && echo true || echo false)
floating_ips = true
api_extensions = ${extensions:-all}

[validation]
run_validation = false

[volume]
region = RegionOne
endpoint_type = publicURL
catalog_type = volumev3
min_microversion = 3.0
max_microversion = $volume_max
build_timeout = 120
build_interval = 1
volume_size = 1
disk_format = raw
storage_protocol = nbd
vendor_name = Nimbus

[volume-feature-enabled]
api_v3 = true
api_v2 = false
multi_backend = false
backup = true
snapshot = true
clone = true
manage_snapshot = false
manage_volume = false
extend_attached_volume = true
extend_attached_encrypted_volume = false
consistency_group = false
volume_revert = false
api_extensions = ${volume_extensions:-all}
EOF
}

# run_tempest runs one Tempest pass: its name, the include list (one regex
# per line) and how many of its tests may be skipped, with the reasons a
# skip may give (an extended regex; "" allows none).
run_tempest() {
	local name=${1:-Tempest} list=${2:-$TEMPEST_LIST} skips_ok=${3:-0} skip_reason=${4:-}
	step "$name"
	mkdir -p "$(dirname "$TEMPEST_DIR")"
	if [[ ! -f "$TEMPEST_DIR/etc/tempest.conf.sample" && ! -d "$TEMPEST_DIR/etc" ]]; then
		# The workspace is registered in a file of its own beside it, not in
		# ~/.tempest/workspace.yaml, where a workspace of the same name made
		# elsewhere (another XDG_CACHE_HOME) makes tempest init fail.
		(cd "$(dirname "$TEMPEST_DIR")" && tempest init --workspace-path "$TEMPEST_DIR.workspaces.yaml" "$(basename "$TEMPEST_DIR")") >/dev/null ||
			die "tempest init failed"
	fi
	mkdir -p "$TEMPEST_DIR/etc" "$TEMPEST_DIR/locks"
	tempest_conf "$TEMPEST_DIR/etc/tempest.conf" || die "could not write tempest.conf"
	local selection=(--include-list "$list")
	if [[ -n "${NIMBUS_IT_TEMPEST_REGEX:-}" ]]; then
		selection=(--regex "$NIMBUS_IT_TEMPEST_REGEX")
	fi
	local want entries declared
	entries=$(grep -cvE '^\s*(#|$)' "$list")
	declared=$(sed -n 's/^# count: *\([0-9]*\).*/\1/p' "$list" | head -n1)
	if [[ -n "$declared" ]]; then
		eq "$(basename "$list") header count matches its entries" "grep -c entries $list" "$entries" "$declared" || true
	fi
	# The test methods the selection names (an idempotent id may name a
	# method in several classes).
	(cd "$TEMPEST_DIR" && tempest run --list-tests "${selection[@]}" 2>/dev/null | grep '^tempest\.' | sed 's/\[.*//') >"$WORK/listed.txt" || true
	want=$(grep -c . "$WORK/listed.txt" || true)
	echo "  workspace $TEMPEST_DIR; ${NIMBUS_IT_TEMPEST_REGEX:-$want test methods from $entries entries of $list}"
	local rc=0
	# Four workers on two cores: the fake driver's steps and Debian's
	# Tempest's 10 s sleep before every subnet delete are waits, not work
	# (594 tests: 9.7 min at 4 workers, about 16 at 2).
	(cd "$TEMPEST_DIR" && timeout "${NIMBUS_IT_TEMPEST_TIMEOUT:-900}" \
		tempest run --concurrency "${NIMBUS_IT_TEMPEST_CONCURRENCY:-4}" "${selection[@]}") \
		>"$WORK/tempest.out" 2>&1 || rc=$?
	cp "$WORK/tempest.out" "$TEMPEST_DIR/last-run.out" 2>/dev/null || true
	# Per-test lines look like "{0} tempest.api...test_x [0.1s] ... ok".
	local tp tf ts
	tp=$(grep -cE '\.\.\. ok$' "$WORK/tempest.out" || true)
	tf=$(grep -cE '\.\.\. FAILED$' "$WORK/tempest.out" || true)
	# Skipped test methods (a setUpClass skip names its class, not a test).
	ts=$(grep -E '\.\.\. SKIPPED' "$WORK/tempest.out" | grep -cv 'setUpClass' || true)
	grep -E '\.\.\. (ok|FAILED|SKIPPED)' "$WORK/tempest.out" | sed 's/^{[0-9]*} /  /' || true
	PASSED=$((PASSED + tp))
	echo "  $name: $tp passed, $tf failed, $ts skipped (exit $rc)"
	# Every listed test method must run and pass. A method may be left
	# out only when it, or its class, was skipped for a reason the pass
	# allows (skip_reason), and no more than skips_ok methods on their own.
	local short=0 missing
	if [[ -z "${NIMBUS_IT_TEMPEST_REGEX:-}" ]]; then
		missing=$(python3 - "$WORK/listed.txt" "$WORK/tempest.out" "$skip_reason" "$skips_ok" <<'PY'
import re, sys
listed = [l.strip() for l in open(sys.argv[1]) if l.strip()]
out = open(sys.argv[2]).read().splitlines()
allowed = re.compile(sys.argv[3]) if sys.argv[3] else None
passed, skipped, class_skip = set(), {}, {}
for l in out:
    l = re.sub(r'^\{\d+\} ', '', l).strip()
    m = re.match(r'setUpClass \((\S+)\) \.\.\. SKIPPED: (.*)', l)
    if m:
        class_skip[m.group(1)] = m.group(2)
        continue
    m = re.match(r'(tempest\.\S+?)(\[\S*\])? \[[\d.]+s\] \.\.\. (ok|SKIPPED: (.*))$', l)
    if m:
        if m.group(3) == 'ok':
            passed.add(m.group(1))
        else:
            skipped[m.group(1)] = m.group(4)
bad, own = [], 0
for t in listed:
    if t in passed:
        continue
    reason = skipped.get(t)
    if reason is not None:
        own += 1
    else:
        reason = class_skip.get(t.rsplit('.', 1)[0])
    if reason is None or not allowed or not allowed.search(reason) or own > int(sys.argv[4]):
        bad.append('%s (%s)' % (t, reason or 'did not run'))
print('\n'.join(bad))
PY
		)
		if [[ -n "$missing" ]]; then
			short=1
			echo "  $name: listed test methods that did not pass:" >&2
			printf '%s\n' "$missing" | sed 's/^/    /' | head -n 40 >&2
		fi
	fi
	if [[ $rc -ne 0 || $tf -ne 0 || $tp -eq 0 || $short -ne 0 ]]; then
		FAILED=$((FAILED + (tf > 0 ? tf : 1)))
		FAILURES+=("$name")
		echo "---- tempest output (failures) ----" >&2
		sed -n '/^===*$/,$p' "$WORK/tempest.out" | head -n 400 >&2
		tail -n 30 "$WORK/tempest.out" >&2
		echo "  full output: $TEMPEST_DIR/last-run.out; log: $TEMPEST_DIR/tempest.log" >&2
	fi
}

# interop_list writes the include list of the interop guideline's
# required tests (interop-2020.06.txt), by idempotent id as a
# certification run selects them, less those the validation pass runs on
# real VMs (tempest-validation.txt).
interop_list() {
	local out=$1
	{
		echo "# Written by run.sh from interop-2020.06.txt"
		grep -vE '^\s*(#|$)' "$HERE/interop-2020.06.txt" | while IFS=$'\t' read -r test _ id; do
			if grep -qF "$(printf '%s' "$test" | sed 's/\./\\./g')\\[" "$HERE/tempest-validation.txt"; then
				continue
			fi
			printf '%s\n' "$id" | sed 's/^id-/\\[.*id-/; s/$/[],]/'
		done
	} >"$out"
}

if [[ "$RUN_TEMPEST" == 1 ]]; then
	if [[ "${NIMBUS_IT_CURATED:-1}" == 1 ]]; then
		run_tempest
	fi
	if [[ "${NIMBUS_IT_INTEROP:-1}" == 1 && -z "${NIMBUS_IT_TEMPEST_REGEX:-}" ]]; then
		# The interop guideline's required tests as a certification run
		# configures Tempest: every extension claimed (api_extensions = all),
		# IPv6 on (Tempest's default: the IPv6 classes of the listed tests
		# run too) and the fake driver at its default 500 ms step. Only
		# the Xen-only test may skip.
		stop_nimbus
		NIMBUS_IT_FAKE_DELAY=500ms start_nimbus
		interop_list "$WORK/interop-tests.txt"
		CERTIFY=1 run_tempest "interop 2020.06" "$WORK/interop-tests.txt" 1 'Xen|xenapi'
	fi
fi

if [[ -n "$VALIDATION_PID" ]]; then
	step "validation pass (test/integration/validation.sh, run beside this one)"
	wait "$VALIDATION_PID" || true
	VALIDATION_PID=""
	cat "$WORK/validation.out"
	read -r vp vf < <(sed -n 's/^validation: \([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "$WORK/validation.out" | tail -n1) ||
		{ vp=0 vf=1; }
	PASSED=$((PASSED + vp))
	FAILED=$((FAILED + vf))
	((vf == 0)) || FAILURES+=("validation pass")
fi

echo
if ((FAILED > 0)); then
	echo "failed checks:" >&2
	printf '  %s\n' "${FAILURES[@]}" >&2
fi
echo "integration: $PASSED passed, $FAILED failed"
((FAILED == 0))

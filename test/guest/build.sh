#!/usr/bin/env bash
# Build the Nimbus test guest: a tiny Linux made only from Debian packages
# (a Debian cloud kernel, busybox-static, dropbear), for the QEMU driver's
# tests. See FINDINGS §2 in the QEMU notes and internal/testenv/guest.go.
#
#   test/guest/build.sh [OUTDIR]
#
# OUTDIR defaults to $NIMBUS_CACHE/test-guest-v2, where NIMBUS_CACHE
# defaults to ${XDG_CACHE_HOME:-$HOME/.cache}/nimbus. It gets:
#   guest.qcow2  MBR + syslinux; p1 FAT16 "BOOT" (vmlinuz, initrd.img,
#                syslinux.cfg), p2 ext4 "root" (with a journal)
#   vmlinuz, initrd.img   for direct kernel boot (-kernel/-initrd)
#   cmdline      the kernel command line for direct kernel boot (-append)
#   manifest     package versions and sizes
#   stamp        hash of this script, rootfs/ and iobench/; the build is
#                skipped when it matches
# The guest's /usr/bin/iobench (4 KiB random I/O with O_DIRECT at a queue
# depth, for the volume benchmarks) is built from iobench/ with the host's
# Go toolchain (go, or $GO), static.
# and the path of OUTDIR is printed on stdout. Downloaded .debs are kept in
# $NIMBUS_CACHE/debs, so a rebuild needs no network.
#
# Only apt (for missing host tools; as root or with password-less sudo) needs
# privileges: no loop devices, no mounts. Exit status 3 means a host tool is
# missing and cannot be installed.
#
# Bump GUEST_VERSION when the guest changes in a way a cached build must not
# hide (the stamp already covers this script and rootfs/).
set -euo pipefail

GUEST_VERSION=v2
# Kernel command line, for syslinux.cfg and the cmdline file.
CMDLINE="root=LABEL=root console=ttyS0,115200 quiet"
# Modules the initramfs loads to find the root disk (ext4 is built in).
INITRAMFS_MODULES="virtio_pci virtio_blk"
ROOT_MIB=128 # size of the ext4 root partition

export PATH=$PATH:/usr/sbin:/sbin
export LC_ALL=C MTOOLS_SKIP_CHECK=1

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${NIMBUS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nimbus}
out=${1:-$cache/test-guest-$GUEST_VERSION}
case "$out" in /*) ;; *) out=$PWD/$out ;; esac
debs=$cache/debs
start=$(date +%s.%N)

log() { printf 'build.sh: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

inputs_hash() {
	(
		cd "$here"
		sha256sum build.sh
		find rootfs iobench -type f ! -name '*_test.go' -print0 | sort -z | xargs -0 -r sha256sum
		echo "$GUEST_VERSION"
	) | sha256sum | cut -d' ' -f1
}
want=$(inputs_hash)

up_to_date() {
	local f
	for f in guest.qcow2 vmlinuz initrd.img cmdline stamp; do
		[ -s "$out/$f" ] || return 1
	done
	[ "$(head -n 1 "$out/stamp")" = "$want" ]
}

if up_to_date; then
	echo "$out"
	exit 0
fi

# From here on only OUTDIR goes to stdout (fd 3); tools' chatter goes to
# stderr.
exec 3>&1 1>&2
mkdir -p "$(dirname "$out")" "$debs"
exec 9>"$out.lock"
if ! flock -n 9; then
	log "waiting for another build of $out"
	flock 9
fi
if up_to_date; then
	echo "$out" >&3
	exit 0
fi
log "building $out"
# Leftovers of builds that were killed (we hold the lock: none is running).
find "$(dirname "$out")" -maxdepth 1 -name ".$(basename "$out").tmp.*" -exec rm -rf {} +
find "$debs" -maxdepth 1 -name '.dl.*' -mmin +60 -exec rm -rf {} +

# ---------------------------------------------------------------- host tools

SUDO=()
can_admin() {
	if [ "$(id -u)" = 0 ]; then
		return 0
	fi
	if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
		SUDO=(sudo -n)
		return 0
	fi
	return 1
}

apt_updated=
apt_update() {
	[ -z "$apt_updated" ] || return 0
	apt_updated=1
	can_admin || return 1
	log "apt-get update"
	"${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=600 -qq update >&2 || return 1
}

missing=()
need() { # need TOOL PACKAGE: TOOL is a command or an absolute path
	case "$1" in
	/*) [ -e "$1" ] || missing+=("$2") ;;
	*) command -v "$1" >/dev/null || missing+=("$2") ;;
	esac
}
need qemu-img qemu-utils
need mkfs.ext4 e2fsprogs
need mkfs.vfat dosfstools
need mcopy mtools
need syslinux syslinux
need /usr/lib/syslinux/mbr/mbr.bin syslinux-common
need sfdisk fdisk
need cpio cpio
need readelf binutils
need depmod kmod
need modprobe kmod
need gzip gzip
need dpkg-deb dpkg
need apt-get apt
GO=${GO:-go}
if ! command -v "$GO" >/dev/null; then
	log "missing host tool: $GO (the Go toolchain, to build iobench/); set GO or put go on PATH"
	exit 3
fi
if [ ${#missing[@]} -gt 0 ]; then
	mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
	if ! can_admin; then
		log "missing host tools (packages: ${missing[*]}); run as root or install them"
		exit 3
	fi
	log "installing ${missing[*]}"
	install=("${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "${missing[@]}")
	if ! DEBIAN_FRONTEND=noninteractive "${install[@]}" >&2; then
		apt_update || true
		DEBIAN_FRONTEND=noninteractive "${install[@]}" >&2 || {
			log "cannot install ${missing[*]}"
			exit 3
		}
	fi
fi

# ---------------------------------------------------------------- packages

tmp=$(mktemp -d "$(dirname "$out")/.$(basename "$out").tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

aptopts=(-q)
[ "$(id -u)" != 0 ] || aptopts+=(-o APT::Sandbox::User=root)

# candidates PKG... fills cand[PKG] with the apt candidate versions (one
# apt-cache run: each takes about a second).
declare -A cand=()
candidates() {
	local p v
	while read -r p v; do
		[ "$v" = "(none)" ] || cand[$p]=$v
	done < <(apt-cache policy "$@" 2>/dev/null |
		awk '/^[^ ].*:$/ { p = substr($1, 1, length($1) - 1) } $1 == "Candidate:" { print p, $2 }')
}

# cached PKG prints the path of PKG's .deb in $debs: the candidate
# version, or else (offline, no apt lists, a failed download) the newest
# cached one.
cached() {
	local pkg=$1 ver=${cand[$1]:-} f
	if [ -n "$ver" ]; then
		for f in "$debs/${pkg}_${ver//:/%3a}_"*.deb; do
			if [ -s "$f" ]; then
				echo "$f"
				return 0
			fi
		done
	fi
	f=$(find "$debs" -maxdepth 1 -name "${pkg}_*.deb" | sort -V | tail -n 1)
	[ -n "$f" ] || return 1
	[ -z "$ver" ] || log "using $(basename "$f") instead of $pkg=$ver"
	echo "$f"
}

# fetch PKG... downloads the candidate versions not yet in $debs (in one
# apt-get run) and prints the paths of the packages' .debs.
fetch() {
	local p get=() dl f
	for p in "$@"; do
		if [ -n "${cand[$p]:-}" ] && ! compgen -G "$debs/${p}_${cand[$p]//:/%3a}_*.deb" >/dev/null; then
			get+=("$p=${cand[$p]}")
		fi
	done
	if [ ${#get[@]} -gt 0 ]; then
		dl=$(mktemp -d "$debs/.dl.XXXXXX")
		if (cd "$dl" && apt-get download "${aptopts[@]}" "${get[@]}" >&2); then
			for f in "$dl"/*.deb; do
				mv "$f" "$debs/"
			done
		else
			log "cannot download ${get[*]}; trying the cache"
		fi
		rm -rf "$dl"
	fi
	for p in "$@"; do
		cached "$p" || die "no package $p (no apt candidate, nothing cached in $debs)"
	done
}

# The kernel: the versioned package linux-image-cloud-amd64 depends on.
kernel_package() {
	apt-cache depends linux-image-cloud-amd64 2>/dev/null |
		awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }'
}
kpkg=$(kernel_package || true)
if [ -z "$kpkg" ] && apt_update; then
	kpkg=$(kernel_package || true)
fi

# dropbear-bin and what it depends on, recursively (libraries; only those
# its binaries need end up in the guest). Remembered for offline rebuilds.
closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
	--no-breaks --no-replaces --no-enhances dropbear-bin 2>/dev/null | grep -v '^[ <]' | sort -u || true)
if [ -n "$closure" ]; then
	echo "$closure" >"$debs/dropbear-bin.closure"
elif [ -s "$debs/dropbear-bin.closure" ]; then
	closure=$(cat "$debs/dropbear-bin.closure")
else
	die "cannot resolve the dependencies of dropbear-bin"
fi

# shellcheck disable=SC2086 # package names
candidates $kpkg busybox-static $closure
if [ -z "${cand[busybox-static]:-}" ] && apt_update; then
	# shellcheck disable=SC2086 # package names
	candidates $kpkg busybox-static $closure
fi

if [ -z "$kpkg" ]; then
	# Offline without apt lists: the newest cached kernel.
	kpkg=$(find "$debs" -maxdepth 1 -name 'linux-image-[0-9]*-cloud-amd64_*.deb' -printf '%f\n' |
		sort -V | tail -n 1 | cut -d_ -f1)
	[ -n "$kpkg" ] || die "cannot resolve linux-image-cloud-amd64"
fi
# shellcheck disable=SC2086 # package names
mapfile -t pkgdebs < <(fetch "$kpkg" busybox-static $closure)
[ ${#pkgdebs[@]} -eq $((2 + $(echo "$closure" | wc -w))) ] || die "missing packages"

pk=$tmp/pkgs
mkdir -p "$pk"
: >"$tmp/manifest"
for d in "${pkgdebs[@]}"; do
	dpkg-deb -x "$d" "$pk"
	# shellcheck disable=SC2016 # dpkg-query's format
	dpkg-deb --show --showformat='${Package} ${Version}\n' "$d" >>"$tmp/manifest"
done
log "packages: $(sed 's/ /=/' "$tmp/manifest" | paste -sd' ')"

kver=$(ls "$pk/lib/modules")
[ "$(echo "$kver" | wc -l)" = 1 ] || die "expected one kernel in $pk/lib/modules, got: $kver"
depmod -b "$pk" "$kver"

# modfiles MODULE... prints the module files (relative to the package tree)
# to load for MODULE..., dependencies first, each once; built-ins are skipped.
modfiles() {
	local m
	for m in "$@"; do
		modprobe -d "$pk" -S "$kver" --show-depends "$m" || die "no module $m in $kver"
	done | awk -v pre="$pk/" '$1 == "insmod" { p = $2; sub("^" pre, "", p); if (!seen[p]++) print p }'
}

# ---------------------------------------------------------------- root file system

root=$tmp/root
mkdir -p "$root"
cp -R "$here/rootfs/." "$root/"
chmod -R u=rwX,go=rX "$root"
# Scripts (#!) are executable whatever mode the checkout gave them.
# shellcheck disable=SC2038 # our own file names: no newlines
find "$root" -type f -exec awk 'FNR == 1 { if (/^#!/) print FILENAME; nextfile }' {} + |
	xargs -r -d '\n' chmod 0755
chmod 0600 "$root/etc/shadow"
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,run,tmp,mnt,root,home,var/lib/nimbus,var/log,etc/dropbear,lib/x86_64-linux-gnu,lib64}
chmod 0700 "$root/root"
chmod 1777 "$root/tmp"
ln -s /run "$root/var/run"

# busybox and its applets (the initramfs makes its links at boot).
install -m 0755 "$pk/bin/busybox" "$root/bin/busybox"
for a in $("$pk/bin/busybox" --list-full); do
	[ -e "$root/$a" ] || [ -L "$root/$a" ] || ln -s /bin/busybox "$root/$a"
done

# dropbear and the shared libraries it needs.
for b in usr/sbin/dropbear usr/bin/dropbearkey usr/bin/dbclient usr/bin/dropbearconvert; do
	install -m 0755 "$pk/$b" "$root/$b"
done
findlib() {
	local d
	for d in lib/x86_64-linux-gnu usr/lib/x86_64-linux-gnu lib64 lib usr/lib; do
		if [ -e "$pk/$d/$1" ]; then
			echo "$pk/$d/$1"
			return 0
		fi
	done
	return 1
}
copylibs() {
	local lib src
	for lib in $(readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
		[ ! -e "$root/lib/x86_64-linux-gnu/$lib" ] || continue
		src=$(findlib "$lib") || die "no $lib (needed by $1) in the packages"
		cp -L "$src" "$root/lib/x86_64-linux-gnu/$lib"
		copylibs "$root/lib/x86_64-linux-gnu/$lib"
	done
}
for b in usr/sbin/dropbear usr/bin/dropbearkey usr/bin/dbclient usr/bin/dropbearconvert; do
	copylibs "$root/$b"
	interp=$(readelf -l "$root/$b" | sed -n 's/.*program interpreter: \(.*\)]/\1/p')
	if [ -n "$interp" ] && [ ! -e "$root$interp" ]; then
		mkdir -p "$root$(dirname "$interp")"
		base=$(basename "$interp")
		if [ -e "$root/lib/x86_64-linux-gnu/$base" ] && [ "$interp" != "/lib/x86_64-linux-gnu/$base" ]; then
			ln -s "/lib/x86_64-linux-gnu/$base" "$root$interp"
		else
			cp -L "$pk$interp" "$root$interp"
		fi
	fi
done

# iobench, static (the guest has no C library for it).
(cd "$here/iobench" && CGO_ENABLED=0 GOOS=linux GOARCH=amd64 GOWORK=off GOFLAGS=-mod=readonly \
	"$GO" build -trimpath -ldflags='-s -w' -o "$root/usr/bin/iobench" .) || die "cannot build iobench"

# Kernel modules: what rcS loads (etc/modules.load) and the initramfs set,
# with a modules.dep for busybox modprobe.
mods=$(awk '$1 !~ /^#/ && NF { print $1 }' "$root/etc/modules.load")
# shellcheck disable=SC2086 # module names
for f in $(modfiles $mods $INITRAMFS_MODULES); do
	mkdir -p "$root/$(dirname "$f")"
	cp "$pk/$f" "$root/$f"
done
for f in modules.order modules.builtin modules.builtin.modinfo; do
	[ ! -e "$pk/lib/modules/$kver/$f" ] || cp "$pk/lib/modules/$kver/$f" "$root/lib/modules/$kver/"
done
depmod -b "$root" "$kver"

# ---------------------------------------------------------------- initramfs

ird=$tmp/initramfs
mkdir -p "$ird"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,tmp,newroot,etc,usr/lib/nimbus}
install -m 0755 "$pk/bin/busybox" "$ird/bin/busybox"
ln -s busybox "$ird/bin/sh"
install -m 0755 "$here/rootfs/usr/lib/nimbus/initramfs-init" "$ird/init"
install -m 0644 "$here/rootfs/usr/lib/nimbus/lib.sh" "$ird/usr/lib/nimbus/lib.sh"
: >"$ird/etc/modules.initramfs"
# shellcheck disable=SC2086 # module names
for f in $(modfiles $INITRAMFS_MODULES); do
	mkdir -p "$ird/$(dirname "$f")"
	cp "$pk/$f" "$ird/$f"
	echo "/$f" >>"$ird/etc/modules.initramfs"
done

# newc NAME MODE MAJOR MINOR INO writes a cpio (newc) entry without data:
# for the device node the build cannot create without root. MODE is octal.
newc() {
	local name=$1 mode=$2 major=$3 minor=$4 ino=$5 n pad
	n=$((${#name} + 1))
	printf '070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X' \
		"$ino" "$((8#$mode))" 0 0 1 0 0 0 0 "$major" "$minor" "$n" 0
	printf '%s\0' "$name"
	pad=$(((4 - (110 + n) % 4) % 4))
	head -c "$pad" /dev/zero
}
{
	(cd "$ird" && find . -mindepth 1 | sort | cpio -o -H newc -R 0:0 --quiet)
	# /dev/console, so the kernel can give /init a console.
	newc dev 040755 0 0 900001
	newc dev/console 020600 5 1 900002
	newc 'TRAILER!!!' 0 0 0 0
} | gzip -9 -n >"$tmp/initrd.img"

# ---------------------------------------------------------------- disk image

cp "$pk/boot/vmlinuz-$kver" "$tmp/vmlinuz"
echo "$CMDLINE" >"$tmp/cmdline"
cat >"$tmp/syslinux.cfg" <<EOF
SERIAL 0 115200
DEFAULT nimbus
PROMPT 0
TIMEOUT 0
LABEL nimbus
  LINUX /vmlinuz
  INITRD /initrd.img
  APPEND $CMDLINE
EOF

mib() { # size in MiB of FILE..., rounded up
	du -cb "$@" | awk 'END { printf "%d\n", ($1 + 1048575) / 1048576 }'
}
boot_mib=$(($(mib "$tmp/vmlinuz" "$tmp/initrd.img") * 105 / 100 + 3))
boot=$tmp/boot.img
mkfs.vfat -C "$boot" $((boot_mib * 1024)) -F 16 -n BOOT -h 2048 >/dev/null
mcopy -i "$boot" "$tmp/vmlinuz" "$tmp/initrd.img" "$tmp/syslinux.cfg" ::/
syslinux --install "$boot"

rootimg=$tmp/root.img
used=$(du -sm "$root" | cut -f1)
[ "$used" -lt $((ROOT_MIB / 2)) ] || die "root file system of $used MiB does not fit in $ROOT_MIB MiB"
mkfs.ext4 -q -F -L root -d "$root" -E root_owner=0:0 "$rootimg" "${ROOT_MIB}M"

disk=$tmp/disk.raw
total_mib=$((1 + boot_mib + ROOT_MIB))
truncate -s "${total_mib}M" "$disk"
sfdisk -q --no-reread --no-tell-kernel "$disk" <<EOF
label: dos
unit: sectors
start=2048, size=$((boot_mib * 2048)), type=6, bootable
start=$((2048 + boot_mib * 2048)), size=$((ROOT_MIB * 2048)), type=83
EOF
dd if=/usr/lib/syslinux/mbr/mbr.bin of="$disk" bs=440 count=1 conv=notrunc status=none
dd if="$boot" of="$disk" bs=1M seek=1 conv=notrunc,sparse status=none
dd if="$rootimg" of="$disk" bs=1M seek=$((1 + boot_mib)) conv=notrunc,sparse status=none

stage=$tmp/out
mkdir -p "$stage"
qemu-img convert -c -O qcow2 "$disk" "$stage/guest.qcow2"
mv "$tmp/vmlinuz" "$tmp/initrd.img" "$tmp/cmdline" "$stage/"
{
	echo "guest $GUEST_VERSION, kernel $kver"
	echo "cmdline $CMDLINE"
	echo "rootfs $(du -sk "$root" | cut -f1) KiB, initrd.img $(($(stat -c %s "$stage/initrd.img") / 1024)) KiB," \
		"vmlinuz $(($(stat -c %s "$stage/vmlinuz") / 1024)) KiB, guest.qcow2 $(($(stat -c %s "$stage/guest.qcow2") / 1024)) KiB" \
		"(virtual ${total_mib} MiB: BOOT ${boot_mib} MiB, root ${ROOT_MIB} MiB)"
	cat "$tmp/manifest"
} >"$stage/manifest"
echo "$want" >"$stage/stamp"

# Into place: a rename when OUTDIR is new, else the old one is moved aside
# first (everyone else waits on the lock or sees a complete directory).
if [ -e "$out" ]; then
	mv -T "$out" "$tmp/old"
fi
mv -T "$stage" "$out"
log "built $out in $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s: $(sed -n 3p "$out/manifest")"
echo "$out" >&3

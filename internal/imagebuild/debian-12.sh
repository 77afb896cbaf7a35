#!/usr/bin/env bash
# Build a Debian 12 (bookworm) cloud image from Debian's packages only, for
# `nimbus admin image build debian-12` (internal/imagebuild embeds this file).
#
#   bash debian-12.sh OUTDIR
#
# OUTDIR gets:
#   disk.qcow2  MBR + syslinux; p1 FAT16 "BOOT" (vmlinuz, initrd.img,
#               syslinux.cfg), p2 ext4 "root", last, so growroot and
#               cloud-init's growpart grow it to the server's disk
#   manifest    package versions (sorted), sizes, the rootfs tar's sha256
#   sha256      the sha256 of disk.qcow2
# Downloaded .debs are kept in $NIMBUS_CACHE/debs-debian-12, so a rebuild
# downloads only the package lists and what changed. Needs root (or
# password-less sudo) for apt, mmdebstrap and to keep file owners; no loop
# devices, no mounts of the image.
#
# Reproducible: the same packages give the same rootfs tar (mmdebstrap with
# SOURCE_DATE_EPOCH) and, on the same host, the same disk image (fixed
# UUIDs, hash seed, volume id and times). Exit status 3: a host tool is
# missing and cannot be installed.
set -euo pipefail

out=${1:?usage: debian-12.sh OUTDIR}
case "$out" in /*) ;; *) out=$PWD/$out ;; esac
cache=${NIMBUS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nimbus}
debs=$cache/debs-debian-12
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1686355200} # Debian 12.0, 2023-06-10
export E2FSPROGS_FAKE_TIME=$SOURCE_DATE_EPOCH
export PATH=$PATH:/usr/sbin:/sbin LC_ALL=C MTOOLS_SKIP_CHECK=1 TZ=UTC
# Fixed identities: two builds of the same packages are the same bytes.
ROOT_UUID=6e696d62-7573-4465-6269-616e31320001
HASH_SEED=6e696d62-7573-4465-6269-616e31320002
BOOT_VOLID=4e494d42
BOOT_FSUUID=4E49-4D42 # the FAT volume id as blkid shows it
CMDLINE="root=UUID=$ROOT_UUID ro console=tty0 console=ttyS0,115200"
PACKAGES=(
	linux-image-cloud-amd64 initramfs-tools systemd-sysv udev dbus
	systemd-resolved cloud-init openssh-server cloud-guest-utils
	cloud-initramfs-growroot qemu-guest-agent sudo e2fsprogs
	ca-certificates less locales netbase procps iproute2 iputils-ping
)

log() { printf 'debian-12.sh: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}
start=$(date +%s.%N)
exec 3>&1 1>&2

SUDO=()
if [ "$(id -u)" != 0 ]; then
	sudo -n true 2>/dev/null || {
		log "needs root or password-less sudo (apt, mmdebstrap, file owners)"
		exit 3
	}
	SUDO=(sudo -n --preserve-env=SOURCE_DATE_EPOCH,E2FSPROGS_FAKE_TIME,LC_ALL,TZ)
fi

# ---------------------------------------------------------------- host tools
missing=()
need() { # need TOOL PACKAGE
	case "$1" in
	/*) [ -e "$1" ] || missing+=("$2") ;;
	*) command -v "$1" >/dev/null || missing+=("$2") ;;
	esac
}
need mmdebstrap mmdebstrap
need qemu-img qemu-utils
need mkfs.ext4 e2fsprogs
need mkfs.vfat dosfstools
need mcopy mtools
need syslinux syslinux
need /usr/lib/syslinux/mbr/mbr.bin syslinux-common
need sfdisk fdisk
need /usr/share/keyrings/debian-archive-keyring.gpg debian-archive-keyring
if [ ${#missing[@]} -gt 0 ]; then
	log "installing ${missing[*]}"
	install=("${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "${missing[@]}")
	"${install[@]}" || { "${SUDO[@]}" apt-get -qq update && "${install[@]}"; } || {
		log "cannot install ${missing[*]}"
		exit 3
	}
fi

mkdir -p "$(dirname "$out")" "$debs"
tmp=$(mktemp -d "$(dirname "$out")/.$(basename "$out").tmp.XXXXXX")
trap '"${SUDO[@]}" rm -rf "$tmp"' EXIT

# ---------------------------------------------------------------- root file system
# mmdebstrap writes a tar (bit-reproducible with SOURCE_DATE_EPOCH); the
# hooks reuse and refill the .deb cache and make the tree a cloud image.
sources=$tmp/debian.sources
cat >"$sources" <<EOF
Types: deb
URIs: ${NIMBUS_DEBIAN_MIRROR:-http://deb.debian.org/debian}
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${NIMBUS_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
custom=$tmp/customize.sh
cat >"$custom" <<'EOF'
#!/bin/sh
# Runs with the tree in $1 (mmdebstrap customize hook).
set -eu
r=$1
chroot "$r" systemctl enable systemd-networkd.service systemd-resolved.service
# cloud-init: the datasources Nimbus gives (config drive, NoCloud, the
# metadata service), no slow probing of others; C.UTF-8, which needs no
# locale-gen at first boot.
cat >"$r/etc/cloud/cloud.cfg.d/90-nimbus.cfg" <<'CFG'
datasource_list: [ConfigDrive, NoCloud, OpenStack, None]
locale: C.UTF-8
CFG
printf 'UUID=%s / ext4 rw,discard,errors=remount-ro 0 1\nUUID=%s /boot/syslinux vfat defaults,nofail,umask=0077 0 0\n' \
	"$ROOT_UUID" "$BOOT_FSUUID" >"$r/etc/fstab"
mkdir -p "$r/boot/syslinux"
# syslinux boots the kernel on the FAT partition: a new kernel or initramfs
# (apt upgrade) is copied there when it is the newest installed.
mkdir -p "$r/etc/initramfs/post-update.d"
cat >"$r/etc/initramfs/post-update.d/nimbus-syslinux" <<'HOOK'
#!/bin/sh
# update-initramfs calls this with the kernel version and the initrd.
set -e
newest=$(ls /boot/vmlinuz-* 2>/dev/null | sed 's|^/boot/vmlinuz-||' | sort -V | tail -n 1)
if [ "$1" != "$newest" ] || ! mountpoint -q /boot/syslinux; then
	exit 0
fi
cp "/boot/vmlinuz-$1" /boot/syslinux/vmlinuz.new
cp "$2" /boot/syslinux/initrd.img.new
mv /boot/syslinux/vmlinuz.new /boot/syslinux/vmlinuz
mv /boot/syslinux/initrd.img.new /boot/syslinux/initrd.img
sync
HOOK
chmod 0755 "$r/etc/initramfs/post-update.d/nimbus-syslinux"
echo localhost >"$r/etc/hostname"
# Per-instance identity is made at first boot, not baked in.
rm -f "$r"/etc/ssh/ssh_host_*key* "$r/var/lib/dbus/machine-id"
: >"$r/etc/machine-id"
rm -rf "$r"/var/lib/apt/lists/* "$r"/var/log/*.log "$r"/var/log/apt/* \
	"$r/var/cache/ldconfig/aux-cache" "$r"/var/cache/debconf/*-old "$r"/var/lib/dpkg/*-old
EOF
chmod 0755 "$custom"
log "mmdebstrap bookworm (${#PACKAGES[@]} packages and their dependencies)"
"${SUDO[@]}" env ROOT_UUID="$ROOT_UUID" BOOT_FSUUID="$BOOT_FSUUID" mmdebstrap --mode=root --variant=minbase \
	--include="$(printf '%s\n' "${PACKAGES[@]}" | sort | paste -sd,)" \
	--aptopt='Apt::Install-Recommends "false"' \
	--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
	--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
	--skip=download/empty --skip=essential/unlink \
	--setup-hook='mkdir -p "$1"/var/cache/apt/archives/' \
	--setup-hook="sync-in $debs /var/cache/apt/archives/" \
	--customize-hook="sync-out /var/cache/apt/archives $debs" \
	--customize-hook='rm -f "$1"/var/cache/apt/archives/*.deb' \
	--customize-hook="$custom" \
	bookworm "$tmp/rootfs.tar" "$sources" >&2
"${SUDO[@]}" chown -R "$(id -u):$(id -g)" "$debs"
"${SUDO[@]}" rm -f "$debs/lock" && "${SUDO[@]}" rm -rf "$debs/partial"

root=$tmp/root
mkdir -p "$root"
"${SUDO[@]}" tar -C "$root" --numeric-owner --xattrs --xattrs-include='*' -xpf "$tmp/rootfs.tar"
"${SUDO[@]}" chroot "$root" dpkg-query -W -f '${Package} ${Version}\n' | sort >"$tmp/packages"
kver=$(cd "$root/boot" && ls vmlinuz-* | sed 's/^vmlinuz-//')
[ "$(echo "$kver" | wc -l)" = 1 ] || die "expected one kernel in /boot, got: $kver"
grep -q '^  *name: debian$' "$root/etc/cloud/cloud.cfg" || die "cloud-init's default user is not debian"

# ---------------------------------------------------------------- disk image
boot_dir=$tmp/bootfiles
mkdir -p "$boot_dir"
"${SUDO[@]}" cat "$root/boot/vmlinuz-$kver" >"$boot_dir/vmlinuz"
"${SUDO[@]}" cat "$root/boot/initrd.img-$kver" >"$boot_dir/initrd.img"
cat >"$boot_dir/syslinux.cfg" <<EOF
SERIAL 0 115200
DEFAULT debian
PROMPT 0
TIMEOUT 0
LABEL debian
  LINUX /vmlinuz
  INITRD /initrd.img
  APPEND $CMDLINE
EOF
touch -d "@$SOURCE_DATE_EPOCH" "$boot_dir"/*
mib() { du -cb "$@" | awk 'END { printf "%d\n", ($1 + 1048575) / 1048576 }'; }
# Room for a second kernel and initramfs: the update hook copies before it
# renames.
boot_mib=$(($(mib "$boot_dir"/*) * 22 / 10 + 16))
boot=$tmp/boot.img
# The label by mlabel: mkfs.vfat stamps its label entry with the time of
# day, mtools with SOURCE_DATE_EPOCH.
mkfs.vfat -C -i "$BOOT_VOLID" "$boot" $((boot_mib * 1024)) -F 16 -h 2048 >/dev/null
mlabel -i "$boot" ::BOOT
mcopy -m -i "$boot" "$boot_dir/vmlinuz" "$boot_dir/initrd.img" "$boot_dir/syslinux.cfg" ::/
syslinux --install "$boot"

used=$("${SUDO[@]}" du -sm "$root" | cut -f1)
root_mib=$(((used * 5 / 4 + 256 + 63) / 64 * 64))
rootimg=$tmp/root.img
"${SUDO[@]}" mkfs.ext4 -q -F -L root -U "$ROOT_UUID" -E "hash_seed=$HASH_SEED,root_owner=0:0" \
	-d "$root" "$rootimg" "${root_mib}M"
# mkfs.ext4 -d copies the tree's ctimes and atimes (the extraction's time):
# every inode gets SOURCE_DATE_EPOCH instead (unused ones are ignored).
inodes=$(dumpe2fs -h "$rootimg" 2>/dev/null | awk -F: '$1 == "Inode count" { print $2 + 0 }')
stamp=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y%m%d%H%M%S)
seq 1 "$inodes" | awk -v t="$stamp" '{
	for (i = 1; i <= 3; i++) printf "set_inode_field <%d> %s %s\n", $1, f[i], t
	for (i = 1; i <= 3; i++) printf "set_inode_field <%d> %s_extra 0\n", $1, f[i]
} BEGIN { split("atime ctime crtime", f) }' >"$tmp/times.debugfs"
"${SUDO[@]}" debugfs -w -f "$tmp/times.debugfs" "$rootimg" >/dev/null 2>&1
fsck=$("${SUDO[@]}" e2fsck -fn "$rootimg" 2>&1) || die "the root file system does not check clean: $fsck"

disk=$tmp/disk.raw
total_mib=$((1 + boot_mib + root_mib))
truncate -s "${total_mib}M" "$disk"
sfdisk -q --no-reread --no-tell-kernel "$disk" <<EOF
label: dos
label-id: 0x$BOOT_VOLID
unit: sectors
start=2048, size=$((boot_mib * 2048)), type=6, bootable
start=$((2048 + boot_mib * 2048)), size=$((root_mib * 2048)), type=83
EOF
dd if=/usr/lib/syslinux/mbr/mbr.bin of="$disk" bs=440 count=1 conv=notrunc status=none
dd if="$boot" of="$disk" bs=1M seek=1 conv=notrunc,sparse status=none
"${SUDO[@]}" dd if="$rootimg" of="$disk" bs=1M seek=$((1 + boot_mib)) conv=notrunc,sparse status=none

stage=$tmp/out
mkdir -p "$stage"
qemu-img convert -c -O qcow2 "$disk" "$stage/disk.qcow2"
sha=$(sha256sum "$stage/disk.qcow2" | cut -d' ' -f1)
echo "$sha" >"$stage/sha256"
{
	echo "debian-12 kernel $kver"
	echo "cmdline $CMDLINE"
	echo "rootfs.tar sha256 $(sha256sum "$tmp/rootfs.tar" | cut -d' ' -f1)"
	echo "disk.qcow2 sha256 $sha"
	echo "size $(stat -c %s "$stage/disk.qcow2") bytes, virtual $((total_mib * 1048576)) bytes (BOOT $boot_mib MiB, root $root_mib MiB, $used MiB used)"
	echo "SOURCE_DATE_EPOCH $SOURCE_DATE_EPOCH"
	cat "$tmp/packages"
} >"$stage/manifest"

if [ -e "$out" ]; then
	mv -T "$out" "$tmp/old"
fi
mv -T "$stage" "$out"
log "built $out in $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
echo "$out" >&3

# Helpers for the Nimbus test guest, sourced by the initramfs /init, rcS,
# rcK and the seed reader. busybox ash.

# say prints a marker line on the console (ttyS0 with console=ttyS0).
say() {
	echo "nimbus-guest: $*" >/dev/console 2>/dev/null || echo "nimbus-guest: $*"
}

# readstr FILE OFFSET LEN prints LEN bytes of FILE at OFFSET, without NULs
# and trailing blanks.
readstr() {
	dd if="$1" bs=1 skip="$2" count="$3" 2>/dev/null | tr -d '\000' | sed 's/[[:space:]]*$//'
}

# fsprobe DEV prints "TYPE LABEL" for the file system on DEV: iso9660, ext4
# or vfat (busybox has no blkid, and its findfs misses small ISOs). It
# fails for anything else, a disk with partitions or an unreadable device
# (an empty CD drive). Few processes: each costs under TCG.
fsprobe() {
	set -- "$1" /sys/class/block/"${1#/dev/}"/"${1#/dev/}"*
	[ ! -e "$2" ] || return 1
	_p=${NIMBUS_TMP:-/tmp}/fsprobe.$$
	if ! dd if="$1" of="$_p" bs=2048 count=17 2>/dev/null; then
		rm -f "$_p"
		return 1
	fi
	_rc=0
	if [ "$(dd if="$_p" bs=1 skip=32769 count=5 2>/dev/null)" = CD001 ]; then
		echo "iso9660 $(readstr "$_p" 32808 32)"
	elif [ "$(od -An -tx1 -j1080 -N2 "$_p")" = " 53 ef" ]; then
		echo "ext4 $(readstr "$_p" 1144 16)"
	else
		case "$(dd if="$_p" bs=1 skip=54 count=5 2>/dev/null)" in
		FAT12 | FAT16) echo "vfat $(readstr "$_p" 43 11)" ;;
		*)
			if [ "$(dd if="$_p" bs=1 skip=82 count=5 2>/dev/null)" = FAT32 ]; then
				echo "vfat $(readstr "$_p" 71 11)"
			else
				_rc=1
			fi
			;;
		esac
	fi
	rm -f "$_p"
	return $_rc
}

# blockdevs prints the block devices a root or seed may live on.
blockdevs() {
	for _d in /dev/sr* /dev/vd* /dev/sd* /dev/xvd* /dev/nvme*n*; do
		[ -b "$_d" ] && echo "$_d"
	done
}

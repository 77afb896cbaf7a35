#!/bin/sh
# record.sh OUT [ROOT]
#
# Records into OUT the sysfs and procfs files that nimbus/internal/host.Discover and
# PassthroughProblems read from the host whose root is ROOT (default /), as a small tree
# that the package's tests can read: CPU topology, NUMA nodes' CPU lists and memory,
# /proc/meminfo, and each PCI device's class, vendor, device and numa_node with its
# iommu_group and driver links. Links are re-created as relative links inside OUT, and
# /dev/vfio entries as empty files (device nodes do not go into git).
#
# Nothing that identifies the host or its owner is recorded: no host name, serials,
# MAC or IP addresses. To send us your host's tree:
#
#     sh record.sh /tmp/myhost && tar czf myhost.tgz -C /tmp myhost
set -eu

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
	echo "usage: $0 OUT [ROOT]" >&2
	exit 2
fi
out=$1
src=${2:-/}
src=${src%/} # "/" becomes "", so "$src/sys" is "/sys"

if [ -e "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ]; then
	echo "$0: $out exists and is not empty" >&2
	exit 1
fi
mkdir -p "$out"

# copy REL copies ROOT/REL to OUT/REL if it is readable. Here and below,
# parameter expansions stand in for dirname and basename: a big host has
# thousands of these files, and a fork each adds up.
copy() {
	[ -r "$src/$1" ] || return 0
	mkdir -p "$out/${1%/*}"
	cat "$src/$1" >"$out/$1" 2>/dev/null || rm -f "$out/$1"
}

cpu=sys/devices/system/cpu
copy $cpu/online
copy $cpu/isolated
for d in "$src"/$cpu/cpu[0-9]*; do
	[ -d "$d/topology" ] || continue
	n=${d##*/}
	for f in core_id physical_package_id thread_siblings_list; do
		copy "$cpu/$n/topology/$f"
	done
done

node=sys/devices/system/node
copy $node/online
for d in "$src"/$node/node[0-9]*; do
	[ -d "$d" ] || continue
	n=${d##*/}
	copy "$node/$n/cpulist"
	copy "$node/$n/meminfo"
done

copy proc/meminfo

pci=sys/bus/pci/devices
for d in "$src"/$pci/*; do
	[ -e "$d/class" ] || continue
	a=${d##*/}
	mkdir -p "$out/$pci/$a"
	for f in class vendor device numa_node; do
		copy "$pci/$a/$f"
	done
	# From OUT/sys/bus/pci/devices/ADDR, ../../../../ is OUT/sys.
	if [ -L "$d/iommu_group" ]; then
		g=$(readlink "$d/iommu_group")
		g=${g##*/}
		ln -s "../../../../kernel/iommu_groups/$g" "$out/$pci/$a/iommu_group"
	fi
	if [ -L "$d/driver" ]; then
		drv=$(readlink "$d/driver")
		drv=${drv##*/}
		ln -s "../../../../bus/pci/drivers/$drv" "$out/$pci/$a/driver"
	fi
done

groups=sys/kernel/iommu_groups
for g in "$src"/$groups/*; do
	[ -d "$g/devices" ] || continue
	n=${g##*/}
	mkdir -p "$out/$groups/$n/devices"
	for m in "$g"/devices/*; do
		[ -e "$m" ] || [ -L "$m" ] || continue
		# From OUT/sys/kernel/iommu_groups/N/devices, ../../../../ is OUT/sys.
		ln -s "../../../../bus/pci/devices/${m##*/}" "$out/$groups/$n/devices/${m##*/}"
	done
done

for f in "$src"/dev/vfio/*; do
	[ -e "$f" ] || continue
	mkdir -p "$out/dev/vfio"
	: >"$out/dev/vfio/${f##*/}"
done

echo "recorded ${2:-/} into $out"

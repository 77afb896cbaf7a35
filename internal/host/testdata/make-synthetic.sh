#!/bin/sh
# make-synthetic.sh rewrites the hand-made trees gpu-2socket and amd-1node, laid out
# as record.sh lays out a recorded host. Run it from anywhere; the trees are in git,
# so this is only needed to change them.
set -eu
cd "$(dirname "$0")"

# w FILE LINE... writes the lines to FILE, making its directory.
w() {
	f=$1
	shift
	mkdir -p "$(dirname "$f")"
	printf '%s\n' "$@" >"$f"
}

# pci TREE ADDR CLASS VENDOR DEVICE NUMA GROUP DRIVER adds a PCI device;
# GROUP or DRIVER "-" leaves that link out.
pci() {
	d=$1/sys/bus/pci/devices/$2
	w "$d/class" "$3"
	w "$d/vendor" "$4"
	w "$d/device" "$5"
	w "$d/numa_node" "$6"
	if [ "$7" != - ]; then
		ln -s "../../../../kernel/iommu_groups/$7" "$d/iommu_group"
		mkdir -p "$1/sys/kernel/iommu_groups/$7/devices"
		ln -s "../../../../bus/pci/devices/$2" "$1/sys/kernel/iommu_groups/$7/devices/$2"
	fi
	if [ "$8" != - ]; then
		ln -s "../../../../bus/pci/drivers/$8" "$d/driver"
	fi
}

# gpu-2socket: two Xeons of 16 cores x 2 threads; Linux numbers the second
# threads after all first threads (siblings N and N+32), socket 0 first.
t=gpu-2socket
rm -rf $t
cpu=$t/sys/devices/system/cpu
w $cpu/online 0-63
w $cpu/isolated 2-15,18-31,34-47,50-63
for i in $(seq 0 63); do
	first=$((i % 32))
	w $cpu/cpu$i/topology/core_id $((i % 16))
	w $cpu/cpu$i/topology/physical_package_id $((first / 16))
	w $cpu/cpu$i/topology/thread_siblings_list "$first,$((first + 32))"
done
node=$t/sys/devices/system/node
w $node/online 0-1
w $node/node0/cpulist 0-15,32-47
w $node/node1/cpulist 16-31,48-63
for n in 0 1; do
	w $node/node$n/meminfo \
		"Node $n MemTotal:       268435456 kB" \
		"Node $n MemFree:        260046848 kB" \
		"Node $n MemUsed:          8388608 kB"
done
w $t/proc/meminfo \
	"MemTotal:       536870912 kB" \
	"MemFree:        520093696 kB" \
	"MemAvailable:   522190848 kB"
#       tree addr         class    vendor device numa group driver
pci $t 0000:00:00.0 0x060000 0x8086 0x09a2 0 0 -           # host bridge
pci $t 0000:00:02.0 0x030000 0x8086 0x4c8a 0 1 i915        # Intel integrated VGA: not for rent
pci $t 0000:03:00.0 0x030000 0x1a03 0x2000 0 2 ast         # BMC's VGA (ASPEED): not a GPU vendor
pci $t 0000:18:00.0 0x020000 0x8086 0x1593 0 20 ice        # E810 NIC
pci $t 0000:65:00.0 0x010802 0x144d 0xa824 0 30 nvme       # NVMe controller
pci $t 0000:17:00.0 0x030200 0x10de 0x20b5 0 40 vfio-pci   # A100 80GB, ready
pci $t 0000:31:00.0 0x030200 0x10de 0x20b5 0 41 vfio-pci   # A100 80GB, ready
pci $t 0000:98:00.0 0x030200 0x10de 0x20b5 1 42 vfio-pci   # A100 80GB, ready
pci $t 0000:b1:00.0 0x030200 0x10de 0x20b5 1 43 vfio-pci   # A100 80GB, ready
pci $t 0000:ca:00.0 0x030200 0x10de 0x27b8 1 50 nvidia     # L4 held by the host's driver
# A PCIe switch without ACS: its downstream ports, the L4 and a NIC behind
# them all land in group 51.
pci $t 0000:e2:00.0 0x060400 0x10b5 0xc010 1 51 pcieport
pci $t 0000:e2:01.0 0x060400 0x10b5 0xc010 1 51 pcieport
pci $t 0000:e3:00.0 0x030200 0x10de 0x27b8 1 51 vfio-pci   # L4 sharing its group
pci $t 0000:e4:00.0 0x020000 0x15b3 0x101d 1 51 mlx5_core  # ConnectX-6 Dx NIC
# /dev/vfio as record.sh leaves it: empty files for the device nodes.
mkdir -p $t/dev/vfio
for g in vfio 40 41 42 43 51; do
	: >$t/dev/vfio/$g
done

# amd-1node: one EPYC-like socket of 8 cores x 2 threads with siblings N and
# N+1 and core ids with gaps (as CCXs leave them), a kernel that shows no
# NUMA nodes, no IOMMU, no GPU (only the BMC's VGA) and no isolated CPUs.
t=amd-1node
rm -rf $t
cpu=$t/sys/devices/system/cpu
w $cpu/online 0-15
w $cpu/isolated ""
set -- 0 1 2 3 8 9 10 11
for i in $(seq 0 15); do
	c=$((i / 2))
	core=$(eval echo "\${$((c + 1))}")
	w $cpu/cpu$i/topology/core_id "$core"
	w $cpu/cpu$i/topology/physical_package_id 0
	w $cpu/cpu$i/topology/thread_siblings_list "$((2 * c))-$((2 * c + 1))"
done
w $t/proc/meminfo \
	"MemTotal:       131900000 kB" \
	"MemFree:        127000000 kB" \
	"MemAvailable:   128000000 kB"
pci $t 0000:00:00.0 0x060000 0x1022 0x1480 -1 - -          # root complex
pci $t 0000:00:01.1 0x060400 0x1022 0x1483 -1 - pcieport   # root port
pci $t 0000:01:00.0 0x010802 0x144d 0xa80a -1 - nvme       # NVMe controller
pci $t 0000:c1:00.0 0x020000 0x14e4 0x16d7 -1 - bnxt_en    # NIC
pci $t 0000:c2:00.0 0x030000 0x1a03 0x2000 -1 - ast        # BMC's VGA

echo "wrote gpu-2socket and amd-1node"

// Package scheduler chooses the host for each new server and keeps, in
// memory, what every host has to give and what is already taken there. It
// is pure: no database, no driver calls, no clock. The compute service feeds
// it the fleet and the claims it reads from the store, asks it to reserve,
// and writes each claim to the store, which re-checks it (the store's
// transaction is the plan applier: a claim it refuses is released here).
//
// Vocabulary:
//
//   - host: one hypervisor host as the driver reports it — logical CPUs
//     grouped into cores (sibling threads) and NUMA nodes, memory per NUMA
//     node, a local disk pool and passthrough GPUs. Reserved CPUs are the
//     host's own and never given out.
//   - cell: the part of a server that lives on one NUMA node of its host:
//     the pinned host CPUs and the memory taken from that node.
//   - claim: all that one server holds on its host: its cells, whole GPUs
//     (by PCI address) and local disk. CPUs and GPUs are held by one claim
//     at most; memory and disk are never overcommitted.
//   - reserve: filter the hosts on counters, weigh those that fit, pick the
//     winner's CPUs and GPUs in detail and take them, all under one lock.
//     apply: record a claim made elsewhere (the store at start-up, another
//     controller), refusing one that conflicts. release: give a claim back.
//   - weigher: the order among hosts that fit: "spread" (most free first,
//     even load) or "pack" (fullest first, whole hosts stay free), after
//     soft affinity and before the host name as the last tie-break.
package scheduler

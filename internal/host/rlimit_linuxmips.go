//go:build linux && (mips || mipsle || mips64 || mips64le)

package host

// rlimitMemlock is RLIMIT_MEMLOCK, which package syscall does not define;
// MIPS numbers it apart from the other architectures.
const rlimitMemlock = 9

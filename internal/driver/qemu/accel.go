package qemu

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Accelerator picks "kvm" or "tcg" for mode, and says why.
//
//   - "tcg" always gives tcg.
//   - "kvm" gives kvm when /dev/kvm opens read-write, else an error: a
//     forced accelerator is not second-guessed any further.
//   - "auto" (or "") gives kvm only when /dev/kvm opens read-write AND the
//     CPU really virtualises: a vmx or svm flag in /proc/cpuinfo, or
//     kvm_intel or kvm_amd loaded (/proc/modules) or built in
//     (/sys/module). Otherwise tcg. A /dev/kvm alone is not enough: nested
//     hosts such as Firecracker VMs with PVM (module kvm_pvm, no vmx) offer
//     a /dev/kvm on which QEMU starts but no stock guest boots.
func Accelerator(mode string) (accel string, reason string, err error) {
	return accelerator(mode, "/")
}

// accelerator is Accelerator with the files looked up under root (a fake
// tree in tests).
func accelerator(mode, root string) (string, string, error) {
	devErr := openKVM(root)
	switch strings.ToLower(strings.TrimSpace(mode)) {
	case "tcg":
		return "tcg", "tcg forced by configuration", nil
	case "kvm":
		if devErr != nil {
			return "", "", fmt.Errorf("qemu: accelerator kvm forced but %v", devErr)
		}
		return "kvm", "kvm forced by configuration", nil
	case "", "auto":
	default:
		return "", "", fmt.Errorf("qemu: unknown accelerator %q (want auto, kvm or tcg)", mode)
	}
	if devErr != nil {
		return "tcg", fmt.Sprintf("auto: %v", devErr), nil
	}
	if flag := cpuVirtFlag(root); flag != "" {
		return "kvm", fmt.Sprintf("auto: /dev/kvm opens and the CPU has %s", flag), nil
	}
	if mod := kvmModule(root); mod != "" {
		return "kvm", fmt.Sprintf("auto: /dev/kvm opens and %s is loaded", mod), nil
	}
	return "tcg", "auto: /dev/kvm opens but the CPU has no vmx/svm flag and neither kvm_intel nor kvm_amd is loaded (nested or paravirtual KVM such as kvm_pvm cannot boot stock guests)", nil
}

// openKVM is nil when root/dev/kvm opens read-write.
func openKVM(root string) error {
	f, err := os.OpenFile(filepath.Join(root, "dev", "kvm"), os.O_RDWR, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return errors.New("/dev/kvm does not exist")
		}
		return fmt.Errorf("/dev/kvm does not open read-write: %v", errors.Unwrap(err))
	}
	f.Close()
	return nil
}

// cpuVirtFlag is "vmx" or "svm" when a processor in root/proc/cpuinfo has
// that flag, else "".
func cpuVirtFlag(root string) string {
	f, err := os.Open(filepath.Join(root, "proc", "cpuinfo"))
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(key) != "flags" {
			continue
		}
		for _, fl := range strings.Fields(val) {
			if fl == "vmx" || fl == "svm" {
				return fl
			}
		}
	}
	return ""
}

// kvmModule names the hardware KVM module (kvm_intel or kvm_amd) that is
// loaded per root/proc/modules or built in per root/sys/module, else "".
func kvmModule(root string) string {
	if b, err := os.ReadFile(filepath.Join(root, "proc", "modules")); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			name, _, _ := strings.Cut(line, " ")
			if name == "kvm_intel" || name == "kvm_amd" {
				return name
			}
		}
	}
	for _, name := range []string{"kvm_intel", "kvm_amd"} {
		if fi, err := os.Stat(filepath.Join(root, "sys", "module", name)); err == nil && fi.IsDir() {
			return name
		}
	}
	return ""
}

// HypervisorType is what os-hypervisors shows for a host running accel, as
// Nova's libvirt driver does: "KVM" for kvm, "QEMU" for tcg.
func HypervisorType(accel string) string {
	if accel == "kvm" {
		return "KVM"
	}
	return "QEMU"
}

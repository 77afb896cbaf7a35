package qemu

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeRoot builds a tree with the given files (path → content); a content
// of "<dir>" makes a directory.
func fakeRoot(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, c := range files {
		full := filepath.Join(root, p)
		if c == "<dir>" {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const (
	cpuinfoIntel = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep vmx smx est\n\nprocessor\t: 1\nflags\t\t: fpu vme vmx\n"
	cpuinfoAMD   = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu vme de pse tsc msr svm extapic\n"
	cpuinfoPVM   = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep hypervisor\n"
	// vmxflags is a field name that must not count as the vmx flag.
	cpuinfoTricky  = "processor\t: 0\nvmx flags\t: vnmi preemption_timer\nflags\t\t: fpu hypervisor\n"
	modulesPVM     = "kvm_pvm 65536 0 - Live 0x0000000000000000\nkvm 1200128 1 kvm_pvm, Live 0x0000000000000000\n"
	modulesIntel   = "kvm_intel 409600 0 - Live 0x0000000000000000\nkvm 1200128 1 kvm_intel, Live 0x0000000000000000\n"
	modulesAMD     = "kvm_amd 155648 0 - Live 0x0000000000000000\nkvm 1200128 1 kvm_amd, Live 0x0000000000000000\n"
	modulesNothing = "ext4 1000 1 - Live 0x0\n"
)

func TestAccelerator(t *testing.T) {
	cases := []struct {
		name    string
		mode    string
		files   map[string]string
		want    string
		wantErr string
		reason  string // a substring of the reason
	}{
		{"pvm auto", "auto", map[string]string{"dev/kvm": "", "proc/cpuinfo": cpuinfoPVM, "proc/modules": modulesPVM}, "tcg", "", "no vmx/svm"},
		{"pvm empty mode", "", map[string]string{"dev/kvm": "", "proc/cpuinfo": cpuinfoPVM, "proc/modules": modulesPVM, "sys/module/kvm_pvm": "<dir>"}, "tcg", "", "no vmx/svm"},
		{"intel", "auto", map[string]string{"dev/kvm": "", "proc/cpuinfo": cpuinfoIntel, "proc/modules": modulesIntel}, "kvm", "", "vmx"},
		{"amd", "auto", map[string]string{"dev/kvm": "", "proc/cpuinfo": cpuinfoAMD, "proc/modules": modulesAMD}, "kvm", "", "svm"},
		{"intel module without flag", "AUTO", map[string]string{"dev/kvm": "", "proc/cpuinfo": cpuinfoPVM, "proc/modules": modulesIntel}, "kvm", "", "kvm_intel is loaded"},
		{"amd built in", "auto", map[string]string{"dev/kvm": "", "proc/cpuinfo": cpuinfoPVM, "sys/module/kvm_amd": "<dir>"}, "kvm", "", "kvm_amd"},
		{"tricky cpuinfo", "auto", map[string]string{"dev/kvm": "", "proc/cpuinfo": cpuinfoTricky, "proc/modules": modulesNothing}, "tcg", "", "no vmx/svm"},
		{"no /dev/kvm", "auto", map[string]string{"proc/cpuinfo": cpuinfoIntel, "proc/modules": modulesIntel}, "tcg", "", "/dev/kvm does not exist"},
		{"no /proc at all", "auto", map[string]string{"dev/kvm": ""}, "tcg", "", "no vmx/svm"},
		{"forced tcg on intel", "tcg", map[string]string{"dev/kvm": "", "proc/cpuinfo": cpuinfoIntel, "proc/modules": modulesIntel}, "tcg", "", "forced"},
		{"forced kvm on pvm", "kvm", map[string]string{"dev/kvm": "", "proc/cpuinfo": cpuinfoPVM, "proc/modules": modulesPVM}, "kvm", "", "forced"},
		{"forced kvm without /dev/kvm", "kvm", map[string]string{"proc/cpuinfo": cpuinfoIntel}, "", "/dev/kvm does not exist", ""},
		{"unknown mode", "hvf", map[string]string{"dev/kvm": ""}, "", "unknown accelerator", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := fakeRoot(t, c.files)
			got, reason, err := accelerator(c.mode, root)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("accel = %q, want %q (reason %q)", got, c.want, reason)
			}
			if !strings.Contains(reason, c.reason) {
				t.Errorf("reason = %q, want it to contain %q", reason, c.reason)
			}
		})
	}
}

// TestAcceleratorHere runs the real detection: it must not fail, and on the
// project's machines (no vmx/svm) it must give tcg.
func TestAcceleratorHere(t *testing.T) {
	accel, reason, err := Accelerator("auto")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("this host: %s (%s)", accel, reason)
	if cpuVirtFlag("/") == "" && kvmModule("/") == "" && accel != "tcg" {
		t.Errorf("no vmx/svm and no kvm_intel/kvm_amd, but accel = %s", accel)
	}
}

func TestHypervisorType(t *testing.T) {
	for accel, want := range map[string]string{"kvm": "KVM", "tcg": "QEMU", "": "QEMU"} {
		if got := HypervisorType(accel); got != want {
			t.Errorf("HypervisorType(%q) = %q, want %q", accel, got, want)
		}
	}
}

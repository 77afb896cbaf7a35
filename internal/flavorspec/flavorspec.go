// Package flavorspec reads what a flavor's extra specs say about the
// hardware a server gets: its GPUs. It is the one reader that the
// scheduler's claims, the flavor API's validation, billing's metering and
// the panel all ask, so that a flavor claims, shows and is charged for the
// same number of devices.
package flavorspec

import (
	"fmt"
	"strconv"
	"strings"
)

// Extra spec keys.
const (
	// GPUModelKey names the GPU model a flavor passes through, as the
	// hypervisor driver names it ("A100 80GB").
	GPUModelKey = "nimbus:gpu_model"
	// AliasKey is Nova's pci_passthrough:alias: "alias:count[,alias:count…]".
	AliasKey = "pci_passthrough:alias"
)

// MaxGPUs bounds the devices one flavor may ask for, in all: far above any
// real host, low enough that no count overflows a price.
const MaxGPUs = 64

// AliasEntry is one "alias:count" of a pci_passthrough:alias.
type AliasEntry struct {
	Alias string
	Count int
}

// ParseAlias reads a pci_passthrough:alias value: entries separated by
// commas (spaces around them allowed), each "alias:count" as Nova writes
// it, or a bare "alias" for one device, which earlier Nimbus flavors
// stored. A count is 1 to MaxGPUs and so is the sum of all of them;
// anything else is an error saying what is wrong.
func ParseAlias(v string) ([]AliasEntry, error) {
	if strings.TrimSpace(v) == "" {
		return nil, fmt.Errorf("the alias list is empty")
	}
	var out []AliasEntry
	total := 0
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		name, count, hasCount := strings.Cut(part, ":")
		n := 1
		if hasCount {
			var err error
			if n, err = strconv.Atoi(count); err != nil || strconv.Itoa(n) != count {
				return nil, fmt.Errorf("'%s' does not end in a whole number of devices", part)
			}
		}
		switch {
		case name == "" || strings.ContainsAny(name, " \t:"):
			return nil, fmt.Errorf("'%s' is not alias:count", part)
		case n < 1 || n > MaxGPUs:
			return nil, fmt.Errorf("'%s' asks for %d devices; from 1 to %d may be asked for", part, n, MaxGPUs)
		}
		total += n
		if total > MaxGPUs {
			return nil, fmt.Errorf("the list asks for more than %d devices", MaxGPUs)
		}
		out = append(out, AliasEntry{Alias: name, Count: n})
	}
	return out, nil
}

// GPUs is what a flavor passes through: Count devices of Model.
type GPUs struct {
	Model string
	Count int
}

// GPUsOf reads a flavor's GPUs from its extra specs: the model
// (GPUModelKey) and, as many as its pci_passthrough:alias entries ask for
// in all, one when it has none. A flavor without a model has none (an
// alias alone names devices Nimbus does not pass through). An alias list
// that cannot be read is an error: such a flavor cannot be placed or
// priced.
func GPUsOf(extraSpecs map[string]string) (GPUs, error) {
	model := extraSpecs[GPUModelKey]
	if model == "" {
		return GPUs{}, nil
	}
	alias, ok := extraSpecs[AliasKey]
	if !ok {
		return GPUs{Model: model, Count: 1}, nil
	}
	entries, err := ParseAlias(alias)
	if err != nil {
		return GPUs{}, fmt.Errorf("%s of the flavor: %w", AliasKey, err)
	}
	n := 0
	for _, e := range entries {
		n += e.Count
	}
	return GPUs{Model: model, Count: n}, nil
}

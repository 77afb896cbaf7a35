package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"nimbus/internal/driver"
	"nimbus/internal/qmp"
)

// NIC hot-plug. A port attached to a server goes into its record first
// (state.json's spec), so that every later start of its QEMU has the NIC
// from the command line; a live QEMU then gets it by QMP: the data
// plane's netdev, and a NIC device on a free spare pcie-root-port
// (Machine.HotplugSlots). A NIC is found in the live VM by its MAC, which
// is its port's, so that a NIC that was on the command line (named by its
// place there) and one plugged later are found alike.

// unplugTimeout bounds the wait for the guest to release a NIC: Linux's
// pciehp waits 5 s after the attention button before it lets go.
const unplugTimeout = 30 * time.Second

// nicHotplugID is the netdev id of a NIC plugged live (its device is
// this id + "-dev", as on the command line).
func nicHotplugID(portID string) string { return "nic-" + portID }

// AttachPort records port in the server's spec and, when its QEMU runs,
// plugs its NIC. A NIC already there is left as it is.
func (d *Driver) AttachPort(ctx context.Context, id string, port driver.Port) error {
	if !validPortID(port.ID) {
		return fmt.Errorf("qemu: attach port: bad port id %q", port.ID)
	}
	v, err := d.acquire(ctx, id)
	if err != nil {
		return err
	}
	defer d.release(v)
	v.mu.Lock()
	k := slices.IndexFunc(v.st.Spec.Ports, func(p driver.Port) bool { return p.ID == port.ID })
	if k < 0 {
		if port.MAC == "" {
			port.MAC = macFor(id, len(v.st.Spec.Ports))
		}
		st := v.st
		st.Spec.Ports = append(slices.Clone(st.Spec.Ports), port)
		if err := writeState(v.dir, st); err != nil {
			v.mu.Unlock()
			return err
		}
		v.st.Spec.Ports = st.Spec.Ports
	} else {
		port = v.st.Spec.Ports[k]
	}
	model := v.st.Spec.Image.Properties["hw_vif_model"]
	v.mu.Unlock()
	p := v.current()
	if p == nil || p.mon == nil {
		return nil // a stopped server: its next start has the NIC
	}
	if err := d.plug(ctx, p.mon, port, model); err != nil {
		// Leave no record of a NIC the VM does not have.
		d.dropPort(v, port.ID)
		return fmt.Errorf("qemu: server %s: attach port %s: %w", id, port.ID, err)
	}
	d.log.Info("qemu: NIC attached", "server", id, "port", port.ID)
	return nil
}

// DetachPort unplugs port portID's NIC from a running QEMU, then drops
// it from the server's record. A port the server does not have is not an
// error.
func (d *Driver) DetachPort(ctx context.Context, id, portID string) error {
	v, err := d.acquire(ctx, id)
	if err != nil {
		return err
	}
	defer d.release(v)
	v.mu.Lock()
	k := slices.IndexFunc(v.st.Spec.Ports, func(p driver.Port) bool { return p.ID == portID })
	var port driver.Port
	if k >= 0 {
		port = v.st.Spec.Ports[k]
		if port.MAC == "" {
			port.MAC = macFor(id, k)
		}
	}
	v.mu.Unlock()
	if k < 0 {
		return nil
	}
	if p := v.current(); p != nil && p.mon != nil {
		if err := d.unplug(ctx, p.mon, port.MAC); err != nil {
			return fmt.Errorf("qemu: server %s: detach port %s: %w", id, portID, err)
		}
	}
	if err := d.dropPort(v, portID); err != nil {
		return err
	}
	d.log.Info("qemu: NIC detached", "server", id, "port", portID)
	return nil
}

// dropPort removes a port from v's record.
func (d *Driver) dropPort(v *vm, portID string) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	st := v.st
	st.Spec.Ports = slices.DeleteFunc(slices.Clone(st.Spec.Ports), func(p driver.Port) bool { return p.ID == portID })
	if err := writeState(v.dir, st); err != nil {
		return err
	}
	v.st.Spec.Ports = st.Spec.Ports
	return nil
}

// plug adds port's netdev and NIC to a live QEMU, unless a NIC with its
// MAC is there already; in bridged mode the port's tap must be wired
// first, and QEMU gets it open (plugTap). What it added is taken out
// again when a later step fails.
func (d *Driver) plug(ctx context.Context, mon *qmp.Monitor, port driver.Port, vifModel string) error {
	if dev, _, err := nicByMAC(ctx, mon, port.MAC); err != nil {
		return err
	} else if dev != "" {
		return nil
	}
	b, bridged := d.cfg.Net.(BridgedNet)
	if bridged {
		if err := b.waitWired(ctx, []driver.Port{port}); err != nil {
			return err
		}
	}
	model, err := nicModel(vifModel)
	if err != nil {
		return err
	}
	nid := nicHotplugID(port.ID)
	netdev, err := d.cfg.Net.Netdev(nid, port, nil)
	if err != nil {
		return err
	}
	slot, err := freeHotplugSlot(ctx, mon)
	if err != nil {
		return err
	}
	// A netdev left by an attempt cut short would make netdev_add fail.
	_ = mon.Execute(ctx, "netdev_del", map[string]string{"id": nid}, nil)
	if bridged {
		err = b.plugTap(ctx, mon, nid, port)
	} else if err = hmp(ctx, mon, "netdev_add "+netdev); err != nil {
		err = fmt.Errorf("netdev_add: %w", err)
	}
	if err != nil {
		return err
	}
	err = mon.Execute(ctx, "device_add", map[string]any{"driver": model, "id": nid + "-dev", "netdev": nid,
		"mac": port.MAC, "bus": slot}, nil)
	if err != nil {
		_ = mon.Execute(context.WithoutCancel(ctx), "netdev_del", map[string]string{"id": nid}, nil)
		return fmt.Errorf("device_add: %w", err)
	}
	return nil
}

// hmp runs a human monitor command. netdev_add goes this way because it
// takes the data plane's -netdev text as it is, where QMP's netdev_add
// wants each backend's options as typed JSON.
func hmp(ctx context.Context, mon *qmp.Monitor, cmd string) error {
	var out string
	if err := mon.Execute(ctx, "human-monitor-command", map[string]string{"command-line": cmd}, &out); err != nil {
		return err
	}
	if out = strings.TrimSpace(out); out != "" {
		return errors.New(out)
	}
	return nil
}

// unplug takes the NIC with MAC mac out of a live QEMU: device_del, the
// guest's DEVICE_DELETED (bounded by unplugTimeout), then its netdev.
// Every NIC sits on a pcie-root-port, those of the command line too
// (NICPortID), except in a QEMU started before they did, where they sit
// on the root complex, which cannot unplug: there its netdev is deleted,
// which takes its link down, so that nothing passes, and the next start
// of the QEMU is without it.
func (d *Driver) unplug(ctx context.Context, mon *qmp.Monitor, mac string) error {
	dev, netdev, err := nicByMAC(ctx, mon, mac)
	if err != nil || dev == "" {
		return err
	}
	if err := deviceDel(ctx, mon, dev, "NIC"); err != nil && !errors.Is(err, errNoHotplug) {
		return err
	}
	// Where the NIC stays, QEMU takes its link down when its netdev goes.
	return delNetdev(ctx, mon, netdev)
}

// errNoHotplug is a device_del of a device on a bus that cannot unplug
// (the root complex).
var errNoHotplug = errors.New("its bus cannot unplug")

// deviceDel takes device dev (a what: a NIC, a disk) out of a live QEMU:
// device_del, then the guest's DEVICE_DELETED for it, bounded by
// unplugTimeout. A device on a bus that cannot unplug is errNoHotplug.
func deviceDel(ctx context.Context, mon *qmp.Monitor, dev, what string) error {
	events, cancel := mon.Subscribe("DEVICE_DELETED")
	defer cancel()
	err := mon.Execute(ctx, "device_del", map[string]string{"id": dev}, nil)
	if err != nil && strings.Contains(err.Error(), "does not support hotplugging") {
		return fmt.Errorf("device_del: %w (%w)", err, errNoHotplug)
	}
	if err != nil {
		return fmt.Errorf("device_del: %w", err)
	}
	wctx, stop := context.WithTimeout(ctx, unplugTimeout)
	defer stop()
	for {
		ev, err := qmp.WaitEvent(wctx, events, "DEVICE_DELETED")
		if err != nil {
			return fmt.Errorf("the guest did not release %s %s: %w", what, dev, err)
		}
		var data struct {
			Device string `json:"device"`
		}
		if json.Unmarshal(ev.Data, &data) == nil && data.Device == dev {
			return nil
		}
	}
}

// delNetdev deletes a netdev; one already gone is fine.
func delNetdev(ctx context.Context, mon *qmp.Monitor, id string) error {
	if id == "" {
		return nil
	}
	err := mon.Execute(ctx, "netdev_del", map[string]string{"id": id}, nil)
	if e, ok := errors.AsType[*qmp.Error](err); ok && e.Class == "DeviceNotFound" {
		return nil
	}
	if err != nil {
		return fmt.Errorf("netdev_del: %w", err)
	}
	return nil
}

// nicByMAC finds the NIC device with MAC mac among a QEMU's named
// devices, and its netdev; "" when there is none.
func nicByMAC(ctx context.Context, mon *qmp.Monitor, mac string) (dev, netdev string, err error) {
	var props []struct {
		Name string `json:"name"`
		Type string `json:"type"`
	}
	if err := mon.Execute(ctx, "qom-list", map[string]string{"path": "/machine/peripheral"}, &props); err != nil {
		return "", "", fmt.Errorf("qom-list: %w", err)
	}
	for _, p := range props {
		if !strings.HasPrefix(p.Type, "child<") {
			continue
		}
		path := "/machine/peripheral/" + p.Name
		var m string
		if err := mon.Execute(ctx, "qom-get", map[string]string{"path": path, "property": "mac"}, &m); err != nil {
			continue // not a NIC
		}
		if !strings.EqualFold(m, mac) {
			continue
		}
		if err := mon.Execute(ctx, "qom-get", map[string]string{"path": path, "property": "netdev"}, &netdev); err != nil {
			return "", "", fmt.Errorf("qom-get %s netdev: %w", p.Name, err)
		}
		return p.Name, netdev, nil
	}
	return "", "", nil
}

// pciDevice is one device of query-pci, with the devices behind it when
// it is a bridge (a pcie-root-port).
type pciDevice struct {
	QdevID string `json:"qdev_id"`
	Bridge *struct {
		Devices []pciDevice `json:"devices"`
	} `json:"pci_bridge"`
}

// freeHotplugSlot is the first spare pcie-root-port (in query-pci's
// order, which is the command line's) with nothing behind it.
func freeHotplugSlot(ctx context.Context, mon *qmp.Monitor) (string, error) {
	var buses []struct {
		Devices []pciDevice `json:"devices"`
	}
	if err := mon.Execute(ctx, "query-pci", nil, &buses); err != nil {
		return "", fmt.Errorf("query-pci: %w", err)
	}
	for _, b := range buses {
		if id := freeIn(b.Devices); id != "" {
			return id, nil
		}
	}
	return "", errors.New("no free PCIe slot for another NIC")
}

func freeIn(devs []pciDevice) string {
	for _, dv := range devs {
		if dv.Bridge == nil {
			continue
		}
		if strings.HasPrefix(dv.QdevID, "hp") && len(dv.Bridge.Devices) == 0 {
			return dv.QdevID
		}
		if id := freeIn(dv.Bridge.Devices); id != "" {
			return id
		}
	}
	return ""
}

package qemu

import (
	"context"
	"encoding/json"
	"time"

	"nimbus/internal/driver"
	"nimbus/internal/qmp"
)

// watch follows one QEMU process until it exits or the driver closes: its
// QMP events (SHUTDOWN, STOP, RESUME) and its exit. A change the driver did
// not cause — the guest powered itself off, QEMU died, something else
// paused the VM — is told to the power listener, as Nova's power-state
// sync learns it from libvirt's lifecycle events.
func (d *Driver) watch(v *vm, p *proc) {
	defer d.wg.Done()
	var events <-chan qmp.Event
	if p.mon != nil {
		events = p.mon.Events()
	}
	var poll <-chan time.Time
	if !p.child {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		poll = t.C
	}
	var quitAfter <-chan time.Time
	for {
		select {
		case <-d.closing:
			return
		case <-p.exited:
			d.exited(v, p)
			return
		case <-poll:
			p.done()
		case ev, ok := <-events:
			if !ok {
				events = nil
				if !p.child {
					// The socket's EOF: QEMU is going; look often.
					t := time.NewTicker(20 * time.Millisecond)
					defer t.Stop()
					poll = t.C
				}
				continue
			}
			switch ev.Name {
			case "SHUTDOWN":
				var data struct {
					Guest  bool   `json:"guest"`
					Reason string `json:"reason"`
				}
				json.Unmarshal(ev.Data, &data)
				if p.expect.Load() {
					continue
				}
				p.guestOff.Store(true)
				d.log.Info("qemu: guest shut down", "server", v.id, "reason", data.Reason, "guest", data.Guest)
				// Without -no-shutdown QEMU now exits; make sure it does.
				quitAfter = time.After(10 * time.Second)
			case "STOP", "RESUME":
				if !p.guestOff.Load() && !p.expect.Load() {
					d.syncPower(v, p)
				}
			}
		case <-quitAfter:
			quitAfter = nil
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if p.mon == nil || p.mon.Quit(ctx) != nil {
				p.kill()
			}
			cancel()
		}
	}
}

// exited records that p is gone. Unless the driver stopped it, the server
// is now off: its desired state becomes shutoff (a guest that powers
// itself off stays off, as in Nova) and the listener hears Shutdown.
func (d *Driver) exited(v *vm, p *proc) {
	p.closeMon()
	v.mu.Lock()
	if v.proc == p {
		v.proc = nil
	}
	news := !p.expect.Load() && !v.gone
	if news && (v.st.Power == wantRunning || v.st.Power == wantPaused) {
		v.st.Power = wantShutoff
		if err := writeState(v.dir, v.st); err != nil {
			d.log.Error("qemu: saving state", "server", v.id, "error", err)
		}
	}
	v.mu.Unlock()
	if !news {
		return
	}
	if p.guestOff.Load() {
		d.log.Info("qemu: server powered off by its guest", "server", v.id)
	} else {
		d.log.Warn("qemu: QEMU exited unexpectedly", "server", v.id, "pid", p.pid, "status", p.exitErr,
			"log", logTail(v.dir+"/"+logFile, 0))
	}
	d.notify(v, driver.Shutdown)
}

// syncPower tells the listener the power state QEMU is in when it is not
// the one the server should be in and no op is at work on the server (an
// op's own pauses, as a snapshot's, are no news).
func (d *Driver) syncPower(v *vm, p *proc) {
	if v.busy.Load() > 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	power := d.procPower(ctx, p)
	v.mu.Lock()
	want := v.st.Power
	v.mu.Unlock()
	if (want == wantRunning && power == driver.Running) || (want == wantPaused && power == driver.Paused) {
		v.notified.Store(int32(power))
		return
	}
	d.notify(v, power)
}

// notify tells the power listener, once per change.
func (d *Driver) notify(v *vm, power driver.PowerState) {
	if v.notified.Swap(int32(power)) == int32(power) {
		return
	}
	if l := d.listener.Load(); l != nil && *l != nil {
		(*l)(v.id, power)
	}
}

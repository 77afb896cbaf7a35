package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"nimbus/internal/driver"
)

// Suspend is Nova's managed save: the VM is paused, its whole state
// (RAM and devices) is migrated into DIR/suspend.state, and QEMU exits.
// Resume starts QEMU again restoring that state.
//
// QEMU 7.2 has no file: migration URI, and exec:cat would need QEMU to
// spawn a shell, which its seccomp sandbox (spawn=deny) forbids. So QEMU
// migrates to a unix socket in the server directory, on which the driver
// listens and copies the stream into the file.
func (d *Driver) Suspend(ctx context.Context, id string) error {
	v, err := d.acquire(ctx, id)
	if err != nil {
		return err
	}
	defer d.release(v)
	state := filepath.Join(v.dir, suspendFile)
	p := v.current()
	if p == nil {
		if v.want() == wantSuspended && fileExists(state) {
			return nil
		}
		return fmt.Errorf("qemu: suspend %s: the server is not running", id)
	}
	if p.mon == nil {
		return fmt.Errorf("qemu: suspend %s: no QMP monitor", id)
	}
	start := time.Now()
	wasRunning := d.procPower(ctx, p) == driver.Running
	if err := d.save(ctx, v, p, state, wasRunning); err != nil {
		return fmt.Errorf("qemu: suspend %s: %w", id, err)
	}
	if err := v.setPower(wantSuspended); err != nil {
		return err
	}
	saved := time.Since(start)
	if err := d.stop(ctx, v, p, false, 0); err != nil {
		return err
	}
	fi, _ := os.Stat(state)
	var size int64
	if fi != nil {
		size = fi.Size()
	}
	d.log.Info("qemu: suspended", "server", id, "bytes", size, "save_ms", saved.Milliseconds(), "ms", time.Since(start).Milliseconds())
	return nil
}

// save migrates a paused QEMU into path. On failure the VM runs again as it
// did and no file is left.
func (d *Driver) save(ctx context.Context, v *vm, p *proc, path string, wasRunning bool) (err error) {
	sock := filepath.Join(v.dir, migrateSock)
	os.Remove(sock)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return err
	}
	defer os.Remove(sock)
	defer l.Close()
	if d.runAs != nil {
		uid, _ := strconv.Atoi(d.runAs.Uid)
		gid, _ := strconv.Atoi(d.runAs.Gid)
		os.Chown(sock, uid, gid)
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()

	// Save as fast as the disk goes: the default limit is 32 MiB/s.
	if err := p.mon.Execute(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40}, nil); err != nil {
		d.log.Warn("qemu: migrate-set-parameters", "server", v.id, "error", err)
	}
	if wasRunning {
		if err := p.mon.Stop(ctx); err != nil {
			return fmt.Errorf("stop: %w", err)
		}
		defer func() {
			if err != nil && !p.done() {
				cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				p.mon.Cont(cctx)
			}
		}()
	}

	copied := make(chan error, 1)
	conn := make(chan *net.UnixConn, 1)
	go func() {
		c, err := l.AcceptUnix()
		if err != nil {
			copied <- err
			return
		}
		conn <- c
		defer c.Close()
		_, err = io.Copy(f, c)
		copied <- err
	}()
	if err := p.mon.Execute(ctx, "migrate", map[string]any{"uri": "unix:" + sock}, nil); err != nil {
		l.Close()
		<-copied
		return fmt.Errorf("migrate: %w", err)
	}
	for {
		var mig struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := p.mon.Execute(ctx, "query-migrate", nil, &mig); err != nil {
			l.Close()
			<-copied
			return fmt.Errorf("query-migrate: %w", err)
		}
		if mig.Status == "completed" {
			break
		}
		if mig.Status == "failed" || mig.Status == "cancelled" {
			l.Close()
			<-copied
			return fmt.Errorf("migration %s: %s", mig.Status, mig.ErrorDesc)
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			p.mon.Execute(cctx, "migrate_cancel", nil, nil)
			cancel()
			l.Close()
			<-copied
			return ctx.Err()
		}
	}
	// QEMU closes the stream once the migration completed.
	select {
	case err = <-copied:
	case <-time.After(time.Minute):
		l.Close()
		select {
		case c := <-conn:
			c.Close()
		default:
		}
		<-copied
		err = errors.New("the state stream did not end")
	}
	if err != nil {
		return fmt.Errorf("saving the state: %w", err)
	}
	if d.runAs != nil {
		// Resume has QEMU (as RunAs) read it back.
		uid, _ := strconv.Atoi(d.runAs.Uid)
		gid, _ := strconv.Atoi(d.runAs.Gid)
		if err = f.Chown(uid, gid); err != nil {
			return err
		}
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Resume restores a suspended server.
func (d *Driver) Resume(ctx context.Context, id string) error {
	v, err := d.acquire(ctx, id)
	if err != nil {
		return err
	}
	defer d.release(v)
	return d.resume(ctx, v)
}

func (d *Driver) resume(ctx context.Context, v *vm) error {
	state := filepath.Join(v.dir, suspendFile)
	if p := v.current(); p != nil {
		if d.procPower(ctx, p) != driver.Running {
			return fmt.Errorf("qemu: resume %s: the server is not suspended", v.id)
		}
		// Restored by an agent that died before it could record it.
		os.Remove(state)
		return v.setPower(wantRunning)
	}
	if !fileExists(state) {
		return fmt.Errorf("qemu: resume %s: the server is not suspended", v.id)
	}
	start := time.Now()
	if _, err := d.launchRetry(ctx, v, state); err != nil {
		return err
	}
	if err := v.setPower(wantRunning); err != nil {
		return err
	}
	os.Remove(state)
	d.log.Info("qemu: resumed", "server", v.id, "ms", time.Since(start).Milliseconds())
	return nil
}

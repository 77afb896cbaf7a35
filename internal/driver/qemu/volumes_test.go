package qemu

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"nimbus/internal/driver"
)

const testVolID = "5e2b1c9a-7d3f-4e8b-a1c2-9f0e8d7c6b5a"

// TestVolumeSpec: the objects, node tree and device one volume gets, the
// same JSON for QMP and the command line.
func TestVolumeSpec(t *testing.T) {
	n := namesOf(testVolID, false)
	base := volBase(testVolID)
	if len(n.proto) > 31 || len(n.thr) > 31 || !strings.HasPrefix(n.dev, "vol") {
		t.Fatalf("names too long or badly formed: %+v", n)
	}
	dir := "/srv/instances/x,y"
	for _, c := range []struct {
		name    string
		vol     driver.Volume
		objects []string
		node    string
		device  string
	}{{
		name:   "file",
		vol:    driver.Volume{ID: testVolID, Conn: driver.VolumeConn{Driver: driver.VolumeFile, Path: "/data/volumes/volume-1"}},
		node:   `{"driver":"raw","file":{"aio":"threads","cache":{"direct":true},"driver":"file","filename":"/data/volumes/volume-1","node-name":"` + base + `-proto","read-only":false},"node-name":"` + base + `-fmt","read-only":false}`,
		device: `{"bus":"hp1","drive":"` + base + `-fmt","driver":"virtio-blk-pci","id":"` + base + `-dev","serial":"` + testVolID + `"}`,
	}, {
		name: "file read-only throttled (total wins)",
		vol: driver.Volume{ID: testVolID, ReadOnly: true, Conn: driver.VolumeConn{Driver: driver.VolumeFile, Path: "/v,1"},
			Throttle: driver.Throttle{ReadIOPS: 10, WriteIOPS: 20, TotalIOPS: 100, WriteBytes: 1 << 20}},
		objects: []string{`{"id":"` + base + `-tg","qom-type":"throttle-group","x-bps-write":1048576,"x-iops-total":100}`},
		node:    `{"driver":"throttle","file":{"driver":"raw","file":{"aio":"threads","cache":{"direct":true},"driver":"file","filename":"/v,1","node-name":"` + base + `-proto","read-only":true},"node-name":"` + base + `-fmt","read-only":true},"node-name":"` + base + `-thr","read-only":true,"throttle-group":"` + base + `-tg"}`,
		device:  `{"bus":"hp1","drive":"` + base + `-thr","driver":"virtio-blk-pci","id":"` + base + `-dev","serial":"` + testVolID + `"}`,
	}, {
		name: "nbd",
		vol: driver.Volume{ID: testVolID, Conn: driver.VolumeConn{Driver: driver.VolumeNBD, Host: "10.0.0.2", Port: 10809,
			Export: "volume-1", PSKIdentity: "nimbus", PSKKey: "00ff"}},
		objects: []string{`{"dir":"/srv/instances/x,y/` + base + `.psk","endpoint":"client","id":"` + base + `-tls","priority":"` + driver.NBDTLSPriority + `","qom-type":"tls-creds-psk","username":"nimbus"}`},
		node:    `{"driver":"raw","file":{"driver":"nbd","export":"volume-1","node-name":"` + base + `-proto","read-only":false,"server":{"host":"10.0.0.2","port":"10809","type":"inet"},"tls-creds":"` + base + `-tls"},"node-name":"` + base + `-fmt","read-only":false}`,
		device:  `{"bus":"hp1","drive":"` + base + `-fmt","driver":"virtio-blk-pci","id":"` + base + `-dev","serial":"` + testVolID + `"}`,
	}, {
		name: "rbd",
		vol: driver.Volume{ID: testVolID, Conn: driver.VolumeConn{Driver: driver.VolumeRBD, Pool: "volumes", Image: "volume-1",
			User: "cinder", Key: "QVFEY2V4YW1wbGU=", Monitors: []string{"10.0.0.3", "10.0.0.4:3300", "[fd00::1]:6789"}},
			Throttle: driver.Throttle{ReadBytes: 5}},
		objects: []string{
			`{"file":"/srv/instances/x,y/` + base + `.key","format":"base64","id":"` + base + `-key","qom-type":"secret"}`,
			`{"id":"` + base + `-tg","qom-type":"throttle-group","x-bps-read":5}`,
		},
		node:   `{"driver":"throttle","file":{"driver":"raw","file":{"auth-client-required":["cephx"],"driver":"rbd","image":"volume-1","key-secret":"` + base + `-key","node-name":"` + base + `-proto","pool":"volumes","read-only":false,"server":[{"host":"10.0.0.3","port":"6789"},{"host":"10.0.0.4","port":"3300"},{"host":"fd00::1","port":"6789"}],"user":"cinder"},"node-name":"` + base + `-fmt","read-only":false},"node-name":"` + base + `-thr","read-only":false,"throttle-group":"` + base + `-tg"}`,
		device: `{"bus":"hp1","drive":"` + base + `-thr","driver":"virtio-blk-pci","id":"` + base + `-dev","serial":"` + testVolID + `"}`,
	}} {
		t.Run(c.name, func(t *testing.T) {
			if err := validVolume(c.vol); err != nil {
				t.Fatal(err)
			}
			p := volumeSpec(dir, c.vol, "hp1")
			var objs []string
			for _, o := range p.objects {
				objs = append(objs, jsonArg(o))
			}
			if !slices.Equal(objs, c.objects) {
				t.Errorf("objects\n got %q\nwant %q", objs, c.objects)
			}
			if got := jsonArg(p.node); got != c.node {
				t.Errorf("node\n got %s\nwant %s", got, c.node)
			}
			if got := jsonArg(p.device); got != c.device {
				t.Errorf("device\n got %s\nwant %s", got, c.device)
			}
			// Never a key on a command line.
			for _, a := range append(objs, jsonArg(p.node)) {
				if k := c.vol.Conn.Key + c.vol.Conn.PSKKey; k != "" && strings.Contains(a, k) {
					t.Errorf("key in %s", a)
				}
			}
		})
	}
}

func TestValidVolume(t *testing.T) {
	file := driver.VolumeConn{Driver: driver.VolumeFile, Path: "/v"}
	nbd := driver.VolumeConn{Driver: driver.VolumeNBD, Host: "h", Port: 10809, Export: "e", PSKIdentity: "i", PSKKey: "ab"}
	rbd := driver.VolumeConn{Driver: driver.VolumeRBD, Pool: "p", Image: "i", User: "u", Key: "QQ==", Monitors: []string{"m"}}
	for _, c := range []struct {
		what string
		vol  driver.Volume
		ok   bool
	}{
		{"file", driver.Volume{ID: "v", Conn: file}, true},
		{"nbd", driver.Volume{ID: "v", Conn: nbd}, true},
		{"rbd", driver.Volume{ID: "v", Conn: rbd}, true},
		{"no id", driver.Volume{Conn: file}, false},
		{"newline in id", driver.Volume{ID: "a\nb", Conn: file}, false},
		{"relative path", driver.Volume{ID: "v", Conn: driver.VolumeConn{Driver: driver.VolumeFile, Path: "v"}}, false},
		{"unknown driver", driver.Volume{ID: "v", Conn: driver.VolumeConn{Driver: "iscsi"}}, false},
		{"negative limit", driver.Volume{ID: "v", Conn: file, Throttle: driver.Throttle{ReadIOPS: -1}}, false},
		{"nbd no port", driver.Volume{ID: "v", Conn: func() driver.VolumeConn { c := nbd; c.Port = 0; return c }()}, false},
		{"nbd colon identity", driver.Volume{ID: "v", Conn: func() driver.VolumeConn { c := nbd; c.PSKIdentity = "a:b"; return c }()}, false},
		{"nbd key not hex", driver.Volume{ID: "v", Conn: func() driver.VolumeConn { c := nbd; c.PSKKey = "xyz"; return c }()}, false},
		{"rbd no monitors", driver.Volume{ID: "v", Conn: func() driver.VolumeConn { c := rbd; c.Monitors = nil; return c }()}, false},
		{"rbd key not base64", driver.Volume{ID: "v", Conn: func() driver.VolumeConn { c := rbd; c.Key = "%%"; return c }()}, false},
	} {
		if err := validVolume(c.vol); (err == nil) != c.ok {
			t.Errorf("%s: err = %v, want ok %v", c.what, err, c.ok)
		}
	}
}

// TestVolumeKeysStashed: state.json never holds a volume's key; its file
// (0600) does, and the command line names the file.
func TestVolumeKeysStashed(t *testing.T) {
	dir := t.TempDir()
	nbdVol := driver.Volume{ID: "vol-nbd", Conn: driver.VolumeConn{Driver: driver.VolumeNBD, Host: "h", Port: 1, Export: "e",
		PSKIdentity: "ident", PSKKey: "0123abcd"}}
	rbdVol := driver.Volume{ID: "vol-rbd", Conn: driver.VolumeConn{Driver: driver.VolumeRBD, Pool: "p", Image: "i", User: "u",
		Key: "c2VjcmV0a2V5", Monitors: []string{"m"}}}
	st := state{Spec: driver.Spec{ServerID: "s", Volumes: []driver.Volume{nbdVol, rbdVol}}}
	if err := writeState(dir, st); err != nil {
		t.Fatal(err)
	}
	if st.Spec.Volumes[0].Conn.PSKKey == "" {
		t.Fatal("writeState changed its caller's volumes")
	}
	b, _ := os.ReadFile(filepath.Join(dir, stateFile))
	if strings.Contains(string(b), "0123abcd") || strings.Contains(string(b), "c2VjcmV0a2V5") {
		t.Fatalf("a key is in state.json:\n%s", b)
	}
	for file, want := range map[string]string{
		filepath.Join(namesOf("vol-nbd", false).pskDir, "keys.psk"): "ident:0123abcd\n",
		namesOf("vol-rbd", false).keyFile:                           "c2VjcmV0a2V5",
	} {
		fi, err := os.Stat(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v", file, fi.Mode())
		}
		if got, _ := os.ReadFile(filepath.Join(dir, file)); string(got) != want {
			t.Errorf("%s holds %q, want %q", file, got, want)
		}
	}
	back, err := readState(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The record read back (without keys) is the same connection; another
	// key is not.
	if !sameConn(dir, back.Spec.Volumes[0], nbdVol) || !sameConn(dir, back.Spec.Volumes[1], rbdVol) {
		t.Error("the recorded volumes are not the same connections")
	}
	other := nbdVol
	other.Conn.PSKKey = "ffff"
	if sameConn(dir, back.Spec.Volumes[0], other) {
		t.Error("another PSK is the same connection")
	}
	other = nbdVol
	other.Conn.Port = 2
	if sameConn(dir, back.Spec.Volumes[0], other) {
		t.Error("another port is the same connection")
	}
	// Writing the record again (keys gone) keeps the files.
	if err := writeState(dir, back); err != nil {
		t.Fatal(err)
	}
	d := &Driver{}
	if err := d.volumeFiles(dir, back.Spec.Volumes); err != nil {
		t.Fatal(err)
	}
	removeVolumeKeys(dir, nbdVol)
	if err := d.volumeFiles(dir, back.Spec.Volumes); err == nil {
		t.Error("a missing PSK file is no error")
	}
	if fileExists(filepath.Join(dir, namesOf("vol-nbd", false).pskDir)) {
		t.Error("the PSK directory is still there")
	}
}

// TestCommandVolumes: each volume on its own pcie-root-port ("hpv<i>",
// after the NICs' "hpn<i>" and before the spare "hp<i>" ones), with the
// JSON hot-plug uses; Validate refuses a volume twice. With QEMU, QEMU
// accepts the command line (file volumes; an nbd or rbd one would
// connect at start).
func TestCommandVolumes(t *testing.T) {
	m := baseMachine("/srv")
	vols := []driver.Volume{
		{ID: testVolID, Conn: driver.VolumeConn{Driver: driver.VolumeFile, Path: filepath.Join(m.Dir, "v1,raw")}},
		{ID: "second-volume", ReadOnly: true, Conn: driver.VolumeConn{Driver: driver.VolumeFile, Path: filepath.Join(m.Dir, "v2.raw")},
			Throttle: driver.Throttle{TotalIOPS: 500}},
	}
	m.Volumes = vols
	argv := Command(m)
	var devs []string
	for i, a := range argv {
		if i > 0 && argv[i-1] == "-device" && (strings.HasPrefix(a, "pcie-root-port") || strings.HasPrefix(a, "{")) {
			devs = append(devs, a)
		}
	}
	// The NICs' root ports ("hpn<i>") come first, with their NICs.
	var want []string
	for i := range m.NICs {
		want = append(want, fmt.Sprintf("pcie-root-port,id=%s,chassis=%d,slot=%d", NICPortID(i), i+1, i+1))
	}
	c := len(m.NICs)
	want = append(want,
		fmt.Sprintf("pcie-root-port,id=hpv0,chassis=%d,slot=%d", c+1, c+1),
		jsonArg(volumeSpec(m.Dir, vols[0], "hpv0").device),
		fmt.Sprintf("pcie-root-port,id=hpv1,chassis=%d,slot=%d", c+2, c+2),
		jsonArg(volumeSpec(m.Dir, vols[1], "hpv1").device),
	)
	for i := range m.HotplugSlots {
		want = append(want, fmt.Sprintf("pcie-root-port,id=hp%d,chassis=%d,slot=%d", i, c+i+3, c+i+3))
	}
	if !slices.Equal(devs, want) {
		t.Errorf("devices\n got %q\nwant %q", devs, want)
	}
	if tg := jsonArg(volumeSpec(m.Dir, vols[1], "").objects[0]); !slices.Contains(argv, tg) {
		t.Errorf("no %s in %q", tg, argv)
	}
	if err := Validate(m); err != nil {
		t.Fatal(err)
	}
	m.Volumes = append(m.Volumes, vols[0])
	if err := Validate(m); err == nil {
		t.Error("a volume twice is valid")
	}

	bin, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 not found")
	}
	tmp, err := os.MkdirTemp("", "nq")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	m = baseMachine(tmp)
	m.Volumes = slices.Clone(vols)
	for i := range m.Volumes {
		m.Volumes[i].Conn.Path = filepath.Join(m.Dir, filepath.Base(m.Volumes[i].Conn.Path))
	}
	prepareFiles(t, m)
	for _, v := range m.Volumes {
		writeSized(t, v.Conn.Path, 1<<20)
	}
	argv = Command(m)
	for i, a := range argv {
		if i > 0 && argv[i-1] == "-netdev" {
			argv[i] = hostfwdPort.ReplaceAllString(a, "hostfwd=tcp:$1:0-")
		}
	}
	if out, err := runQEMU(t, bin, append(argv, "-S"), filepath.Join(m.Dir, QMPSocket)); err != nil {
		t.Fatalf("QEMU rejected the command line: %v\n%s", err, out)
	}
}

//go:build lab

package scenario

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
)

// apiCurl is a curl of the agent's main socket as root: the answer's body goes to /tmp/body, the
// HTTP status to stdout.
const apiCurl = `curl -s --unix-socket /run/rbd-owner/rbd-owner.sock -H "Content-Type: application/json" -o /tmp/body -w "%{http_code}\n"`

// roleGIDs sets csi and adm in a guest script: the gids of groups rbd-owner and rbd-owner-admin.
const roleGIDs = `csi=$(getent group rbd-owner | cut -d: -f3); adm=$(getent group rbd-owner-admin | cut -d: -f3)`

// Lines of guest and Ceph output this file reads: a monitor of `ceph mon dump`, one with a v2
// address alone; the adopt-or-fence writer's device and its window.
var (
	monLine    = regexp.MustCompile(`^[0-9]+: `)
	monV2Line  = regexp.MustCompile(`^[0-9]+: \[?v2:[0-9.]+:3300/0\]? mon\.[abc]$`)
	writerDev  = regexp.MustCompile(`device=([^ ]*)`)
	writerWind = regexp.MustCompile(`window_ms=.*`)
)

// nodeAMaps is the step "node-a: map, idempotent map, claim, map options, secrets"; it sets devA,
// linkA, e1 and aAddr1 for the later steps.
func (e *e2e) nodeAMaps() {
	e.Step("node-a: map, idempotent map, claim, map options, secrets")
	e.T(0, "agent answers on node-a (socket activation)", nodeA, `{ rbd-owner status || [ $? = 5 ]; } && systemctl is-active rbd-owner.socket && systemctl show -p TriggeredBy --value rbd-owner | grep -q rbd-owner.socket`)
	e.T(0, "rbd module not loaded before the first map (the sandboxed agent must load it)", nodeA, `[ ! -e /sys/bus/rbd ] && ! grep -qw "^rbd" /proc/modules`)
	e.T(0, "node-a maps rbd/img1", nodeA, `rbd-owner map --json rbd/img1`)
	first, err := e.mapReply()
	e.devA, e.linkA = first.Device, first.Link
	if first.Claim != nil {
		e.e1 = first.Claim.Epoch
	}
	e.Check("map reply: a device, already_mapped=false, epoch >= 1", func() error {
		if err != nil {
			return err
		}
		return Cond(strings.HasPrefix(e.devA, "/dev/rbd") && !first.AlreadyMapped && e.e1 >= 1,
			"device %q, already_mapped=%t, epoch %d", e.devA, first.AlreadyMapped, e.e1)
	})
	e.T(0, fmt.Sprintf("stable udev link %s → %s", e.linkA, e.devA), nodeA,
		fmt.Sprintf(`[ "$(readlink -f '%s')" = '%s' ] && [[ '%s' == /dev/rbd-owner/*/rbd/img1 ]]`, e.linkA, e.devA, e.linkA))
	e.T(0, "map again: same device, already_mapped=true", nodeA, `rbd-owner map --json rbd/img1`)
	again, err := e.mapReply()
	e.Check("idempotent map reply", func() error {
		if err != nil {
			return err
		}
		return Cond(again.Device == e.devA && again.AlreadyMapped && again.Claim.Epoch == e.e1,
			"device %q, already_mapped=%t, epoch %d; want %s, true, %d", again.Device, again.AlreadyMapped, again.Claim.Epoch, e.devA, e.e1)
	})
	e.T(0, "still exactly one rbd device on node-a", nodeA, `[ $(ls /sys/bus/rbd/devices | wc -l) = 1 ]`)
	e.aAddr1 = e.clientAddr(nodeA, e.devA)
	e.Check(fmt.Sprintf("claim record in RADOS: node-a, epoch %d, the mapping's client_addr", e.e1), func() error {
		if err := e.HoldersAre(fmt.Sprintf("node-a@%d", e.e1), "img1"); err != nil {
			return err
		}
		r, err := e.Claim("img1")
		if err != nil {
			return err
		}
		if r == nil || len(r.Holders) == 0 {
			return fmt.Errorf("claim of img1 has no holder")
		}
		return Cond(r.Holders[0].ClientAddr == e.aAddr1, "the holder's client_addr is %q, the mapping's %q", r.Holders[0].ClientAddr, e.aAddr1)
	})
	e.T(0, "config_info: key=rbd-owner.rbdowner.<nonce>, noshare, no secret=, no exclusive", nodeA,
		fmt.Sprintf(`c=$(cat /sys/bus/rbd/devices/%s/config_info); echo "$c"; [[ $c == *key=rbd-owner.rbdowner.* && $c == *noshare* && $c != *secret=* && $c != *exclusive* ]]`,
			strings.TrimPrefix(e.devA, "/dev/rbd")))
	if e.prod() {
		// msgr2 only: the monitors list v2 addresses alone and nothing listens on msgr1's port, so a
		// mapping that works speaks msgr2; the kernel's client says which mode it asked for
		e.Check("prod: three monitors, msgr2 only (v2 addresses alone, nothing listening on 6789)", e.nodeMonsV2Only)
		e.T(0, "prod: node-a's mapping is a kernel client with ms_mode=secure (debugfs client_options)", nodeA,
			`f=$(grep -l ms_mode=secure /sys/kernel/debug/ceph/*/client_options) && cat $f && [ -n "$f" ]`)
		e.Check("prod: … ms_mode=secure came from the cluster's rbd_default_map_options (config store), the agent's config has no map_options", e.nodeSecureFromCluster)
	}
	e.T(0, "no secret in sysfs config_info, udev database, journal (node-a)", nodeA, e.secretCheck())
	// no inotify watch on rbd devices (udev/60-rbd-owner.rules): newer systemd sets one, and its
	// "change" event after each close of a written device made udev read the image, which hung on
	// a cut-off node until the worker was killed, leaving a stale stable link (Debian forky)
	e.T(0, "udev does not watch node-a's rbd device with inotify (no udev read of the image after each write)", nodeA,
		fmt.Sprintf(`mm=$(cat /sys/block/%s/dev) && udevadm settle -t 10; ls -l /run/udev/watch 2>/dev/null | grep "b$mm"; [ ! -e /run/udev/watch/b$mm ] && ! grep -qs '^W:' /run/udev/data/b$mm`,
			strings.TrimPrefix(e.devA, "/dev/")))
}

// nodeMonsV2Only (prod): `ceph mon dump` lists three monitors with v2 addresses alone, none with
// a v1 address, and nothing in the lab's namespace listens on msgr1's port 6789.
func (e *e2e) nodeMonsV2Only() error {
	d, err := e.Ceph("mon", "dump")
	if err != nil {
		return err
	}
	var mons []string
	v2 := 0
	for _, ln := range strings.Split(d, "\n") {
		if monLine.MatchString(ln) {
			mons = append(mons, ln)
		}
		if monV2Line.MatchString(ln) {
			v2++
		}
	}
	if v2 != 3 || strings.Contains(d, "v1:") {
		return fmt.Errorf("%d monitors with a v2 address alone, want 3 and no v1: address; monitors: %s", v2, strings.Join(mons, "; "))
	}
	ss, err := e.NSX("ss", "-ltn")
	if err != nil {
		return err
	}
	return Cond(!strings.Contains(ss, ":6789 "), "something listens on 6789: %s", ss)
}

// nodeSecureFromCluster (prod): the agent's config has no map_options, and node-a's status says
// img1's ms_mode=secure came from the cluster's config store.
func (e *e2e) nodeSecureFromCluster() error {
	if out, rc := e.On(nodeA, `! grep -q map_options /etc/rbd-owner/config.yaml`); rc != 0 {
		return fmt.Errorf("/etc/rbd-owner/config.yaml has map_options (exit %d) %s", rc, out)
	}
	st, err := e.status(nodeA)
	if err != nil {
		return err
	}
	n := 0
	var seen []string
	for _, d := range st.Devices {
		if d.Image != "img1" {
			continue
		}
		for _, o := range d.Options {
			seen = append(seen, o.Option+" from "+o.From)
			if o.Option == "ms_mode=secure" && o.From == "cluster rbd_default_map_options (config)" {
				n++
			}
		}
	}
	return Cond(n == 1, "%d options of img1 are ms_mode=secure from the cluster's rbd_default_map_options, want 1; options: %s", n, strings.Join(seen, "; "))
}

// badNames is the step "node-a: bad names refused without a sysfs write; non-root callers
// refused".
func (e *e2e) badNames() {
	e.Step("node-a: bad names refused without a sysfs write; non-root callers refused")
	const devicesAndMaps = `ls /sys/bus/rbd/devices | wc -l; dmesg | grep -c "rbd: "`
	before, _ := e.Run(nodeA, devicesAndMaps)
	for _, bad := range []string{"rbd/a,b", "rbd/a b", "rbd/img1,name=admin", "r,bd/img1"} {
		e.T(2, fmt.Sprintf("CLI: rbd-owner map '%s' → exit 2", bad), nodeA, fmt.Sprintf("rbd-owner map '%s'", bad))
	}
	e.T(0, `API: POST /v1/map with image "a,b" → 400 invalid_argument`, nodeA,
		`c=$(`+apiCurl+` -d '{"cluster":"lab","pool":"rbd","image":"a,b"}' http://x/v1/map); cat /tmp/body; [ "$c" = 400 ] && grep -q invalid_argument /tmp/body`)
	e.T(0, `API: POST /v1/map with pool "rbd name=admin" → 400`, nodeA,
		`c=$(`+apiCurl+` -d '{"cluster":"lab","pool":"rbd name=admin","image":"img2"}' http://x/v1/map); cat /tmp/body; [ "$c" = 400 ]`)
	e.T(0, "API: unknown field → 400", nodeA,
		`c=$(`+apiCurl+` -d '{"cluster":"lab","pool":"rbd","image":"img2","secret":"x"}' http://x/v1/map); cat /tmp/body; [ "$c" = 400 ]`)
	after, _ := e.Run(nodeA, devicesAndMaps)
	e.Check(fmt.Sprintf("no device appeared and the kernel saw no map attempt (devices, dmesg unchanged; before: %s)", strings.ReplaceAll(before, "\n", " ")), func() error {
		return Cond(after == before, "devices and rbd kernel messages now %q, before %q", after, before)
	})
	e.T(0, "nobody (not in group rbd-owner): socket mode 0660 refuses the connection: exit 1, one line naming the permission and the group, not a missing agent", nodeA,
		`rc=0; o=$(setpriv --reuid=65534 --regid=65534 --clear-groups rbd-owner status 2>&1) || rc=$?; echo "$o"; [ $rc = 1 ] && [ $(echo "$o" | wc -l) = 1 ] && echo "$o" | grep -q "no permission to connect to the rbd-owner agent.s socket.*usermod -aG rbd-owner" && ! echo "$o" | grep -qi "is the agent running\|no rbd-owner agent answers"`)
	e.T(0, "a member of group rbd-owner may use the API", nodeA,
		`setpriv --reuid=65534 --regid=65534 --groups=$(getent group rbd-owner | cut -d: -f3) rbd-owner status || [ $? = 5 ]`)
	e.T(0, "nobody with the socket opened up (0666): the agent's SO_PEERCRED check answers 403", nodeA,
		`rm -f /tmp/body; chmod 0666 /run/rbd-owner/rbd-owner.sock
  c=$(setpriv --reuid=65534 --regid=65534 --clear-groups `+apiCurl+` http://x/v1/status); cat /tmp/body
  setpriv --reuid=65534 --regid=65534 --clear-groups rbd-owner map rbd/img3; rc=$?
  chmod 0660 /run/rbd-owner/rbd-owner.sock; echo "http $c, cli exit $rc"; [ "$c" = 403 ] && [ $rc = 1 ]`)
	e.CheckWithin(5*time.Second, "denied audited with REQUESTER_UID=65534", e.auditHas(nodeA, `^denied .* 65534$`))
}

// roles is the step "node-a: two roles: the CSI socket and group rbd-owner may not fence; group
// rbd-owner-admin may".
func (e *e2e) roles() {
	e.Step("node-a: two roles: the CSI socket and group rbd-owner may not fence; group rbd-owner-admin may")
	// an unread journal counts none, as grep -c did: the closing count then says what it saw
	denied0, _ := e.auditMatches(nodeA, `^denied `)
	e.T(0, "the CSI socket /run/rbd-owner/csi/csi.sock exists in a directory of its own (0660 root:rbd-owner)", nodeA,
		`[ "$(stat -c "%a %U %G" /run/rbd-owner/csi/csi.sock)" = "660 root rbd-owner" ] && [ "$(ls /run/rbd-owner/csi)" = csi.sock ]`)
	e.T(0, "root on the CSI socket may read status", nodeA, `rbd-owner --socket /run/rbd-owner/csi/csi.sock status`)
	e.T(1, "root on the CSI socket: fence refused (403)", nodeA, `rbd-owner --socket /run/rbd-owner/csi/csi.sock fence rbd/img3`)
	e.Check("… the refusal says the admin role is needed", e.OutHas("admin role"))
	e.T(1, "root on the CSI socket: release --force refused (403)", nodeA, `rbd-owner --socket /run/rbd-owner/csi/csi.sock release --force rbd/img3`)
	e.Check("… the refusal says the admin role is needed", e.OutHas("admin role"))
	e.T(1, "root on the CSI socket: map --takeover refused (403): a CSI caller never fences another node", nodeA, `rbd-owner --socket /run/rbd-owner/csi/csi.sock map --takeover rbd/img3`)
	e.Check("… the refusal says the admin role is needed", e.OutHas("admin role"))
	e.T(0, "… and it was audited as denied", nodeA, `journalctl -u rbd-owner -o cat --no-pager RBD_OWNER_EVENT=denied | grep -q "with takeover"`)
	e.T(1, "uid 65534 in group rbd-owner on the main socket: fence refused (403)", nodeA,
		roleGIDs+`; setpriv --reuid=65534 --regid=65534 --groups=$csi rbd-owner fence rbd/img3`)
	e.Check("… the refusal says the admin role is needed", e.OutHas("admin role"))
	e.T(0, "uid 65534 in group rbd-owner on the main socket may still map and unmap", nodeA,
		roleGIDs+`; setpriv --reuid=65534 --regid=65534 --groups=$csi rbd-owner map rbd/img3 && setpriv --reuid=65534 --regid=65534 --groups=$csi rbd-owner unmap rbd/img3`)
	e.T(0, "uid 65534 in groups rbd-owner and rbd-owner-admin: orphan removal allowed (admin)", nodeA,
		roleGIDs+`; setpriv --reuid=65534 --regid=65534 --groups=$csi,$adm rbd-owner claims --remove-orphans`)
	e.T(1, "… and its fence of img3 reaches the call (img3 has no claim)", nodeA,
		roleGIDs+`; setpriv --reuid=65534 --regid=65534 --groups=$csi,$adm rbd-owner fence rbd/img3`)
	e.Check("… answered by the call, not refused for the role", e.OutHasNot("permission"))
	e.CheckWithin(5*time.Second, "the four refusals audited (denied)", e.auditCount(nodeA, `^denied `, denied0+4))
}

// crossNode is the step "node-b: cross-node refusal; snapshot of a mapped image".
func (e *e2e) crossNode() {
	e.Step("node-b: cross-node refusal; snapshot of a mapped image")
	e.T(3, "node-b: map rbd/img1 (held by node-a) → exit 3", nodeB, `rbd-owner map rbd/img1`)
	e.Check("the refusal names the owner node-a", e.OutHas("node-a"))
	e.T(0, "node-b: no device appeared", nodeB, `[ -z "$(ls /sys/bus/rbd/devices)" ]`)
	e.CheckWithin(5*time.Second, "node-b journal: refuse, RBD_OWNER_NODE=node-a", e.auditHas(nodeB, `^refuse img1 .* node-a `))
	e.Check("rbd snap create on the mapped image works", func() error {
		if _, err := e.RBD("snap", "create", "rbd/img1@e2e"); err != nil {
			return err
		}
		ls, err := e.RBD("snap", "ls", "rbd/img1")
		if err != nil {
			return err
		}
		return Cond(strings.Contains(ls, "e2e"), "rbd snap ls rbd/img1 lists no e2e: %s", ls)
	})
}

// behindTheBack is the step "node-b: devices removed or mapped behind the agent's back".
func (e *e2e) behindTheBack() {
	e.Step("node-b: devices removed or mapped behind the agent's back")
	img2Released := func() error { return e.HoldersAre("", "img2") }
	e.T(0, "node-b maps rbd/img2", nodeB, `rbd-owner map rbd/img2`)
	dev := e.Out
	e.Check("claim img2 held by node-b", func() error { return e.HeldBy(nodeB, "img2") })
	e.T(0, "rbd unmap (the rbd CLI) behind the agent's back", nodeB, "rbd --id rbdowner unmap "+dev)
	if !e.CheckWithin(3*time.Second, "… claim released within 3 s", img2Released) {
		e.nodeJournalTail(nodeB, 25)
	}
	e.CheckWithin(3*time.Second, "… device_lost audited", e.auditCount(nodeB, `^device_lost img2 `, 1))
	e.T(0, "node-b maps rbd/img2 again", nodeB, `rbd-owner map rbd/img2`)
	dev = e.Out
	e.T(0, "echo ID > /sys/bus/rbd/remove_single_major behind the agent's back", nodeB,
		fmt.Sprintf("echo %s > /sys/bus/rbd/remove_single_major", strings.TrimPrefix(dev, "/dev/rbd")))
	if !e.CheckWithin(3*time.Second, "… claim released within 3 s", img2Released) {
		e.nodeJournalTail(nodeB, 25)
	}
	e.CheckWithin(3*time.Second, "… device_lost audited", e.auditCount(nodeB, `^device_lost img2 `, 2))
	e.T(0, "rbd map (the rbd CLI) behind the agent's back", nodeB, `rbd --id rbdowner map rbd/img3`)
	dev = e.Out
	e.CheckWithin(5*time.Second, "… unmanaged_device audited", e.auditHas(nodeB, `^unmanaged_device img3 `))
	e.Check("… and shown in rbd-owner status (managed=false, exit 5)", func() error {
		return e.nodeStatus5With(nodeB, "unmanaged device of img3", func(d api.Device) bool { return d.Image == "img3" && !d.Managed })
	})
	e.Check("… and no claim was made for it", func() error { return e.HoldersAre("", "img3") })
	e.Check("rbd unmap of the unmanaged device; it leaves rbd-owner status", func() error {
		if out, rc := e.On(nodeB, "rbd --id rbdowner unmap "+dev); rc != 0 {
			return fmt.Errorf("rbd unmap %s: exit %d: %s", dev, rc, out)
		}
		return e.until(5*time.Second, nodeB, `! rbd-owner status | grep -q img3`)
	})
}

// enforcement is the step "enforcement: Ceph's own rbd map on node-b of an image node-a holds is
// fenced at once", through the unmanaged policies report and adopt-or-fence, back to the default.
func (e *e2e) enforcement() {
	e.Step("enforcement: Ceph's own rbd map on node-b of an image node-a holds is fenced at once")
	e.enforceFenceIfClaimed()
	e.enforceReport()
	e.enforceAdoptOrFence()
	e.Check("node-b: back to the default policy (agent restarted)", func() error { return e.setPolicy(nodeB, "") })
}

// enforceFenceIfClaimed: under the default policy, node-b's noshare mapping of node-a's image is
// fenced and recorded as an intruder; one without noshare is reported, not fenced.
func (e *e2e) enforceFenceIfClaimed() {
	e.T(0, "node-a maps rbd/enf1 through the agent", nodeA, `rbd-owner map --json rbd/enf1`)
	enf, _ := e.mapReply()
	devEnf, eEnf := enf.Device, uint64(0)
	if enf.Claim != nil {
		eEnf = enf.Claim.Epoch
	}
	aEnfAddr := e.clientAddr(nodeA, devEnf)
	e.T(0, "node-a writes to enf1 (O_DIRECT)", nodeA, fmt.Sprintf("dd if=/dev/urandom of=%s bs=4k count=1 oflag=direct", devEnf))
	e.T(0, "node-b: rbd map -o noshare rbd/enf1 with Ceph's own rbd, behind the agent's back (the kernel does not ask)", nodeB, `rbd --id rbdowner map -o noshare rbd/enf1`)
	devIntr := e.Out
	bIntrAddr := e.clientAddr(nodeB, devIntr)
	e.CheckWithin(20*time.Second, fmt.Sprintf("node-b's mapping (%s) is blocklisted", bIntrAddr), func() error { return e.Blocklisted(bIntrAddr) })
	e.T(1, fmt.Sprintf("node-b: an O_DIRECT write to %s fails (EIO, not a hang)", devIntr), nodeB, writeFails(devIntr))
	e.Check(fmt.Sprintf("node-a's enf1 mapping (%s) is not blocklisted", aEnfAddr), func() error { return e.NotBlocklisted(aEnfAddr) })
	e.T(0, "node-a's writes to enf1 go on", nodeA, fmt.Sprintf("dd if=/dev/urandom of=%s bs=4k count=1 seek=1 oflag=direct", devEnf))
	e.Check(fmt.Sprintf("claim enf1: still node-a at epoch %d", eEnf), func() error { return e.HoldersAre(fmt.Sprintf("node-a@%d", eEnf), "enf1") })
	e.Check("… and it records node-b's fenced mapping", e.intrudersAre("node-b@"+bIntrAddr, "enf1"))
	e.CheckWithin(10*time.Second, "node-b journal: unmanaged_device, error priority, owner node-a", e.auditHas(nodeB, `^unmanaged_device enf1 - node-a [0-3] `))
	e.T(0, "… its message names node-a, the device and the client", nodeB,
		fmt.Sprintf(`journalctl -u rbd-owner -o cat --no-pager RBD_OWNER_EVENT=unmanaged_device RBD_IMAGE=enf1 | grep FENCED | grep node-a | grep -F '%s' | grep -F '%s'`, devIntr, bIntrAddr))
	e.Check("node-b status: the device is unmanaged and fenced (exit 5)", func() error {
		return e.nodeStatus5With(nodeB, "fenced unmanaged device of enf1", func(d api.Device) bool {
			return d.Image == "enf1" && !d.Managed && d.FencedUntil != nil
		})
	})
	e.T(0, "node-a: rbd-owner claims shows the fenced intruder on node-b", nodeA, `rbd-owner claims | grep enf1 | grep "FENCED INTRUDER" | grep -q node-b`)
	e.T(1, "node-b: rbd-owner unfence rbd/enf1 while it is still mapped → refused", nodeB, `rbd-owner unfence rbd/enf1`)
	e.Check("… the refusal says to unmap it first", e.OutHas("unmap it first"))
	e.T(0, "node-b: rbd unmap of the fenced device", nodeB, "rbd --id rbdowner unmap -o force "+devIntr)
	e.T(0, "node-b: rbd-owner unfence rbd/enf1 (admin)", nodeB, `rbd-owner unfence rbd/enf1`)
	e.Check("… node-b's former client is off the blocklist", func() error { return e.NotBlocklisted(bIntrAddr) })
	e.Check("… and off the claim; node-a still holds enf1", e.intrudersAre("", "enf1"))
	e.T(0, "node-b: rbd map rbd/enf1 WITHOUT noshare, as stock ceph-csi maps", nodeB, `rbd --id rbdowner map rbd/enf1`)
	devSh := e.Out
	bShAddr := e.clientAddr(nodeB, devSh)
	e.CheckWithin(20*time.Second, "… reported at error priority: two writers possible, naming noshare in mapOptions and the drop-in", func() error {
		return e.nodeTwoWritersReported(devSh)
	})
	e.Check("… and not fenced: its kernel client may serve every other mapping of node-b", func() error { return e.NotBlocklisted(bShAddr) })
	e.T(0, "node-b: rbd unmap of it", nodeB, "rbd --id rbdowner unmap "+devSh)
}

// enforceReport: under unmanaged: report, node-b's mapping of node-a's image is only reported.
func (e *e2e) enforceReport() {
	e.Check("node-b: unmanaged: report (agent restarted)", func() error { return e.setPolicy(nodeB, "report") })
	e.T(0, "node-b: rbd map rbd/enf1 by hand again", nodeB, `rbd --id rbdowner map rbd/enf1`)
	devIntr := e.Out
	bIntrAddr := e.clientAddr(nodeB, devIntr)
	e.CheckWithin(20*time.Second, "node-b journal: reported (warning), naming node-a", e.auditHas(nodeB, `^unmanaged_device enf1 - node-a 4 `))
	e.Check("… under report it is not fenced", func() error { return e.NotBlocklisted(bIntrAddr) })
	e.T(0, "node-b: rbd unmap of it", nodeB, "rbd --id rbdowner unmap "+devIntr)
	e.T(0, "node-a unmaps rbd/enf1", nodeA, `rbd-owner unmap rbd/enf1`)
}

// enforceAdoptOrFence: under unmanaged: adopt-or-fence, node-b's mapping of a free image is
// adopted; node-a's noshare mapping of it is fenced from its add uevent alone (the window its
// writes had is logged); a read-only one is only reported.
func (e *e2e) enforceAdoptOrFence() {
	e.Check("node-b: unmanaged: adopt-or-fence (agent restarted)", func() error { return e.setPolicy(nodeB, "adopt-or-fence") })
	e.T(0, "node-b: rbd map -o noshare rbd/enf2 by hand (a free image)", nodeB, `rbd --id rbdowner map -o noshare rbd/enf2`)
	devAdopt := e.Out
	e.CheckWithin(20*time.Second, "claim enf2: adopted by node-b", func() error { return e.HeldBy(nodeB, "enf2") })
	e.CheckWithin(5*time.Second, fmt.Sprintf("node-b status: %s managed", devAdopt), func() error {
		return e.nodeStatusWith(nodeB, "managed device "+devAdopt, func(d api.Device) bool { return d.Device == devAdopt && d.Managed })
	})
	e.Check("node-b journal: unmanaged_device adopted", e.auditHas(nodeB, `^unmanaged_device enf2 [0-9]+ node-b 4 `))
	// damage limitation: a second node maps the adopted image by hand with noshare and writes at
	// once (O_DIRECT, 4 KiB each, from the moment its map returned) until a write fails: node-a's
	// agent fences the mapping from its add uevent alone. The loop is the workload measured, in
	// the guest.
	e.T(0, "node-a: rbd map -o noshare rbd/enf2 (held by node-b) and write until the fence stops it", nodeA,
		`d=$(rbd --id rbdowner map -o noshare rbd/enf2) || exit 2; t0=$(date +%s%N); n=0
   while timeout 30 dd if=/dev/urandom of=$d bs=4k count=1 seek=$n oflag=direct 2>/dev/null; do n=$((n + 1)); [ $n -lt 20000 ] || exit 3; done
   echo "device=$d window_ms=$(( ($(date +%s%N) - t0) / 1000000 )) writes_ok=$n"`)
	devAEnf2 := ""
	if m := writerDev.FindStringSubmatch(e.Out); m != nil {
		devAEnf2 = m[1]
	}
	e.Logf("adopt-or-fence, a second node's noshare map: %s (map returned → first refused write)", writerWind.FindString(e.Out))
	e.Check("… it was fenced: named in enf2's claim as an intruder of node-a", e.intrudersAre("node-a@"+e.clientAddr(nodeA, devAEnf2), "enf2"))
	e.T(0, "node-a: unmap the fenced device, then unfence rbd/enf2", nodeA, fmt.Sprintf("rbd --id rbdowner unmap -o force %s && rbd-owner unfence rbd/enf2", devAEnf2))
	e.T(0, "node-a: rbd map --read-only -o noshare rbd/enf2: a reader is only reported", nodeA, `rbd --id rbdowner map --read-only -o noshare rbd/enf2`)
	devRO := e.Out
	aROAddr := e.clientAddr(nodeA, devRO)
	e.CheckWithin(20*time.Second, "… node-a journal: reported (warning), it cannot write", e.auditHas(nodeA, `^unmanaged_device enf2 - node-b 4 `))
	e.Check("… and not fenced", func() error { return e.NotBlocklisted(aROAddr) })
	e.T(0, "node-a: rbd unmap of the read-only device", nodeA, "rbd --id rbdowner unmap "+devRO)
	e.T(0, "node-b: rbd-owner unmap rbd/enf2 (the adopted device)", nodeB, fmt.Sprintf("rbd-owner unmap rbd/enf2 && [ ! -e %s ]", devAdopt))
	e.Check("… claim enf2 released", func() error { return e.HoldersAre("", "enf2") })
}

// setPolicy sets node's agent's unmanaged policy ("" for the default), restarts the agent and
// waits up to 30 s for it to answer.
func (e *e2e) setPolicy(node, policy string) error {
	script := `sed -i '/^unmanaged:/d' /etc/rbd-owner/config.yaml && `
	if policy != "" {
		script += fmt.Sprintf(`echo 'unmanaged: %s' >> /etc/rbd-owner/config.yaml && `, policy)
	}
	script += `systemctl restart rbd-owner`
	if out, rc := e.On(node, script); rc != 0 {
		return fmt.Errorf("unmanaged: %q on %s: exit %d: %s", policy, node, rc, out)
	}
	return Within(30*time.Second, func() error { return e.answers(node) })
}

// nodeTwoWritersReported: node-b's journal has an unmanaged_device entry of enf1 at error
// priority whose message (one line of it) says two writers are possible, names dev and points at
// mapOptions.
func (e *e2e) nodeTwoWritersReported(dev string) error {
	lines, err := e.Audit(nodeB, "RBD_OWNER_EVENT=unmanaged_device", "RBD_IMAGE=enf1")
	if err != nil {
		return err
	}
	for _, a := range lines {
		if a.Priority != 3 {
			continue
		}
		for _, ln := range strings.Split(a.Message, "\n") {
			if strings.Contains(ln, "TWO WRITERS ARE POSSIBLE") && strings.Contains(ln, dev) && strings.Contains(ln, "mapOptions") {
				return nil
			}
		}
	}
	return fmt.Errorf("none of node-b's %d unmanaged_device entries of enf1 is at priority 3 saying TWO WRITERS ARE POSSIBLE, %s and mapOptions", len(lines), dev)
}

// nodeStatus5With: `rbd-owner status` on node exits 5 (it answers with problems) and its status
// lists a device ok accepts (what names it in the error).
func (e *e2e) nodeStatus5With(node, what string, ok func(api.Device) bool) error {
	if out, rc := e.On(node, "rbd-owner status"); rc != 5 {
		return fmt.Errorf("rbd-owner status on %s: exit %d, want 5: %s", node, rc, out)
	}
	return e.nodeStatusWith(node, what, ok)
}

// nodeStatusWith: node's status lists a device ok accepts (what names it in the error).
func (e *e2e) nodeStatusWith(node, what string, ok func(api.Device) bool) error {
	st, err := e.status(node)
	if err != nil {
		return err
	}
	var seen []string
	for _, d := range st.Devices {
		if ok(d) {
			return nil
		}
		fenced := "not fenced"
		if d.FencedUntil != nil {
			fenced = "fenced until " + d.FencedUntil.UTC().Format(time.RFC3339)
		}
		seen = append(seen, fmt.Sprintf("%s %s/%s managed=%t %s", d.Device, d.Pool, d.Image, d.Managed, fenced))
	}
	return fmt.Errorf("%s's status lists no %s; its devices: [%s]", node, what, strings.Join(seen, "; "))
}

// nodeJournalTail prints the last n lines of node's agent's journal under a failed assertion,
// for its context.
func (e *e2e) nodeJournalTail(node string, n int) {
	out, _ := e.OnT(10*time.Second, node, fmt.Sprintf("journalctl -u rbd-owner -o short-precise --no-pager -n %d", n))
	if out == "" {
		return
	}
	for _, ln := range strings.Split(out, "\n") {
		fmt.Fprintf(e.out, "      | %s\n", ln)
	}
}

//go:build lab

package scenario

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"
)

// csiShim puts the drop-ins first on a guest script's PATH, as ceph-csi's plugin container has
// them.
const csiShim = "export PATH=/usr/lib/rbd-owner/bin:$PATH; "

// csiArgs are the connection arguments ceph-csi passes to rbd: the monitors as its config lists
// them (the prod topology's three msgr2 addresses) and a keyfile.
func (e *e2e) csiArgs() string {
	return "--id rbdowner -m " + strings.Join(e.Mons, ",") + " --keyfile=/tmp/csi.key"
}

// sameAsCeph is a guest script: the drop-in and Ceph's rbd, given args, print the same (through
// filter, "" for cat) and exit the same.
func sameAsCeph(args, filter string) string {
	if filter == "" {
		filter = "cat"
	}
	return csiShim + fmt.Sprintf(`a=$(rbd %[1]s 2>&1 | %[2]s; echo "rc=${PIPESTATUS[0]}"); b=$(/usr/bin/rbd %[1]s 2>&1 | %[2]s; echo "rc=${PIPESTATUS[0]}"); printf "%%s\n--\n%%s\n" "$a" "$b"; [ "$a" = "$b" ]`, args, filter)
}

var rbdDevice = regexp.MustCompile(`^/dev/rbd[0-9]+$`)

// isDevice: the last command's output is a device node alone.
func (e *e2e) isDevice() error {
	return Cond(rbdDevice.MatchString(e.Out), "not a device alone: %q", e.Out)
}

// oneLineNaming: the last command's output is one line, and says sub (ignoring case).
func (e *e2e) oneLineNaming(sub string) func() error {
	out, has := e.Out, e.OutHas(sub)
	return func() error {
		if strings.Contains(out, "\n") {
			return fmt.Errorf("more than one line: %s", out)
		}
		return has()
	}
}

// sysfsID is the sysfs id of an rbd device node (/dev/rbd3 → 3).
func sysfsID(dev string) string { return strings.TrimPrefix(dev, "/dev/rbd") }

// runsClean: script, run on node, exits 0 (else what it printed).
func (e *e2e) runsClean(node, script string) error {
	out, rc := e.On(node, script)
	return Cond(rc == 0, "exit %d: %s", rc, out)
}

// agentAnswersWithin: node's agent answers within d.
func (e *e2e) agentAnswersWithin(d time.Duration, node string) error {
	return Within(d, func() error { return e.answers(node) })
}

// adoptedAt: node-a's status lists dev as managed at epoch and, with noProblem, without a problem.
func (e *e2e) adoptedAt(dev string, epoch uint64, noProblem bool) func() error {
	return func() error {
		st, err := e.status(nodeA)
		if err != nil {
			return err
		}
		var seen []string
		for _, d := range st.Devices {
			if d.Device != dev {
				continue
			}
			if d.Managed && d.Epoch == epoch && (!noProblem || d.Problem == "") {
				return nil
			}
			seen = append(seen, fmt.Sprintf("managed=%t epoch=%d problem=%q", d.Managed, d.Epoch, d.Problem))
		}
		if len(seen) == 0 {
			return fmt.Errorf("node-a's status lists no device %s (problems: %s)", dev, strings.Join(st.Problems, "; "))
		}
		want := fmt.Sprintf("managed, epoch %d", epoch)
		if noProblem {
			want += ", no problem"
		}
		return fmt.Errorf("%s: %s; want %s", dev, strings.Join(seen, "; "), want)
	}
}

// csiDropIn is the step "ceph-csi through the drop-in rbd: …": ceph-csi v3.12.2's call sequences
// (internal/rbd/rbd_attach.go: getDeviceList, createPath, detachRBDImageOrDeviceSpec), the nbd
// mounter's and another network namespace's refusals.
func (e *e2e) csiDropIn() {
	e.Step(fmt.Sprintf("ceph-csi through the drop-in rbd: the call sequences of ceph-csi v3.12.2 against the guest's Ceph rbd (%s)", e.Guest))
	csi := e.csiArgs()
	for _, n := range Nodes {
		e.T(0, n+": rbd on the plugin's PATH is the drop-in; a keyfile as ceph-csi writes one", n,
			csiShim+`[ "$(command -v rbd)" = /usr/lib/rbd-owner/bin/rbd ] && awk '/key *=/{print $3}' `+e.keyf+` > /tmp/csi.key`)
	}
	e.T(0, "node-a NodeStage: rbd device list --format=json --device-type krbd", nodeA, csiShim+"rbd device list --format=json --device-type krbd")
	e.Check("… the list is Ceph's JSON array", func() error {
		var list []json.RawMessage
		if err := e.JSON(&list); err != nil {
			return err
		}
		return Cond(list != nil, "not an array: %s", e.Out)
	})
	e.T(0, fmt.Sprintf("node-a NodeStage: rbd %s map rbd/csi1 --device-type krbd --options noudev", csi), nodeA,
		csiShim+"rbd "+csi+" map rbd/csi1 --device-type krbd --options noudev")
	devCSI := e.Out
	e.Check(fmt.Sprintf("… stdout is the device alone (%s)", devCSI), e.isDevice)
	e.Check("claim csi1: held by node-a", func() error { return e.HeldBy(nodeA, "csi1") })
	e.T(0, "node-a: the drop-in's device list is byte-identical to Ceph's rbd device list", nodeA,
		`a=$(`+csiShim+`rbd device list --format=json --device-type krbd); b=$(/usr/bin/rbd device list --format=json --device-type krbd); printf '%s\n%s\n' "$a" "$b"; [ "$a" = "$b" ] && [[ $a == *'"name":"csi1"'* ]]`)
	e.T(16, "node-b NodeStage of csi1 (held by node-a) → refused (exit 16, EBUSY)", nodeB,
		csiShim+"rbd "+csi+" map rbd/csi1 --device-type krbd --options noudev")
	e.Check("… one stderr line naming node-a: "+e.Out, e.oneLineNaming("node-a"))
	e.T(0, "node-b: no device appeared", nodeB, `[ -z "$(ls /sys/bus/rbd/devices)" ]`)
	e.T(0, "node-a: map rbd/csi2 with a StorageClass's mapOptions (queue_depth=128)", nodeA,
		csiShim+"rbd "+csi+" map rbd/csi2 --device-type krbd --options noudev --options queue_depth=128")
	devCSI2 := e.Out
	if e.prod() {
		e.T(22, "prod: node-b: a StorageClass's ms_mode=crc where the cluster's rbd_default_map_options ask for secure → refused (EINVAL), nothing claimed", nodeB,
			csiShim+"rbd "+csi+" map rbd/img3 --device-type krbd --options noudev --options ms_mode=crc")
		e.Check("… one stderr line naming the cluster's setting: "+e.Out, e.oneLineNaming("ask for ms_mode=secure"))
		e.Check("… img3 unclaimed", func() error { return e.HoldersAre("", "img3") })
	}
	e.T(0, "… the kernel got queue_depth=128, noshare and the agent's key", nodeA,
		`c=$(cat /sys/bus/rbd/devices/`+sysfsID(devCSI2)+`/config_info); echo "$c"; [[ $c == *queue_depth=128* && $c == *noshare* && $c == *key=rbd-owner.rbdowner.* ]]`)
	e.T(0, "node-a NodeUnstage: rbd unmap rbd/csi2 --device-type krbd --options noudev", nodeA,
		csiShim+"rbd unmap rbd/csi2 --device-type krbd --options noudev && [ ! -e "+devCSI2+" ]")
	e.Check("… claim csi2 released", func() error { return e.HoldersAre("", "csi2") })
	e.T(22, "node-a NodeUnstage again: csi2 is not mapped", nodeA, csiShim+"rbd unmap rbd/csi2 --device-type krbd --options noudev")
	out := e.Out
	e.Check("… stderr is the line ceph-csi takes for success", func() error {
		want := "rbd: rbd/csi2: not a mapped image or snapshot"
		return Cond(out == want, "stderr %q, want %q", out, want)
	})
	e.T(0, fmt.Sprintf("node-a undo path: rbd unmap %s --device-type krbd --options noudev", devCSI), nodeA,
		csiShim+"rbd unmap "+devCSI+" --device-type krbd --options noudev && [ ! -e "+devCSI+" ]")
	e.Check("… claim csi1 released", func() error { return e.HoldersAre("", "csi1") })
	e.csiROX(csi)
	e.csiPassThrough()
	e.csiNBD(csi)
	e.csiNetns(csi)
}

// csiROX is ceph-csi's ReadOnlyMany on both nodes (the step "ceph-csi through the drop-in rbd").
func (e *e2e) csiROX(csi string) {
	e.T(0, "ROX: node-a maps rbd/csi1 --read-only", nodeA, csiShim+"rbd "+csi+" map rbd/csi1 --device-type krbd --options noudev --read-only")
	e.T(0, "ROX: node-b maps rbd/csi1 --read-only", nodeB, csiShim+"rbd "+csi+" map rbd/csi1 --device-type krbd --options noudev --read-only")
	e.Check("… claim csi1: rox, held by node-a and node-b", func() error {
		r, err := e.Claim("csi1")
		if err != nil {
			return err
		}
		got := ""
		if r != nil {
			var nodes []string
			for _, h := range r.Holders {
				nodes = append(nodes, h.NodeID)
			}
			sort.Strings(nodes)
			got = string(r.Access) + " " + strings.Join(nodes, ",")
		}
		return Cond(got == "rox node-a,node-b", "claim csi1: '%s', want 'rox node-a,node-b'", got)
	})
	e.T(0, "ROX: a writable map of csi1 is refused on node-a", nodeA,
		csiShim+"rbd "+csi+` map rbd/csi1 --device-type krbd --options noudev; rc=$?; [ $rc = 16 ] || [ $rc = 22 ]`)
	for _, n := range Nodes {
		e.T(0, "ROX: "+n+" unstages csi1", n, csiShim+"rbd unmap rbd/csi1 --device-type krbd --options noudev")
	}
}

// csiPassThrough: what is not a map or an unmap is Ceph's rbd's (the step "ceph-csi through the
// drop-in rbd").
func (e *e2e) csiPassThrough() {
	e.T(0, "pass-through: rbd info rbd/csi1 (same output and exit code with and without the drop-in; timestamps aside)", nodeA,
		sameAsCeph("--id rbdowner info rbd/csi1", "grep -v timestamp"))
	e.T(0, "pass-through: rbd snap create rbd/csi1@s1 through the drop-in", nodeA,
		csiShim+"rbd --id rbdowner snap create rbd/csi1@s1 && /usr/bin/rbd --id rbdowner snap ls rbd/csi1 | grep -qw s1")
	e.T(0, "pass-through: rbd snap create of an existing snapshot fails alike", nodeA, sameAsCeph("--id rbdowner snap create rbd/csi1@s1", ""))
}

// csiNBD is the mounter rbd-nbd (the step "ceph-csi through the drop-in rbd"). ceph-csi maps with
// `rbd … map --device-type nbd` (Ceph's rbd would run its own rbd-nbd, past PATH) and re-attaches
// after a plugin restart with `rbd-nbd … attach` by name: both drop-ins refuse, in one line naming
// the StorageClass's mounter. The guests have no rbd-nbd of Ceph's; the refusals need none.
func (e *e2e) csiNBD(csi string) {
	e.T(95, "mounter: rbd-nbd: rbd --id rbdowner map rbd/csi1 --device-type nbd → refused by the drop-in (exit 95, EOPNOTSUPP)", nodeA,
		csiShim+"rbd --id rbdowner map rbd/csi1 --device-type nbd")
	e.Check("… one stderr line naming the StorageClass's mounter: "+e.Out, e.oneLineNaming("mounter: rbd-nbd"))
	e.T(95, "… ceph-csi's own nbd map (log file, nbd options) → refused", nodeA,
		csiShim+"rbd "+csi+" --log-file /tmp/rbd-nbd-csi1.log map rbd/csi1 --device-type nbd --options try-netlink --options reattach-timeout=300 --options io-timeout=0")
	e.Check("… one line: "+e.Out, e.oneLineNaming("rbd-owner: refused: rbd map --device-type nbd of rbd/csi1: "))
	e.T(95, "… the device type before the command: rbd -t nbd --id rbdowner device map rbd/csi1 → refused", nodeA,
		csiShim+"rbd -t nbd --id rbdowner device map rbd/csi1")
	e.T(0, "rbd-nbd on the plugin's PATH is the drop-in", nodeA, csiShim+`[ "$(command -v rbd-nbd)" = /usr/lib/rbd-owner/bin/rbd-nbd ]`)
	e.T(1, "rbd-nbd --id rbdowner map rbd/csi1 through the drop-in's directory → refused (exit 1, as rbd-nbd fails)", nodeA,
		csiShim+"rbd-nbd --id rbdowner map rbd/csi1")
	e.Check("… one line naming the StorageClass's mounter: "+e.Out, e.oneLineNaming("mounter: rbd-nbd"))
	e.T(1, "ceph-csi's re-attach after a plugin restart: rbd-nbd … attach rbd/csi1 --device /dev/nbd0 → refused", nodeA,
		csiShim+"rbd-nbd "+csi+" --log-file /tmp/rbd-nbd-csi1.log attach rbd/csi1 --device /dev/nbd0 --try-netlink --reattach-timeout=300 --io-timeout=0")
	e.Check("… one line: "+e.Out, e.oneLineNaming("rbd-owner: refused: rbd-nbd attach of rbd/csi1: "))
	e.T(0, "… no device appeared: no connected nbd device, no rbd-nbd process, no rbd device of csi1", nodeA,
		`! ls /sys/block/nbd*/pid >/dev/null 2>&1 && ! pgrep -x rbd-nbd && { ! ls /sys/bus/rbd/devices/*/name >/dev/null 2>&1 || ! grep -qx csi1 /sys/bus/rbd/devices/*/name; }`)
	e.Check("… claim csi1: no holder (the agent was not asked)", func() error { return e.HoldersAre("", "csi1") })
	// the rest of nbd is Ceph's, so that nbd mappings made before rbd-owner can be taken down
	e.T(0, "pass-through: rbd device list --device-type nbd is Ceph's", nodeA, sameAsCeph("device list --format=json --device-type nbd", ""))
	e.T(0, "pass-through: rbd-nbd list-mapped runs Ceph's rbd-nbd, or says in one line that it cannot (the guests have none)", nodeA,
		csiShim+`o=$(rbd-nbd list-mapped 2>&1); rc=$?; echo "rc=$rc: $o"
  if [ -x /usr/bin/rbd-nbd ]; then [ "$o" = "$(/usr/bin/rbd-nbd list-mapped 2>&1)" ]
  else [ $rc = 127 ] && [ "$(wc -l <<< "$o")" = 1 ] && [[ $o == *"cannot run Ceph"*"(/usr/bin/rbd-nbd)"* ]]; fi`)
}

// csiNetns: a map from another network namespace (ceph-csi's netNamespaceFilePath) is refused
// (the step "ceph-csi through the drop-in rbd").
func (e *e2e) csiNetns(csi string) {
	e.T(22, "netns: rbd map from another network namespace (ceph-csi's netNamespaceFilePath: nsenter --net=…) → refused", nodeA,
		csiShim+"unshare --net rbd "+csi+" map rbd/csi1 --device-type krbd --options noudev")
	e.Check("… the refusal says why (another network namespace)", e.OutHas("network namespace"))
	e.T(0, "… and no device was made", nodeA, `! ls /sys/bus/rbd/devices/*/name >/dev/null 2>&1 || ! grep -qx csi1 /sys/bus/rbd/devices/*/name`)
}

// agentKilled is the step "node-a: agent killed with SIGKILL and restarted while mapped and
// mounted".
func (e *e2e) agentKilled() {
	e.Step("node-a: agent killed with SIGKILL and restarted while mapped and mounted")
	e.T(0, "node-a: mkfs, mount, write a file on "+e.devA, nodeA,
		"mkfs.ext4 -q "+e.devA+" && mkdir -p /mnt/img1 && mount "+e.devA+" /mnt/img1 && echo 'node-a was here' > /mnt/img1/a.txt && sync")
	pid1, _ := e.On(nodeA, "systemctl show -p MainPID --value rbd-owner")
	e.Check("systemctl kill -s KILL rbd-owner; systemd restarts it", func() error {
		// the kill's own status is not the check: a new main process that answers is
		killOut, _ := e.On(nodeA, "systemctl kill -s KILL rbd-owner")
		err := Within(20*time.Second, func() error {
			p, _ := e.On(nodeA, "systemctl show -p MainPID --value rbd-owner")
			if p == "0" || p == pid1 {
				return fmt.Errorf("rbd-owner's MainPID is %s (%s before the kill)", p, pid1)
			}
			if out, rc := e.On(nodeA, "systemctl is-active rbd-owner"); rc != 0 {
				return fmt.Errorf("rbd-owner (MainPID %s) is %s", p, out)
			}
			return e.answers(nodeA)
		})
		if err != nil {
			st, _ := e.On(nodeA, "systemctl status --no-pager rbd-owner")
			return fmt.Errorf("not restarted within 20s: %v\n%s\n%s", err, killOut, st)
		}
		return nil
	})
	e.Check(fmt.Sprintf("device re-adopted: %s managed, epoch %d, no problem", e.devA, e.e1), e.adoptedAt(e.devA, e.e1, true))
	e.claimKept()
	h0 := e.HeartbeatMark(nodeA)
	e.CheckWithin(15*time.Second, "node-a's lease renewed again after the restart (its heartbeat moves)",
		func() error { return e.HeartbeatMoved(nodeA, h0) })
	e.T(0, "the mount was untouched", nodeA, "mountpoint -q /mnt/img1 && cat /mnt/img1/a.txt")
}

// claimKept: img1's claim is still node-a's, at its first epoch.
func (e *e2e) claimKept() {
	e.Check(fmt.Sprintf("claim kept: node-a, same epoch %d", e.e1), func() error {
		return e.HoldersAre(fmt.Sprintf("node-a@%d", e.e1), "img1")
	})
}

// stateFileCut is the step "node-a: state file cut short while mapped and mounted; the agent starts
// anyway and rebuilds".
func (e *e2e) stateFileCut() {
	e.Step("node-a: state file cut short while mapped and mounted; the agent starts anyway and rebuilds")
	since, _ := e.On(nodeA, `date "+%Y-%m-%d %H:%M:%S"`)
	e.T(0, "mappings.json truncated to half, agent restarted", nodeA,
		`f=/var/lib/rbd-owner/mappings.json; truncate -s $(( $(stat -c %s $f) / 2 )) $f && systemctl restart rbd-owner`)
	e.Check("… the agent answers and stays active (no restart loop)", func() error {
		if err := e.agentAnswersWithin(30*time.Second, nodeA); err != nil {
			return err
		}
		if out, rc := e.On(nodeA, "systemctl is-active rbd-owner"); rc != 0 {
			return fmt.Errorf("rbd-owner is %s", out)
		}
		// systemd logs every restart of its own ("Scheduled restart job"): none since the
		// explicit one (NRestarts cannot say: an explicit restart sets it back to 0 on systemd
		// 252, and a count kept from before would hide one crash)
		// (the SIGKILL before made one: the line is looked for where it is known to be)
		if out, rc := e.On(nodeA, `journalctl -u rbd-owner --no-pager -o cat | grep -q "Scheduled restart job"`); rc != 0 {
			return fmt.Errorf("systemd's line for the restart after the SIGKILL is not in the journal (exit %d) %s", rc, out)
		}
		out, rc := e.On(nodeA, `journalctl -u rbd-owner --no-pager -o cat --since "`+since+`" | grep "Scheduled restart job"`)
		return Cond(rc == 1, "systemd restarted the agent on its own since %s: %s", since, out)
	})
	e.T(0, "… the bad file is kept as mappings.json.corrupt-<time>", nodeA,
		`ls /var/lib/rbd-owner/mappings.json.corrupt-* && jq -e .incarnation /var/lib/rbd-owner/mappings.json`)
	e.CheckWithin(10*time.Second, fmt.Sprintf("… %s adopted back from the kernel and its claim: managed, epoch %d", e.devA, e.e1),
		e.adoptedAt(e.devA, e.e1, false))
	e.Check("… the rebuild is reported at warning priority, naming the device", func() error {
		lines, err := e.Audit(nodeA, "RBD_OWNER_EVENT=state_rebuilt")
		if err != nil {
			return err
		}
		want := "1 rbd device(s) adopted back: " + e.devA
		var seen []string
		for _, a := range lines {
			if a.Priority == 4 && strings.Contains(a.Message, want) {
				return nil
			}
			seen = append(seen, fmt.Sprintf("priority %d: %s", a.Priority, a.Message))
		}
		return fmt.Errorf("no state_rebuilt entry at priority 4 says %q; seen: %s", want, strings.Join(seen, " | "))
	})
	e.T(0, "… and counted (rbd_owner_state_set_aside_total 1)", nodeA, metricsCmd+` | grep -qx "rbd_owner_state_set_aside_total 1"`)
	e.claimKept()
	h0 := e.HeartbeatMark(nodeA)
	e.CheckWithin(15*time.Second, "node-a's lease renewed after the rebuild (its heartbeat moves)",
		func() error { return e.HeartbeatMoved(nodeA, h0) })
	e.Check("no problem left, the mount untouched", func() error {
		if err := e.until(10*time.Second, nodeA, "rbd-owner status >/dev/null"); err != nil {
			return fmt.Errorf("rbd-owner status: %w", err)
		}
		return e.runsClean(nodeA, "mountpoint -q /mnt/img1 && cat /mnt/img1/a.txt")
	})
}

// configRefused is the step "node-a: a config the agent refuses: the unit ends failed (start
// limit), the mounted device stays".
func (e *e2e) configRefused() {
	e.Step("node-a: a config the agent refuses: the unit ends failed (start limit), the mounted device stays")
	// (nothing connects to the API socket while the unit is failed: that would fail the socket too)
	e.T(0, "node-a: a typo appended to config.yaml; check-config names its line and the key meant", nodeA,
		`cp /etc/rbd-owner/config.yaml /etc/rbd-owner/config.yaml.e2e && echo "lease_duraton: 30s" >> /etc/rbd-owner/config.yaml || exit 2
  out=$(RBD_OWNER_TEST_SHORT_FENCES=1 rbd-owner check-config 2>&1) && exit 1; echo "$out"
  grep -qE "config /etc/rbd-owner/config.yaml: line [0-9]+: lease_duraton: unknown key; did you mean lease_duration\?$" <<< "$out"`)
	// (systemd 252 keeps Result=exit-code when the limit stops the restarts: the journal's "Start
	// request repeated too quickly" is what says the limit did it)
	e.TT(180*time.Second, 0, "systemctl restart rbd-owner: the unit ends failed by its start limit within a minute, not restarting forever", nodeA,
		`since=$(date "+%Y-%m-%d %H:%M:%S"); systemctl restart rbd-owner
  end=$((SECONDS + 90)); until systemctl is-failed -q rbd-owner || [ $SECONDS -ge $end ]; do sleep 1; done
  systemctl show -p ActiveState -p SubState -p Result -p NRestarts rbd-owner
  systemctl is-failed -q rbd-owner && journalctl -u rbd-owner --since "$since" --no-pager -o cat | grep -F "Start request repeated too quickly"`)
	e.T(0, "… the journal says why, in the config's terms", nodeA,
		`journalctl -u rbd-owner -o cat --no-pager -n 100 | grep lease_duraton | tail -3
  journalctl -u rbd-owner -o cat --no-pager -n 100 | grep -qE "^rbd-owner daemon: config /etc/rbd-owner/config.yaml: line [0-9]+: lease_duraton: unknown key; did you mean lease_duration\?$"`)
	e.T(0, fmt.Sprintf("… %s still mapped and its filesystem writable", e.devA), nodeA,
		"[ -e /sys/bus/rbd/devices/"+sysfsID(e.devA)+" ] && mountpoint -q /mnt/img1 && echo 'written while the agent was failed' > /mnt/img1/failed.txt && sync && cat /mnt/img1/failed.txt")
	e.Check("config restored, systemctl reset-failed rbd-owner, start: the agent answers", func() error {
		if err := e.runsClean(nodeA, `cp /etc/rbd-owner/config.yaml.e2e /etc/rbd-owner/config.yaml && RBD_OWNER_TEST_SHORT_FENCES=1 rbd-owner check-config && systemctl reset-failed rbd-owner rbd-owner.socket &&
  systemctl start rbd-owner.socket rbd-owner`); err != nil {
			return err
		}
		return e.agentAnswersWithin(30*time.Second, nodeA)
	})
	e.Check(fmt.Sprintf("device re-adopted: %s managed, epoch %d, no problem", e.devA, e.e1), func() error {
		// up to 10 s for the agent's problems to clear; the device's own fields are the check
		_ = e.until(10*time.Second, nodeA, "rbd-owner status >/dev/null")
		return e.adoptedAt(e.devA, e.e1, true)()
	})
	e.claimKept()
}

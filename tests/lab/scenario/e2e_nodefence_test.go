//go:build lab

package scenario

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
)

// nodeFenceState is what this file's scenarios keep between them (e2e.nf).
type nodeFenceState struct {
	// node-a's mappings of nf1, nf2, cov1 and cov2 (the after-fence step): device and client
	// address by image
	dev, addr map[string]string
}

// nfImages are the images node-a holds while it is frozen, in the order it maps them.
var nfImages = []string{"nf1", "nf2", "cov1", "cov2"}

// afterFence is the step "node-a frozen holding nf1, nf2, cov1, cov2: node-b under after-fence;
// ceph-csi's blocklist forms, then fence --node".
func (e *e2e) afterFence() {
	e.Step("node-a frozen holding nf1, nf2, cov1, cov2: node-b under after-fence; ceph-csi's blocklist forms, then fence --node")
	e.Check("node-b: takeover_policy: after-fence (agent restarted)", func() error { return e.setTakeoverPolicy(nodeB, "after-fence") })
	e.nfMapAll()
	aIP := e.NodeIP[nodeA]
	e.nfFrozen()
	e.nfCSIForms(aIP)
	e.nfNodeFence()
	e.nfResumed()
}

// setTakeoverPolicy sets node's takeover_policy and restarts its agent: nil once it answers
// again (within 30 s).
func (e *e2e) setTakeoverPolicy(node, policy string) error {
	script := fmt.Sprintf(`sed -i 's/^takeover_policy: .*/takeover_policy: %s/' /etc/rbd-owner/config.yaml && systemctl restart rbd-owner`, policy)
	if err := e.guestSucceeds(node, script); err != nil {
		return err
	}
	return Within(30*time.Second, func() error { return e.answers(node) })
}

// guestSucceeds: script, run on node, exits 0 (else its status and output).
func (e *e2e) guestSucceeds(node, script string) error {
	out, rc := e.On(node, script)
	return Cond(rc == 0, "exit %d, want 0; output:\n%s", rc, out)
}

// mapRetryingScript is a guest script: rbd-owner map --json pool rbd's image, retried for up to
// 180 s while it answers cluster_unavailable, as ceph-csi's NodeStage is retried (node-a's RADOS
// client may still be reconnecting after the previous scenario's long cut: once a claim read
// timed out there with ret=-110 while the other images mapped). A subshell: its exit ends only
// itself, so a command after it runs.
func mapRetryingScript(image string) string {
	return fmt.Sprintf(`( end=$(( $(date +%%s) + 180 )); while :; do out=$(rbd-owner map --json rbd/%s 2>&1) && { echo "$out"; exit 0; }; echo "$out" | jq -e '.error.code == "cluster_unavailable"' >/dev/null 2>&1 && [ "$(date +%%s)" -lt "$end" ] || { echo "$out"; exit 1; }; echo "retrying after: $out" >&2; sleep 2; done )`, image)
}

// nfMapAll: node-a maps nf1, nf2, cov1 and cov2 and writes to each (their devices and client
// addresses kept in e.nf).
func (e *e2e) nfMapAll() {
	e.nf.dev, e.nf.addr = map[string]string{}, map[string]string{}
	for _, im := range nfImages {
		e.T(0, fmt.Sprintf("node-a maps rbd/%s and writes to it", im), nodeA, mapRetryingScript(im)+
			fmt.Sprintf(` && dd if=/dev/urandom of=$(rbd-owner status --json | jq -r '.devices[] | select(.image=="%s") | .device') bs=4k count=1 oflag=direct 2>/dev/null`, im))
		if d, err := e.device(nodeA, im); err == nil {
			e.nf.dev[im], e.nf.addr[im] = d.Device, e.clientAddr(nodeA, d.Device)
		}
	}
	if e.prod() {
		e.T(0, "prod: node-a's mappings are each ms_mode=secure (sysfs config_info; no agent option)", nodeA, secureCheck)
	}
}

// nfFrozen: node-b sees node-a's holds, node-a is paused, and after-fence refuses while nothing
// blocklists it.
func (e *e2e) nfFrozen() {
	e.Check("node-b: rbd-owner claims --node node-a lists nf1, nf2, cov1, cov2 (through node-a's heartbeat, no pool listing)",
		func() error { return e.holdsOfAre(nodeB, nodeA, "cov1,cov2,nf1,nf2") })
	e.Check("qemu stop: node-a paused", func() error { return e.GuestPaused(nodeA) })
	e.T(3, "node-b: map rbd/cov1 while nothing blocklists node-a → refused (after-fence waits for a fence, not a lease)", nodeB, "rbd-owner map rbd/cov1")
	e.Check("… the refusal says no blocklist entry covers node-a's mapping, and names fence --node", func() error {
		if err := e.OutHas("is on no blocklist entry for its whole node")(); err != nil {
			return err
		}
		return e.OutHas("fence --node node-a")()
	})
}

// holdsOfAre: `rbd-owner claims --node holder --json` on node lists exactly the images want
// (sorted, comma-separated), as the cluster's claims ([]api.Claim).
func (e *e2e) holdsOfAre(node, holder, want string) error {
	out, rc := e.On(node, "rbd-owner claims --node "+holder+" --json")
	if rc != 0 {
		return fmt.Errorf("rbd-owner claims --node %s on %s: exit %d: %s", holder, node, rc, out)
	}
	var claims []api.Claim
	if err := json.Unmarshal([]byte(out), &claims); err != nil {
		return fmt.Errorf("rbd-owner claims --node %s on %s: %w: %s", holder, node, err, out)
	}
	var images []string
	for _, c := range claims {
		images = append(images, c.Image)
	}
	sort.Strings(images)
	got := strings.Join(images, ",")
	return Cond(got == want, "claims of %s: '%s', want '%s'", holder, got, want)
}

// nfCSIForms: ceph-csi's two forms of out-of-service fencing each let node-b map one image at
// once, and node-b's own entries stay once the admin's are lifted.
func (e *e2e) nfCSIForms(aIP string) {
	// ceph-csi's out-of-service fencing, first form: `osd blocklist range add <ip>/32`
	_, _ = e.Ceph("osd", "blocklist", "range", "add", aIP+"/32")
	tFence := time.Now()
	e.T(0, fmt.Sprintf("ceph-csi's form 1 (osd blocklist range add %s/32): node-b maps rbd/cov1 at its first attempt", aIP), nodeB, "rbd-owner map --json rbd/cov1")
	e.Logf("range fence to node-b's map of cov1: %d ms", time.Since(tFence).Milliseconds())
	e.Check("… node-b holds cov1", func() error { return e.HeldBy(nodeB, "cov1") })
	_, _ = e.Ceph("osd", "blocklist", "range", "rm", aIP+"/32")
	e.CheckWithin(20*time.Second, "… node-b's own entry for node-a's cov1 client stays once the range is lifted",
		func() error { return e.Blocklisted(e.nf.addr["cov1"]) })
	// second form, ceph-csi's fallback: `osd blocklist add <ip>:0/0`
	_, _ = e.Ceph("osd", "blocklist", "add", aIP+":0/0")
	tFence = time.Now()
	e.T(0, fmt.Sprintf("ceph-csi's form 2 (osd blocklist add %s:0/0): node-b maps rbd/cov2 at its first attempt", aIP), nodeB, "rbd-owner map --json rbd/cov2")
	e.Logf("ip:0/0 fence to node-b's map of cov2: %d ms", time.Since(tFence).Milliseconds())
	_, _ = e.Ceph("osd", "blocklist", "rm", aIP+":0/0")
	e.CheckWithin(20*time.Second, "… node-b's own entry for node-a's cov2 client stays once ip:0/0 is lifted",
		func() error { return e.Blocklisted(e.nf.addr["cov2"]) })
}

// nfNodeFence: the admin's fence --node takes both remaining holds, and node-b maps nf1 at once.
func (e *e2e) nfNodeFence() {
	tFence := time.Now()
	e.T(0, "node-b: rbd-owner fence --node node-a (admin): both remaining holds", nodeB, "rbd-owner fence --node node-a")
	e.Check("… it names nf1 and nf2", e.OutHas("2 holds fenced"))
	e.T(0, "node-b maps rbd/nf1 at its first attempt after the node fence (no release --force, no lease)", nodeB, "rbd-owner map --json rbd/nf1")
	e.Logf("fence --node to node-b's map of nf1: %d ms", time.Since(tFence).Milliseconds())
	if e.prod() {
		e.T(0, "prod: node-b's takeover mappings are each ms_mode=secure (sysfs config_info)", nodeB, secureCheck)
	}
	e.CheckWithin(20*time.Second, "… node-a's nf2 client is blocklisted too", func() error { return e.Blocklisted(e.nf.addr["nf2"]) })
	e.CheckWithin(5*time.Second, "node-b journal: the node fence audited per image and as a whole", e.auditHas(nodeB, "^fence nf2 "))
	e.T(0, "node-b: fence --node node-a again is idempotent (nf2 fenced again)", nodeB, `rbd-owner fence --node node-a | grep -q "fenced already"`)
}

// nfResumed: node-a, resumed, cannot write to any of its four fenced mappings, cleans up, and
// node-b goes back to takeover_policy: manual.
func (e *e2e) nfResumed() {
	e.Check("qemu cont: node-a resumed", func() error { return e.GuestRunning(nodeA) })
	for _, im := range nfImages {
		e.CheckWithin(90*time.Second, fmt.Sprintf("… node-a's %s fence entry has 20 s of life left", im),
			func() error { return e.FencesInForce(e.nf.addr[im]) })
		e.T(1, fmt.Sprintf("fenced node-a: a direct write to its %s device fails", im), nodeA, writeFails(e.nf.dev[im]))
	}
	e.Check("node-a: agent restarted (it was on the range and ip:0/0 entries too), cleans up with unmap --force", func() error {
		if err := e.guestSucceeds(nodeA, "systemctl restart rbd-owner"); err != nil {
			return err
		}
		if err := Within(30*time.Second, func() error { return e.answers(nodeA) }); err != nil {
			return err
		}
		if err := e.guestSucceeds(nodeA, `for i in nf1 nf2 cov1 cov2; do rbd-owner unmap --force rbd/$i || exit 1; done`); err != nil {
			return err
		}
		return e.until(5*time.Second, nodeA, `[ -z "$(ls /sys/bus/rbd/devices)" ]`)
	})
	e.Check("node-b unmaps nf1, cov1, cov2 and goes back to takeover_policy: manual", func() error {
		if err := e.guestSucceeds(nodeB, "rbd-owner unmap rbd/nf1 && rbd-owner unmap rbd/cov1 && rbd-owner unmap rbd/cov2"); err != nil {
			return err
		}
		return e.setTakeoverPolicy(nodeB, "manual")
	})
	e.T(0, "nf2 (fenced, not taken) is released by an admin", nodeB, "rbd-owner release --force rbd/nf2")
}

// krbdRun is the krbd package's TestRealKernel running in node-a in the background: done is
// closed once it ended, with its output and exit status.
type krbdRun struct {
	done    chan struct{}
	out     string
	rc      int
	saveErr error // writing the output to the lab's logs
}

// startKrbd runs krbd TestRealKernel in node-a (its maps waiting for udevd, then not), its output
// going to kout; the binary was built by tests/lab/e2e into node-a's share (/mnt/host/krbd.test).
func (e *e2e) startKrbd(kout string) *krbdRun {
	script := fmt.Sprintf(`cd /tmp && cp /mnt/host/krbd.test . && rc=0 && for udev in wait no; do
    echo "== RBD_OWNER_KRBD_UDEV=$udev"
    RBD_OWNER_KRBD_REAL=1 RBD_OWNER_KRBD_UDEV=$udev RBD_OWNER_KRBD_MON=%s RBD_OWNER_KRBD_OPTIONS=%s RBD_OWNER_KRBD_USER=rbdowner \
    RBD_OWNER_KRBD_KEYRING=%s RBD_OWNER_KRBD_FSID=%s RBD_OWNER_KRBD_IMAGES='rbd/kimg1 rbd/ns1/kimg2 rbd/kimg1@s1' \
    timeout -k 10 300 ./krbd.test -test.run '^TestRealKernel$' -test.v -test.count=1 -test.timeout 280s || rc=1; done; exit $rc`,
		e.Mons[0], e.MapOpts, e.keyf, e.FSID)
	k := &krbdRun{done: make(chan struct{})}
	go func() {
		defer close(k.done)
		k.out, k.rc = e.OnT(600*time.Second, nodeA, script)
		k.saveErr = os.WriteFile(kout, []byte(k.out+"\n"), 0o644)
	}()
	// never leave it behind: if the story ends early, its end waits for the test's
	e.closers = append(e.closers, func() { <-k.done })
	return k
}

// krbdNoise are the lines of TestRealKernel's output a failure's details leave out.
var krbdNoise = regexp.MustCompile(`devwatch: |FIGURE |config_info: |link /dev/|^=== RUN`)

// rebootAndKrbd is the step "node-b reboots with rbd/ns1/img4 mapped; meanwhile krbd
// TestRealKernel runs in node-a".
func (e *e2e) rebootAndKrbd() {
	e.Step("node-b reboots with rbd/ns1/img4 mapped; meanwhile krbd TestRealKernel runs in node-a")
	e.T(0, "node-b maps rbd/ns1/img4 (a RADOS namespace)", nodeB, "rbd-owner map rbd/ns1/img4")
	e.Check("claim ns1/img4 held by node-b", func() error { return e.HeldBy(nodeB, "img4", "rbd/ns1") })
	kout := e.logPath("krbd-test.log")
	k := e.startKrbd(kout)
	e.Logf("krbd TestRealKernel started in node-a (output: %s)", kout)
	e.rebootNodeB()
	<-k.done
	e.krbdResult(k)
	e.T(0, "node-a: nothing left mapped after the krbd test", nodeA, `[ -z "$(ls /sys/bus/rbd/devices)" ]`)
}

// rebootNodeB reboots node-b and checks that its agent, started by systemd, reconciles: the
// mapping is gone, so is its claim.
func (e *e2e) rebootNodeB() {
	boot1, _ := e.On(nodeB, "cat /proc/sys/kernel/random/boot_id")
	boot1 = strings.TrimSpace(boot1)
	ready := filepath.Join(e.Share(nodeB), "out", "ready")
	if err := os.Remove(ready); err != nil && !os.IsNotExist(err) {
		e.Logf("rm %s: %v", ready, err)
	}
	e.T(0, "node-b: systemctl reboot", nodeB, "systemd-run --quiet --on-active=1 systemctl reboot")
	tRB := time.Now()
	_ = Within(e.BootTimeout, func() error { _, err := os.Stat(ready); return err })
	e.Logf("node-b back after %.1fs", time.Since(tRB).Seconds())
	e.Check("node-b rebooted (new boot id)", func() error {
		b, err := os.ReadFile(ready)
		if err != nil {
			return err
		}
		now := ""
		for _, ln := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(ln, "boot_id="); ok {
				now = strings.TrimSpace(v)
				break
			}
		}
		return Cond(now != boot1, "boot id still %s", boot1)
	})
	e.Check("node-b: agent started by systemd after the reboot", func() error {
		err := e.until(30*time.Second, nodeB, `systemctl is-active -q rbd-owner && { rbd-owner status >/dev/null 2>&1 || [ $? = 5 ]; }`)
		if err != nil {
			out, _ := e.On(nodeB, "systemctl status --no-pager rbd-owner")
			return fmt.Errorf("%w\n%s", err, out)
		}
		return nil
	})
	e.CheckWithin(20*time.Second, "node-b reconciled: the claim on ns1/img4 is released (the mapping is gone)",
		func() error { return e.HoldersAre("", "img4", "rbd/ns1") })
	e.Check("… status shows no devices, no problems (exit 0)", func() error {
		if out, rc := e.On(nodeB, "rbd-owner status"); rc != 0 {
			return fmt.Errorf("rbd-owner status: exit %d, want 0: %s", rc, out)
		}
		st, err := e.status(nodeB)
		if err != nil {
			return err
		}
		return Cond(len(st.Devices) == 0 && len(st.Problems) == 0, "%d devices, problems: %q", len(st.Devices), st.Problems)
	})
	out, _ := e.On(nodeB, "journalctl -b -u rbd-owner -o cat --no-pager | tail -5")
	e.Logf("node-b journal after reboot: %s", oneLine(out, 300))
}

// oneLine is out's lines joined by spaces, cut to n bytes (the shell's `tr '\n' ' ' | cut -c1-n`).
func oneLine(out string, n int) string {
	s := strings.ReplaceAll(out+"\n", "\n", " ")
	if len(s) > n {
		s = s[:n]
	}
	return s
}

// krbdResult passes or fails TestRealKernel as it ended.
func (e *e2e) krbdResult(k *krbdRun) {
	if k.saveErr != nil {
		e.Logf("krbd TestRealKernel output not saved: %v", k.saveErr)
	}
	lines := strings.Split(k.out, "\n")
	if k.rc == 0 {
		n := 0
		for _, ln := range lines {
			if strings.HasPrefix(ln, "--- PASS") {
				n++
			}
		}
		e.Pass(fmt.Sprintf("krbd TestRealKernel in node-a (maps waiting for udevd and not): %d PASS lines", n))
		return
	}
	var kept []string
	for _, ln := range lines {
		if !krbdNoise.MatchString(ln) {
			kept = append(kept, ln)
		}
	}
	if len(kept) > 20 {
		kept = kept[len(kept)-20:]
	}
	e.Fail("krbd TestRealKernel in node-a", strings.Join(kept, "\n"))
}

// ---- prod: Ceph's daemons failing under the agents --------------------------------------------

// prodFaults is the prod topology's step "prod: a monitor killed during a takeover, one out of
// quorum, an OSD paused during a takeover, one pool's OSDs stopped".
func (e *e2e) prodFaults() {
	if !e.prod() {
		return
	}
	e.Step("prod: a monitor killed during a takeover, one out of quorum, an OSD paused during a takeover, one pool's OSDs stopped")
	for _, im := range []string{"rbd/pf1", "rbd/pf2", "rbd/pf4", e.SlowPool + "/pf3"} {
		if _, err := e.RBD("create", "--size", "64M", im); err != nil {
			e.Fail("rbd create "+im, err.Error())
		}
	}
	e.monKilled()
	e.monStopped()
	e.osdStopped()
	e.slowPoolStopped()
}

// takeoverScript is a guest script: the admin's takeover of pool rbd's image under
// takeover_policy manual, on node-b: fence the holder's mapping, then map; each step retried for
// up to 100 s after a clean failure (a monitor election, a placement group waiting for its
// stopped OSD to be marked down).
func takeoverScript(image string) string {
	return fmt.Sprintf(`end=$(( $(date +%%s) + 100 )); try() { until "$@"; do [ "$(date +%%s)" -lt "$end" ] || exit 1; echo "retrying: $*" >&2; sleep 1; done; }; try rbd-owner fence rbd/%s && try rbd-owner map --json rbd/%s`, image, image)
}

// mapWriteScript is a guest script for node-a: map spec (POOL/IMAGE), write a block, print the
// device and the client's address.
func mapWriteScript(spec string) string {
	return fmt.Sprintf(`d=$(rbd-owner map --json %s | jq -r .device) && dd if=/dev/urandom of=$d bs=4k count=1 oflag=direct 2>/dev/null && echo "$d $(cat /sys/bus/rbd/devices/${d#/dev/rbd}/client_addr)"`, spec)
}

// retries counts the takeover script's retries in its output.
func retries(out string) int {
	n := 0
	for _, ln := range strings.Split(out, "\n") {
		if strings.HasPrefix(ln, "retrying") {
			n++
		}
	}
	return n
}

// fieldsN is s's first n whitespace-separated fields ("" for those missing).
func fieldsN(s string, n int) []string {
	f := append(strings.Fields(s), make([]string, n)...)
	return f[:n]
}

// firstLine is s's first line.
func firstLine(s string) string {
	first, _, _ := strings.Cut(s, "\n")
	return first
}

// quorumStatus is what the prod faults read of `ceph quorum_status`.
type quorumStatus struct {
	Names  []string `json:"quorum_names"`
	Leader string   `json:"quorum_leader_name"`
}

// quorumOf is the monitors' quorum now (empty when it cannot be read).
func (e *e2e) quorumOf() quorumStatus {
	var q quorumStatus
	_ = e.CephJSON(&q, "quorum_status")
	return q
}

// quorumSizeIs: the quorum has n monitors.
func (e *e2e) quorumSizeIs(n int) func() error {
	return func() error {
		var q quorumStatus
		if err := e.CephJSON(&q, "quorum_status"); err != nil {
			return err
		}
		return Cond(len(q.Names) == n, "quorum %v, want %d monitors", q.Names, n)
	}
}

// osdsUpAre: n OSDs are up.
func (e *e2e) osdsUpAre(n int) func() error {
	return func() error {
		var st struct {
			Up flexInt `json:"num_up_osds"`
		}
		if err := e.CephJSON(&st, "osd", "stat"); err != nil {
			return err
		}
		return Cond(int(st.Up) == n, "%d OSDs up, want %d", st.Up, n)
	}
}

// isMon: name is one of the lab's monitors (a, b, c).
func isMon(name string) bool { return name == "a" || name == "b" || name == "c" }

// faultDaemons records in the lab's ledger that the lab stops or kills the daemons now, and sends
// them sig; it returns their pids (a daemon whose pid file cannot be read is logged, left out).
func (e *e2e) faultDaemons(sig syscall.Signal, daemons ...string) []int {
	if err := e.CephFault(daemons...); err != nil {
		e.Logf("ceph fault ledger: %v", err)
	}
	var pids []int
	for _, d := range daemons {
		pid, err := e.DaemonPID(d)
		if err != nil {
			e.Fail("the lab stops "+d, err.Error())
			continue
		}
		pids = append(pids, pid)
	}
	e.signalPIDs(sig, pids)
	return pids
}

// signalPIDs sends sig to each pid (a failure is logged).
func (e *e2e) signalPIDs(sig syscall.Signal, pids []int) {
	for _, pid := range pids {
		if err := syscall.Kill(pid, sig); err != nil {
			e.Fail(fmt.Sprintf("kill -%d %d", sig, pid), err.Error())
		}
	}
}

// epochBefore is image's claim epoch before a takeover, or the error reading it.
type epochBefore struct {
	epoch uint64
	err   error
}

// epochOf reads image's claim epoch in pool rbd.
func (e *e2e) epochOf(image string) epochBefore {
	ep, err := e.Epoch(image)
	return epochBefore{ep, err}
}

// claimEpochAbove: image's claim epoch is above before, and node-b holds it.
func (e *e2e) claimEpochAbove(image string, before epochBefore) func() error {
	return func() error {
		if before.err != nil {
			return fmt.Errorf("%s's epoch before the takeover was not read: %w", image, before.err)
		}
		ep, err := e.Epoch(image)
		if err != nil {
			return err
		}
		if ep <= before.epoch {
			return fmt.Errorf("%s: epoch %d, want above %d", image, ep, before.epoch)
		}
		return e.HeldBy(nodeB, image)
	}
}

// monKilled: node-b takes over pf1 while the monitors' leader is killed, then the leader comes
// back.
func (e *e2e) monKilled() {
	e.T(0, "node-a maps rbd/pf1 and writes", nodeA, mapWriteScript("rbd/pf1"))
	f := fieldsN(firstLine(e.Out), 2)
	devPF1, aPF1 := f[0], f[1]
	ePF1 := e.epochOf("pf1")
	l := e.quorumOf().Leader
	if !isMon(l) {
		e.Fail(fmt.Sprintf("no quorum leader ('%s')", l))
	}
	e.faultDaemons(syscall.SIGKILL, "mon."+l)
	t0 := time.Now()
	e.T(0, fmt.Sprintf("node-b fences rbd/pf1 and takes it over while the leader, mon.%s, is killed (SIGKILL)", l), nodeB, takeoverScript("pf1"))
	e.Logf("takeover of pf1 with mon.%s killed at its start: %.1fs (%d retries)", l, time.Since(t0).Seconds(), retries(e.Out))
	e.Check(fmt.Sprintf("… claim pf1 node-b, epoch above %d", ePF1.epoch), e.claimEpochAbove("pf1", ePF1))
	e.CheckWithin(30*time.Second, fmt.Sprintf("… node-a's pf1 mapping (%s) is blocklisted, in force at pool rbd's OSDs", aPF1),
		func() error { return e.Blocklisted(aPF1) })
	e.Check("… with a quorum of the other two monitors", e.quorumSizeIs(2))
	e.T(1, "fenced node-a: a direct write to pf1 fails (EIO, not a hang)", nodeA, writeFails(devPF1))
	if _, err := e.CX("ceph-mon", "-c", e.conf(), "-i", l); err != nil {
		e.Fail(fmt.Sprintf("ceph-mon -i %s did not start again", l), err.Error())
	}
	e.CheckWithin(90*time.Second, fmt.Sprintf("mon.%s restarted: a quorum of three again", l), e.quorumSizeIs(3))
}

// monStopped: node-b's heartbeat renews while a peon is stopped out of the quorum.
func (e *e2e) monStopped() {
	q := e.quorumOf()
	p := ""
	for _, n := range q.Names {
		if n != q.Leader {
			p = n
			break
		}
	}
	if !isMon(p) {
		e.Fail(fmt.Sprintf("no peon ('%s')", p))
	}
	pids := e.faultDaemons(syscall.SIGSTOP, "mon."+p)
	e.CheckWithin(60*time.Second, fmt.Sprintf("mon.%s stopped (SIGSTOP): out of quorum, a quorum of two", p), e.quorumSizeIs(2))
	m := e.HeartbeatMark(nodeB)
	e.CheckWithin(30*time.Second, fmt.Sprintf("node-b's heartbeat in rbd renews with mon.%s out of quorum", p),
		func() error { return e.HeartbeatMoved(nodeB, m) })
	m2 := e.HeartbeatMark(nodeB)
	e.CheckWithin(30*time.Second, "… and again", func() error { return e.HeartbeatMoved(nodeB, m2) })
	e.signalPIDs(syscall.SIGCONT, pids)
	e.CheckWithin(90*time.Second, fmt.Sprintf("mon.%s resumed: a quorum of three again", p), e.quorumSizeIs(3))
}

// osdStopped: node-b takes over pf2 while osd.0 is stopped; once it is back, node-a's writes to
// every object of pf2 fail.
func (e *e2e) osdStopped() {
	e.T(0, "node-a maps rbd/pf2 and writes", nodeA, mapWriteScript("rbd/pf2"))
	f := fieldsN(firstLine(e.Out), 2)
	devPF2, aPF2 := f[0], f[1]
	ePF2 := e.epochOf("pf2")
	pids := e.faultDaemons(syscall.SIGSTOP, "osd.0")
	t0 := time.Now()
	e.T(0, "node-b fences rbd/pf2 and takes it over while osd.0 (in every placement group of pool rbd) is stopped", nodeB, takeoverScript("pf2"))
	e.Logf("takeover of pf2 with osd.0 stopped at its start: %.1fs (%d retries)", time.Since(t0).Seconds(), retries(e.Out))
	e.Check(fmt.Sprintf("… claim pf2 node-b, epoch above %d", ePF2.epoch), e.claimEpochAbove("pf2", ePF2))
	e.signalPIDs(syscall.SIGCONT, pids)
	e.CheckWithin(120*time.Second, "osd.0 resumed and up again", e.osdsUpAre(len(e.RBDOSDs)+len(e.SlowOSD)))
	e.CheckWithin(90*time.Second, fmt.Sprintf("… node-a's pf2 mapping (%s) is blocklisted, in force at osd.0 and osd.1, 20 s of its entry's life left", aPF2),
		func() error { return e.FencesInForce(aPF2) })
	e.T(0, "fenced node-a: a direct write to each of pf2's 16 objects (all on osd.0) fails, none hangs", nodeA,
		fmt.Sprintf(`for o in $(seq 0 15); do timeout 5 dd if=/dev/zero of=%s bs=4k count=1 seek=$((o * 1024)) oflag=direct 2>/dev/null; rc=$?; [ $rc = 0 ] && { echo "object $o: the write succeeded"; exit 1; }; [ $rc = 124 ] && { echo "object $o: the write hung"; exit 1; }; done; exit 0`, devPF2))
}

// slowPoolStopped: with the slow pool's OSDs stopped for 35 s, node-a's heartbeat in rbd renews
// and its lease on pf4 holds; afterwards it still holds pf3 and pf4, a fence of pf4 leaves its
// own client of pf3 writing.
func (e *e2e) slowPoolStopped() {
	e.T(0, fmt.Sprintf("node-a maps %s/pf3 and rbd/pf4 and writes to both", e.SlowPool), nodeA,
		mapWriteScript(e.SlowPool+"/pf3")+" && "+mapWriteScript("rbd/pf4"))
	f := fieldsN(e.Out, 4)
	devPF3, devPF4, aPF4 := f[0], f[2], f[3]
	var osds, ids []string
	for _, i := range e.SlowOSD {
		osds = append(osds, "osd."+strconv.Itoa(i))
		ids = append(ids, strconv.Itoa(i))
	}
	pids := e.faultDaemons(syscall.SIGSTOP, osds...)
	t0 := time.Now()
	m := e.HeartbeatMark(nodeA)
	e.CheckWithin(30*time.Second, fmt.Sprintf("pool %s's OSDs (osd.%s) stopped: node-a's heartbeat in rbd renews", e.SlowPool, strings.Join(ids, " ")),
		func() error { return e.HeartbeatMoved(nodeA, m) })
	m2 := e.HeartbeatMark(nodeA)
	e.CheckWithin(30*time.Second, "… and again", func() error { return e.HeartbeatMoved(nodeA, m2) })
	e.T(3, "… node-b's map of rbd/pf4 is refused: node-a's lease there is live (exit 3)", nodeB, "rbd-owner map rbd/pf4")
	WaitFor(time.Until(t0.Add(35 * time.Second)))
	e.signalPIDs(syscall.SIGCONT, pids)
	e.Logf("pool %s's OSDs stopped for %.1fs", e.SlowPool, time.Since(t0).Seconds())
	e.CheckWithin(120*time.Second, fmt.Sprintf("pool %s answers again", e.SlowPool), e.slowPoolAnswers)
	// a renewal in pool slow failed during the stall: pf3's problem lasts until the next one lands
	out, _ := e.On(nodeA, `rbd-owner status 2>&1 | grep -E "pf3|pf4"`)
	e.Logf("node-a's status of pf3, pf4 right after the stall: %s", oneLine(out, 400))
	e.Check("node-a still holds pf3 and pf4, with no problem within 30 s, and writes to pf3", func() error {
		if err := Within(30*time.Second, e.pf3pf4Clean); err != nil {
			out, _ := e.On(nodeA, "rbd-owner status")
			return fmt.Errorf("%w\n%s", err, out)
		}
		return e.guestSucceeds(nodeA, fmt.Sprintf("dd if=/dev/urandom of=%s bs=4k count=1 seek=1 oflag=direct", devPF3))
	})
	e.T(0, "node-b fences node-a's rbd/pf4 (one pool)", nodeB, "rbd-owner fence rbd/pf4")
	e.CheckWithin(30*time.Second, fmt.Sprintf("… node-a's pf4 mapping (%s) is blocklisted", aPF4), func() error { return e.Blocklisted(aPF4) })
	e.T(1, "fenced node-a: a direct write to pf4 fails", nodeA, writeFails(devPF4))
	e.T(0, fmt.Sprintf("… node-a's mapping of %s/pf3 (a client of its own, noshare) still writes", e.SlowPool), nodeA,
		fmt.Sprintf("dd if=/dev/urandom of=%s bs=4k count=1 seek=2 oflag=direct", devPF3))
	e.Check("cleanup: node-a unmaps pf1, pf2, pf4 (fenced) by force and pf3", func() error {
		if err := e.guestSucceeds(nodeA, `for s in rbd/pf1 rbd/pf2 rbd/pf4; do rbd-owner unmap --force $s || exit 1; done; rbd-owner unmap `+e.SlowPool+`/pf3`); err != nil {
			return err
		}
		return e.until(5*time.Second, nodeA, `[ -z "$(ls /sys/bus/rbd/devices)" ]`)
	})
	e.T(0, "… node-b unmaps pf1 and pf2 and releases pf4", nodeB, "rbd-owner unmap rbd/pf1 && rbd-owner unmap rbd/pf2 && { rbd-owner release --force rbd/pf4 || true; }")
	e.CheckWithin(30*time.Second, "… no claim left on pf1-pf4", func() error {
		for _, im := range []string{"pf1", "pf2", "pf4"} {
			if err := e.HoldersAre("", im); err != nil {
				return fmt.Errorf("%s: %w", im, err)
			}
		}
		if err := e.HoldersAre("", "pf3", e.SlowPool); err != nil {
			return fmt.Errorf("pf3: %w", err)
		}
		return nil
	})
}

// slowPoolAnswers: each of the slow pool's probe objects ($CEPHDIR/slow-probes) can be stat'ed
// within 5 s.
func (e *e2e) slowPoolAnswers() error {
	b, err := os.ReadFile(filepath.Join(e.CephDir, "slow-probes"))
	if err != nil {
		return err
	}
	for _, o := range strings.Split(string(b), "\n") {
		if o = strings.TrimSpace(o); o == "" {
			continue
		}
		if _, err := e.CX("timeout", "5", "rados", "-c", e.conf(), "-p", e.SlowPool, "stat", o); err != nil {
			return err
		}
	}
	return nil
}

// pf3pf4Clean: node-a's status lists pf3 and pf4 with no problem.
func (e *e2e) pf3pf4Clean() error {
	st, err := e.status(nodeA)
	if err != nil {
		return err
	}
	n := 0
	var seen []string
	for _, d := range st.Devices {
		if d.Image != "pf3" && d.Image != "pf4" {
			continue
		}
		seen = append(seen, fmt.Sprintf("%s (problem: %q)", d.Image, d.Problem))
		if d.Problem == "" {
			n++
		}
	}
	return Cond(n == 2, "devices of pf3, pf4: %v", seen)
}

//go:build lab

package scenario

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/claim/record"
)

// fenceState is what this file's scenarios keep between them (e2e.fence).
type fenceState struct {
	// node-a's mapping of rbd/img2, frozen with it and fenced: its device and client address
	devA2, aAddr2 string
	// node-b's device of rbd/img1 after its takeover
	devB1 string
	// node-a's mapping of rbd/fence1, cut off past its fence's first entry: device, address
	devF, aAddrF string
}

// durEnv is a duration of the lab's environment as the shell spelled it (LEASE=35s,
// FENCE_EXPIRY=1m), for the assertions' names; d itself when it is not set.
func durEnv(name string, d time.Duration) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	if d%time.Minute == 0 {
		return fmt.Sprintf("%dm", d/time.Minute)
	}
	return fmt.Sprintf("%gs", d.Seconds())
}

// clockSkew is the step "clock skew: node-b, its clock minutes ahead, cannot take over live node-a".
func (e *e2e) clockSkew() {
	e.Step("clock skew: node-b, its clock minutes ahead, cannot take over live node-a")
	e.T(0, "node-a maps rbd/skew1", nodeA, "rbd-owner map --json rbd/skew1")
	r, _ := e.mapReply()
	devSkew := r.Device
	aSkewAddr := e.clientAddr(nodeA, devSkew)
	e.T(0, "node-b's clock set 5 minutes ahead (date -s)", nodeB, `date -s "+5 minutes" >/dev/null && date`)
	e.T(3, "node-b: map --takeover rbd/skew1 → refused, node-a is live", nodeB, "rbd-owner map --takeover rbd/skew1")
	e.Check("… the refusal says a takeover is possible in N s unless node-a renews", e.OutHas("a takeover is possible in"))
	retry := strings.TrimSuffix(strings.TrimPrefix(regexp.MustCompile(`possible in [0-9]*s`).FindString(e.Out), "possible in "), "s")
	secs, err := strconv.Atoi(retry)
	if err != nil {
		secs = 0
	}
	retryText := retry
	if retryText == "" {
		retryText = "?"
	}
	e.Check(fmt.Sprintf("… retry after %s s: a number of seconds", retryText), func() error {
		return Cond(err == nil && secs >= 1 && secs <= 600, "retry after '%s': not a number of seconds from 1 to 600", retry)
	})
	e.Logf("waiting out node-b's watch of node-a's lease (%d s) while node-a keeps renewing", secs+3)
	WaitFor(time.Duration(secs+3) * time.Second)
	e.T(3, "node-b: map --takeover after the retry time → still refused: node-a renewed in the window", nodeB, "rbd-owner map --takeover rbd/skew1")
	e.Check("node-a's skew1 mapping was not blocklisted", func() error { return e.NotBlocklisted(aSkewAddr) })
	e.T(0, "node-a still writes to skew1", nodeA, fmt.Sprintf("dd if=/dev/zero of=%s bs=4k count=1 oflag=direct", devSkew))
	e.T(0, "node-b's status warns of the skew, naming node-a (exit 5)", nodeB,
		`s=$(rbd-owner status); rc=$?; echo "$s"; [ $rc = 5 ] && grep -qi "clock skew: node node-a" <<< "$s"`)
	e.T(0, "node-b journal: the refusal records the watch window", nodeB,
		`journalctl -u rbd-owner -o cat --no-pager RBD_OWNER_EVENT=refuse RBD_IMAGE=skew1 | grep "a takeover is possible in"`)
	e.T(0, "node-b's clock set back (date -s)", nodeB, `date -s "-5 minutes" >/dev/null && date`)
	e.T(0, "node-a unmaps rbd/skew1", nodeA, "rbd-owner unmap rbd/skew1")
}

// frozenTakeover is the step "node-a frozen (qemu stop) holding img1 and img2: refusal,
// fence+release, takeover", through node-b's claims released and "unmap is idempotent".
func (e *e2e) frozenTakeover() {
	e.Step("node-a frozen (qemu stop) holding img1 and img2: refusal, fence+release, takeover")
	e.frozenFenceImg2()
	e.frozenTakeoverImg1()
	e.frozenFenceWatched()
	e.frozenFenceRemovedByHand()
	e.frozenResumedFenced()
	e.frozenCleanup()
}

// frozenFenceImg2 (frozenTakeover): node-a frozen; node-b refused img1, then fences and releases
// img2 and maps it.
func (e *e2e) frozenFenceImg2() {
	e.T(0, "node-a maps rbd/img2", nodeA, "rbd-owner map --json rbd/img2")
	r, _ := e.mapReply()
	var e2 uint64
	if r.Claim != nil {
		e2 = r.Claim.Epoch
	}
	e.fence.devA2 = r.Device
	e.fence.aAddr2 = e.clientAddr(nodeA, r.Device)
	e.T(0, "node-a writes and syncs before it dies", nodeA, `echo 'last words of node-a' > /mnt/img1/last.txt && sync`)
	e.Check("qemu stop: node-a paused", func() error { return e.GuestPaused(nodeA) })
	e.T(3, "node-b: map rbd/img1 while node-a's lease is live → exit 3", nodeB, "rbd-owner map rbd/img1")
	namesOwner, saysLive := e.OutHas("node-a"), e.OutHas("live")
	e.Check("… the refusal says the lease is live and names node-a", func() error {
		if err := namesOwner(); err != nil {
			return err
		}
		return saysLive()
	})
	// an entry listed before the fence with a shorter life (as librbd's lock break lists a client
	// for an hour): Ceph keeps a listed entry's expiry when it is added again, so the fence must
	// remove and add it before the hold is written, or it lapses at the old expiry
	e.Check("… node-a's img2 mapping listed by hand for 20 s before the fence (a re-add keeps that expiry)", func() error {
		_, err := e.Ceph("osd", "blocklist", "add", e.fence.aAddr2, "20")
		return err
	})
	e.T(0, "node-b: rbd-owner fence rbd/img2 (admin)", nodeB, "rbd-owner fence rbd/img2")
	e.CheckWithin(20*time.Second, "… node-a's img2 mapping address is blocklisted", func() error { return e.Blocklisted(e.fence.aAddr2) })
	e.Check(fmt.Sprintf("… for the fence's whole life, not the 20 s listed before it (at least 45 s of %s)", durEnv("FENCE_EXPIRY", e.FenceExpiry)),
		func() error { return e.ListedForAtLeast(e.fence.aAddr2, 45*time.Second) })
	e.T(0, "node-b: rbd-owner release --force rbd/img2", nodeB, "rbd-owner release --force rbd/img2")
	e.T(0, "node-b maps rbd/img2 after fence + release", nodeB, "rbd-owner map --json rbd/img2")
	rb, err := e.mapReply()
	e.Check("… claim img2 node-b, epoch raised", func() error {
		if err != nil {
			return err
		}
		if rb.Claim.Epoch <= e2 {
			return fmt.Errorf("epoch %d, not above node-a's %d", rb.Claim.Epoch, e2)
		}
		return e.HeldBy(nodeB, "img2")
	})
}

// frozenTakeoverImg1 (frozenTakeover): node-a's lease runs out; node-b takes img1 over, fencing
// node-a's mapping.
func (e *e2e) frozenTakeoverImg1() {
	e.Check(fmt.Sprintf("node-a's heartbeat unchanged for a whole lease (%s, this host's clock)", durEnv("LEASE", e.Lease)),
		func() error { return e.WaitLeaseUnrenewed(nodeA) })
	e.T(3, "node-b: map rbd/img1 after the lease expired, without --takeover → exit 3", nodeB, "rbd-owner map rbd/img1")
	e.Check("… the refusal says expired", e.OutHas("expired"))
	e.T(0, "node-b: rbd-owner map --takeover rbd/img1", nodeB, "rbd-owner map --takeover --json rbd/img1")
	r, err := e.mapReply()
	e.fence.devB1 = r.Device
	want := e.e1 + 1
	e.Check(fmt.Sprintf("… epoch %d → %d, claim node-b", e.e1, want), func() error {
		if err != nil {
			return err
		}
		if r.Claim.Epoch != want {
			return fmt.Errorf("epoch %d, want %d", r.Claim.Epoch, want)
		}
		return e.HoldersAre(fmt.Sprintf("node-b@%d", want), "img1")
	})
	e.Check("the pool's claim index names img1 and img2", func() error {
		out, err := e.Rados("-p", "rbd", "listomapkeys", "rbd-owner.claims")
		if err != nil {
			return err
		}
		keys := map[string]bool{}
		for _, k := range strings.Split(out, "\n") {
			keys[k] = true
		}
		return Cond(keys["img1"] && keys["img2"], "rbd-owner.claims lists: %s", strings.ReplaceAll(out, "\n", " "))
	})
	e.CheckWithin(20*time.Second, "… node-a's img1 mapping address is blocklisted", func() error { return e.Blocklisted(e.aAddr1) })
	e.CheckWithin(5*time.Second, "node-b journal: takeover audited", e.auditHas(nodeB, "^takeover img1 "))
	e.Check("node-b journal: fence audited", e.auditHas(nodeB, "^fence img"))
}

// frozenFenceWatched (frozenTakeover): node-a's img1 fence is watched while node-a stays frozen
// for longer than fence_expiry.
func (e *e2e) frozenFenceWatched() {
	// the fence as the cluster enforces it, watched about once a second while node-a stays frozen
	// for longer than the lab's fence_expiry: a re-add lengthens nothing, so node-b keeps it by
	// removing and adding it under a short entry for node-a's whole address; never missing
	fenceS := int(e.FenceExpiry / time.Second)
	w, werr := e.WatchFence(e.aAddr1, e.logPath("fence-watch-img1.txt"))
	if werr == nil {
		e.closers = append(e.closers, w.Stop)
	}
	e.Logf("node-a frozen: watching its img1 fence %s for %d s", e.aAddr1, fenceS+30)
	WaitFor(time.Duration(fenceS+30) * time.Second)
	w.Stop()
	// (a look is one `ceph osd blocklist ls`, a second or two apart: at least one every 3 s is asked)
	summary, err := "", werr
	if werr == nil {
		summary, err = w.Clean(fenceS / 3)
	}
	e.Check(fmt.Sprintf("… node-a's img1 fence was cut off at every look while node-a was frozen (fence_watch: %s)", summary),
		func() error { return err })
}

// frozenFaultAudited: node-b's journal has an error-priority fence entry saying node-a's img1
// address was not on the cluster's blocklist.
func (e *e2e) frozenFaultAudited() error {
	out, rc := e.On(nodeB, fmt.Sprintf(`journalctl -u rbd-owner -o cat --no-pager -p err RBD_OWNER_EVENT=fence | grep -F -- '%s' | grep -q 'was not on the cluster.s blocklist'`, e.aAddr1))
	return Cond(rc == 0, "no error-priority fence entry of node-b says %s was not on the cluster's blocklist (exit %d) %s", e.aAddr1, rc, out)
}

// frozenFenceRemovedByHand (frozenTakeover): an operator removes node-a's img1 fence; node-b, the
// holder, puts it back within one renew interval and says so at error priority.
func (e *e2e) frozenFenceRemovedByHand() {
	// node-b lengthens this entry every quarter of the lab's short fence_expiry by removing it and
	// adding it again under a cover: a removal by hand that lands within that second or two is put
	// back by node-b's own add, with nothing missing to report (seen once in e2e-prod). Removed
	// again then, at most three times, until node-b finds it missing
	var rmErr error
	putBack, putBackText := time.Duration(0), ""
	for try := 1; try <= 3; try++ {
		if _, err := e.Ceph("osd", "blocklist", "rm", e.aAddr1); err != nil && rmErr == nil {
			rmErr = err
		}
		rmT := time.Now()
		if Within(30*time.Second, func() error { return e.ListedForAtLeast(e.aAddr1, time.Second) }) != nil {
			break
		}
		putBack = time.Since(rmT)
		putBackText = fmt.Sprintf("%.9f", putBack.Seconds())
		if Within(10*time.Second, e.frozenFaultAudited) == nil {
			break
		}
		e.Logf("removal %d of node-a's img1 fence landed while node-b lengthened it (put back by node-b's own add, nothing missing): removed again", try)
	}
	e.Check(fmt.Sprintf("… removed by hand: ceph osd blocklist rm %s", e.aAddr1), func() error { return rmErr })
	e.Check("… listed again by node-b", func() error { return e.ListedForAtLeast(e.aAddr1, time.Second) })
	shown, renew := putBackText, durEnv("RENEW", e.Renew)
	if shown == "" {
		shown = "?"
	}
	e.Logf("node-a's img1 fence removed by hand was listed again after %s s (renew interval %s)", shown, renew)
	e.Check(fmt.Sprintf("… within one renew interval and the monitors' answer (%s s ≤ %s + 5 s)", shown, renew), func() error {
		if putBackText == "" {
			return errors.New("never seen listed again after a removal")
		}
		return Cond(putBack <= e.Renew+5*time.Second, "listed again after %s s, more than %s + 5 s", putBackText, renew)
	})
	e.Check("node-b journal: the missing fence reported at error priority", e.frozenFaultAudited)
	e.Check("node-b: the fault counted (rbd_owner_fence_faults_total kind missing, repaired)", func() error {
		return e.metricAtLeast(nodeB, `rbd_owner_fence_faults_total\{.*kind="missing".*outcome="repaired"`, 1)
	})
}

// frozenResumedFenced (frozenTakeover): node-b reads node-a's last write; node-a, resumed, cannot
// write and learns it lost its claim.
func (e *e2e) frozenResumedFenced() {
	e.T(0, "node-b mounts img1 and reads node-a's last write", nodeB,
		fmt.Sprintf("mkdir -p /mnt/img1 && mount %s /mnt/img1 && cat /mnt/img1/last.txt /mnt/img1/a.txt", e.fence.devB1))
	// (each entry just before its own write: two entries' renewal cycles need not overlap; img1's
	// before node-a resumes, its file system mounted there)
	e.CheckWithin(90*time.Second, "… node-a's img1 fence entry has 20 s of life left (the lab's short fence_expiry)",
		func() error { return e.FencesInForce(e.aAddr1) })
	e.Check("qemu cont: node-a resumed", func() error { return e.GuestRunning(nodeA) })
	e.T(1, fmt.Sprintf("fenced node-a: a direct write to %s fails (EIO, not a hang)", e.devA), nodeA,
		fmt.Sprintf(`timeout 90 dd if=/dev/zero of=%s bs=4k count=1 oflag=direct 2>&1; rc=$?; dmesg | grep -E 'rbd|libceph' | tail -3; [ $rc = 0 ] && exit 0; [ $rc = 124 ] && exit 124; exit 1`, e.devA))
	e.CheckWithin(90*time.Second, "… node-a's img2 fence entry has 20 s of life left", func() error { return e.FencesInForce(e.fence.aAddr2) })
	e.T(1, fmt.Sprintf("fenced node-a: a direct write to %s fails (EIO, not a hang)", e.fence.devA2), nodeA, writeFails(e.fence.devA2))
	e.CheckWithin(30*time.Second, "node-a reports the lost claim in status (through node-b's notice: claims are read slowly, once an hour)",
		e.fenceClaimLost(nodeA, "img1"))
	e.CheckWithin(30*time.Second, "… node-a's notice of the takeover is handled and cleared", e.fenceNoticeCleared(nodeA))
	e.CheckWithin(10*time.Second, "node-a journal: an error-priority entry for img1", e.auditErr(nodeA, "img1"))
}

// fenceClaimLost: node's status answers with problems (exit 5) and its device of image has one.
func (e *e2e) fenceClaimLost(node, image string) func() error {
	return func() error {
		out, rc := e.On(node, "rbd-owner status --json")
		if rc != 5 {
			return fmt.Errorf("rbd-owner status on %s: exit %d, want 5: %s", node, rc, out)
		}
		var st api.Status
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			return fmt.Errorf("rbd-owner status on %s: %w: %s", node, err, out)
		}
		for _, d := range st.Devices {
			if d.Image == image {
				return Cond(d.Problem != "", "%s's device %s of %s has no problem", node, d.Device, image)
			}
		}
		return fmt.Errorf("%s's status lists no device of %s", node, image)
	}
}

// fenceNoticeCleared: node's notice object in pool rbd holds no notice (or there is none).
func (e *e2e) fenceNoticeCleared(node string) func() error {
	return func() error {
		out, err := e.Stdout("rados", "-c", e.conf(), "-p", "rbd", "listomapkeys", "rbd-owner.notice."+node)
		if err != nil && !strings.Contains(err.Error(), "No such file or directory") {
			return err
		}
		keys := strings.TrimSpace(string(out))
		return Cond(keys == "", "rbd-owner.notice.%s still holds: %s", node, strings.ReplaceAll(keys, "\n", " "))
	}
}

// frozenCleanup (frozenTakeover): node-a unmaps its fenced devices, img1's entry is lifted, and
// node-b releases img1 and img2.
func (e *e2e) frozenCleanup() {
	out, _ := e.On(nodeA, "umount -l /mnt/img1; rbd-owner unmap --force rbd/img1; rbd-owner unmap --force rbd/img2")
	e.Check("node-a cleans up: umount, unmap --force both", func() error {
		if err := e.until(5*time.Second, nodeA, `ls /sys/bus/rbd/devices; [ -z "$(ls /sys/bus/rbd/devices)" ]`); err != nil {
			return fmt.Errorf("%s\nnode-a's devices not gone within 5 s: %w", out, err)
		}
		return nil
	})
	// img1's fence ends with node-a's mapping, and node-b (its holder) removes the entry, which
	// this project listed; img2's was listed by hand before the fence: not ours to lift, it lapses
	// (whichever agent checks first removes it: node-a's own, right after it marks the fence gone,
	// or node-b's; a CI run once had node-b put it back in between, which node-b now removes again)
	liftedBy := func(node string) bool {
		_, rc := e.On(node, fmt.Sprintf(`journalctl -u rbd-owner -o cat --no-pager RBD_OWNER_EVENT=fence | grep -qF 'removed the blocklist entry %s '`, e.aAddr1))
		return rc == 0
	}
	e.CheckWithin(30*time.Second, "node-a's img1 entry is removed once its mapping is gone (this project listed it; by node-b or node-a's own agent)", func() error {
		if !liftedBy(nodeB) && !liftedBy(nodeA) {
			return fmt.Errorf("neither agent's journal says it removed the blocklist entry %s", e.aAddr1)
		}
		return e.NotBlocklisted(e.aAddr1)
	})
	e.Check("node-b's claims survive node-a's cleanup", func() error {
		if err := e.HoldersAre(fmt.Sprintf("node-b@%d", e.e1+1), "img1"); err != nil {
			return fmt.Errorf("img1: %w", err)
		}
		if err := e.HeldBy(nodeB, "img2"); err != nil {
			return fmt.Errorf("img2: %w", err)
		}
		return nil
	})
	e.T(0, "node-b unmounts and unmaps img1, img2", nodeB,
		`umount /mnt/img1 && rbd-owner unmap rbd/img1 && rbd-owner unmap rbd/img2 && [ -z "$(ls /sys/bus/rbd/devices)" ]`)
	e.Check("… claims released", func() error {
		for _, im := range []string{"img1", "img2"} {
			if err := e.HoldersAre("", im); err != nil {
				return fmt.Errorf("%s: %w", im, err)
			}
		}
		return nil
	})
	_, rc := e.Run(nodeB, "rbd-owner unmap --json rbd/img1")
	e.Check("unmap is idempotent: unmapped=false", func() error {
		if rc != 0 {
			return fmt.Errorf("rbd-owner unmap --json rbd/img1: exit %d: %s", rc, e.Out)
		}
		var r struct {
			Unmapped *bool `json:"unmapped"` // api.UnmapResponse's field, required here
		}
		if err := e.JSON(&r); err != nil {
			return err
		}
		return Cond(r.Unmapped != nil && !*r.Unmapped, "want unmapped=false: %s", e.Out)
	})
}

// fenceLifetime is the step "fence lifetime: node-a cut off for longer than fence_expiry (…)
// after node-b took its image over and released it".
func (e *e2e) fenceLifetime() {
	fenceText := durEnv("FENCE_EXPIRY", e.FenceExpiry)
	e.Step(fmt.Sprintf("fence lifetime: node-a cut off for longer than fence_expiry (%s) after node-b took its image over and released it", fenceText))
	e.T(0, "node-a maps rbd/fence1 and writes to it", nodeA, "rbd-owner map --json rbd/fence1")
	r, _ := e.mapReply()
	e.fence.devF = r.Device
	e.fence.aAddrF = e.clientAddr(nodeA, r.Device)
	e.T(0, "… a direct write", nodeA, fmt.Sprintf("dd if=/dev/urandom of=%s bs=4k count=8 oflag=direct", e.fence.devF))
	e.Check("node-a cut off the cluster (its tap down)", func() error { return e.CutNode(nodeA) })
	e.Check(fmt.Sprintf("node-a's heartbeat unchanged for a whole lease (%s, this host's clock)", durEnv("LEASE", e.Lease)),
		func() error { return e.WaitLeaseUnrenewed(nodeA) })
	// node-b first looks at node-a's hold of fence1 now: its takeover waits a whole lease on its
	// own clock from that look (three leases allowed; 120 tries of a fast refusal once came to less)
	e.Check("node-b: map --takeover rbd/fence1, retried until node-a's lease ran out on node-b's clock", func() error {
		return e.until(3*e.Lease, nodeB, "rbd-owner map --takeover rbd/fence1")
	})
	e.CheckWithin(20*time.Second, "… node-a's fence1 mapping is blocklisted", func() error { return e.Blocklisted(e.fence.aAddrF) })
	e.T(0, "node-b unmaps fence1: nobody holds its claim now", nodeB, "rbd-owner unmap rbd/fence1")
	e.Check("… the free claim keeps node-a's fence, live", func() error {
		if err := e.HoldersAre("", "fence1"); err != nil {
			return err
		}
		f, err := e.fenceOfA()
		if err != nil {
			return err
		}
		return Cond(f.Gone == "", "node-a's fence is gone: %s", f.Gone)
	})
	f0, _ := e.fenceOfA()
	e.Logf("waiting out the fence's life and more (%s + 20 s): node-a cut off, the claim free, node-a's fence entry made at %s, expiring %s",
		fenceText, fenceTime(f0, func(f *record.Fence) time.Time { return f.At }), fenceTime(f0, fenceExpires))
	WaitFor(e.FenceExpiry + 20*time.Second)
	e.fenceOutlivesEntry(f0)
	e.fenceEndsWithMapping()
}

// fenceOfA is node-a's fence of rbd/fence1 as its claim records it (an error when there is none).
func (e *e2e) fenceOfA() (*record.Fence, error) {
	r, err := e.Claim("fence1")
	if err != nil {
		return nil, err
	}
	if r != nil {
		for i := range r.Fences {
			if r.Fences[i].Addr == e.fence.aAddrF {
				return &r.Fences[i], nil
			}
		}
	}
	return nil, fmt.Errorf("fence1's claim records no fence of %s", e.fence.aAddrF)
}

// fenceExpires is when f's blocklist entry expires, as its record says.
func fenceExpires(f *record.Fence) time.Time { return f.Expires }

// fenceTime is a time of f as its record spells it ("" without a fence).
func fenceTime(f *record.Fence, get func(*record.Fence) time.Time) string {
	if f == nil {
		return ""
	}
	return get(f).Format(time.RFC3339Nano)
}

// fenceOutlivesEntry (fenceLifetime): past its first entry's life, node-a's fence is kept by
// node-b's renewals, and still holds when node-a comes back.
func (e *e2e) fenceOutlivesEntry(f0 *record.Fence) {
	// Ceph 16.2 does not lengthen an entry still listed when it is added again, and a re-add just
	// after the old expiry can be undone by the monitors' next tick: with this lab's short
	// fence_expiry the entry may be missing for a moment between its expiry and the next renewal
	// (a quarter of its life later), which a single look at a fixed time sometimes saw. What is
	// asserted: past its first entry's life it is listed again within that renewal period (the
	// default fence_expiry of ten years is why production never reaches such a gap)
	fenceS := int(e.FenceExpiry / time.Second)
	e.CheckWithin(time.Duration(fenceS/2)*time.Second, "node-a's fence1 mapping is blocklisted past its first entry's life (renewed by then)",
		func() error { return e.Blocklisted(e.fence.aAddrF) })
	var exp0 time.Time
	if f0 != nil {
		exp0 = f0.Expires
	}
	cur, _ := e.fenceOfA()
	e.Check(fmt.Sprintf("… kept by node-b's renewals: renewed_by node-b, a later expiry (%s)", fenceTime(cur, fenceExpires)), func() error {
		f, err := e.fenceOfA()
		if err != nil {
			return err
		}
		return Cond(f.RenewedBy == nodeB && f.Expires.After(exp0), "renewed_by '%s', expires %s (first %s)",
			f.RenewedBy, f.Expires.Format(time.RFC3339Nano), exp0.Format(time.RFC3339Nano))
	})
	e.CheckWithin(90*time.Second, "… its entry has 20 s of life left", func() error { return e.FencesInForce(e.fence.aAddrF) })
	e.Check("node-a healed (its tap up)", func() error { return e.HealNode(nodeA) })
	e.T(1, fmt.Sprintf("fenced node-a: a direct write to %s fails (EIO, not a hang)", e.fence.devF), nodeA, writeFails(e.fence.devF))
	e.CheckWithin(30*time.Second, "node-a reports its claim on fence1 lost", e.fenceClaimLost(nodeA, "fence1"))
}

// fenceEndsWithMapping (fenceLifetime): node-a unmaps its fenced fence1 and its agent records the
// fence gone.
func (e *e2e) fenceEndsWithMapping() {
	// (node-a's own RADOS client may still be reconnecting after the long cut: a release the
	// cluster does not answer yet is retried by its agent's reconciler, which then records the
	// fence gone)
	e.T(0, "node-a unmaps its fenced fence1 (the device goes at once; the claim's release may be retried)", nodeA,
		fmt.Sprintf(`out=$(rbd-owner unmap --force rbd/fence1 2>&1); rc=$?; echo "$out"; [ $rc = 0 ] || { grep -q 'will retry' <<< "$out" && [ ! -e %s ]; }`, e.fence.devF))
	e.CheckWithin(60*time.Second, "… its agent recorded the mapping gone in the fence: no longer renewed", func() error {
		f, err := e.fenceOfA()
		if err != nil {
			return err
		}
		return Cond(strings.Contains(f.Gone, "unmapped"), "node-a's fence gone: '%s', want it to say unmapped", f.Gone)
	})
	gone := ""
	if f, err := e.fenceOfA(); err == nil {
		gone = f.Gone
		if gone == "" {
			gone = "still live"
		}
	}
	e.Logf("node-a's fence of fence1: %s", gone)
}

// metrics is the step "metrics: what the scenarios did is counted (counters since each agent's
// last restart)".
func (e *e2e) metrics() {
	e.Step("metrics: what the scenarios did is counted (counters since each agent's last restart)")
	e.T(0, "node-b: GET /metrics serves rbd_owner_build_info", nodeB, metricsCmd+` | grep '^rbd_owner_build_info{'`)
	// at is a series (a regexp anchored at the line's start) and the least sum it must reach
	type at struct {
		re string
		n  float64
	}
	atLeast := func(name, node string, series ...at) {
		e.Check(name, func() error {
			for _, s := range series {
				if err := e.metricAtLeast(node, s.re, s.n); err != nil {
					return err
				}
			}
			return nil
		})
	}
	atLeast("node-b: its maps counted (maps_total ok)", nodeB, at{`rbd_owner_maps_total\{.*result="ok"`, 2})
	atLeast("node-b: its refused maps of img1 counted (claimed_elsewhere)", nodeB, at{`rbd_owner_map_refusals_total\{.*reason="claimed_elsewhere"`, 2})
	atLeast("node-b: its takeover of img1 counted, and the fence it took", nodeB,
		at{`rbd_owner_takeovers_total\{`, 1}, at{`rbd_owner_fences_total\{.*cause="takeover"`, 1})
	atLeast("node-b: its liveness writes counted", nodeB, at{`rbd_owner_liveness_writes_total\{.*result="ok"`, 1})
	atLeast("node-a: its lost claims counted", nodeA, at{`rbd_owner_claims_lost_total\{`, 1})
	atLeast("node-b: its renewals of node-a's fences counted (fence_renewals_total ok)", nodeB, at{`rbd_owner_fence_renewals_total\{.*result="ok"`, 1})
	// fences_expiring counts live fences whose entries end within a quarter of fence_expiry. Ceph
	// 16.2 does not lengthen a listed entry when it is added again, so with the lab's one-minute
	// life an entry is renewed once it ran out, and may be in its last quarter at any look: the
	// renewals work when the gauge is back to 0 within three quarters of a life (it stays above 0
	// while they fail)
	e.CheckWithin(45*time.Second, "node-b: no live fence it keeps stays near its expiry (fences_expiring back to 0 within 45 s)", func() error {
		out, rc := e.On(nodeB, metricsCmd)
		if rc != 0 {
			return fmt.Errorf("GET /metrics on node-b: exit %d: %s", rc, out)
		}
		var series, near []string
		for _, ln := range strings.Split(out, "\n") {
			if strings.HasPrefix(ln, "rbd_owner_fences_expiring{") {
				series = append(series, ln)
				if !strings.HasSuffix(ln, " 0") {
					near = append(near, ln)
				}
			}
		}
		if len(series) == 0 {
			return errors.New("GET /metrics on node-b serves no rbd_owner_fences_expiring series")
		}
		return Cond(len(near) == 0, "fences near their expiry: %s", strings.Join(near, "; "))
	})
}

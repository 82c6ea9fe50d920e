//go:build lab

package scenario

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// aes256kKey is a new cephx key of type aes256k in cephx's encoding: type 2, a creation time
// (seconds, nanoseconds), the secret's length and a 32-byte secret.
func aes256kKey() (string, error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return "", err
	}
	b := binary.LittleEndian.AppendUint16(nil, 2)
	b = binary.LittleEndian.AppendUint32(b, uint32(time.Now().Unix()))
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(secret)))
	return base64.StdEncoding.EncodeToString(append(b, secret...)), nil
}

// keyType is a cephx key's type (its first 16 bits, little-endian: 1 aes, 2 aes256k); 0 when
// the key does not decode.
func keyType(key string) int {
	b, err := base64.StdEncoding.DecodeString(key)
	if err != nil || len(b) < 2 {
		return 0
	}
	return int(binary.LittleEndian.Uint16(b))
}

// oldKeys is the step on guests older than aes256k (Debian 12 and 13: kernels 6.1 and 6.12,
// librados 16.2 and 18.2): a keyring with an aes256k key is refused in one line naming the key
// type, this node's kernel and librados releases, what each needs and what to do. The key is
// made here; no cluster is asked.
func (e *e2e) oldKeys() {
	if e.Guest == "forky" {
		return
	}
	e.Step("keys: an aes256k key on a node whose kernel and librados cannot use it is refused in one line")
	key, err := aes256kKey()
	if err != nil {
		e.Fail("an aes256k key made for the check", err.Error())
		return
	}
	e.T(0, "node-a: check-config refuses an aes256k key, naming its kernel's and librados's releases and what each needs", nodeA,
		`printf "[client.rbdowner]\n\tkey = %s\n" `+key+` >/tmp/aes256k.keyring &&
  sed "s#keyring: .*#keyring: /tmp/aes256k.keyring#" /etc/rbd-owner/config.yaml >/tmp/aes256k.yaml || exit 2
  lib=$(dpkg-query -W -f="\${Version}" librados2 | sed "s/^[0-9]*://; s/[+~-].*//")
  out=$(RBD_OWNER_TEST_SHORT_FENCES=1 rbd-owner check-config --config /tmp/aes256k.yaml 2>&1) && exit 1
  rm -f /tmp/aes256k.keyring /tmp/aes256k.yaml; echo "$out"; [ "$(wc -l <<<"$out")" = 1 ] &&
  grep -F "the key is aes256k, which this node cannot use: its kernel $(uname -r) needs Linux 7.0 and its librados $lib needs Ceph 19.2.6 or 20.2.4: keep this user's key aes until the nodes run Linux 7.0" <<<"$out"`)
	e.StepDone()
}

// acked is the number of the last block the rot1 writer had acknowledged (-1: none yet); an
// error when it cannot be read (the writer rewrites the file at every block: a read may find it
// empty).
func (e *e2e) acked() (int, error) {
	out, rc := e.On(nodeA, "cat /run/rot1.acked 2>/dev/null || echo -1")
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if rc != 0 || err != nil {
		return 0, fmt.Errorf("/run/rot1.acked: %q (exit %d)", out, rc)
	}
	return n, nil
}

// writesGoOn: the rot1 writer acknowledges another block within d (from the first count read).
func (e *e2e) writesGoOn(d time.Duration) func() error {
	return func() error {
		end := time.Now().Add(d)
		a, err := e.acked()
		for err != nil && time.Now().Before(end) {
			time.Sleep(200 * time.Millisecond)
			a, err = e.acked()
		}
		if err != nil {
			return err
		}
		b := a
		for time.Now().Before(end) {
			time.Sleep(500 * time.Millisecond)
			if n, err := e.acked(); err == nil {
				if b = n; b > a {
					return nil
				}
			}
		}
		return fmt.Errorf("acknowledged: %d, then %d", a, b)
	}
}

// priorKeyMappings is node's count of mappings made with a key its keyring no longer holds
// (status, the first cluster).
func (e *e2e) priorKeyMappings(node string) (int, error) {
	st, err := e.status(node)
	if err != nil {
		return 0, err
	}
	if len(st.Clusters) == 0 {
		return 0, fmt.Errorf("%s's status lists no cluster", node)
	}
	return st.Clusters[0].PriorKeyMappings, nil
}

func (e *e2e) priorKeyMappingsAre(node string, want int) error {
	n, err := e.priorKeyMappings(node)
	if err != nil {
		return err
	}
	return Cond(n == want, "%s: %d mappings of a prior key, want %d", node, n, want)
}

// restarts is node's agent's restart count and main process start time: unchanged when it was
// not restarted.
func (e *e2e) restarts(node string) string {
	out, _ := e.On(node, "systemctl show -p NRestarts --value rbd-owner; systemctl show -p ExecMainStartTimestampMonotonic --value rbd-owner")
	return strings.Join(strings.Fields(out), " ")
}

// authUser is `ceph auth get` of the agents' user: its key and the pending one.
func (e *e2e) authUser() (key, pending string, err error) {
	var users []struct {
		Key        string `json:"key"`
		PendingKey string `json:"pending_key"`
	}
	if err := e.CephJSON(&users, "auth", "get", "client.rbdowner"); err != nil {
		return "", "", err
	}
	if len(users) == 0 {
		return "", "", fmt.Errorf("ceph auth get client.rbdowner: no user")
	}
	return users[0].Key, users[0].PendingKey, nil
}

// keyRotation: Ceph 20.2.4 (Tentacle) and later: keys are aes256k, and a fresh cluster allows no
// other type. The rotation is the one Ceph offers for a user whose key stays in use: a pending
// key beside the current one, written to the agents' keyrings. Both authenticate until the first
// connection with the pending key, which commits it (seen on 20.2.4: within a second, msgr2) and
// so drops the prior one.
func (e *e2e) keyRotation() {
	if e.Cluster != "tentacle" {
		return
	}
	e.Step("keys: the agents' aes256k key on an aes256k-only cluster, rotated while node-a writes to rbd/rot1 (a pending key, committed by its first use): no write lost")
	for _, im := range []string{"rot1", "rot2"} {
		if out, err := e.RBD("create", "--size", "64M", "rbd/"+im); err != nil {
			e.Fail("rbd create "+im, out)
		}
	}
	e.Check("the cluster allows only aes256k keys (ceph mon dump: auth_allowed_ciphers aes256k)", func() error {
		out, err := e.Ceph("mon", "dump")
		if err != nil {
			return err
		}
		for _, ln := range strings.Split(out, "\n") {
			if ln == "auth_allowed_ciphers aes256k" {
				return nil
			}
		}
		return fmt.Errorf("ceph mon dump has no line 'auth_allowed_ciphers aes256k': %s", out)
	})
	k1, _, err := e.authUser()
	if err != nil {
		e.Logf("ceph auth get client.rbdowner: %v", err)
	}
	e.Check("the agents' key (client.rbdowner) is aes256k", func() error {
		return Cond(keyType(k1) == 2, "key type %d", keyType(k1))
	})
	restartsA := e.restarts(nodeA)
	// the writer: block i holds "rot1 block i" (padded to 4 KiB), written O_DIRECT every 0.2 s;
	// the last acknowledged block's number in /run/rot1.acked; it retries a block whose write fails
	e.Check("node-a maps rbd/rot1 and starts writing numbered blocks to it (O_DIRECT, one every 0.2 s)", func() error {
		if _, rc := e.Run(nodeA, "rbd-owner map --json rbd/rot1"); rc != 0 {
			return fmt.Errorf("map: exit %d: %s", rc, e.Out)
		}
		r, err := e.mapReply()
		if err != nil {
			return err
		}
		out, rc := e.On(nodeA, fmt.Sprintf(`d=%s; [ -b "$d" ] && echo "$d" > /run/rot1.dev && rm -f /run/rot1.acked &&
   systemd-run --quiet --unit=rot1-writer --collect /bin/bash -c "i=0; while [ \$i -lt 12000 ]; do printf \"rot1 block %%d\n\" \$i | dd of=$d bs=4096 seek=\$i count=1 oflag=direct conv=sync,notrunc status=none && { echo \$i > /run/rot1.acked; i=\$((i + 1)); }; sleep 0.2; done"`, r.Device))
		return Cond(rc == 0, "the writer did not start: exit %d: %s", rc, out)
	})
	e.Check("… its writes are acknowledged", e.writesGoOn(10*time.Second))
	_, _ = e.Ceph("auth", "get-or-create-pending", "client.rbdowner")
	_, k2, err := e.authUser()
	if err != nil {
		e.Logf("ceph auth get client.rbdowner: %v", err)
	}
	e.Check("a pending key beside it (ceph auth get-or-create-pending), aes256k too", func() error {
		return Cond(keyType(k2) == 2, "pending key type %d", keyType(k2))
	})
	k1ring := filepath.Join(e.Dir, "k1.keyring")
	if err := os.WriteFile(k1ring, []byte("[client.rbdowner]\n\tkey = "+k1+"\n"), 0o600); err != nil {
		e.Logf("%s: %v", k1ring, err)
	}
	// k1Answer: what a new connection with the prior key gets ("" when it is let in)
	k1Answer := func() string {
		out, _ := e.CX("timeout", "20", "rados", "--no-mon-config", "-c", e.conf(), "-n", "client.rbdowner", "--keyring", k1ring, "-p", "rbd", "stat", "rbd_directory")
		if strings.Contains(out, "Permission denied") {
			return "Permission denied"
		}
		return ""
	}
	e.Check("… the prior key still authenticates while the pending one is unused", func() error {
		return Cond(k1Answer() == "", "a connection with the prior key was refused")
	})
	for _, n := range Nodes {
		if err := os.WriteFile(filepath.Join(e.Share(n), "keyring.new"), []byte("[client.rbdowner]\n\tkey = "+k2+"\n"), 0o600); err != nil {
			e.Logf("keyring.new for %s: %v", n, err)
		}
		e.T(0, n+": its keyring replaced by one with the pending key alone", n, "install -m 0600 /mnt/host/keyring.new "+e.keyf+" && rm /mnt/host/keyring.new")
	}
	e.Check("node-a: status counts 1 mapping made with the prior key (rot1), and so does the metric", func() error {
		if err := e.priorKeyMappingsAre(nodeA, 1); err != nil {
			return err
		}
		out, rc := e.On(nodeA, metricsCmd)
		return Cond(rc == 0 && strings.Contains("\n"+out+"\n", "\nrbd_owner_prior_key_mappings{cluster=\"lab\"} 1\n"),
			"no line rbd_owner_prior_key_mappings{cluster=\"lab\"} 1 in the metrics (exit %d)", rc)
	})
	e.Check("node-a maps rbd/rot2 with the new key, without a restart", func() error {
		if out, rc := e.On(nodeA, "rbd-owner map rbd/rot2"); rc != 0 {
			return fmt.Errorf("map: exit %d: %s", rc, out)
		}
		now := e.restarts(nodeA)
		return Cond(now == restartsA, "the agent restarted: %q, was %q", now, restartsA)
	})
	e.Check("… still 1 mapping of the prior key (rot2 was made with the new one)", func() error { return e.priorKeyMappingsAre(nodeA, 1) })
	tDrop := time.Now()
	e.CheckWithin(20*time.Second, "rot2's map (the pending key's first use) committed it: the user's key is the new one, nothing pending", func() error {
		key, pending, err := e.authUser()
		if err != nil {
			return err
		}
		return Cond(key == k2 && pending == "", "key %.12s…, pending %q", key, pending)
	})
	e.Check("… and the prior key is dropped: a new connection with it is refused (permission denied)", func() error {
		return Cond(k1Answer() == "Permission denied", "a connection with the prior key was not refused")
	})
	e.Check("rot1, mapped with the dropped key, still writes", e.writesGoOn(10*time.Second))
	m := e.HeartbeatMark(nodeA)
	e.CheckWithin(30*time.Second, "node-a's agent (connected with the dropped key) still renews its heartbeat", func() error { return e.HeartbeatMoved(nodeA, m) })
	// a mon session lost and made again: the kernel's clients of rot1 and rot2 hold tickets of the
	// keys they were mapped with, the first now dropped (seen on 7.2 with 20.2.4: the kernel logs
	// "auth protocol 'cephx' msgr authentication failed: -13" and its sessions come back)
	_ = e.CutNode(nodeA)
	WaitFor(20 * time.Second)
	_ = e.HealNode(nodeA)
	e.Check("node-a cut off the cluster for 20 s and healed: rot1 (the dropped key) writes again within 60 s", e.writesGoOn(60*time.Second))
	m = e.HeartbeatMark(nodeA)
	e.CheckWithin(60*time.Second, "… and node-a's agent renews its heartbeat", func() error { return e.HeartbeatMoved(nodeA, m) })
	fails, _ := e.On(nodeA, `dmesg | grep -c "authentication failed: -13"`)
	e.Logf("rot1 written for %.1fs since its key was dropped; node-a's kernel: %s 'authentication failed: -13' lines", time.Since(tDrop).Seconds(), fails)
	e.Check("node-a: the agent restarted connects with the new key (its RADOS connection had the prior one)", func() error {
		if out, rc := e.On(nodeA, "systemctl restart rbd-owner"); rc != 0 {
			return fmt.Errorf("restart: exit %d: %s", rc, out)
		}
		if err := Within(30*time.Second, func() error { return e.answers(nodeA) }); err != nil {
			return err
		}
		st, err := e.status(nodeA)
		if err != nil {
			return err
		}
		return Cond(len(st.Clusters) > 0 && st.Clusters[0].Connected, "not connected: %+v", st.Clusters)
	})
	e.T(0, "node-a stops the writer: every acknowledged block of rot1 reads back as written", nodeA,
		`systemctl stop rot1-writer; a=$(cat /run/rot1.acked); d=$(cat /run/rot1.dev); echo "$a blocks acknowledged"; [ "$a" -gt 0 ] &&
   dd if=$d bs=4096 count=$((a + 1)) iflag=direct status=none | tr -d "\0" | awk -v n="$a" '$0 != "rot1 block " NR - 1 {bad++; if (bad < 4) print "block " NR - 1 ": " $0} END {print NR " blocks read"; exit !(bad == 0 && NR == n + 1)}'`)
	e.Check("node-a unmaps rot1 and maps it again: 0 mappings of a prior key", func() error {
		if out, rc := e.On(nodeA, "rbd-owner unmap rbd/rot1 && rbd-owner map rbd/rot1"); rc != 0 {
			return fmt.Errorf("exit %d: %s", rc, out)
		}
		return e.priorKeyMappingsAre(nodeA, 0)
	})
	e.T(0, "cleanup: node-a unmaps rot1 and rot2", nodeA, "rbd-owner unmap rbd/rot1 && rbd-owner unmap rbd/rot2")
	e.CheckWithin(30*time.Second, "… no claim left on rot1, rot2", func() error {
		if err := e.HoldersAre("", "rot1"); err != nil {
			return err
		}
		return e.HoldersAre("", "rot2")
	})
}

// finalChecks is the step "final checks on both nodes".
func (e *e2e) finalChecks() {
	e.Step("final checks on both nodes")
	for _, n := range Nodes {
		e.T(0, n+": no secret in sysfs, udev database or the whole journal", n, e.secretCheck())
		e.T(0, n+": no rbd device left mapped", n, `[ -z "$(ls /sys/bus/rbd/devices)" ]`)
		e.T(0, n+": rbd-owner.service active, no restarts except the deliberate kill", n, "systemctl is-active rbd-owner && systemctl show -p NRestarts rbd-owner")
	}
	e.Check("no claim left in the pool", e.noClaimLeft)
}

// noClaimLeft: none of the images the story maps has a holder.
func (e *e2e) noClaimLeft() error {
	for _, im := range []string{"img1", "img2", "img3", "ns1/img4", "skew1", "enf1", "enf2", "csi1", "csi2", "fence1", "nf1", "nf2", "cov1", "cov2"} {
		pool, image := "rbd", im
		if ns, name, ok := strings.Cut(im, "/"); ok {
			pool, image = "rbd/"+ns, name
		}
		if err := e.HoldersAre("", image, pool); err != nil {
			return fmt.Errorf("%s: %w", im, err)
		}
	}
	return nil
}

// chaosRound is a short fixed-seed fault campaign in this lab (tests/chaos/run 1 SEED), the last
// scenario of make e2e (E2E_CHAOS=0 leaves it out: make test's second lab, make e2e has run it).
func (e *e2e) chaosRound() {
	if !e.chaos {
		return
	}
	seed, secs := envOr("CHAOS_SEED", "1"), envOr("CHAOS_SECONDS", "90")
	e.Step(fmt.Sprintf("chaos: a short fixed-seed fault campaign in this lab (tests/chaos/run 1 %s, %s s)", seed, secs))
	logPath := e.logPath("chaos.log")
	// (the kinds of faults as when seed 1 was chosen, so that its schedule stays the same: the
	// long-cut fault, minutes long, is the campaign's (make chaos) and this e2e's fence step's)
	faults := envOr("CHAOS_FAULTS", "freeze cut kill clock unmap pause-osd pause-mon reboot idle-claim slow-pool")
	err := e.runChaos(logPath, seed, secs, faults)
	log, _ := os.ReadFile(logPath)
	if err == nil {
		last := ""
		for _, ln := range strings.Split(string(log), "\n") {
			if strings.HasPrefix(ln, "chaos: seed") {
				last = ln
			}
		}
		e.Pass("chaos: " + last)
	} else {
		// all a reader needs when the lab is gone (a CI run): the log's end, the cluster, the agents
		lines := strings.Split(strings.TrimRight(string(log), "\n"), "\n")
		var details []string
		for _, ln := range lines {
			if strings.HasPrefix(ln, "VIOLATION") {
				details = append(details, ln)
			}
		}
		if len(details) > 10 {
			details = details[len(details)-10:]
		}
		if len(lines) > 40 {
			lines = lines[len(lines)-40:]
		}
		details = append(details, lines...)
		cs, _ := e.Ceph("-s")
		details = append(details, "-- ceph -s:", cs)
		for _, n := range Nodes {
			st, _ := e.OnT(20*time.Second, n, "rbd-owner status 2>&1 | head -20")
			details = append(details, "-- "+n+": rbd-owner status:", st)
		}
		e.Fail(fmt.Sprintf("chaos: the campaign found a violation or did not finish (log: %s)", logPath), details...)
	}
	e.StepDone()
}

// runChaos runs tests/chaos/run in this lab, its output into logPath, within 600 s.
func (e *e2e) runChaos(logPath, seed, secs, faults string) error {
	f, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Second)
	defer cancel()
	// a TERM to this process (tests/lab/e2e stopped) ends the campaign as its deadline does,
	// its own trap healing the lab, instead of leaving its process group running
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM)
	defer stop()
	cmd := exec.CommandContext(ctx, filepath.Join(e.Repo, "tests", "chaos", "run"), "1", seed)
	cmd.Env = append(os.Environ(), "CHAOS_IN_LAB=1", "ROUND_SECONDS="+secs, "FAULTS="+faults)
	cmd.Stdout, cmd.Stderr = f, f
	// at the deadline the campaign's whole process group gets TERM, as `timeout` sent it: its
	// own trap heals the lab and stops its samplers; KILL follows a minute later
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = time.Minute
	err = cmd.Run()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // whatever of the group is left
	}
	return err
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// flaps is the closing step: no OSD or monitor flapped on its own (the monitors' cluster log
// against the lab's own faults).
func (e *e2e) flaps() {
	e.Step("the Ceph cluster: no OSD or monitor flapped (the monitors' cluster log against the lab's own faults)")
	lines, err := cephFlaps(filepath.Join(e.Dir, "logs", "ceph-faults.txt"), filepath.Join(e.CephDir, "log"))
	if err == nil {
		e.Pass("no flapping: " + strings.Join(lines, ";"))
	} else {
		e.Fail("the cluster's daemons flapped, or its log could not be read: more down-markings or elections than the lab caused", append(lines, err.Error())...)
	}
	e.StepDone()
}

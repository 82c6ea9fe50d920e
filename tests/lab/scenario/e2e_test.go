//go:build lab

package scenario

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
)

// TestE2E is `make e2e` and `make e2e-prod`: every scenario as PASS/FAIL assertions on the lab
// tests/lab/e2e brought up (LAB_DIR). The run's counts and steps go to E2E_RESULTS (JSON, kept
// current after every assertion, so that a run stopped or timed out still counts what it did)
// for the shell's closing line; without it this prints them itself.
func TestE2E(t *testing.T) {
	dir := os.Getenv("LAB_DIR")
	if dir == "" {
		t.Skip("no lab: run through tests/lab/e2e (make e2e)")
	}
	lab, err := LoadLab(dir)
	if err != nil {
		t.Fatal(err)
	}
	e := &e2e{Suite: NewSuite(lab, os.Stdout), keyf: "/etc/ceph/ceph.client.rbdowner.keyring", chaos: os.Getenv("E2E_CHAOS") != "0"}
	results := os.Getenv("E2E_RESULTS")
	e.KeepResults(results)
	defer func() {
		// a part that panics ends the story: counted as a failure, never as a finished run
		if r := recover(); r != nil {
			e.Fail(fmt.Sprintf("the story stopped: panic: %v", r), string(debug.Stack()))
		}
		if results != "" {
			if err := e.Finish(); err != nil {
				t.Errorf("results: %v", err)
			}
		} else {
			e.Close("e2e")
		}
		if e.Failed > 0 {
			t.Fail()
		}
	}()
	defer e.cleanup()
	for _, part := range []func(){
		e.nodeAMaps, e.badNames, e.roles, e.crossNode, e.behindTheBack, e.enforcement,
		e.csiDropIn, e.agentKilled, e.stateFileCut, e.configRefused,
		e.clockSkew, e.frozenTakeover, e.fenceLifetime, e.metrics,
		e.afterFence, e.rebootAndKrbd, e.prodFaults,
		e.oldKeys, e.keyRotation, e.finalChecks, e.chaosRound, e.flaps,
	} {
		part()
	}
}

const nodeA, nodeB = "node-a", "node-b"

// e2e is the story's state: what one scenario leaves for the next (devices, epochs, addresses).
type e2e struct {
	*Suite
	keyf  string
	chaos bool

	// node-a's first mapping (rbd/img1): its device, stable link, epoch and client address
	devA, linkA string
	e1          uint64
	aAddr1      string

	// each file's own state
	fence fenceState
	nf    nodeFenceState

	// the closers of background work a scenario started (the krbd test, a fence watch)
	closers []func()
}

func (e *e2e) cleanup() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
}

// ---- the guest's answers, read with the agent's types --------------------------------------

// mapReply is the last command's output as `rbd-owner map --json` answers.
func (e *e2e) mapReply() (api.MapResponse, error) {
	var r api.MapResponse
	if err := e.JSON(&r); err != nil {
		return r, err
	}
	if r.Claim == nil {
		return r, fmt.Errorf("map reply without a claim: %s", e.Out)
	}
	return r, nil
}

// status is node's `rbd-owner status --json` (exit 0, or 5: answered with problems).
func (e *e2e) status(node string) (api.Status, error) {
	var st api.Status
	out, rc := e.On(node, "rbd-owner status --json")
	if rc != 0 && rc != 5 {
		return st, fmt.Errorf("rbd-owner status on %s: exit %d: %s", node, rc, out)
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return st, fmt.Errorf("rbd-owner status on %s: %w: %s", node, err, out)
	}
	return st, nil
}

// device is node's device of image (by image name), per its status.
func (e *e2e) device(node, image string) (api.Device, error) {
	st, err := e.status(node)
	if err != nil {
		return api.Device{}, err
	}
	for _, d := range st.Devices {
		if d.Image == image {
			return d, nil
		}
	}
	return api.Device{}, fmt.Errorf("%s's status lists no device of %s", node, image)
}

// clientAddr is the kernel client address of node's device dev (/dev/rbdN); "" when it cannot be
// read (every check of an address refuses "").
func (e *e2e) clientAddr(node, dev string) string {
	out, rc := e.On(node, "cat /sys/bus/rbd/devices/"+strings.TrimPrefix(dev, "/dev/rbd")+"/client_addr")
	if rc != 0 || strings.ContainsAny(out, " \n") {
		e.Logf("client address of %s on %s: exit %d: %s", dev, node, rc, out)
		return ""
	}
	return out
}

// answers: node's agent answers (`rbd-owner status` exits 0, or 5 when it has problems; 4: not
// reachable).
func (e *e2e) answers(node string) error {
	out, rc := e.On(node, "rbd-owner status >/dev/null 2>&1")
	return Cond(rc == 0 || rc == 5, "rbd-owner status on %s: exit %d %s", node, rc, out)
}

// until runs script on node until it exits 0, within d (polled from the host).
func (e *e2e) until(d time.Duration, node, script string) error {
	return Within(d, func() error {
		out, rc := e.On(node, script)
		return Cond(rc == 0, "exit %d: %s", rc, out)
	})
}

// writeFails is a guest script: an O_DIRECT write to dev fails with an error (exit 1), not a hang
// (124); 2 when dev is not a block device (a failed write there would prove nothing).
func writeFails(dev string) string {
	return fmt.Sprintf(`[ -b '%[1]s' ] || { echo "no block device '%[1]s'"; exit 2; }; timeout 90 dd if=/dev/zero of=%[1]s bs=4k count=1 oflag=direct 2>&1; rc=$?; [ $rc = 0 ] && exit 0; [ $rc = 124 ] && exit 124; exit 1`, dev)
}

// ---- audit entries ---------------------------------------------------------------------------

// auditHas: an audit entry of node, as "EVENT IMAGE EPOCH OWNER PRIORITY UID", matches re.
func (e *e2e) auditHas(node, re string) func() error {
	return func() error {
		n, err := e.auditMatches(node, re)
		if err != nil {
			return err
		}
		return Cond(n > 0, "no audit entry of %s matches %s", node, re)
	}
}

// auditCount: exactly n audit entries of node match re.
func (e *e2e) auditCount(node, re string, n int) func() error {
	return func() error {
		got, err := e.auditMatches(node, re)
		if err != nil {
			return err
		}
		return Cond(got == n, "%d audit entries of %s match %s, want %d", got, node, re, n)
	}
}

func (e *e2e) auditMatches(node, re string) (int, error) {
	rx, err := regexp.Compile(re)
	if err != nil {
		return 0, err
	}
	lines, err := e.Audit(node)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, a := range lines {
		if rx.MatchString(a.String()) {
			n++
		}
	}
	return n, nil
}

// auditErr: an entry of node about image at error priority or worse.
func (e *e2e) auditErr(node, image string) func() error {
	return func() error {
		lines, err := e.Audit(node)
		if err != nil {
			return err
		}
		for _, a := range lines {
			if a.Image == image && a.Priority <= 3 {
				return nil
			}
		}
		return fmt.Errorf("no error-priority audit entry of %s about %s", node, image)
	}
}

// intrudersAre: the fenced intruders image's claim records, as "node@addr,…" ("" for none).
func (e *e2e) intrudersAre(want, image string) func() error {
	return func() error {
		r, err := e.Claim(image)
		if err != nil {
			return err
		}
		var got []string
		if r != nil {
			for _, in := range r.Intruders {
				got = append(got, in.NodeID+"@"+in.Addr)
			}
		}
		return Cond(strings.Join(got, ",") == want, "intruders: '%s', want '%s'", strings.Join(got, ","), want)
	}
}

// ---- metrics ---------------------------------------------------------------------------------

const metricsCmd = "curl -sf --unix-socket /run/rbd-owner/rbd-owner.sock http://x/metrics"

// metricSum is the sum of node's metric series whose line matches re (Prometheus text).
func (e *e2e) metricSum(node, re string) (float64, error) {
	rx, err := regexp.Compile("^" + re)
	if err != nil {
		return 0, err
	}
	out, rc := e.On(node, metricsCmd)
	if rc != 0 {
		return 0, fmt.Errorf("GET /metrics on %s: exit %d: %s", node, rc, out)
	}
	sum := 0.0
	for _, ln := range strings.Split(out, "\n") {
		if !rx.MatchString(ln) {
			continue
		}
		f := strings.Fields(ln)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metric line %q: %w", ln, err)
		}
		sum += v
	}
	return sum, nil
}

// metricAtLeast: the series of node matching re sum to at least n.
func (e *e2e) metricAtLeast(node, re string, n float64) error {
	v, err := e.metricSum(node, re)
	if err != nil {
		return err
	}
	return Cond(v >= n, "%s sums to %g, want at least %g", re, v, n)
}

// ---- guest checks that stay scripts (they read the guest's own files) -------------------------

// secretCheck: no secret of the agents' keyring in sysfs config_info, the udev database or the
// whole journal of the node.
func (e *e2e) secretCheck() string {
	return `K=$(awk "/key *=/{print \$3}" ` + e.keyf + `); [ ${#K} -gt 20 ] || { echo "no key in keyring"; exit 2; }
  f=0
  for c in /sys/bus/rbd/devices/*/config_info; do [ -e "$c" ] && grep -qF -- "$K" "$c" && { echo "secret in $c"; f=1; }; done
  for d in /dev/rbd[0-9]*; do [ -b "$d" ] || continue
    udevadm info -q all -n "$d" | grep -qF -- "$K" && { echo "secret in udevadm info $d"; f=1; }
    udevadm info -a -n "$d" 2>/dev/null | grep -qF -- "$K" && { echo "secret in udevadm info -a $d"; f=1; }; done
  grep -rqF -- "$K" /run/udev/data 2>/dev/null && { echo "secret in /run/udev/data"; f=1; }
  journalctl -o verbose --no-pager | grep -qF -- "$K" && { echo "secret in the journal"; f=1; }
  exit $f`
}

// secureCheck (prod, whose ms_mode=secure comes from the cluster's config store alone): every
// mapping on the node was given ms_mode=secure (sysfs config_info), and there is at least one.
const secureCheck = `n=0; for c in /sys/bus/rbd/devices/*/config_info; do [ -e "$c" ] || continue; n=$((n + 1))
    grep -q "ms_mode=secure" "$c" || { echo "not ms_mode=secure: $c: $(cat "$c")"; exit 1; }; done
  echo "$n mappings, each ms_mode=secure"; [ "$n" -gt 0 ]`

// prod: the production-shaped topology
func (e *e2e) prod() bool { return e.Topology == "prod" }

// logPath is a file in the lab's logs.
func (e *e2e) logPath(name string) string { return filepath.Join(e.Dir, "logs", name) }

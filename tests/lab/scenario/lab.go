//go:build lab

package scenario

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// Lab is a running lab as its lab.env and the e2e's environment describe it.
type Lab struct {
	Dir      string // LAB_DIR: logs, shares, lab.env
	NS       string // the network namespace the cluster runs in
	CephDir  string // the cluster's directory (ceph.conf, run/, log/)
	CephRoot string // the cluster's chroot ("" for the host's own Ceph)
	FSID     string
	Guest    string // bookworm, trixie, forky
	Cluster  string // pacific, reef, tentacle
	Topology string // small or prod
	SlowPool string // "" without one
	Repo     string // the repository's root

	QPID    map[string]int    // each node's qemu process
	NodeIP  map[string]string // each node's address on the lab's bridge
	Mons    []string          // the monitors as ceph-csi passes them to rbd -m
	MapOpts string            // the kernel options the cluster's config store asks for ("" for none)
	RBDOSDs []int             // pool rbd's OSDs
	SlowOSD []int             // the slow pool's OSDs

	Lease, Renew, FenceExpiry time.Duration
	CmdTimeout, BootTimeout   time.Duration

	seq atomic.Int64
}

// Nodes are the lab's two guests.
var Nodes = []string{"node-a", "node-b"}

// LoadLab reads the lab recorded in dir/lab.env and the e2e's environment (LAB_MONS, LEASE, …,
// exported by tests/lab/e2e).
func LoadLab(dir string) (*Lab, error) {
	env, err := readEnvFile(filepath.Join(dir, "lab.env"))
	if err != nil {
		return nil, fmt.Errorf("lab %s: %w (is a lab up? tests/lab/lab up)", dir, err)
	}
	l := &Lab{
		Dir: dir, NS: env["NS"], CephDir: env["CEPHDIR"], CephRoot: env["CEPH_ROOT"], FSID: env["FSID"],
		Guest: env["LAB_GUEST"], Cluster: env["LAB_CLUSTER"], Topology: env["LAB_TOPOLOGY"], SlowPool: env["SLOW_POOL"],
		QPID: map[string]int{}, NodeIP: map[string]string{},
		Mons: strings.Fields(os.Getenv("LAB_MONS")), MapOpts: os.Getenv("LAB_MAP_OPTS"),
	}
	if l.NS == "" || l.CephDir == "" {
		return nil, fmt.Errorf("lab %s: lab.env names no namespace or Ceph directory", dir)
	}
	if l.Topology == "" {
		l.Topology = "small"
	}
	for _, n := range Nodes {
		short := strings.TrimPrefix(n, "node-")
		if v := env["QPID_"+short]; v != "" {
			pid, err := strconv.Atoi(v)
			if err != nil || pid <= 0 {
				return nil, fmt.Errorf("lab %s: lab.env: QPID_%s=%q is not a process id", dir, short, v)
			}
			l.QPID[n] = pid
		}
	}
	for _, kv := range strings.Fields(os.Getenv("LAB_NODE_IPS")) {
		n, ip, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("LAB_NODE_IPS: %q is not NODE=IP", kv)
		}
		l.NodeIP[n] = ip
	}
	if l.RBDOSDs, err = ints(os.Getenv("LAB_RBD_OSDS")); err != nil {
		return nil, fmt.Errorf("LAB_RBD_OSDS: %w", err)
	}
	if l.SlowOSD, err = ints(os.Getenv("LAB_SLOW_OSDS")); err != nil {
		return nil, fmt.Errorf("LAB_SLOW_OSDS: %w", err)
	}
	if len(l.Mons) == 0 || len(l.RBDOSDs) == 0 || len(l.NodeIP) != len(Nodes) {
		return nil, errors.New("the lab's topology is not in the environment (LAB_MONS, LAB_RBD_OSDS, LAB_NODE_IPS): run through tests/lab/e2e")
	}
	for _, d := range []struct {
		name string
		to   *time.Duration
		def  string
	}{{"LEASE", &l.Lease, "35s"}, {"RENEW", &l.Renew, "5s"}, {"FENCE_EXPIRY", &l.FenceExpiry, "1m"},
		{"CMD_TIMEOUT", &l.CmdTimeout, "120"}, {"BOOT_TIMEOUT", &l.BootTimeout, "300"}} {
		v := os.Getenv(d.name)
		if v == "" {
			v = d.def
		}
		if _, err := strconv.Atoi(v); err == nil {
			v += "s"
		}
		if *d.to, err = time.ParseDuration(v); err != nil {
			return nil, fmt.Errorf("%s=%q: %w", d.name, v, err)
		}
	}
	l.Repo = os.Getenv("LAB_REPO")
	return l, nil
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Fields(s) {
		i, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not a number", f)
		}
		out = append(out, i)
	}
	return out, nil
}

// readEnvFile reads KEY=VALUE lines (lab.env: written by lab_save_env, no quoting).
func readEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			env[k] = v
		}
	}
	return env, sc.Err()
}

// Share is a node's 9p share on the host (its command channel's directories live there).
func (l *Lab) Share(node string) string {
	return filepath.Join(l.Dir, "share-"+strings.TrimPrefix(node, "node-"))
}

// On runs script (a bash script's text) as root in node with the lab's command timeout: its
// output (stdout and stderr) and its exit status. 124: it did not finish in time; 125: the
// command channel failed (the guest is gone, or it left no exit status).
func (l *Lab) On(node, script string) (string, int) {
	return l.OnT(l.CmdTimeout, node, script)
}

// OnT is On with its own deadline: the one primitive every scenario drives a guest with
// (tests/lab/cmdloop.sh is the guest's side).
func (l *Lab) OnT(timeout time.Duration, node, script string) (string, int) {
	s := l.Share(node)
	id := fmt.Sprintf("%d-%d-%d", time.Now().UnixNano(), os.Getpid(), l.seq.Add(1))
	tmp := filepath.Join(s, "cmd", "."+id+".tmp")
	if err := os.WriteFile(tmp, []byte(script+"\n"), 0o644); err != nil {
		return fmt.Sprintf("lab: %s: %v", node, err), 125
	}
	if err := os.Rename(tmp, filepath.Join(s, "cmd", id+".sh")); err != nil {
		return fmt.Sprintf("lab: %s: %v", node, err), 125
	}
	outF, rcF := filepath.Join(s, "out", id+".out"), filepath.Join(s, "out", id+".rc")
	end := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(rcF); err == nil {
			break
		}
		if pid := l.QPID[node]; pid > 0 && syscall.Kill(pid, 0) != nil {
			return fmt.Sprintf("lab: %s is not running (qemu %d gone)", node, pid), 125
		}
		if time.Now().After(end) {
			out, _ := os.ReadFile(outF)
			return fmt.Sprintf("%slab: command on %s did not finish in %s: %s", out, node, timeout, script), 124
		}
		time.Sleep(50 * time.Millisecond)
	}
	out, _ := os.ReadFile(outF)
	rcText, _ := os.ReadFile(rcF)
	rc, err := strconv.Atoi(strings.TrimSpace(string(rcText)))
	if err != nil {
		return fmt.Sprintf("%slab: command on %s left exit status %q, not a number", out, node, rcText), 125
	}
	for _, f := range []string{outF, rcF, filepath.Join(s, "run", id+".sh")} {
		_ = os.Remove(f)
	}
	return strings.TrimSuffix(string(out), "\n"), rc
}

// hostDeadline bounds every host-side command (the Ceph CLIs bound their own connection).
const hostDeadline = 90 * time.Second

// NSX runs a command on the host inside the lab's network namespace: its combined output,
// without the last newline.
func (l *Lab) NSX(args ...string) (string, error) {
	return l.host(append([]string{"ip", "netns", "exec", l.NS}, args...)...)
}

// CX runs a command inside the namespace with the cluster's own release's tools (in its chroot
// when it has one).
func (l *Lab) CX(args ...string) (string, error) {
	if l.CephRoot != "" {
		return l.NSX(append([]string{"chroot", l.CephRoot}, args...)...)
	}
	return l.NSX(args...)
}

// Ceph is Ceph's ceph CLI with the lab's admin key (RBD and Rados likewise).
func (l *Lab) Ceph(args ...string) (string, error) {
	return l.CX(append([]string{"ceph", "-c", l.conf(), "--connect-timeout", "15"}, args...)...)
}

// RBD is Ceph's rbd CLI with the lab's admin key.
func (l *Lab) RBD(args ...string) (string, error) {
	return l.CX(append([]string{"rbd", "-c", l.conf()}, args...)...)
}

// Rados is Ceph's rados CLI with the lab's admin key.
func (l *Lab) Rados(args ...string) (string, error) {
	return l.CX(append([]string{"rados", "-c", l.conf()}, args...)...)
}

func (l *Lab) conf() string { return filepath.Join(l.CephDir, "ceph.conf") }

func (l *Lab) host(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), hostDeadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	out, err := cmd.CombinedOutput()
	text := strings.TrimSuffix(string(out), "\n")
	if err != nil {
		return text, fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, lastLine(text))
	}
	return text, nil
}

// Stdout runs a host command inside the namespace (and chroot) and returns its standard output
// alone: for JSON read from Ceph's CLIs, whose warnings go to stderr.
func (l *Lab) Stdout(args ...string) ([]byte, error) {
	pre := []string{"ip", "netns", "exec", l.NS}
	if l.CephRoot != "" {
		pre = append(pre, "chroot", l.CephRoot)
	}
	args = append(pre, args...)
	ctx, cancel := context.WithTimeout(context.Background(), hostDeadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s: %w: %s", strings.Join(args[len(pre):], " "), err, lastLine(stderr.String()))
	}
	return out, nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// CephJSON runs `ceph ARGS -f json` and decodes its answer into v.
func (l *Lab) CephJSON(v any, args ...string) error {
	out, err := l.Stdout(append([]string{"ceph", "-c", l.conf(), "--connect-timeout", "15"}, append(args, "-f", "json")...)...)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(out, v); err != nil {
		return fmt.Errorf("ceph %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

// tap is a node's tap device on the lab's bridge.
func (l *Lab) tap(node string) (string, error) {
	out, err := l.NSX("ip", "-o", "link", "show")
	if err != nil {
		return "", err
	}
	prefix := "tl" + strings.TrimPrefix(node, "node-")
	for _, f := range strings.Fields(out) {
		name := strings.TrimSuffix(f, ":")
		if strings.HasPrefix(name, prefix) {
			return strings.SplitN(name, "@", 2)[0], nil
		}
	}
	return "", fmt.Errorf("no tap device of %s in namespace %s", node, l.NS)
}

// CutNode takes node's link to the cluster down (its command channel is not networked: it still
// runs commands).
func (l *Lab) CutNode(node string) error { return l.link(node, "down") }

// HealNode brings node's link to the cluster up again.
func (l *Lab) HealNode(node string) error { return l.link(node, "up") }

func (l *Lab) link(node, state string) error {
	t, err := l.tap(node)
	if err != nil {
		return err
	}
	_, err = l.NSX("ip", "link", "set", "dev", t, state)
	return err
}

// CephFault records in the lab's ledger (logs/ceph-faults.txt) that the lab stops or kills these
// Ceph daemons now (osd.N, mon.X), for the closing check that nothing flapped on its own.
func (l *Lab) CephFault(daemons ...string) error {
	f, err := os.OpenFile(filepath.Join(l.Dir, "logs", "ceph-faults.txt"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, d := range daemons {
		if _, err := fmt.Fprintf(f, "%d %s\n", time.Now().Unix(), d); err != nil {
			return err
		}
	}
	return nil
}

// DaemonPID is a Ceph daemon's process id from its pid file (mon.a, osd.0).
func (l *Lab) DaemonPID(daemon string) (int, error) {
	b, err := os.ReadFile(filepath.Join(l.CephDir, "run", daemon+".pid"))
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("%s's pid file holds %q", daemon, b)
	}
	return pid, nil
}

// Hmp sends one command to node's qemu monitor and returns its answer's lines.
func (l *Lab) Hmp(node, command string) (string, error) {
	c, err := net.DialTimeout("unix", filepath.Join(l.Dir, node+".mon"), 10*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	untilPrompt := func() (string, error) {
		var b []byte
		buf := make([]byte, 4096)
		for !strings.HasSuffix(string(b), "(qemu) ") {
			n, err := c.Read(buf)
			if err != nil {
				return string(b), err
			}
			b = append(b, buf[:n]...)
		}
		return string(b), nil
	}
	if _, err := untilPrompt(); err != nil {
		return "", fmt.Errorf("qemu monitor of %s: %w", node, err)
	}
	if _, err := c.Write([]byte(command + "\n")); err != nil {
		return "", err
	}
	out, err := untilPrompt()
	if err != nil {
		return "", fmt.Errorf("qemu monitor of %s: %s: %w", node, command, err)
	}
	var lines []string
	for _, ln := range strings.Split(strings.ReplaceAll(out, "\r", ""), "\n") {
		if ln == "" || strings.HasPrefix(ln, "(qemu)") || strings.TrimSpace(ln) == command || strings.Contains(ln, "\x1b") || strings.TrimSpace(ln) == "" {
			continue
		}
		lines = append(lines, ln)
	}
	return strings.Join(lines, "\n"), nil
}

// GuestPaused stops node's guest (qemu stop) and checks that the monitor says so.
func (l *Lab) GuestPaused(node string) error { return l.guestState(node, "stop", "paused") }

// GuestRunning resumes node's guest (qemu cont) and checks that the monitor says so.
func (l *Lab) GuestRunning(node string) error { return l.guestState(node, "cont", "running") }

func (l *Lab) guestState(node, cmd, want string) error {
	if _, err := l.Hmp(node, cmd); err != nil {
		return err
	}
	st, err := l.Hmp(node, "info status")
	if err != nil {
		return err
	}
	if !strings.Contains(st, want) {
		return fmt.Errorf("%s: qemu says %q, want %s", node, st, want)
	}
	return nil
}

// Package cephconn opens RADOS connections with a deadline on every cluster call and turns
// librados return codes into errors that callers can branch on. It is, with the packages
// built on it, the only place that imports go-ceph.
package cephconn

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ceph/go-ceph/rados"

	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/monaddr"
)

// Options says how to reach one cluster as one cephx identity.
type Options struct {
	// User is the cephx id without the "client." prefix (e.g. "rbd-owner").
	User string
	// Keyring is the path of a keyring file holding the user's key.
	Keyring string
	// ConfFile is an optional ceph.conf; Monitors override its mon_host.
	ConfFile string
	// Monitors are "host:port" or Ceph address vectors; optional when ConfFile names them.
	Monitors []string
	// Timeout bounds every call into the cluster: connecting, monitor commands and OSD
	// operations (client_mount_timeout, rados_mon_op_timeout, rados_osd_op_timeout).
	// Zero means 10 seconds.
	Timeout time.Duration
}

// DefaultTimeout bounds cluster calls when Options.Timeout is zero. It is the config's
// ClusterCallTimeout: the shortest lease the config accepts is derived from it.
const DefaultTimeout = config.ClusterCallTimeout

// Connect opens and connects a RADOS handle. The caller owns it and must Shutdown it.
func Connect(o Options) (*rados.Conn, error) {
	if o.User == "" {
		return nil, errors.New("connect: no cephx user given")
	}
	if strings.HasPrefix(o.User, "client.") {
		return nil, fmt.Errorf("connect: user %q: give the id without the \"client.\" prefix", o.User)
	}
	if o.ConfFile == "" && len(o.Monitors) == 0 {
		return nil, errors.New("connect: neither a ceph.conf nor monitor addresses given")
	}
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	conn, err := rados.NewConnWithUser(o.User)
	if err != nil {
		return nil, fmt.Errorf("connect as client.%s: %w", o.User, err)
	}
	fail := func(what string, err error) (*rados.Conn, error) {
		conn.Shutdown()
		return nil, Classify(fmt.Errorf("connect as client.%s: %s: %w", o.User, what, err), "connect", "mon 'profile rbd'")
	}
	if o.ConfFile != "" {
		if err := conn.ReadConfigFile(o.ConfFile); err != nil {
			return fail("read "+o.ConfFile, err)
		}
	}
	secs := strconv.FormatFloat(timeout.Seconds(), 'f', -1, 64)
	opts := [][2]string{
		{"client_mount_timeout", secs},
		{"rados_mon_op_timeout", secs},
		{"rados_osd_op_timeout", secs},
		// the agent must not write a log file or an admin socket of its own
		{"log_file", ""},
		{"admin_socket", ""},
	}
	if len(o.Monitors) > 0 {
		opts = append(opts, [2]string{"mon_host", monHost(o.Monitors)})
	}
	if o.Keyring != "" {
		opts = append(opts, [2]string{"keyring", o.Keyring})
	}
	for _, kv := range opts {
		if err := conn.SetConfigOption(kv[0], kv[1]); err != nil {
			return fail("set "+kv[0], err)
		}
	}
	if err := conn.Connect(); err != nil {
		if why := unreadableKey(o, err); why != "" {
			conn.Shutdown()
			return nil, fmt.Errorf("connect as client.%s: %s: %w", o.User, why, err)
		}
		return fail("connect", err)
	}
	return conn, nil
}

// unreadableKey explains a connection refused at once because this node's librados cannot read
// the user's key (an aes256k key before Ceph 19.2.6 and 20.2.4: librados logs "keyring not found"
// and returns EIO before it reaches a monitor), naming librados's release; "" for any other
// failure, or when that release reads the key.
func unreadableKey(o Options, err error) string {
	if o.Keyring == "" || Code(err) != -int(syscall.EIO) {
		return ""
	}
	secret, kerr := krbd.ReadKeyringFile(o.Keyring, "client."+o.User)
	if kerr != nil {
		return ""
	}
	typ, _ := krbd.KeyType(secret)
	release := LibradosRelease()
	if typ != krbd.KeyAES256K || release != "" && krbd.LibradosReadsKey(typ, release) {
		return ""
	}
	lib := "this node's librados " + release
	if release == "" {
		lib = "this node's librados (version unknown)"
	}
	return fmt.Sprintf("%s cannot read the user's %s key in %s (it needs %s libraries; the kernel needs %s): upgrade the node's Ceph libraries, or keep this user's key %s",
		lib, typ, o.Keyring, krbd.AES256KLibrados, krbd.AES256KKernel, krbd.KeyAES)
}

// monHost joins monitor addresses for librados. A plain "ip:port" is the kernel's (msgr1)
// form; librados would first try msgr2 on it unless the port is 3300, so it is marked v1.
// Typed addresses, address vectors and addresses without a port pass as written.
func monHost(monitors []string) string {
	var out []string
	for _, m := range monitors {
		for _, e := range monaddr.Split(m) {
			if a, err := monaddr.Parse(e); err == nil && len(a) == 1 && a[0].Type == "" && a[0].Port != 0 && a[0].Port != monaddr.PortV2 {
				e = monaddr.V1 + ":" + e
			}
			out = append(out, e)
		}
	}
	return strings.Join(out, ",")
}

// Errors callers branch on (with errors.Is); they are the agent's shared fault sentinels.
var (
	// ErrUnavailable: the cluster did not answer within the deadline, or the connection is gone.
	ErrUnavailable = fault.ErrUnavailable
	// ErrNotFound: the pool, namespace, image or object does not exist.
	ErrNotFound = fault.ErrNotFound
	// ErrPermission: cephx refused the operation; the PermissionError says which cap is missing.
	ErrPermission = fault.ErrPermission
	// ErrBlocklisted: this client has been blocklisted (fenced) by the cluster.
	ErrBlocklisted = fault.ErrBlocklisted
)

// PermissionError names the operation that was refused and the cap that allows it.
type PermissionError struct {
	Op  string // what was attempted, e.g. "blocklist 10.0.0.1:0/123"
	Cap string // the cap the agent's user needs, e.g. `mon 'allow command "osd blocklist"'`
	Err error
}

func (e *PermissionError) Error() string {
	return fmt.Sprintf("%v (the agent's cephx user needs %s)", e.Err, e.Cap)
}
func (e *PermissionError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrPermission) true.
func (e *PermissionError) Is(target error) bool { return target == ErrPermission }

// Kind is the fault class the API answers with.
func (e *PermissionError) Kind() fault.Kind { return fault.PermissionDenied }

// Code returns the negative errno carried by a go-ceph error, or 0.
func Code(err error) int {
	var ce interface{ ErrorCode() int }
	if errors.As(err, &ce) {
		return ce.ErrorCode()
	}
	return 0
}

// Classify wraps err so that errors.Is finds ErrUnavailable, ErrNotFound, ErrPermission or
// ErrBlocklisted when the librados code says so. op and need describe what was attempted and
// which cap permits it, for the PermissionError. Other errors are returned unchanged.
func Classify(err error, op, need string) error {
	if err == nil {
		return nil
	}
	switch -Code(err) {
	case int(syscall.ETIMEDOUT), int(syscall.ENOTCONN), int(syscall.ECONNREFUSED), int(syscall.EHOSTUNREACH):
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	case int(syscall.ENOENT):
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	case int(syscall.EPERM), int(syscall.EACCES):
		return &PermissionError{Op: op, Cap: need, Err: err}
	case int(syscall.ESHUTDOWN):
		return fmt.Errorf("%w: %w", ErrBlocklisted, err)
	}
	return err
}

// BlocklistCap is the cap the agent's user needs to fence.
const BlocklistCap = `mon 'allow command "osd blocklist"'`

// Blocklist adds addr ("ip:port/nonce", or "ip:0/0" for every client of a host) to the
// cluster's blocklist for expire, through the monitors, and returns when the entry ends as this
// node estimates it. It is safe to repeat.
func Blocklist(conn *rados.Conn, addr string, expire time.Duration) (time.Time, error) {
	until, _, err := BlocklistAdd(conn, addr, expire)
	return until, err
}

// addAnswerRE reads the monitors' answer to an add: "blocklisting ADDR until TIME (N sec)".
var addAnswerRE = regexp.MustCompile(`until (\S+) \((\d+(?:\.\d+)?) sec\)`)

// MonNowOfAdd is the monitors' clock when they answered an add, from its answer ("blocklisting
// 10.0.0.1:0/1 until 2026-12-06T20:25:48.038326+0000 (600 sec)": their now is the until less
// the seconds). They compute it even where the add changes nothing (an address listed already
// keeps its expiry). Zero when the answer says no time.
func MonNowOfAdd(status string) time.Time {
	m := addAnswerRE.FindStringSubmatch(status)
	if m == nil {
		return time.Time{}
	}
	until, err := time.Parse("2006-01-02T15:04:05.999999-0700", m[1])
	if err != nil {
		return time.Time{}
	}
	secs, err := strconv.ParseFloat(m[2], 64)
	if err != nil {
		return time.Time{}
	}
	return until.Add(-time.Duration(secs * float64(time.Second)))
}

// BlocklistAdd is Blocklist, with the monitors' clock as their answer names it (MonNowOfAdd;
// zero when it names none).
func BlocklistAdd(conn *rados.Conn, addr string, expire time.Duration) (time.Time, time.Time, error) {
	if addr == "" || strings.ContainsAny(addr, "\"\\ \t\n") {
		return time.Time{}, time.Time{}, fmt.Errorf("blocklist %q: not a client address", addr)
	}
	if expire < time.Second {
		return time.Time{}, time.Time{}, fmt.Errorf("blocklist %s: expiry %s is too short", addr, expire)
	}
	// The monitor wants expire as a JSON float: "600" is refused with EINVAL, "600.0" accepted.
	cmd := fmt.Sprintf(`{"prefix":"osd blocklist","blocklistop":"add","addr":%q,"expire":%.1f}`,
		addr, expire.Seconds())
	until := time.Now().Add(expire)
	_, status, err := conn.MonCommand([]byte(cmd))
	if err != nil {
		return time.Time{}, time.Time{}, Classify(fmt.Errorf("blocklist %s: %w (%s)", addr, err, strings.TrimSpace(status)),
			"blocklist "+addr, BlocklistCap)
	}
	return until, MonNowOfAdd(status), nil
}

// BlocklistRange adds a range of ips (a CIDR) to the cluster's blocklist for expire (`osd
// blocklist range add`, Ceph 16.2.8 and later), and returns this node's estimate of its end.
func BlocklistRange(conn *rados.Conn, cidr string, expire time.Duration) (time.Time, error) {
	if cidr == "" || strings.ContainsAny(cidr, "\"\\ \t\n") || !strings.Contains(cidr, "/") {
		return time.Time{}, fmt.Errorf("blocklist range %q: not a CIDR", cidr)
	}
	if expire < time.Second {
		return time.Time{}, fmt.Errorf("blocklist range %s: expiry %s is too short", cidr, expire)
	}
	cmd := fmt.Sprintf(`{"prefix":"osd blocklist","range":"range","blocklistop":"add","addr":%q,"expire":%.1f}`, cidr, expire.Seconds())
	until := time.Now().Add(expire)
	if _, status, err := conn.MonCommand([]byte(cmd)); err != nil {
		return time.Time{}, Classify(fmt.Errorf("blocklist range %s: %w (%s)", cidr, err, strings.TrimSpace(status)),
			"blocklist range "+cidr, BlocklistCap)
	}
	return until, nil
}

// UnblocklistRange removes a range entry from the cluster's blocklist (`osd blocklist range rm`).
func UnblocklistRange(conn *rados.Conn, cidr string) error {
	if cidr == "" || strings.ContainsAny(cidr, "\"\\ \t\n") || !strings.Contains(cidr, "/") {
		return fmt.Errorf("unblocklist range %q: not a CIDR", cidr)
	}
	cmd := fmt.Sprintf(`{"prefix":"osd blocklist","range":"range","blocklistop":"rm","addr":%q}`, cidr)
	if _, status, err := conn.MonCommand([]byte(cmd)); err != nil {
		return Classify(fmt.Errorf("unblocklist range %s: %w (%s)", cidr, err, strings.TrimSpace(status)),
			"unblocklist range "+cidr, BlocklistCap)
	}
	return nil
}

// Unblocklist removes addr from the cluster's blocklist. Removing an address that is not
// listed succeeds (the monitor says so and changes nothing).
func Unblocklist(conn *rados.Conn, addr string) error {
	if addr == "" || strings.ContainsAny(addr, "\"\\ \t\n") {
		return fmt.Errorf("unblocklist %q: not a client address", addr)
	}
	cmd := fmt.Sprintf(`{"prefix":"osd blocklist","blocklistop":"rm","addr":%q}`, addr)
	if _, status, err := conn.MonCommand([]byte(cmd)); err != nil {
		return Classify(fmt.Errorf("unblocklist %s: %w (%s)", addr, err, strings.TrimSpace(status)),
			"unblocklist "+addr, BlocklistCap)
	}
	return nil
}

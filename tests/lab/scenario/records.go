//go:build lab

package scenario

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/claim/record"
)

// poolArgs splits "pool" or "pool/namespace" (default rbd) into rados's arguments.
func poolArgs(pool []string) []string {
	p := "rbd"
	if len(pool) > 0 && pool[0] != "" {
		p = pool[0]
	}
	if name, ns, ok := strings.Cut(p, "/"); ok {
		return []string{"-p", name, "-N", ns}
	}
	return []string{"-p", p}
}

// object reads a RADOS object of the agents' (nil, nil when there is none).
func (l *Lab) object(name string, pool []string) ([]byte, error) {
	args := append([]string{"rados", "-c", l.conf()}, poolArgs(pool)...)
	out, err := l.Stdout(append(args, "get", name, "-")...)
	if err != nil {
		if strings.Contains(err.Error(), "No such file or directory") {
			return nil, nil
		}
		return nil, err
	}
	return out, nil
}

// Claim is image's claim record as the agent wrote it, in pool (default rbd; "pool/ns" for a
// namespace); nil when there is none.
func (l *Lab) Claim(image string, pool ...string) (*record.Record, error) {
	b, err := l.object("rbd-owner.claim."+image, pool)
	if err != nil || b == nil {
		return nil, err
	}
	var r record.Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("claim of %s: %w", image, err)
	}
	return &r, nil
}

// Holders is the claim's holders as "node@epoch,…" ("" for none or no claim).
func (l *Lab) Holders(image string, pool ...string) (string, error) {
	r, err := l.Claim(image, pool...)
	if err != nil || r == nil {
		return "", err
	}
	var hs []string
	for _, h := range r.Holders {
		hs = append(hs, fmt.Sprintf("%s@%d", h.NodeID, h.Epoch))
	}
	return strings.Join(hs, ","), nil
}

// HoldersAre checks that the claim's holders are exactly want ("" for none).
func (l *Lab) HoldersAre(want, image string, pool ...string) error {
	got, err := l.Holders(image, pool...)
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("holders: '%s', want '%s'", got, want)
	}
	return nil
}

// HeldBy checks that node is the one holder, at any epoch.
func (l *Lab) HeldBy(node, image string, pool ...string) error {
	got, err := l.Holders(image, pool...)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(got, node+"@") || strings.Contains(got, ",") {
		return fmt.Errorf("holders: '%s', want %s", got, node)
	}
	return nil
}

// Epoch is the claim's epoch (0 without a claim).
func (l *Lab) Epoch(image string, pool ...string) (uint64, error) {
	r, err := l.Claim(image, pool...)
	if err != nil || r == nil {
		return 0, err
	}
	return r.Epoch, nil
}

// Heartbeat is node's liveness record in pool (nil when there is none).
func (l *Lab) Heartbeat(node string, pool ...string) (*claim.Heartbeat, error) {
	b, err := l.object("rbd-owner.node."+node, pool)
	if err != nil || b == nil {
		return nil, err
	}
	var h claim.Heartbeat
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("heartbeat of %s: %w", node, err)
	}
	return &h, nil
}

// HeartbeatMark is node's heartbeat as "incarnation/seq" ("none" when there is none, or it
// cannot be read): it changes at every renewal.
func (l *Lab) HeartbeatMark(node string, pool ...string) string {
	h, err := l.Heartbeat(node, pool...)
	if err != nil || h == nil {
		return "none"
	}
	return fmt.Sprintf("%s/%d", h.Incarnation, h.Seq)
}

// HeartbeatMoved checks that node's heartbeat is no longer mark.
func (l *Lab) HeartbeatMoved(node, mark string, pool ...string) error {
	h, err := l.Heartbeat(node, pool...)
	switch {
	case err != nil:
		return err
	case h == nil:
		return fmt.Errorf("%s has no heartbeat", node)
	}
	if now := fmt.Sprintf("%s/%d", h.Incarnation, h.Seq); now == mark {
		return fmt.Errorf("%s's heartbeat is still %s", node, mark)
	}
	return nil
}

// WaitLeaseUnrenewed polls node's heartbeat until it has stayed the same for a whole lease (plus
// 2 s), measured on this host's clock from the first look (the rule the agents follow on their
// own clocks); bounded by four leases.
func (l *Lab) WaitLeaseUnrenewed(node string, pool ...string) error {
	last, seen := l.HeartbeatMark(node, pool...), time.Now()
	end := seen.Add(4 * l.Lease)
	for time.Since(seen) < l.Lease+2*time.Second {
		if time.Now().After(end) {
			return fmt.Errorf("%s's heartbeat kept moving for four leases (last %s)", node, last)
		}
		if cur := l.HeartbeatMark(node, pool...); cur != last {
			last, seen = cur, time.Now()
		}
		time.Sleep(500 * time.Millisecond)
	}
	return nil
}

// auditFields are the journal fields Audit reads.
const auditFields = "RBD_OWNER_EVENT,RBD_IMAGE,RBD_CLAIM_EPOCH,RBD_OWNER_NODE,REQUESTER_UID,PRIORITY,MESSAGE"

// AuditLine is one audit entry of an agent's journal, the fields the scenarios look at.
type AuditLine struct {
	Event, Image, Epoch, Owner string
	Priority                   int
	UID                        string
	Message                    string
}

// String is the entry as one line: EVENT IMAGE EPOCH OWNER PRIORITY UID ("-" for a field not
// set), the form the scenarios' patterns match.
func (a AuditLine) String() string {
	return strings.Join([]string{a.Event, a.Image, a.Epoch, a.Owner, strconv.Itoa(a.Priority), a.UID}, " ")
}

// Audit is node's audit trail: the agent's journal entries with an RBD_OWNER_EVENT, oldest
// first; journalArgs narrow it (journalctl's matches and options).
func (l *Lab) Audit(node string, journalArgs ...string) ([]AuditLine, error) {
	// (only the audit entries' fields, and only entries that have an event, cross the command
	// channel: the whole journal is polled often and grows over the run)
	out, rc := l.On(node, "journalctl -u rbd-owner -o json --no-pager --output-fields="+auditFields+" "+
		strings.Join(journalArgs, " ")+" | grep -F '\"RBD_OWNER_EVENT\"'; exit ${PIPESTATUS[0]}")
	if rc != 0 {
		return nil, fmt.Errorf("journalctl on %s: exit %d: %s", node, rc, lastLine(out))
	}
	var lines []AuditLine
	for _, ln := range strings.Split(out, "\n") {
		if !strings.HasPrefix(ln, "{") {
			continue
		}
		var f map[string]any
		if err := json.Unmarshal([]byte(ln), &f); err != nil {
			return nil, fmt.Errorf("journal of %s: %w", node, err)
		}
		ev := field(f, "RBD_OWNER_EVENT")
		if ev == "" {
			continue
		}
		a := AuditLine{Event: ev, Image: orDash(field(f, "RBD_IMAGE")), Epoch: orDash(field(f, "RBD_CLAIM_EPOCH")),
			Owner: orDash(field(f, "RBD_OWNER_NODE")), UID: orDash(field(f, "REQUESTER_UID")), Message: field(f, "MESSAGE")}
		var perr error
		if a.Priority, perr = strconv.Atoi(field(f, "PRIORITY")); perr != nil {
			a.Priority = -1 // matches no priority: not an error entry, not a warning
		}
		lines = append(lines, a)
	}
	return lines, nil
}

// field is a journal field as text (journalctl writes a field that is not valid UTF-8 as a list
// of bytes).
func field(f map[string]any, k string) string {
	switch v := f[k].(type) {
	case string:
		return v
	case []any:
		b := make([]byte, 0, len(v))
		for _, x := range v {
			if n, ok := x.(float64); ok {
				b = append(b, byte(n))
			}
		}
		return string(b)
	}
	return ""
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Blocklist is the cluster's blocklist, read with the agent's own parser.
func (l *Lab) Blocklist() ([]record.BlockEntry, error) {
	out, err := l.Stdout("ceph", "-c", l.conf(), "--connect-timeout", "15", "osd", "blocklist", "ls", "-f", "json")
	if err != nil {
		return nil, err
	}
	return record.ParseBlocklist(out)
}

// entryOf is addr's own entry.
func entryOf(entries []record.BlockEntry, addr string) (record.BlockEntry, bool) {
	for _, e := range entries {
		if !e.Range.IsValid() && e.Addr == record.BareAddr(addr) {
			return e, true
		}
	}
	return record.BlockEntry{}, false
}

// RBDOSDsCurrent checks that every OSD of pool rbd has the cluster's newest osdmap. A blocklist entry is in
// force at an OSD only once it has the map the entry was added in; until then a fenced client's
// write may still be acknowledged.
func (l *Lab) RBDOSDsCurrent() error {
	var dump struct {
		Epoch flexInt `json:"epoch"`
	}
	if err := l.CephJSON(&dump, "osd", "dump"); err != nil {
		return err
	}
	for _, i := range l.RBDOSDs {
		out, err := l.Stdout("timeout", "10", "ceph", "--admin-daemon", filepath.Join(l.CephDir, "run", fmt.Sprintf("ceph-osd.%d.asok", i)), "status")
		if err != nil {
			return err
		}
		var st struct {
			NewestMap flexInt `json:"newest_map"`
		}
		if err := json.Unmarshal(out, &st); err != nil {
			return fmt.Errorf("osd.%d status: %w", i, err)
		}
		if st.NewestMap < dump.Epoch {
			return fmt.Errorf("osd.%d has osdmap %d, the cluster %d", i, st.NewestMap, dump.Epoch)
		}
	}
	return nil
}

// flexInt is a number Ceph prints as a JSON number or as a string (an OSD's admin socket status
// gives newest_map as a string on Ceph 20.2, as a number on 16.2).
type flexInt int

func (n *flexInt) UnmarshalJSON(b []byte) error {
	v, err := strconv.Atoi(strings.Trim(string(b), `"`))
	if err != nil {
		return fmt.Errorf("%s is not a number", b)
	}
	*n = flexInt(v)
	return nil
}

// Blocklisted checks that addr has its own entry on the cluster's blocklist, in force at pool rbd's OSDs.
func (l *Lab) Blocklisted(addr string) error {
	if addr == "" {
		return errors.New("blocklisted: no address given")
	}
	bl, err := l.Blocklist()
	if err != nil {
		return err
	}
	if _, ok := entryOf(bl, addr); !ok {
		return fmt.Errorf("%s is not on the blocklist", addr)
	}
	return l.RBDOSDsCurrent()
}

// NotBlocklisted checks that the cluster's blocklist (which answered) has no entry of addr's own.
func (l *Lab) NotBlocklisted(addr string) error {
	if addr == "" {
		return errors.New("not blocklisted: no address given")
	}
	bl, err := l.Blocklist()
	if err != nil {
		return err
	}
	if e, ok := entryOf(bl, addr); ok {
		return fmt.Errorf("%s is listed until %s", addr, e.Until)
	}
	return nil
}

// ListedUntil is how long addr's own entry has left (false when it is not listed).
func (l *Lab) ListedUntil(addr string) (time.Duration, bool, error) {
	bl, err := l.Blocklist()
	if err != nil {
		return 0, false, err
	}
	e, ok := entryOf(bl, addr)
	if !ok {
		return 0, false, nil
	}
	return time.Until(e.Until), true, nil
}

// ListedForAtLeast checks that addr's own entry has at least d of life left.
func (l *Lab) ListedForAtLeast(addr string, d time.Duration) error {
	left, ok, err := l.ListedUntil(addr)
	switch {
	case err != nil:
		return err
	case !ok:
		return fmt.Errorf("%s not listed", addr)
	case left < d:
		return fmt.Errorf("%s: %ds left, want %ds", addr, int(left.Seconds()), int(d.Seconds()))
	}
	return nil
}

// FencesInForce checks that addr is blocklisted with at least 20 s of its entry's life left, and in force at
// pool rbd's OSDs. Asked before a fenced client writes a while after its fence: the lab's
// fence_expiry is a minute, and Ceph 16.2 and 18.2 lengthen no entry still listed, so a renewal
// adds an entry again only once it has expired; an entry a minute old may be gone for up to a
// renewal period (15 s), or about to go. One address per call: two entries' renewal cycles need
// not overlap.
func (l *Lab) FencesInForce(addr string) error {
	if err := l.ListedForAtLeast(addr, 20*time.Second); err != nil {
		return err
	}
	return l.RBDOSDsCurrent()
}

// FenceWatch looks at the cluster's blocklist about once a second in the background, one line
// per look into a file: "UNIX ok", "UNIX missing" (the address not cut off) or "UNIX unread".
type FenceWatch struct {
	path string
	stop chan struct{}
	done chan struct{}
}

// WatchFence starts a FenceWatch of addr writing to path.
func (l *Lab) WatchFence(addr, path string) (*FenceWatch, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	w := &FenceWatch{path: path, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer f.Close()
		for {
			state := "unread"
			if bl, err := l.Blocklist(); err == nil {
				state = "missing"
				if _, ok := record.Covering(bl, addr); ok {
					state = "ok"
				}
			}
			fmt.Fprintf(f, "%d %s\n", time.Now().Unix(), state)
			select {
			case <-w.stop:
				return
			case <-time.After(time.Second):
			}
		}
	}()
	return w, nil
}

// Stop ends the watch and waits for its last look (idempotent).
func (w *FenceWatch) Stop() {
	if w == nil {
		return
	}
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// Clean checks that the watch made at least `least` looks and none found the address missing.
func (w *FenceWatch) Clean(least int) (string, error) {
	b, err := os.ReadFile(w.path)
	if err != nil {
		return "", err
	}
	looks, missing := 0, 0
	for _, ln := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasSuffix(ln, " ok"):
			looks++
		case strings.HasSuffix(ln, " missing"):
			looks++
			missing++
		}
	}
	summary := fmt.Sprintf("%d looks, %d missing", looks, missing)
	if looks < least || missing > 0 {
		return summary, fmt.Errorf("%s (want at least %d looks, none missing)", summary, least)
	}
	return summary, nil
}

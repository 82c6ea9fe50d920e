package krbd

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/rbd-owner/rbd-owner/agent/monaddr"
)

// ClusterDefaults is the cluster's rbd_default_map_options for one image, as Ceph's rbd device
// map reads it: the image's own setting (`rbd config image set`), else its pool's (`rbd config
// pool set`), else the client's configuration (the monitors' config store, as Rook sets it). The
// most specific level's whole string counts; levels are never merged.
type ClusterDefaults struct {
	Options string // "ms_mode=secure,queue_depth=128"; "" when no level sets it
	Level   string // LevelImage, LevelPool or LevelConfig
}

// The levels rbd_default_map_options is read from, most specific first.
const (
	LevelImage  = "image"
	LevelPool   = "pool"
	LevelConfig = "config"
)

// OptionSource says where one kernel option of a mapping came from (Compose).
type OptionSource struct {
	Option string `json:"option"`
	From   string `json:"from"`
}

// The sources of a mapping's options, most authoritative first; the cluster's are
// FromCluster + " (" + level + ")".
const (
	FromCaller  = "caller"
	FromAgent   = "agent map_options"
	FromCluster = "cluster rbd_default_map_options"
	FromDefault = "agent default: the monitors offer msgr2"
)

// Layers is what a mapping's kernel options are made of.
type Layers struct {
	Caller  []string        // what the request asked (Requested.Extra)
	Agent   []string        // map_options, the config's then the cluster's
	Cluster ClusterDefaults // the cluster's rbd_default_map_options
	// Monitors are the cluster's monitors and KernelMsgr2 whether this kernel speaks msgr2: with
	// both, and no layer naming an ms_mode, the mapping gets ms_mode=prefer-crc (what Ceph's own
	// rbd device map does since Tentacle).
	Monitors    []string
	KernelMsgr2 bool
}

// negatable are the kernel options that have a "no" form: crc and nocrc are one option.
var negatable = map[string]bool{"crc": true, "tcp_nodelay": true, "cephx_require_signatures": true, "cephx_sign_messages": true}

// family is the option an "opt" or "opt=value" sets, its "no" form folded in.
func family(opt string) string {
	name, _, _ := strings.Cut(opt, "=")
	if base, ok := strings.CutPrefix(name, "no"); ok && negatable[base] {
		return base
	}
	return name
}

// ownedByAgent are options a caller may not give (refusedOptions) or that the agent decides
// itself; in the cluster's defaults they are left out, as the agent's rules say.
var ownedByAgent = map[string]string{
	"udev": "whether a map waits for udevd is the caller's", "noudev": "whether a map waits for udevd is the caller's",
}

// Compose makes a mapping's kernel options: the caller's and the agent's map_options (one both
// give must agree), then the cluster's rbd_default_map_options for each option neither gives
// (as Ceph's rbd lets its --options override them one by one), then the msgr2 default. It says
// where each option came from; a cluster option the agent sets itself (share, exclusive, ro...)
// is listed as not applied. Refused: an option the kernel does not know, in any layer; and a
// mapping in clear text where the cluster's defaults ask for ms_mode=secure.
func Compose(l Layers) ([]string, []OptionSource, error) {
	out, err := mergeExtra(l.Agent, l.Caller)
	if err != nil {
		return nil, nil, err
	}
	src := make([]OptionSource, 0, len(out))
	for _, o := range out {
		from := FromCaller
		if slices.Contains(l.Agent, o) {
			from = FromAgent
		}
		src = append(src, OptionSource{Option: o, From: from})
	}
	clusterFrom := FromCluster + " (" + l.Cluster.Level + ")"
	secure := false
	for _, o := range splitOptions(l.Cluster.Options) {
		if why, ok := agentSets(o); ok {
			src = append(src, OptionSource{Option: o, From: clusterFrom + ", not applied: " + why})
			continue
		}
		if err := ValidateExtraOption(o); err != nil {
			return nil, nil, fmt.Errorf("%w, in the cluster's rbd_default_map_options (%s level): fix the setting", err, l.Cluster.Level)
		}
		secure = secure || o == "ms_mode=secure"
		if slices.ContainsFunc(out, func(c string) bool { return family(c) == family(o) }) {
			continue
		}
		out = append(out, o)
		src = append(src, OptionSource{Option: o, From: clusterFrom})
	}
	i := slices.IndexFunc(out, func(c string) bool { return family(c) == "ms_mode" })
	switch {
	case secure && i >= 0 && out[i] != "ms_mode=secure":
		// the other mode is the caller's or map_options' (the cluster's own gave way to it)
		from := src[slices.IndexFunc(src, func(o OptionSource) bool { return o.Option == out[i] })].From
		return nil, nil, fmt.Errorf("%w: option \"ms_mode\": the cluster's rbd_default_map_options (%s level) ask for ms_mode=secure and the %s's %s could map in clear text; drop it, or make it ms_mode=secure",
			ErrInvalid, l.Cluster.Level, from, out[i])
	case i < 0 && l.KernelMsgr2 && offersMsgr2(l.Monitors):
		out = append(out, "ms_mode=prefer-crc")
		src = append(src, OptionSource{Option: "ms_mode=prefer-crc", From: FromDefault})
	}
	return out, src, nil
}

// DescribeSources is a mapping's options for its audit line: "; options ms_mode=secure (cluster
// rbd_default_map_options (config)), queue_depth=128 (caller)", or "" without any.
func DescribeSources(src []OptionSource) string {
	if len(src) == 0 {
		return ""
	}
	parts := make([]string, len(src))
	for i, o := range src {
		parts[i] = o.Option + " (" + o.From + ")"
	}
	return "; options " + strings.Join(parts, ", ")
}

// agentSets says why a cluster default is not the cluster's to set on an rbd-owner mapping.
func agentSets(o string) (string, bool) {
	name, _, _ := strings.Cut(o, "=")
	if why, ok := refusedOptions[name]; ok {
		return why, true
	}
	why, ok := ownedByAgent[name]
	return why, ok
}

// splitOptions splits a map options string as Ceph's rbd does: at commas and spaces.
func splitOptions(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' })
}

// offersMsgr2 says whether the monitors list an msgr2 address: typed v2, or untyped on the
// msgr2 port.
func offersMsgr2(mons []string) bool {
	addrs, err := monaddr.ParseAll(mons)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(addrs, func(a monaddr.Addr) bool {
		return a.Type == monaddr.V2 || (a.Type == "" && a.Port == msgr2Port)
	})
}

// msgr2Port is the monitors' IANA port for msgr2.
const msgr2Port = 3300

// KernelSpeaksMsgr2 says whether a kernel of this release (uname -r) has libceph's msgr2
// (ms_mode, Linux 5.11).
func KernelSpeaksMsgr2(release string) bool {
	var major, minor int
	if _, err := fmt.Sscanf(release, "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major > 5 || (major == 5 && minor >= 11)
}

// KernelRelease is this node's kernel release (uname -r), "" when it cannot be read.
func KernelRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

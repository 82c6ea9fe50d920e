package config

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/krbd"
)

// Key describes one key of the config file: agent/internal/confdoc writes the manual page
// rbd-owner.yaml(5) and the key tables of docs/configuration.md and the README from Keys. The
// defaults and bounds come from the constants that fill and validate use, and the tests hold
// the list to the yaml tags of Config and Cluster and the defaults to what Parse fills in.
// Text is plain, one paragraph, with `code` in backquotes.
type Key struct {
	// Name is the key as written in the file, "lease_duration"; a key of each entry of a list
	// has the list's name and "[]." before it, "clusters[].id".
	Name string
	// Type is the kind of value: "string", "path", "host:port", "duration", "boolean",
	// "list of strings" or "list of mappings".
	Type string
	// Default is the value the key takes when it is left out, as it would be written in the
	// file ("60s", "[]"); "" when it has none, or one that depends (DefaultNote says).
	Default string
	// DefaultNote says what Default does not: "a third of `lease_duration`", "required".
	DefaultNote string
	// Summary is a few words, for the README's short table.
	Summary string
	// Doc is what the key means.
	Doc string
	// Values are the words the key takes, when it takes one of a few.
	Values []Value
	// Rule is what Parse accepts beyond the type ("at least `1s`"); "" for any value of it.
	Rule string
	// See is a page of docs/ that says more, with an anchor if need be ("unmanaged.md").
	See string
}

// Value is one of the words a key takes, and what it means.
type Value struct {
	Name string
	Doc  string
}

// ClustersPrefix begins the names of the keys of each entry of clusters.
const ClustersPrefix = "clusters[]."

// Keys describes every key of the config file, in the order of Config's fields, each cluster's
// keys after clusters.
func Keys() []Key {
	return slices.Concat(
		[]Key{nodeKey(), socketKey(), csiSocketKey(), stateDirKey(), clustersKey()},
		clusterKeys(),
		leaseKeys(),
		policyKeys(),
		mapKeys(),
		sweepKeys(),
		metricsKeys(),
	)
}

func nodeKey() Key {
	return Key{Name: "node_id", Type: "string", DefaultNote: "the contents of `" + DefaultMachineID + "`",
		Summary: "this node's identity in claims",
		Doc: "This node's identity in claim records: unique among the nodes that map the same images, and " +
			"stable across reboots.",
		Rule: fmt.Sprintf("one word of at most %d characters, without `/`", maxNodeIDLength)}
}

func socketKey() Key {
	return Key{Name: "socket", Type: "path", Default: DefaultSocket, Summary: "the main API socket (keep `rbd-owner.socket` in line)",
		Doc: "The main API socket: root and group `rbd-owner-admin` get the admin role, group `rbd-owner` the " +
			"CSI role, anyone else is refused. Under systemd `rbd-owner.socket` creates it: keep the two in line.",
		Rule: "an absolute path", See: "api.md"}
}

func csiSocketKey() Key {
	return Key{Name: "csi_socket", Type: "path", Default: DefaultCSISocket,
		Summary: "the CSI socket (CSI role only); `none` turns it off",
		Doc: "The CSI socket: the CSI role only (map, unmap, release this node's own claims, read), whoever " +
			"calls, in a directory of its own for a CSI plugin's pod to mount. Also created by `rbd-owner.socket`.",
		Rule: "an absolute path in another directory than `socket`'s, or `none` (no CSI socket)", See: "kubernetes.md"}
}

func stateDirKey() Key {
	return Key{Name: "state_dir", Type: "path", Default: DefaultStateDir, Summary: "local persisted state",
		Doc: "The directory of the agent's local state (which device belongs to which claim) and of the " +
			"goroutine dumps of a watchdog abort. Root only.",
		Rule: "an absolute path"}
}

func clustersKey() Key {
	var sub []string
	for _, k := range clusterKeys() {
		sub = append(sub, "`"+strings.TrimPrefix(k.Name, ClustersPrefix)+"`")
	}
	list := strings.Join(sub[:len(sub)-1], ", ") + " and " + sub[len(sub)-1]
	return Key{Name: "clusters", Type: "list of mappings", DefaultNote: "required (`[]` for none yet)",
		Summary: "one entry per cluster: " + list,
		Doc: "The Ceph clusters this node maps images from, one mapping each with the keys " + list + ". " +
			"`--cluster ID` on the command line (and `cluster` in the API) names one of them; it may be left " +
			"out when there is exactly one. Until one is listed there is nothing the agent can map.",
		Rule: "each entry's `id` unique"}
}

func clusterKeys() []Key {
	return []Key{
		{Name: ClustersPrefix + "id", Type: "string", DefaultNote: "required",
			Doc:  "A name of your choice for the cluster (the CSI plugin's clusterID fits well).",
			Rule: "one word without a `/`, a comma or an `=`"},
		{Name: ClustersPrefix + "monitors", Type: "list of strings", DefaultNote: "required",
			Doc: "The cluster's monitor addresses, `host:port` (`[10.0.0.1:6789, 10.0.0.2:6789]`), or as Ceph " +
				"writes them in `mon_host` (`v2:10.0.0.1:3300`, `[v2:10.0.0.1:3300/0,v1:10.0.0.1:6789/0]`). On a " +
				"msgr2-only cluster list the v2 addresses (port 3300): the kernel is given the v2 addresses under an " +
				"`ms_mode`, the v1 ones without. Where the monitors offer v2 and the node's kernel speaks it (Linux " +
				"5.11 on), a mapping that no option gives an `ms_mode` gets `ms_mode=prefer-crc`, as Ceph's own `rbd " +
				"device map` does since Tentacle. A request that names monitors instead of a cluster (as the CSI plugin's " +
				"`rbd -m` does) is matched to the cluster by them.",
			Rule: "at least one; each an IP address or host name, with an optional port (IPv6 in brackets), typed (`v1:`, `v2:`) or not, or an address vector; a list in one string is split at commas, semicolons and spaces"},
		{Name: ClustersPrefix + "user", Type: "string", DefaultNote: "required",
			Doc: "The agent's cephx id on the cluster, without the `client.` prefix (`rbd-owner`). It needs " +
				"`mon 'profile rbd, allow command \"osd blocklist\"' osd 'profile rbd' mgr 'profile rbd'`.",
			Rule: "without the `client.` prefix, spaces, commas or `=`"},
		{Name: ClustersPrefix + "keyring", Type: "path", DefaultNote: "required",
			Doc: "The keyring file that holds the user's key " +
				"(`/etc/ceph/ceph.client.rbd-owner.keyring`); the config holds no secret.",
			Rule: "the absolute path of the file (not the key)"},
		{Name: ClustersPrefix + "map_options", Type: "list of strings", Default: "[]",
			Doc:  "krbd map options for this cluster's mappings only, added to `map_options`.",
			Rule: optionsRule()},
	}
}

func leaseKeys() []Key {
	var c Config
	c.LeaseDuration = DefaultLeaseDuration
	c.RenewInterval = Duration(DefaultRenew(DefaultLeaseDuration.D()))
	c.OSDFailover = DefaultOSDFailover
	return []Key{
		{Name: "lease_duration", Type: "duration", Default: FormatDuration(DefaultLeaseDuration.D()),
			Summary: "how long another node watches this node's liveness record unchanged before it may take an image over",
			Doc: "How long another node watches this node's liveness record unchanged, on its own clock, " +
				"before it may take one of this node's images over.",
			Rule: fmt.Sprintf("more than `renew_interval` + the longer of `%s` + the heartbeat's deadline (`renew_interval`, "+
				"at most `%s`) and `osd_failover` (+ `renew_interval` past `%s`), + `%s` (`%s` with the defaults)",
				FormatDuration(ClusterCallTimeout), FormatDuration(MaxHeartbeatTimeout), FormatDuration(ClusterCallTimeout),
				FormatDuration(ClusterCallTimeout), FormatDuration(c.LeaseBound()))},
		{Name: "renew_interval", Type: "duration", Default: FormatDuration(c.RenewInterval.D()),
			DefaultNote: fmt.Sprintf("`lease_duration` / %d, at most `%s`", RenewsPerLease, FormatDuration(MaxDefaultRenew)),
			Summary:     "how often held claims are renewed; at most half of `lease_duration`",
			Doc:         "How often the agent renews the claims it holds: one heartbeat per pool and namespace it holds claims in.",
			Rule:        "positive, and at most half of `lease_duration`"},
		{Name: "osd_failover", Type: "duration", Default: FormatDuration(DefaultOSDFailover.D()),
			Summary: "how long your clusters take to serve a placement group again after its OSD stops; the lease covers it",
			Doc: "How long your clusters take, at most, to serve a placement group again once the OSD serving it stops " +
				"answering: Ceph's `osd_heartbeat_grace` (20 s by default) before the monitors mark the OSD down, then the " +
				"new map and peering. A heartbeat stored on a stopped OSD waits that long, so the lease must cover it, or " +
				"another node judges this live node dead and fences it. Raise it when your clusters have a longer " +
				"`osd_heartbeat_grace` (or `mon_osd_adjust_heartbeat_grace` stretches it for laggy OSDs); give the longest of " +
				"your clusters.",
			Rule: fmt.Sprintf("from `%s` to `%s`", FormatDuration(minOSDFailover), FormatDuration(maxOSDFailover))},
	}
}

func policyKeys() []Key {
	return []Key{
		{Name: "takeover_policy", Type: "string", Default: TakeoverAfterFence,
			Summary: "when an image another node holds is taken over",
			Doc:     "What a map does when another node holds the image.",
			Values: values(takeoverPolicies, map[string]string{
				TakeoverManual: "Never take it over on its own: the map is refused with the holder's name. An admin " +
					"fences the holder (`rbd-owner fence --node NODE`, or `rbd-owner fence IMAGE`), after which a map " +
					"takes it over, or maps with `--takeover` once its lease has expired.",
				TakeoverAfterFence: "As `manual`, and take over at once a hold whose mapping the cluster's blocklist " +
					"already cuts off, whoever put it there: an admin's `rbd-owner fence --node`, ceph-csi's fencing " +
					"of a node Kubernetes declared out of service, a NetworkFence. The takeover adds its own entry first.",
				TakeoverAfterLeaseExpiry: "As `after-fence`, and take over a claim whose lease has expired, after " +
					"fencing the previous holder's mapping.",
			}),
			See: "kubernetes.md#a-node-is-dead-kubernetes-and-rbd-owner"},
		{Name: "unmanaged", Type: "string", Default: UnmanagedFenceIfClaimed,
			Summary: "what to do with a mapping made outside rbd-owner",
			Doc: "What to do with a mapping made on this node outside rbd-owner (a plain `rbd map`, a CSI plugin " +
				"without the drop-in `rbd`, a script), judged when the kernel announces it and at every reconciliation.",
			Values: values(unmanagedPolicies, map[string]string{
				UnmanagedFenceIfClaimed: "When another node holds the image, or this node holds it for another device, " +
					"blocklist the mapping's own kernel client at once, so that it cannot write; record the fence in " +
					"the claim and audit it. Only report a mapping of a free image, a read-only one, or one under an rwx claim.",
				UnmanagedAdoptOrFence: "As `fence-if-claimed`, and claim a writable mapping of a free image that has a " +
					"kernel client of its own (mapped with `-o noshare`) for this node, and manage it from then on.",
				UnmanagedReport: "Only report it (the journal, `rbd-owner status`).",
			}),
			See: "unmanaged.md"},
		{Name: "fence_expiry", Type: "duration", Default: FormatDuration(DefaultFenceExpiry.D()), DefaultNote: "ten years",
			Summary: "how long one blocklist entry lasts; at least `" + FormatDuration(minFenceExpiry) + "`",
			Doc: "How long one blocklist entry (a fence) lasts in the cluster. A fence whose mapping may still exist " +
				"is checked against the blocklist at every renew round and lengthened once less than three quarters of " +
				"it is left, but Ceph does not lengthen an entry that is added again: the agent removes and adds it " +
				"under a cover, and not while the fenced node is seen alive, so only a long one never needs it.",
			Rule: fmt.Sprintf("at least `%s` (`%s` with `%s=1` in the agent's environment, for test labs only)",
				FormatDuration(minFenceExpiry), FormatDuration(minFenceExpiryShort), ShortFencesEnv),
			See: "claim-record.md#fence-lifetimes"},
	}
}

func mapKeys() []Key {
	return []Key{
		{Name: "map_timeout", Type: "duration", Default: FormatDuration(krbd.DefaultTimeout),
			Summary: "how long one map may take",
			Doc:     "How long one map (the kernel's map and the device node ready) may take before the agent gives up and undoes it.",
			Rule:    fmt.Sprintf("at least `%s`", FormatDuration(minMapTimeout))},
		{Name: "mount_timeout", Type: "duration", Default: FormatDuration(krbd.DefaultMountTimeout),
			Summary: "the krbd option `mount_timeout`",
			Doc: "Passed to the kernel as the krbd option `mount_timeout`: how long the kernel client waits for the " +
				"cluster during map and unmap.",
			Rule: fmt.Sprintf("from `%s` to `%s`", FormatDuration(krbd.MinMountTimeout), FormatDuration(krbd.MaxMountTimeout))},
		{Name: "map_options", Type: "list of strings", Default: "[]",
			Summary: "extra krbd options for every mapping (`noshare` and the key are always set; never `exclusive`)",
			Doc: "Extra krbd map options for every mapping of every cluster, one per entry (`[ms_mode=prefer-crc]`, " +
				"`[queue_depth=256]`). The agent always adds `noshare`, so that each mapping has a client of its own " +
				"that can be fenced alone, and passes the key from the kernel keyring. The cluster's own " +
				"`rbd_default_map_options` (the image's, else the pool's, else the monitors' config store's, as " +
				"Ceph's `rbd device map` reads it) apply to every option that neither these nor the caller set; " +
				"where they ask for `ms_mode=secure`, a mapping in any other mode is refused.",
			Rule: optionsRule()},
	}
}

func sweepKeys() []Key {
	return []Key{
		{Name: "orphan_sweep", Type: "boolean", Default: "true",
			Summary: "remove the free claims of deleted images",
			Doc: "Remove the claims of deleted images: `rbd rm` of an unmapped image leaves its claim behind. A sweep " +
				"removes a claim that no node holds, that keeps no live fence and whose image is gone, with a " +
				"compare-and-delete, and audits each removal; `rbd-owner claims --remove-orphans` does the same by hand " +
				"(`--force`: also those held or keeping fences, whose image may only be renamed or in the trash)."},
		{Name: "orphan_sweep_interval", Type: "duration", Default: FormatDuration(DefaultOrphanSweepInterval.D()),
			Summary: "how often each pool is swept",
			Doc: "How often each pool is swept for orphans, by one node of the fleet or another (each looks at a " +
				"random point in the interval). The sweep that keeps fences runs at least every eighth of " +
				"`fence_expiry`, with `orphan_sweep: false` too.",
			Rule: fmt.Sprintf("at least `%s`", FormatDuration(minOrphanSweepInterval))},
		{Name: "claim_check_interval", Type: "duration", Default: FormatDuration(DefaultClaimCheckInterval.D()),
			Summary: "how long a held claim may go without being read again",
			Doc: "How long a held claim may go without being read again. A claim taken over, fenced or " +
				"force-released is read within one `renew_interval` all the same, through the notice its new " +
				"holder leaves; this slow check finds what no notice announces (a claim removed by hand), and " +
				"reads the image's watchers, reporting those no claim explains.",
			Rule: "at least `renew_interval`"},
	}
}

func metricsKeys() []Key {
	return []Key{
		{Name: "metrics_listen", Type: "host:port", Default: `""`, DefaultNote: "off",
			Summary: "a TCP address where `/metrics` is also served",
			Doc: "A TCP address where `GET /metrics` is also served, and nothing else, for a Prometheus server to " +
				"scrape (`127.0.0.1:9283`). Anyone who can reach it can read the metrics: bind it to a private " +
				"address. The metrics are always served on the sockets too.",
			Rule: "empty, or `host:port` with a port from 1 to 65535",
			See:  "metrics.md"},
		{Name: "per_image_metrics", Type: "boolean", Default: "false",
			Summary: "one metrics series per claim",
			Doc: "Add one series per claim (`rbd_owner_claim_info`, with pool, namespace, image and device labels). " +
				"On a node with thousands of volumes it multiplies the series a scrape returns.",
			See: "metrics.md"},
	}
}

// values pairs the words a key takes with their meanings, in the order of words.
func values(words []string, docs map[string]string) []Value {
	vs := make([]Value, len(words))
	for i, w := range words {
		vs[i] = Value{Name: w, Doc: docs[w]}
	}
	return vs
}

// optionsRule is what map_options and a cluster's map_options accept.
func optionsRule() string {
	names := make([]string, 0, len(reservedOptions))
	for name := range reservedOptions {
		names = append(names, "`"+name+"`")
	}
	slices.Sort(names)
	return "one option per entry, without spaces or commas; not " + strings.Join(names[:len(names)-1], ", ") +
		" or " + names[len(names)-1] + " (the agent sets them itself, or they would break it)"
}

// FormatDuration writes d as the config file is best written: in hours when it is whole
// hours, in minutes when it is whole minutes and more than one, else in seconds ("87600h",
// "5m", "60s", "30s").
func FormatDuration(d time.Duration) string {
	switch {
	case d == 0:
		return "0s"
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0 && d > time.Minute:
		return fmt.Sprintf("%dm", d/time.Minute)
	case d%time.Second == 0:
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return d.String()
}

# shellcheck shell=bash
# Guest scripts are single-quoted on purpose throughout: they expand in the guest, not here.
# shellcheck disable=SC2016
# tests/lab/lib.sh — the two-node lab's plumbing, sourced by tests/lab/lab and tests/lab/e2e.
#
#   lab_up           image (cached) → netns (203.0.113.1/24 on br0, one tap per guest, no link to
#                    the root namespace) → Ceph on the host inside it (mon v1 on 6789 for krbd)
#                    while the guests boot → each guest: .deb installed with dpkg -i from its 9p
#                    share, config written by the lab, agent started by systemd (socket activation)
#   lab_down         qemu by PID, the cluster by its PID files, the namespace; idempotent; used by
#                    the EXIT/INT/TERM trap of every caller (unless KEEP=1)
#   on NODE CMD...   run CMD (a bash script text) as root in the guest, print its output, return
#                    its exit status (the command channel: tests/lab/cmdloop.sh over the 9p share)
#   hmp NODE CMD     a qemu monitor command (stop, cont, info status)
#   ceph / rbd / rados   the admin CLIs inside the lab namespace
#   step NAME / step_done / step_end RESULT   progress lines with wall times, and the summary table
#
# State of a running lab: $LAB_DIR/lab.env (NS, PIDs, …); $LAB_DIR/logs/ has consoles, ceph logs,
# timeline.txt, ceph-faults.txt (the Ceph daemons the lab stopped) and, after lab_down,
# ceph-cluster.log. The newest lab's directory is recorded in $CACHE/current (for `lab sh`, `lab down`).
# Needs root, qemu-system-x86, debootstrap, Ceph on the host (tests/deps lab), python3.
#
# Which releases (defaults: today's one combination):
#   LAB_GUEST=bookworm|trixie|forky  the guests' Debian: bookworm = kernel 6.1 + Ceph 16.2 Pacific
#                               client libraries, trixie = kernel 6.12 + Ceph 18.2 Reef, forky
#                               (testing) = kernel 7.2 + Ceph 20.2 Tentacle; all install the same
#                               .deb (built on the host). Images are cached per release side by
#                               side ($CACHE/image-<release>, tests/vm/build-image).
#   LAB_CLUSTER=pacific|reef|tentacle  the cluster's Ceph: pacific = the host's own packages
#                               (Debian 12), reef = Debian trixie's, tentacle = Debian forky's
#                               ceph-mon/ceph-osd/ceph-common in a cached chroot
#                               ($CACHE/root-<release>, tests/ceph/build-root). Its daemons and
#                               the lab's admin CLIs (ceph, rbd, rados below) then run as
#                               `ip netns exec NS chroot ROOT …`; /proc and the lab's
#                               directory are mounted into the root while the lab runs (at the same
#                               paths, so tests/ceph/up and tests/ceph/down work unchanged) and
#                               unmounted by lab_down.
#   LAB_TOPOLOGY=small|prod     the cluster's shape. small (the default): one monitor (msgr1 on
#                               6789 for the kernel, msgr2 on 3300), one memstore OSD, size-1
#                               pools. prod, as Rook and cephadm make them: three monitors, each
#                               on an address of its own (203.0.113.1-3, port 3300), msgr2 only
#                               (ms_bind_msgr1 = false) and every connection ms_mode secure; pool
#                               rbd on two OSDs (size 2, min_size 1, each OSD a CRUSH host of its
#                               own); the slow pool (LAB_SLOW_POOL) on two other OSDs; Ceph's own
#                               paxos_propose_interval and PG read lease. The agents list the three
#                               v2 monitors and map with ms_mode=secure; the guests' rbd CLI too.

LAB_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${RBD_OWNER_LAB_CACHE:-$HOME/.cache/rbd-owner/lab}
NODES=(node-a node-b)
declare -A NODE_IP=([node-a]=203.0.113.11 [node-b]=203.0.113.12)
declare -A NODE_MAC=([node-a]=52:54:00:c0:71:11 [node-b]=52:54:00:c0:71:12)
# the agents' lease and renew interval: the config refuses a lease that does not exceed
# renew_interval + min(renew_interval, 10s) + 20s (README, Configure: 30s for 5s)
# (the prod topology: 50s, above 5s + the OSDs' failover (30s by default) + 10s, README's bound)
LEASE=${LEASE:-$([ "${LAB_TOPOLOGY:-small}" = prod ] && echo 50s || echo 35s)}
RENEW=${RENEW:-5s}
# the agents' fence_expiry: a minute, below the packages' floor of an hour, allowed by the
# agent only under RBD_OWNER_TEST_SHORT_FENCES=1, which the guests set in a drop-in of
# rbd-owner.service (tests/lab/guest.sh): so that a fence outlives its blocklist entry's life
# within a lab run, and is kept only by renewals
FENCE_EXPIRY=${FENCE_EXPIRY:-1m}
# LAB_FLAVOR=k8s: the guests' image has containerd, runc and the CNI plugins (tests/vm/build-image
# FLAVOR=k8s), for the Kubernetes lab (tests/k8s), which also gives them more memory
LAB_FLAVOR=${LAB_FLAVOR:-}
GUEST_MEM=${GUEST_MEM:-$([ "$LAB_FLAVOR" = k8s ] && echo 2048 || echo 512)}
BOOT_TIMEOUT=${BOOT_TIMEOUT:-300}
CMD_TIMEOUT=${CMD_TIMEOUT:-120}
LAB_GUEST=${LAB_GUEST:-bookworm}
LAB_CLUSTER=${LAB_CLUSTER:-pacific}
# LAB_SLOW_POOL=1: a second OSD (memstore, osd.1) in a CRUSH root of its own and a pool "slow"
# placed only there, for the chaos campaign's slow-pool fault (SIGSTOP of osd.1 stalls that pool
# alone); pool rbd stays on osd.0 only. Off by default (tests/chaos/run and tests/lab/e2e set it).
LAB_SLOW_POOL=${LAB_SLOW_POOL:-0}
LAB_TOPOLOGY=${LAB_TOPOLOGY:-small}
# SLOW_POOL: the slow pool's name once lab_up made it ("" without one); saved in lab.env
SLOW_POOL=
case $LAB_TOPOLOGY in small|prod) ;; *) echo "lab: LAB_TOPOLOGY=$LAB_TOPOLOGY: use small or prod" >&2; exit 2 ;; esac
# the topology's monitors and OSDs: MON_IPS (named a, b, c in order), the monitor addresses as
# ceph-csi passes them to rbd -m (MONS) and the agents' config lists them (MON_CONF), the guests' mon_host,
# the kernel's map options beyond the agent's own (MAP_OPTS: prod sets them as Rook does, in the
# cluster's rbd_default_map_options, and the agents' config has no map_options), the OSDs of pool
# rbd (RBD_OSDS) and of the slow pool (SLOW_OSDS); set again by lab_load from the lab's own lab.env
lab_topology() {
if [ "$LAB_TOPOLOGY" = prod ]; then
  MON_IPS=(203.0.113.1 203.0.113.2 203.0.113.3)
  MONS=(203.0.113.1:3300 203.0.113.2:3300 203.0.113.3:3300)
  # the agents' config writes them as Ceph's mon_host does (address vectors): the kernel is
  # given their v2 addresses (ms_mode), librados the vectors, and rbd -m's plain ones match them
  MON_CONF=('"[v2:203.0.113.1:3300/0]"' '"[v2:203.0.113.2:3300/0]"' '"[v2:203.0.113.3:3300/0]"')
  MON_HOST="[v2:203.0.113.1:3300],[v2:203.0.113.2:3300],[v2:203.0.113.3:3300]"
  MAP_OPTS=ms_mode=secure
  RBD_OSDS=(0 1); SLOW_OSDS=(2 3)
else
  MON_IPS=(203.0.113.1)
  MONS=(203.0.113.1:6789)
  MON_CONF=("${MONS[@]}")
  MON_HOST="v1:203.0.113.1:6789"
  MAP_OPTS=
  RBD_OSDS=(0); SLOW_OSDS=(1)
fi
}
lab_topology
case $LAB_GUEST in bookworm|trixie|forky) ;; *) echo "lab: LAB_GUEST=$LAB_GUEST: use bookworm, trixie or forky" >&2; exit 2 ;; esac
case $LAB_CLUSTER in pacific|reef|tentacle) ;; *) echo "lab: LAB_CLUSTER=$LAB_CLUSTER: use pacific, reef or tentacle" >&2; exit 2 ;; esac
# CEPH_ROOT: the chroot the cluster runs in ("" for the host's own Ceph: LAB_CLUSTER=pacific)
CEPH_ROOT=

# ---- time and progress ----------------------------------------------------------------------
now() { date +%s.%N; }
LAB_T0=${LAB_T0:-$(now)}
elapsed() { printf '%.1f' "$(echo "$(now) - ${1:-$LAB_T0}" | bc)"; }
log() { printf '[%6.1fs] %s\n' "$(elapsed)" "$*" | tee -a "${LAB_DIR:-/tmp}/logs/timeline.txt" >&2; }
STEP_NAMES=(); STEP_SECS=(); STEP_RES=(); STEP_T=
step() { step_done; STEP_NAME=$1; STEP_T=$(now); log "── $1"; }
# step_end RESULT: close the current step with RESULT (ok, FAILED …); step_done: with ok
step_end() {
  [ -n "$STEP_T" ] || return 0
  STEP_NAMES+=("$STEP_NAME"); STEP_SECS+=("$(elapsed "$STEP_T")"); STEP_RES+=("$1"); STEP_T=
}
step_done() { step_end ok; }
summary_table() {
  local i
  printf '  %-78s %8s  %s\n' STEP SECONDS RESULT
  for i in "${!STEP_NAMES[@]}"; do
    printf '  %-78s %8s  %s\n' "${STEP_NAMES[$i]}" "${STEP_SECS[$i]}" "${STEP_RES[$i]}"
  done
  printf '  %-78s %8s\n' "total wall time" "$(elapsed)"
}
die() { log "FATAL: $*"; exit 1; }
# within SECONDS CMD [ARG...]: run CMD every 0.2 s until it succeeds (0), or 1 once SECONDS ran out
within() {
  local end; end=$(echo "$(now) + $1" | bc); shift
  until "$@" >/dev/null 2>&1; do [ "$(echo "$(now) < $end" | bc)" = 1 ] || return 1; sleep 0.2; done
}

# ---- captured values are checked before use -----------------------------------------------------
# is_pid VALUE: a process id (digits only, not 0)
is_pid() { [[ $1 =~ ^[1-9][0-9]*$ ]]; }
# is_image_dir DIR: a guest image as tests/vm/build-image leaves it (an absolute path to a
# directory holding root.ext4, a kernel and an initrd)
is_image_dir() { [[ $1 == /* ]] && [ -d "$1" ] && [ -s "$1/root.ext4" ] && [ -s "$1/vmlinuz" ] && [ -s "$1/initrd.img" ]; }
# lab_refuse_if_running WHO: exit when a lab recorded in $CACHE/current is still running
lab_refuse_if_running() {
  local cur
  cur=$(readlink "$CACHE/current" 2>/dev/null) || return 0
  [ -f "$cur/lab.env" ] || return 0
  echo "$1: a lab is already running in $cur (tests/lab/lab down)" >&2; exit 1
}

# ---- admin CLIs inside the namespace --------------------------------------------------------
NSX() { ip netns exec "$NS" "$@"; }
# tap_of NODE: the name of NODE's tap device on the lab's bridge
tap_of() { NSX ip -o link show 2>/dev/null | grep -o "tl${1#node-}[0-9]*" | head -1 | grep .; }
# cut_node NODE / heal_node NODE: NODE's link to the cluster down / up (its command channel is not
# networked: the guest still runs commands)
cut_node() { NSX ip link set dev "$(tap_of "$1")" down; }
heal_node() { NSX ip link set dev "$(tap_of "$1")" up; }
# CX CMD...: CMD inside the namespace with the cluster's own release's tools (in its chroot when
# it has one)
CX() { if [ -n "$CEPH_ROOT" ]; then NSX chroot "$CEPH_ROOT" "$@"; else NSX "$@"; fi; }
ceph() { CX ceph -c "$CEPHDIR/ceph.conf" --connect-timeout 15 "$@"; }
rbd() { CX rbd -c "$CEPHDIR/ceph.conf" "$@"; }
rados() { CX rados -c "$CEPHDIR/ceph.conf" "$@"; }
# claim_json IMAGE [POOL[/NS]]: the claim record as the agent wrote it ("" when there is none)
claim_json() {
  local pool=${2:-rbd} nsarg=()
  case $pool in */*) nsarg=(-N "${pool#*/}"); pool=${pool%%/*} ;; esac
  rados -p "$pool" "${nsarg[@]}" get "rbd-owner.claim.$1" - 2>/dev/null
}
# heartbeat_mark NODE [POOL[/NS]]: NODE's liveness record in the pool as "incarnation/seq"
# ("none" when there is none); it changes at every renewal
heartbeat_mark() {
  local pool=${2:-rbd} nsarg=() out
  case $pool in */*) nsarg=(-N "${pool#*/}"); pool=${pool%%/*} ;; esac
  out=$(rados -p "$pool" "${nsarg[@]}" get "rbd-owner.node.$1" - 2>/dev/null | jq -r '"\(.incarnation)/\(.seq)"') || out=""
  echo "${out:-none}"
}
# wait_lease_unrenewed NODE [POOL[/NS]]: poll NODE's heartbeat until it has stayed the same for
# a whole lease (plus 2 s), measured on this host's clock from the first look (the rule the
# agents follow on their own clocks); bounded by 4 leases
wait_lease_unrenewed() {
  local lease_s=${LEASE%s} last seen cur end
  last=$(heartbeat_mark "$@"); seen=$(now); end=$(echo "$seen + 4 * $lease_s" | bc)
  while [ "$(echo "$(now) - $seen < $lease_s + 2" | bc)" = 1 ]; do
    [ "$(echo "$(now) < $end" | bc)" = 1 ] || return 1
    cur=$(heartbeat_mark "$@")
    [ "$cur" = "$last" ] || { last=$cur; seen=$(now); }
    sleep 0.5
  done
}
# wait_seconds SECONDS: let SECONDS of this host's clock pass (a lease window to wait out),
# polled, never one long sleep
wait_seconds() {
  local end; end=$(echo "$(now) + $1" | bc)
  while [ "$(echo "$(now) < $end" | bc)" = 1 ]; do sleep 0.2; done
}

# ---- the command channel --------------------------------------------------------------------
share() { echo "$LAB_DIR/share-${1#node-}"; }
# on [-t SECONDS] NODE SCRIPT...: run SCRIPT in NODE as root; prints stdout+stderr, returns rc
on() {
  local t=$CMD_TIMEOUT
  [ "$1" = -t ] && { t=$2; shift 2; }
  local node=$1; shift
  local s id end
  s=$(share "$node"); id=$(date +%s%N)-$$-$RANDOM
  printf '%s\n' "$*" > "$s/cmd/.$id.tmp" && mv "$s/cmd/.$id.tmp" "$s/cmd/$id.sh"
  end=$(( $(date +%s) + t ))
  while [ ! -e "$s/out/$id.rc" ]; do
    if [ -n "${QPID[$node]:-}" ] && ! kill -0 "${QPID[$node]}" 2>/dev/null; then
      echo "lab: $node is not running (qemu ${QPID[$node]} gone)" >&2; return 125
    fi
    if [ "$(date +%s)" -ge "$end" ]; then
      cat "$s/out/$id.out" 2>/dev/null
      echo "lab: command on $node did not finish in ${t}s: $*" >&2
      return 124
    fi
    sleep 0.05
  done
  cat "$s/out/$id.out"
  local rc; rc=$(cat "$s/out/$id.rc")
  [[ $rc =~ ^[0-9]+$ ]] || { echo "lab: command on $node left exit status '$rc', not a number" >&2; return 125; }
  rm -f "$s/out/$id.out" "$s/out/$id.rc" "$s/run/$id.sh"
  return "$rc"
}
# hmp NODE COMMAND: one command on the node's qemu monitor, prints the answer
hmp() {
  python3 - "$LAB_DIR/$1.mon" "$2" <<'PY'
import socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.settimeout(10)
def until_prompt():
    b = b""
    while not b.endswith(b"(qemu) "):
        c = s.recv(4096)
        if not c: break
        b += c
    return b.decode(errors="replace")
until_prompt()
s.sendall(sys.argv[2].encode() + b"\n")
out = until_prompt().replace("\r", "")
lines = [l for l in out.split("\n") if l and not l.startswith("(qemu)") and l.strip() != sys.argv[2]]
lines = [l for l in lines if "\x1b" not in l and l.strip()]
if lines: print("\n".join(lines))
PY
}

# ---- up / down --------------------------------------------------------------------------------
# the .deb the guests install: their Debian release's own build from `make debs`
# (dist/debian/*~debNN_amd64.deb) when it is newer than `make package`'s, else the newest of those
lab_deb() { local d newest="" own=""
  for d in "$LAB_REPO"/dist/rbd-owner_*_amd64.deb; do
    [ -f "$d" ] || continue; [ -z "$newest" ] || [ "$d" -nt "$newest" ] && newest=$d; done
  for d in "$LAB_REPO"/dist/debian/rbd-owner_*~deb"$(guest_debian "$LAB_GUEST")"_amd64.deb; do
    [ -f "$d" ] || continue; [ -z "$own" ] || [ "$d" -nt "$own" ] && own=$d; done
  if [ -n "$own" ] && { [ -z "$newest" ] || [ "$own" -nt "$newest" ]; }; then echo "$own"; else echo "$newest"; fi; }
# guest_debian SUITE: the Debian release number of a guest suite
guest_debian() { case $1 in bookworm) echo 12 ;; trixie) echo 13 ;; forky) echo 14 ;; *) echo 0 ;; esac; }

lab_save_env() {
  { echo "NS=$NS"; echo "CEPHDIR=$CEPHDIR"; echo "LAB_DIR=$LAB_DIR"; echo "FSID=${FSID:-}"
    echo "LAB_GUEST=$LAB_GUEST"; echo "LAB_CLUSTER=$LAB_CLUSTER"; echo "CEPH_ROOT=$CEPH_ROOT"; echo "CEPH_ROOT_MADE=$CEPH_ROOT_MADE"
    echo "SLOW_POOL=$SLOW_POOL"; echo "LAB_TOPOLOGY=$LAB_TOPOLOGY"
    for n in "${NODES[@]}"; do echo "QPID_${n#node-}=${QPID[$n]:-}"; done; } > "$LAB_DIR/lab.env"
}
# lab_load DIR: adopt a running lab (for `lab sh`, `lab down`)
lab_load() {
  LAB_DIR=$1; [ -f "$LAB_DIR/lab.env" ] || { echo "no lab in $LAB_DIR" >&2; return 1; }
  # shellcheck disable=SC1091
  . "$LAB_DIR/lab.env"
  [ -z "$CEPH_ROOT" ] || [[ $CEPH_ROOT == /*/root ]] || { echo "lab: $LAB_DIR/lab.env: CEPH_ROOT='$CEPH_ROOT' is not a root directory" >&2; return 1; }
  [[ ${SLOW_POOL:-} =~ ^[a-z]*$ ]] || { echo "lab: $LAB_DIR/lab.env: SLOW_POOL='$SLOW_POOL' is not a pool name" >&2; return 1; }
  LAB_TOPOLOGY=${LAB_TOPOLOGY:-small}
  [ "$LAB_TOPOLOGY" = small ] || [ "$LAB_TOPOLOGY" = prod ] || { echo "lab: $LAB_DIR/lab.env: LAB_TOPOLOGY='$LAB_TOPOLOGY' is neither small nor prod" >&2; return 1; }
  lab_topology
  declare -gA QPID=()
  local n v; for n in "${NODES[@]}"; do
    v=QPID_${n#node-}
    [ -z "${!v}" ] || is_pid "${!v}" || { echo "lab: $LAB_DIR/lab.env: $v='${!v}' is not a process id" >&2; return 1; }
    QPID[$n]=${!v}
  done
}

# ---- the cluster's chroot (LAB_CLUSTER=reef) --------------------------------------------------
# the mount points a lab makes in CEPH_ROOT: /proc, and $LAB_DIR at its own path (the cluster's
# data, logs and pid files under $CEPHDIR, tests/ceph/up's copy, chaos's exports). /dev is the
# root's own (debootstrap made its device nodes): the host's /dev is never mounted there, so a
# careless rm -rf of the cache cannot reach it.
ceph_root_mounts() { printf '%s\n' "$CEPH_ROOT/proc" "$CEPH_ROOT$LAB_DIR"; }
is_mounted() { awk -v d="$1" '$2 == d {f=1} END {exit !f}' /proc/mounts; }
# CEPH_ROOT_MADE: the outermost directory ceph_root_mount made in the root for $LAB_DIR (removed
# again by ceph_root_umount; nothing that was there before is)
CEPH_ROOT_MADE=
ceph_root_mount() {
  local d=$CEPH_ROOT$LAB_DIR
  while [ ! -e "$d" ]; do CEPH_ROOT_MADE=$d; d=${d%/*}; done
  lab_save_env
  mkdir -p "$CEPH_ROOT$LAB_DIR" || return 1
  is_mounted "$CEPH_ROOT/proc" || mount -t proc proc "$CEPH_ROOT/proc" || return 1
  is_mounted "$CEPH_ROOT$LAB_DIR" || mount --bind "$LAB_DIR" "$CEPH_ROOT$LAB_DIR" || return 1
}
# ceph_root_umount: every mount ceph_root_mount made, innermost first (lazily when one is still
# busy: none may stay behind), then the empty directories made for $LAB_DIR inside the root
ceph_root_umount() {
  { [ -n "$CEPH_ROOT" ] && [ -d "$CEPH_ROOT" ]; } || return 0
  local m d
  while read -r m; do
    is_mounted "$m" || continue
    umount "$m" 2>/dev/null || { echo "lab: $m busy, unmounting lazily" >&2; umount -l "$m"; }
  done < <(ceph_root_mounts | tac)
  if [[ -n $CEPH_ROOT_MADE && $CEPH_ROOT_MADE == "$CEPH_ROOT"/* ]]; then
    d=$CEPH_ROOT$LAB_DIR
    while rmdir "$d" 2>/dev/null && [ "$d" != "$CEPH_ROOT_MADE" ]; do d=${d%/*}; done
  fi
  return 0
}

# ---- the slow pool (LAB_SLOW_POOL=1) -----------------------------------------------------------
# lab_slow_pool: the OSDs of SLOW_OSDS (memstore, like pool rbd's: osd.1 in the small topology,
# osd.2 and osd.3 in prod) in CRUSH root "slow", each under a host of its own (slow-h1, …), placed
# there before they start and never moved by themselves (osd_crush_update_on_start false), a rule
# choosing only that root and pool "slow" (8 PGs, the topology's size) using it. Pool rbd keeps
# replicated_rule (root default: RBD_OSDS alone), so nothing of it moves. Checked before use:
# every PG of rbd on all of RBD_OSDS and nothing else, every PG of slow on all of SLOW_OSDS.
# Small topology: osd.1's PG read lease is 5 x osd_heartbeat_grace (100 s; Ceph's default 0.8 x is
# 16 s) so that a stall of up to 35 s never outlives it: a PG whose lease ran out while its OSD
# was stopped turns "laggy" and may never serve its parked ops again until the next interval
# change (seen once in six stalls of 22-33 s here: ops "waiting for readable" for minutes). Pool
# slow has no second OSD that could take over, which is what the shorter lease is for. The prod
# topology keeps Ceph's own lease: a replica takes over there, and a longer lease would hold the
# new primary back that long. $CEPHDIR/slow-probes lists one object per PG of pool slow (written
# here) for tests/chaos/run to check that every PG answers.
osds_up() { [ "$(ceph osd stat -f json 2>/dev/null | jq -r .num_up_osds)" = "$1" ]; }
# ceph_fault DAEMON...: the lab stops or kills these Ceph daemons (osd.N, mon.X) now; a ledger
# (logs/ceph-faults.txt) that ceph_flaps reads. ceph_fault start marks the cluster up.
ceph_fault() { local d; for d in "$@"; do echo "$(date +%s) $d" >> "$LAB_DIR/logs/ceph-faults.txt"; done; }
# ceph_flaps: the cluster log's entries since it came up, as the monitors logged them (in their
# own logs: every release writes those), against the ledger. Prints one line per daemon
# and fails when an OSD was marked down more often than the lab stopped it, or when more monitor
# elections ran than the lab's monitor faults explain (two each: one without it, one with it
# back): a daemon that flapped on its own, under load or a too-tight heartbeat grace.
ceph_flaps() {
  local ledger=$LAB_DIR/logs/ceph-faults.txt since
  if ! [ -f "$ledger" ] || ! grep -qs 'log_channel(cluster)' "$CEPHDIR"/log/mon.*.log; then
    echo "no ledger, or no cluster log entries in the monitors' logs"; return 1
  fi
  since=$(date -u -d "@$(awk '$2 == "start" {print $1; exit}' "$ledger")" +%Y-%m-%dT%H:%M:%S)
  # (a monitor logs the entries it makes: the leader the elections it won and the OSDs it marked down)
  grep -h 'log_channel(cluster)' "$CEPHDIR"/log/mon.*.log | sort | awk -v since="$since" -v ledger="$ledger" '
    BEGIN { while ((getline l < ledger) > 0) { split(l, f, " "); if (f[2] != "start") faults[f[2]]++ } }
    $1 < since { next }
    / is new leader, mons / { elections++ }
    match($0, /osd\.[0-9]+ (failed \(|marked itself down|marked down)/) { split(substr($0, RSTART), w, " "); downs[w[1]]++ }
    END {
      bad = 0; monfaults = 0
      for (d in faults) if (d ~ /^mon\./) monfaults += faults[d]
      for (d in faults) if (d ~ /^osd\./ && !(d in downs)) downs[d] = 0
      for (d in downs) {
        printf "%s marked down %d times, stopped by the lab %d times\n", d, downs[d], faults[d] + 0
        if (downs[d] > faults[d] + 0) bad = 1
      }
      printf "monitor elections %d, monitor faults %d (at most %d elections)\n", elections + 0, monfaults, 2 * monfaults
      if (elections + 0 > 2 * monfaults) bad = 1
      exit bad
    }'
}

# lab_osd ID ROOT HOST: a memstore OSD ID in CRUSH ROOT under HOST, started
lab_osd() {
  local i=$1 root=$2 host=$3 d=$CEPHDIR/osd.$1 uuid secret id
  mkdir -p "$d" || return 1
  uuid=$(uuidgen) && secret=$(CX ceph-authtool --gen-print-key) || return 1
  printf '{"cephx_secret": "%s"}\n' "$secret" > "$d/new.json"
  { ceph config set "osd.$i" osd_crush_update_on_start false && ceph config set "osd.$i" crush_location "root=$root host=$host"; } || return 1
  if [ "$LAB_TOPOLOGY" = small ]; then ceph config set "osd.$i" osd_pool_default_read_lease_ratio 5 || return 1; fi
  { id=$(ceph osd new "$uuid" "$i" -i "$d/new.json") && [ "$id" = "$i" ]; } || { echo "lab: osd new gave '$id', not $i" >&2; return 1; }
  rm -f "$d/new.json"
  CX ceph-authtool --create-keyring "$d/keyring" -n "osd.$i" --add-key "$secret" >/dev/null || return 1
  { ceph osd crush add-bucket "$host" host && ceph osd crush move "$host" "root=$root" &&
    ceph osd crush add "osd.$i" 1.0 "root=$root" "host=$host"; } >/dev/null 2>&1 || { echo "lab: CRUSH host $host for osd.$i failed" >&2; return 1; }
  CX ceph-osd -c "$CEPHDIR/ceph.conf" -i "$i" --mkfs --osd-uuid "$uuid" >/dev/null 2>&1 || { echo "lab: osd.$i mkfs failed (log $CEPHDIR/log/osd.$i.log)" >&2; return 1; }
  CX nice -n 5 ceph-osd -c "$CEPHDIR/ceph.conf" -i "$i" || return 1
}
lab_slow_pool() {
  local t0 i; t0=$(now)
  ceph osd crush add-bucket slow root >/dev/null 2>&1 || { echo "lab: CRUSH root slow failed" >&2; return 1; }
  for i in "${SLOW_OSDS[@]}"; do lab_osd "$i" slow "slow-h$i" || return 1; done
  within 60 osds_up $(( ${#RBD_OSDS[@]} + ${#SLOW_OSDS[@]} )) || { echo "lab: osd.${SLOW_OSDS[*]} not up in 60 s" >&2; return 1; }
  { ceph osd crush rule create-replicated slow slow host && ceph osd pool create slow 8 8 replicated slow; } >/dev/null 2>&1 \
    || { echo "lab: rule or pool slow failed" >&2; return 1; }
  CX timeout 60 rbd -c "$CEPHDIR/ceph.conf" pool init slow || { echo "lab: rbd pool init slow failed" >&2; return 1; }
  # placement as intended, or no slow pool at all (from the osdmap: `ceph pg` needs a mgr, which
  # the lab does not run); each PG's OSDs sorted, as a set
  local pool want ids got
  ceph osd getmap -o "$CEPHDIR/osdmap.check" >/dev/null 2>&1 || { echo "lab: ceph osd getmap failed" >&2; return 1; }
  for pool in "rbd:$(IFS=,; echo "${RBD_OSDS[*]}")" "slow:$(IFS=,; echo "${SLOW_OSDS[*]}")"; do
    want=${pool#*:}; pool=${pool%%:*}
    ids=$(ceph osd pool ls detail -f json 2>/dev/null | jq -r --arg p "$pool" '.[] | select(.pool_name == $p) | .pool_id')
    [[ $ids =~ ^[0-9]+$ ]] || { echo "lab: no id for pool $pool ('$ids')" >&2; return 1; }
    got=$(CX osdmaptool "$CEPHDIR/osdmap.check" --test-map-pgs-dump --pool "$ids" 2>/dev/null | awk -v p="$ids" 'index($1, p ".") == 1 {print $2}' \
      | tr -d '[]' | while IFS=, read -ra o; do printf '%s\n' "${o[@]}" | sort -n | paste -sd,; done | sort | uniq -c | awk '{print "[" $2 "]x" $1}')
    [ "$got" = "[$want]x8" ] || { echo "lab: pool $pool's 8 PGs are not on osd.$want alone: ${got//$'\n'/ }" >&2; return 1; }
  done
  # one probe object in each of pool slow's PGs ($ids: pool slow's id, the loop's last)
  local i pg; declare -A probe=()
  for i in $(seq 0 199); do
    pg=$(CX osdmaptool "$CEPHDIR/osdmap.check" --test-map-object "chaos-probe.$i" --pool "$ids" 2>/dev/null | awk '$1 == "object" {print $4}')
    [ -n "$pg" ] && [ -z "${probe[$pg]:-}" ] && probe[$pg]=chaos-probe.$i
    [ ${#probe[@]} = 8 ] && break
  done
  [ ${#probe[@]} = 8 ] || { echo "lab: no probe object for every PG of pool slow (${#probe[@]} of 8)" >&2; return 1; }
  printf '%s\n' "${probe[@]}" > "$CEPHDIR/slow-probes"
  for i in "${probe[@]}"; do rados -p slow put "$i" "$CEPHDIR/slow-probes" || return 1; done
  rm -f "$CEPHDIR/osdmap.check"
  SLOW_POOL=slow; lab_save_env
  log "pool slow on osd.${SLOW_OSDS[*]} alone (CRUSH root slow, memstore) in $(elapsed "$t0")s; pool rbd on osd.${RBD_OSDS[*]} alone"
}

declare -A QPID=()
lab_up() {
  LAB_DIR=${LAB_DIR:-$CACHE/runs/lab-$(date +%Y%m%d-%H%M%S)-$$}
  NS=rbdo-lab-$$; CEPHDIR=$LAB_DIR/ceph
  mkdir -p "$LAB_DIR/logs" || return 1
  # keep the logs of the last 10 runs
  local old; old=("$CACHE"/runs/lab-*)   # names sort by start time
  while [ ${#old[@]} -gt 10 ]; do [ -f "${old[0]}/lab.env" ] || rm -rf "${old[0]}"; old=("${old[@]:1}"); done
  ln -sfn "$LAB_DIR" "$CACHE/current"
  lab_save_env
  local deb; deb=$(lab_deb)
  { [ -n "$deb" ] && [ -s "$deb" ]; } || die "package: no dist/rbd-owner_*_amd64.deb (run make package)"
  log "package: ${deb#"$LAB_REPO"/} ($(dpkg-deb -f "$deb" Depends | grep -o 'librados2 ([^)]*)'))"

  step "guest image: $LAB_GUEST${LAB_FLAVOR:+ ($LAB_FLAVOR)} (cached; rebuilt only when its inputs change)"
  local img; img=$(SUITE=$LAB_GUEST FLAVOR=$LAB_FLAVOR nice -n 15 "$LAB_REPO/tests/vm/build-image" 2> >(tee -a "$LAB_DIR/logs/build-image.log" >&2)) \
    || die "guest image: tests/vm/build-image failed (log: $LAB_DIR/logs/build-image.log)"
  is_image_dir "$img" || die "guest image: tests/vm/build-image printed '${img:0:200}', not an image directory (root.ext4, vmlinuz, initrd.img)"
  step_done
  if [ "$LAB_CLUSTER" != pacific ]; then
    step "cluster root: Ceph $LAB_CLUSTER (cached; rebuilt only when its inputs change)"
    local root; root=$(nice -n 15 "$LAB_REPO/tests/ceph/build-root" "$LAB_CLUSTER" 2> >(tee -a "$LAB_DIR/logs/build-root.log" >&2)) \
      || die "cluster root: tests/ceph/build-root $LAB_CLUSTER failed (log: $LAB_DIR/logs/build-root.log)"
    { [[ $root == /*/root ]] && [ -x "$root/usr/bin/ceph-mon" ]; } || die "cluster root: tests/ceph/build-root printed '${root:0:200}', not a root with ceph-mon"
    CEPH_ROOT=$root; lab_save_env
    ceph_root_mount || die "cluster root: mounting /proc and $LAB_DIR into $CEPH_ROOT failed"
    step_done
  fi

  step "network namespace $NS (br0 203.0.113.1/24, taps for ${NODES[*]})"
  local n taps=()
  for n in "${NODES[@]}"; do taps+=("tl${n#node-}$$"); done
  "$LAB_REPO/tests/vm/netns-up" "$NS" "${taps[@]}" || die "netns-up failed"
  # the other monitors' addresses (prod), on the same bridge
  local ip; for ip in "${MON_IPS[@]:1}"; do NSX ip addr add "$ip/24" dev br0 || die "ip addr add $ip (monitor address)"; done
  step_done

  step "boot ${NODES[*]} (qemu TCG, $GUEST_MEM MiB) while the Ceph cluster starts"
  local i=0
  for n in "${NODES[@]}"; do
    local s; s=$(share "$n"); mkdir -p "$s"/{cmd,run,out}
    cp "$LAB_REPO/tests/lab/guest.sh" "$s/run.sh"; cp "$LAB_REPO/tests/lab/cmdloop.sh" "$s/cmdloop.sh"
    cp "$deb" "$s/rbd-owner.deb"
    printf 'NODE_ID=%s\nGUEST_IP=%s/24\nMON_HOST=%s\nMAP_OPTS=%s\n' "$n" "${NODE_IP[$n]}" "$MON_HOST" "$MAP_OPTS" > "$s/node.env"
    cat > "$s/config.yaml" <<EOF
# written by tests/lab for $n ($LAB_TOPOLOGY topology)
node_id: $n
clusters:
  - id: lab
    monitors: [$(m=${MON_CONF[*]}; echo "${m// /, }")]
    user: rbdowner
    keyring: /etc/ceph/ceph.client.rbdowner.keyring
lease_duration: $LEASE
renew_interval: $RENEW
$([ "$LAB_TOPOLOGY" = prod ] || printf '%s\n' "# the small topology's pool rbd has one OSD: nothing fails over; the longest stall the lab" \
  "# causes in pool rbd is the chaos campaign's pause-osd, 3-12 s" "osd_failover: 15s")
fence_expiry: $FENCE_EXPIRY
takeover_policy: manual
map_timeout: 30s
mount_timeout: 15s
EOF
    # setsid: the guests outlive a closed terminal under KEEP=1; Ctrl-C reaches them through the trap
    MEM=$GUEST_MEM REBOOT=1 MONITOR=$LAB_DIR/$n.mon setsid nice -n 5 "$LAB_REPO/tests/vm/boot-guest" "$img" "$NS" "${taps[$i]}" \
      "${NODE_MAC[$n]}" "$s" "$LAB_DIR/logs" "$n" &
    QPID[$n]=$!; i=$((i + 1))
    is_pid "${QPID[$n]}" || die "boot $n: qemu's process id '${QPID[$n]}' is not a number"
    log "$n: qemu pid ${QPID[$n]} (${NODE_IP[$n]}, console $LAB_DIR/logs/$n.console)"
  done
  lab_save_env

  local t up; t=$(now); up=$LAB_REPO/tests/ceph/up
  # in the chroot: tests/ceph/up from the lab's directory (mounted there at the same path)
  [ -z "$CEPH_ROOT" ] || { install -m 0755 "$up" "$LAB_DIR/ceph-up" && up=$LAB_DIR/ceph-up; } || die "copy tests/ceph/up"
  local shape=()
  [ "$LAB_TOPOLOGY" = small ] || shape=(MON_IPS="${MON_IPS[*]}" MSGR2_ONLY=1 OSDS=${#RBD_OSDS[@]} POOL_SIZE=2 POOL_MIN_SIZE=1 FAST=0)
  CX env BIND_IP=203.0.113.1 MON_V1_PORT=6789 IMAGE=img1 OSD_STORE=memstore "${shape[@]}" \
    nice -n 5 "$up" "$CEPHDIR" 3300 6800 > "$LAB_DIR/logs/ceph-up.log" 2>&1 \
    || { cat "$LAB_DIR/logs/ceph-up.log" >&2; die "ceph up failed"; }
  FSID=$(awk '$1=="fsid"{print $3}' "$CEPHDIR/ceph.conf")
  [[ $FSID =~ ^[0-9a-f-]{36}$ ]] || die "ceph up: no fsid in $CEPHDIR/ceph.conf (got '$FSID')"
  local im; for im in img2 img3 ns1/img4 kimg1 ns1/kimg2 skew1 enf1 enf2 csi1 csi2 fence1 nf1 nf2 cov1 cov2; do rbd create --size 64M "rbd/$im" || die "rbd create $im"; done
  rbd snap create rbd/kimg1@s1 >/dev/null 2>&1 || die "rbd snap create kimg1@s1"
  # every OSD's PG read lease outlasts the faults' stalls (5 x osd_heartbeat_grace, as osd.1's
  # below): each pool lives on one OSD alone, and a PG whose lease ran out while its OSD was
  # stopped may stay laggy, its ops "waiting for readable", until the next interval change (the
  # rehearsal's trixie cell: after a 10 s SIGSTOP of osd.0, rbd create in pool rbd hung for
  # minutes, as the CI run's closing chaos round had)
  # (the small topology only: in prod a replica takes over, and Ceph's own lease is what users get)
  if [ "$LAB_TOPOLOGY" = small ]; then
    ceph config set osd osd_pool_default_read_lease_ratio 5 || die "ceph config set osd osd_pool_default_read_lease_ratio"
  fi
  # prod: the kernel's msgr2 mode where Rook puts it, in the monitors' config store; the agents
  # (which connect after this) take it from there
  if [ "$LAB_TOPOLOGY" = prod ]; then
    ceph config set client rbd_default_map_options "$MAP_OPTS" || die "ceph config set client rbd_default_map_options"
  fi
  if [ "$LAB_SLOW_POOL" = 1 ]; then lab_slow_pool || die "the slow pool (LAB_SLOW_POOL=1): osd.1 or pool slow failed"; fi
  lab_save_env
  for n in "${NODES[@]}"; do install -m 0600 "$CEPHDIR/client.rbdowner.keyring" "$(share "$n")/keyring"; done
  ceph_fault start
  log "Ceph cluster ($LAB_CLUSTER, $LAB_TOPOLOGY: $(ceph --version | awk '{print $3}')) up in $(elapsed "$t")s: fsid $FSID, mon_host $MON_HOST, OSDs of pool rbd ${RBD_OSDS[*]}, images rbd/img1 img2 img3 ns1/img4"

  for n in "${NODES[@]}"; do
    s=$(share "$n")
    local end=$(( $(date +%s) + BOOT_TIMEOUT ))
    until [ -e "$s/out/ready" ]; do
      kill -0 "${QPID[$n]}" 2>/dev/null || die "$n: qemu exited during boot (see $LAB_DIR/logs/$n.console)"
      [ "$(date +%s)" -lt "$end" ] || { tail -20 "$LAB_DIR/logs/$n.console" >&2; die "$n: not ready in ${BOOT_TIMEOUT}s"; }
      sleep 0.2
    done
    [ "$(cat "$s/out/dpkg.rc" 2>/dev/null)" = 0 ] || { cat "$s/out/setup.log" >&2; die "$n: dpkg -i failed"; }
    log "$n: booted, .deb installed, command channel up (guest uptime $(sed -n 's/^uptime=//p' "$s/out/ready")s)"
  done
  step_done

  step "agents started by systemd (rbd-owner.socket + rbd-owner.service) and answering"
  for n in "${NODES[@]}"; do
    on -t 90 "$n" 'for i in $(seq 600); do systemctl is-active -q rbd-owner.service && { rbd-owner status >/dev/null 2>&1 || [ $? = 5 ]; } && exit 0; sleep 0.1; done
      systemctl status --no-pager rbd-owner; journalctl -b -u rbd-owner --no-pager | tail -20; exit 1' > "$LAB_DIR/logs/$n.agent-start.log" 2>&1 \
      || { cat "$LAB_DIR/logs/$n.agent-start.log" >&2; die "$n: rbd-owner did not become active"; }
  done
  log "agents active on ${NODES[*]}"
  step_done
}

lab_down() {
  local n p
  [ -n "${LAB_DIR:-}" ] || return 0
  for n in "${NODES[@]}"; do
    p=${QPID[$n]:-}
    [ -n "$p" ] || continue
    if kill -0 "$p" 2>/dev/null && tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -q "qemu-system-x86_64 -name $n "; then
      kill -TERM "$p"
    fi
  done
  for n in "${NODES[@]}"; do
    p=${QPID[$n]:-}; [ -n "$p" ] || continue
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$p" 2>/dev/null && tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -q "qemu-system-x86_64 -name $n " && kill -KILL "$p"
    wait "$p" 2>/dev/null
  done
  # the cluster log's entries, as the monitors logged them, outlive the purge (logs/ceph-cluster.log)
  if [ -d "${CEPHDIR:-/nonexistent}/log" ]; then grep -hs 'log_channel(cluster)' "$CEPHDIR"/log/mon.*.log | sort > "$LAB_DIR/logs/ceph-cluster.log"; fi
  # tests/ceph/down only signals the daemons by their pid files (the same paths inside the chroot)
  [ -f "${CEPHDIR:-/nonexistent}/ceph.conf" ] && "$LAB_REPO/tests/ceph/down" "$CEPHDIR" --purge > "$LAB_DIR/logs/ceph-down.log" 2>&1
  ceph_root_umount
  if [ -n "${NS:-}" ]; then
    for _ in $(seq 30); do [ -z "$(ip netns pids "$NS" 2>/dev/null)" ] && break; sleep 0.1; done
    "$LAB_REPO/tests/vm/netns-down" "$NS" || echo "lab: WARNING: namespace $NS left behind" >&2
  fi
  for n in "${NODES[@]}"; do rm -f "$(share "$n")/keyring" "$(share "$n")/rbd-owner.deb" "$(share "$n")/krbd.test" "$LAB_DIR/$n.mon"; done
  [ "$(readlink "$CACHE/current" 2>/dev/null)" = "$LAB_DIR" ] && rm -f "$CACHE/current"
  rm -f "$LAB_DIR/lab.env"
  echo "lab: torn down (logs in $LAB_DIR/logs)" >&2
}

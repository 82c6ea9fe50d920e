# shellcheck shell=bash
# Guest scripts are single-quoted on purpose: they expand in the guest, not here.
# shellcheck disable=SC2016
# tests/lab/checks.sh — the assertions and predicates the lab's scenario scripts share
# (tests/lab/e2e, tests/k8s/lab), sourced after tests/lab/lib.sh. Each check prints PASS: or
# FAIL: and counts into PASSED, FAILED and FAILS; the script's finish prints the totals.
#
# Checks are plain commands or functions, never strings: `check NAME CMD ARGS…` runs CMD ARGS…
# on the host, `check_within SECONDS NAME CMD ARGS…` polls it until it succeeds or the bound runs
# out, and `t RC NAME NODE SCRIPT` runs SCRIPT in a guest (over the command channel) and wants RC.
PASSED=0; FAILED=0; FAILS=()

pass() { PASSED=$((PASSED + 1)); echo "PASS: $*"; }
fail() { FAILED=$((FAILED + 1)); FAILS+=("$1"); echo "FAIL: $1"; shift; [ $# = 0 ] || printf '%s\n' "$@" | tail -30 | sed 's/^/      | /'; }
# run NODE SCRIPT: sets OUT and RC
run() { OUT=$(on "$@" 2>&1); RC=$?; }
# t WANT_RC NAME NODE SCRIPT: the script's exit status must be WANT_RC (its output in OUT)
t() { local want=$1 name=$2; shift 2; run "$@"
  if [ "$RC" = "$want" ]; then pass "$name"; return 0; fi
  fail "$name" "exit $RC, want $want; output:" "$OUT"; return 1; }
# check NAME CMD [ARG...]: a host-side check, a command or function run as it is
check() { local name=$1; shift; local o
  if o=$("$@" 2>&1); then pass "$name"; return 0; fi
  fail "$name" "$*" "$o"; return 1; }
# check_within SECONDS NAME CMD [ARG...]: a host-side check that must become true within SECONDS
check_within() { local secs=$1 name=$2; shift 2
  if within "$secs" "$@"; then pass "$name"; return 0; fi
  fail "$name" "not true within ${secs}s: $*" "$("$@" 2>&1)"; return 1; }
out_has() { grep -qi -- "$1" <<< "$OUT"; }

# ---- predicates (each a plain function of its arguments) --------------------------------------
holders() { claim_json "$@" | jq -r '[.holders[]? | "\(.node_id)@\(.epoch)"] | join(",")'; }
epoch() { claim_json "$@" | jq -r '.epoch // 0'; }
# holders_are WANT IMAGE [POOL[/NS]]: the claim's holders are exactly WANT ("" for none)
holders_are() { local want=$1 got; shift; got=$(holders "$@"); [ "$got" = "$want" ] || { echo "holders: '$got', want '$want'"; return 1; }; }
# held_by NODE IMAGE [POOL[/NS]]: NODE is the one holder, at any epoch
held_by() { local node=$1 got; shift; got=$(holders "$@"); [[ "$got" == "$node"@* ]] || { echo "holders: '$got', want $node"; return 1; }; }
# rbd_osds_current: every OSD of pool rbd (the pool the e2e maps from: osd.0, or osd.0 and osd.1
# in the prod topology) has the cluster's newest osdmap. A blocklist entry is in force at an OSD
# only once it has the map the entry was added in; until then a fenced client's write may still
# be acknowledged.
rbd_osds_current() {
  local e n i
  e=$(ceph osd dump -f json 2>/dev/null | jq -r .epoch) && [[ $e =~ ^[0-9]+$ ]] || return 1
  for i in "${RBD_OSDS[@]}"; do
    n=$(CX timeout 10 ceph --admin-daemon "$CEPHDIR/run/ceph-osd.$i.asok" status 2>/dev/null | jq -r .newest_map) && [[ $n =~ ^[0-9]+$ ]] || return 1
    [ "$n" -ge "$e" ] || return 1
  done
}
# blocklisted ADDR: ADDR is on the cluster's blocklist, and in force at pool rbd's OSDs
blocklisted() {
  [ -n "$1" ] || { echo "blocklisted: no address given"; return 2; }
  ceph osd blocklist ls 2>/dev/null | grep -qF -- "$1" && rbd_osds_current
}
# fences_in_force ADDR: ADDR is blocklisted with at least 20 s of its entry's life left, and in
# force at pool rbd's OSDs. Asked before a fenced client writes a while after its fence: the
# lab's fence_expiry is a minute, and Ceph 16.2 and 18.2 lengthen no entry still listed, so a
# renewal adds an entry again only once it has expired; an entry a minute old may be gone for up
# to a renewal period (15 s), or about to go (the packages' default, ten years, never is). One
# address per call: two entries' renewal cycles need not overlap.
fences_in_force() {
  [ -n "$1" ] || return 2
  local till
  till=$(ceph osd blocklist ls 2>/dev/null | awk -v a="$1" '$1 == a {$1 = ""; print; exit}')
  if [ -z "$till" ] || [ $(( $(date -d "$till" +%s) - $(date +%s) )) -lt 20 ]; then echo "$1: not listed, or listed until $till"; return 1; fi
  rbd_osds_current
}
# guest_paused NODE / guest_running NODE: qemu stop / cont, and the monitor says so
guest_paused() { hmp "$1" stop >/dev/null && hmp "$1" "info status" | grep -q paused; }
guest_running() { hmp "$1" cont >/dev/null && hmp "$1" "info status" | grep -q running; }

# ---- guest-side waits (scripts for inside t) ---------------------------------------------------
# guest_for SECONDS CMD: a guest script that runs CMD until it succeeds, for SECONDS on the
# guest's clock whatever each try takes (for waits that are about time, such as a lease: a try
# count made those depend on how fast the tries were)
guest_for() { printf 'end=$(( $(date +%%s) + %s )); while :; do %s && exit 0; [ "$(date +%%s)" -ge "$end" ] && exit 1; sleep 0.5; done' "$1" "$2"; }

/*
 * observer.pml: a claimer's lease observations across a holder's successive holds in one pool,
 * and the fence a takeover chooses (agent/claim/liveness.go Observer, Store.leases,
 * Store.Heartbeat; agent/claim/ops.go Acquire), for spin.
 *
 * lease.pml checks the lease rule for one hold that a holder keeps renewing. This model adds
 * what that leaves out: a node renews its heartbeat in a pool only while it holds claims there
 * (daemon/heartbeat.go heartbeats), so its heartbeat object stays the same for as long as it holds
 * nothing there; and, before F3's fix, the claimer's Observer kept, per (pool, namespace,
 * holder node), the mark it last saw and since when, across holds, for good.
 *
 * Holder A, one node in one pool: idle (no claim in the pool, no renewal), then it claims
 * (Acquire: a heartbeat write and the claim's compare-and-set, in one order or the other), holds
 * (renewing at most R after its claim landed or its last heartbeat; the mapping's client
 * address recorded at some point, SetMapping), releases, and so on, HOLDS holds in all; it may
 * stop at any moment (a crash, a partition) and is then dead for good. A call may fail (lost,
 * or landed and timed out). Claimer B retries a takeover of whatever A holds at any moment:
 * the read of the claim record, then of A's heartbeat (Store.leases), then the Look on its own
 * monotonic clock (Observer.Look), each at most D after the one before; if the lease is expired,
 * it fences A (the hold's client address, or A's whole node ip:0/0 when none is recorded) and
 * takes the image. B may restart (forget what it saw) between attempts. Real time passes in
 * units; ages are counted in them, capped (as in lease.pml).
 *
 * Checked: a live node (A while it has not stopped; while it holds, it renews as required) is
 * never judged expired (live_holder_judged_expired, where B looks) and never fenced
 * (live_node_fenced, where B fences). It needs R + 2D < L (here 2 + 2 < 6), not lease.pml's
 * R + D < L: B's reads of the claim and of the heartbeat and its Look may each be D apart, and
 * a holder may release (and stop renewing) right after B read its claim.
 *
 * The fix (docs/safety.md, F3), one switch per part:
 *   FIX_HB_FIRST    Acquire writes this node's heartbeat in the pool before the claim's
 *                   compare-and-set; a failed heartbeat write fails the acquire (no claim).
 *                   Without it: the claim is written first and the heartbeat after it (a failed
 *                   write only logged: A's next renewal is then its first heartbeat).
 *   FIX_OBS_HOLD    an observation is valid only for the hold it was made against (the holder's
 *                   epoch, acquired_at, incarnation): a Look at another hold starts a new watch
 *                   (Observer.watches, keyed by place, image and node, each naming its hold).
 *   FIX_OBS_STALE   an observation not looked at for more than a lease is dropped: the next Look
 *                   starts a new watch (Observer.prune).
 *   FIX_NODE_FENCE  a takeover never fences ip:0/0 of a node whose heartbeat this node has seen
 *                   change within the last lease on its own clock (LeaseView.Moved, from
 *                   Observer.beats: a change is a mark that differs from the one at this node's
 *                   previous look, if that look was at most a lease ago); it refuses instead.
 * Other switches:
 *   NO_LOOK_ASSERT  check only that no live node is fenced (a variant may then show whether
 *                   FIX_NODE_FENCE alone keeps a misjudged live node from its fence)
 *   AMB_CLAIM       the claim's compare-and-set may land and still time out: Acquire fails, the
 *                   saga keeps phase claiming, the node does not renew there (its heartbeats renew
 *                   only for phases claimed and mapped) and the reconciler releases the hold at
 *                   some later moment
 *   RENEW_CLAIMING  (with AMB_CLAIM) a remedy: the heartbeats renew the heartbeat for a hold in phase
 *                   claiming too, until the reconciler releases it
 */

#ifndef L
#define L 6             /* the lease (lease_duration 60 s) */
#endif
#ifndef R
#define R 2             /* the longest time from a live holder's claim or heartbeat to its next heartbeat */
#endif
#ifndef D
#define D 1             /* the longest time from one of a claimer's reads to its next step (a call's timeout) */
#endif
#ifndef HOLDS
#define HOLDS 2         /* A's holds in the pool over a run */
#endif
#define CAP (L + D + 1) /* ages are counted up to here */

/* the phases in which A renews its heartbeat, at most R apart */
#ifdef RENEW_CLAIMING
#define RENEWS (aph == HOLDING || aph == UNSURE)
#else
#define RENEWS (aph == HOLDING)
#endif

/* A's phases */
#define IDLE    0       /* no claim in the pool: no renewal */
#define ACQ     1       /* (FIX_HB_FIRST) its heartbeat landed; the claim's compare-and-set next */
#define HOLDING 2       /* it holds a claim in the pool and renews */
#define UNSURE  3       /* (AMB_CLAIM) its claim write timed out but landed; phase claiming */

/* ---- holder A and the objects it writes ---- */
bool alive = 1;         /* A has not stopped */
byte aph;               /* A's phase */
byte hold;              /* A's hold in the claim record: 0 none, else its number (epoch, acquired_at) */
byte holds;             /* holds A has taken so far */
bool addr;              /* that hold records the mapping's client address (SetMapping) */
byte due;               /* while it renews: real time since the later of its claim's landing and its last heartbeat */

/* ---- claimer B's Observer: what it saw of A ---- */
bool seen;              /* it has a mark for A (Observer.seen) */
bool cur_is_seen;       /* A's heartbeat is still the one whose mark B saw */
byte since;             /* real time since B first saw that mark (its monotonic clock) */
#ifdef FIX_OBS_HOLD
byte ob_hold;           /* the hold the observation was made against */
#endif
#if defined(FIX_OBS_STALE) || defined(FIX_NODE_FENCE)
#define FRESH
byte fresh;             /* real time since B last looked at A */
#endif
#ifdef FIX_NODE_FENCE
bool chg_known;         /* B has seen A's heartbeat change */
byte chg;               /* real time since it last saw it change */
#endif

/* ---- B's attempt under way ---- */
byte att;               /* 0 none, 1 the record read, 2 the heartbeat read too */
byte rd_hold;           /* the hold the record read returned */
bool rd_addr;           /* it recorded a client address */
byte rd_age;            /* real time since the last read */
bool rd_is_seen;        /* the heartbeat read returned the mark B saw */
bool rd_is_cur;         /* no heartbeat landed since that read */
bool first, expired;    /* the Look's verdict */
bool b_done;            /* B fenced A and took the image */
bool live_holder_judged_expired;
bool live_node_fenced;

#define INC(x) if :: x < CAP -> x++ :: else fi

/* a heartbeat of A lands (Store.Heartbeat) */
#define HB \
  cur_is_seen = 0; rd_is_cur = 0; due = 0; printf("A: a heartbeat lands\n")

/* A's claim lands: a new hold, no client address yet */
#define GRANT \
  holds++; hold = holds; addr = 0; due = 0; printf("A: its claim lands: hold #%d (no client address)\n", hold)

active proctype Holder() {
end:
  do
  /* Acquire of an image in the pool */
  :: atomic {
       alive && aph == IDLE && holds < HOLDS ->
#ifdef FIX_HB_FIRST
       printf("A: Acquire: its heartbeat first\n");
       if
       :: HB; aph = ACQ
       :: HB; printf("A: (the heartbeat write lands but times out: the acquire fails)\n")
       :: printf("A: (the heartbeat write is lost: the acquire fails)\n")
       fi
#else
       printf("A: Acquire: the claim first\n");
       if
       :: GRANT; aph = HOLDING     /* its heartbeat write follows: a renewal, which may fail */
       :: printf("A: (the claim write is lost: the acquire fails)\n")
#ifdef AMB_CLAIM
       :: GRANT; aph = UNSURE; printf("A: (the claim write lands but times out: phase claiming)\n")
#endif
       fi
#endif
     }
#ifdef FIX_HB_FIRST
  /* the claim's compare-and-set, any time after the heartbeat (the watcher list, the read,
     the holders' leases, fences and retries come in between) */
  :: atomic {
       alive && aph == ACQ ->
       if
       :: GRANT; aph = HOLDING
       :: aph = IDLE; printf("A: (the claim write is lost, or refused: the acquire fails)\n")
#ifdef AMB_CLAIM
       :: GRANT; aph = UNSURE; printf("A: (the claim write lands but times out: phase claiming)\n")
#endif
       fi
     }
#endif
  /* heartbeats: a heartbeat in the pool (at most R apart while it holds: see Time) */
  :: atomic { alive && RENEWS -> HB }
  /* SetMapping: the mapping's client address recorded in the hold */
  :: atomic { alive && aph == HOLDING && !addr -> addr = 1; printf("A: SetMapping: hold #%d records its client address\n", hold) }
  /* the unmap's Release: no claim in the pool any more, no more renewals there */
  :: atomic { alive && aph == HOLDING -> hold = 0; addr = 0; due = 0; aph = IDLE; printf("A: Release: it holds nothing in the pool\n") }
#ifdef AMB_CLAIM
  /* the reconciler (settle, phase claiming): releases the hold, whenever its call succeeds */
  :: atomic { alive && aph == UNSURE -> hold = 0; due = 0; aph = IDLE; printf("A: the reconciler releases the unsure hold\n") }
#endif
  /* stops for good (keeps its hold) */
  :: atomic { alive -> alive = 0; due = 0; printf("A: STOPS (crash, partition): dead from here\n") }
  od
}

/* a takeover of A's hold, retried at any moment: Store.update's read, Store.leases (the
   heartbeat read, Observer.Look), decideAcquire, the fence */
active proctype Claimer() {
end:
  do
  :: atomic {                          /* the claim record: A holds something */
       !b_done && att == 0 && hold != 0 ->
       att = 1; rd_hold = hold; rd_addr = addr; rd_age = 0;
       printf("B: reads the claim: A's hold #%d, client address recorded %d\n", rd_hold, rd_addr)
     }
  :: atomic {                          /* A's heartbeat object */
       att == 1 ->
       att = 2; rd_is_seen = seen && cur_is_seen; rd_is_cur = 1; rd_age = 0;
       printf("B: reads A's heartbeat: the mark it saw before %d\n", rd_is_seen)
     }
  :: atomic {                          /* Observer.Look, on B's clock; then the decision */
       att == 2 ->
       first = (!seen || !rd_is_seen);
#ifdef FIX_OBS_HOLD
       first = first || ob_hold != rd_hold;
#endif
#ifdef FIX_OBS_STALE
       first = first || fresh > L;
#endif
       if
       :: first ->                      /* a new watch, never expired */
#ifdef FIX_NODE_FENCE
            if
            :: seen && !rd_is_seen && fresh <= L -> chg_known = 1; chg = 0   /* the mark changed */
            :: else
            fi;
#endif
            printf("B: Look: a new watch (a new mark %d)\n", !seen || !rd_is_seen);
            seen = 1; since = 0; cur_is_seen = rd_is_cur; expired = 0
#ifdef FIX_OBS_HOLD
            ; ob_hold = rd_hold
#endif
       :: else ->
            expired = (since >= L);
            printf("B: Look: the same mark for %d: expired %d\n", since, expired)
       fi;
#ifdef FRESH
       fresh = 0;
#endif
       live_holder_judged_expired = (expired && alive);
#ifndef NO_LOOK_ASSERT
       assert(!live_holder_judged_expired);
#endif
       if
       :: expired ->
#ifdef FIX_NODE_FENCE
            if
            :: !rd_addr && chg_known && chg < L ->
                 printf("B: takeover refused: no client address, and A's heartbeat changed %d ago\n", chg);
                 goto nxt
            :: else
            fi;
#endif
            if
            :: rd_addr -> printf("B: TAKEOVER: blocklists hold #%d's client address\n", rd_hold)
            :: else -> printf("B: TAKEOVER: blocklists A's whole node (ip:0/0)\n")
            fi;
            live_node_fenced = alive;
            assert(!live_node_fenced);
            b_done = 1                  /* B holds the image; A is dead: nothing more to see */
       :: else
       fi;
nxt:
       att = 0; rd_hold = 0; rd_addr = 0; rd_age = 0; rd_is_seen = 0; rd_is_cur = 0;
       first = 0; expired = 0; live_holder_judged_expired = 0
     }
  :: atomic {                          /* B restarts: it forgets what it saw */
       !b_done && att == 0 && seen ->
       seen = 0; cur_is_seen = 0; since = 0;
#ifdef FIX_OBS_HOLD
       ob_hold = 0;
#endif
#ifdef FRESH
       fresh = 0;
#endif
#ifdef FIX_NODE_FENCE
       chg_known = 0; chg = 0;
#endif
       printf("B: restarts (forgets its observations)\n")
     }
  od
}

/* real time: one unit passes, unless a live holder is due (its heartbeat lands first) or B's
   next step is due */
active proctype Time() {
end:
  do
  :: atomic {
       !(alive && RENEWS && due >= R) && !(att != 0 && rd_age >= D) ->
       printf("time: one unit passes\n");
       if :: alive && RENEWS -> INC(due) :: else fi;
       if
       :: seen -> INC(since)
#ifdef FRESH
          ; INC(fresh)
#endif
       :: else
       fi;
#ifdef FIX_NODE_FENCE
       if :: chg_known -> INC(chg) :: else fi;
#endif
       if :: att != 0 -> INC(rd_age) :: else fi
     }
  od
}

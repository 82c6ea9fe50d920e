/*
 * fence.pml: the lifetime of a fence (a blocklist entry), for spin.
 *
 * rbd_owner.pml treats a blocklist entry as permanent. A real one (`osd blocklist add ADDR
 * EXPIRE`, fence_expiry) runs out: a node fenced by a takeover that stays hung or cut off for
 * longer than the entry's life gets a kernel client that can write again, beside the new
 * holder's. This model follows one such fence through the protocol meant to keep it in force:
 *
 *   - The fence is recorded in the image's claim record (fences[]: the fenced node, the
 *     address, the boot id of its kernel as its heartbeat showed it at fence time, the last
 *     renewal, gone or not). It stays there when the claim is released (the record is then free).
 *   - Renewal (re-blocklisting, which resets the entry's life, and the new expiry written into the
 *     record by compare-and-set) of a fence not known gone: by the holder of record in its renew
 *     round; while nobody renews it as holder (the record is free, or its holder is dead: its
 *     lease expired), by the sweep of the pool of any other live agent; each at the latest at
 *     half the fence's life since its last renewal.
 *   - Known gone (renewal ends; the entry then just runs out): the fenced node's own agent,
 *     which can still reach the cluster when only the mapping's address was fenced, records that
 *     the mapping is gone once its device is unmapped; or a renewer reads the fenced node's
 *     heartbeat and finds a boot id other than the one in the fence (a reboot destroys every
 *     kernel client). A whole-node fence (ip:0/0) cuts the fenced node's agent too: only an admin
 *     lifts it (unfence --node, refused unless the node shows a new boot id, or --force; the
 *     admin learns it from the node itself, whose heartbeat cannot reach the cluster).
 *
 * Nodes: A (0), the fenced node: it held the image and its mapping a1 is still there; B (1),
 * whose takeover made the fence (the initial state); C (2), a third agent. A may be frozen or
 * cut off for any time and resume with a1 still mapped, reboot once (a1 gone, boot id 2), have
 * its agent restart once (the same boot; an agent of a version before boot ids is upgraded), and
 * have a1 unmapped by hand. B and C are alike: each may map (after an Acquire) and unmap,
 * release, claim the free record or take over a dead holder (whose mapping died with it), be
 * frozen or cut off (its mapping stays and counts as a writer) and come back, die and boot
 * again without a mapping. An admin may unfence A's node once (without --force).
 *
 * Time is counted in ticks of the fence's life (LIFE ticks; HALF = half of it): age is the time
 * since the entry was last added; at LIFE it has run out (off the blocklist). A tick passes
 * unless a renewer is due: one that is live (up, its calls succeed), responsible (as above) and
 * finds the fence not known gone, its entry at least HALF old. A renewer that is cut off, dead,
 * or not responsible does not hold time back. The margin from HALF to LIFE is what covers the
 * sweep period, the lease a sweeper waits before it judges a holder dead, failed calls retried
 * and clocks apart (renewers read an expiry another node wrote): each well under half a life
 * (3.5 days by default). A renewal's blocklist call and its record write are one step (in that
 * order in the agent: a renewer that stops between them leaves the record older than the entry,
 * and the next renewal comes early). Everything else is untimed: any step at any moment.
 *
 * Checked: never two unfenced writers (two_unfenced_writers): a mapping writes while its kernel
 * client exists, it is not unmapped and its address is not on the blocklist (a1, while the entry
 * is in force, is fenced; B's and C's mappings are never fenced here). A frozen or cut-off node's
 * mapping counts (it writes as soon as it resumes). Asserted where a writer can appear: the
 * entry running out, a map, the admin's unfence, and (AFTER_FENCE, below) a third party's lift.
 *
 * Assumption (OUTAGES drops it): while B or C holds a mapping or a claim it may map at once and
 * cannot renew (cut off, or its blocklist calls fail), the other can, or less than a tick passes:
 * some renewer reaches the cluster within the margin. Without it no renewal keeps any expiring
 * fence in force (check fences-all-out).
 *
 * Switches:
 *   FIX_CLAIM_RENEWS      an Acquire (a claim of the free record, a takeover, a hold again)
 *                         first renews every fence of the record that is due or has run out,
 *                         before its compare-and-set (refused if it cannot): a new holder's duty
 *                         starts at its claim, not at its first renew round (docs/safety.md, F6).
 *                         Without it: the protocol as first described.
 *   NOBL                  the blocklist calls of B or C may fail for any time (a missing cap, no
 *                         monitor session) while the rest of it works: its heartbeat goes on
 *   FIX_BACKSTOP          (with NOBL) a sweep renews a live fence at 3/4 of its life whoever
 *                         holds the record (docs/safety.md, F7)
 *   NO_RENEW              variant: nobody renews; entries simply run out
 *   HOLDER_ONLY           variant: only the holder of record renews (and reads heartbeats); no
 *                         sweep: renewal stops while the record is free or its holder is dead
 *   GONE_ON_UNKNOWN_BOOT  variant: a renewer compares boot ids as they are, an unknown one (a
 *                         fence made from the heartbeat of an agent that wrote none) included
 *   GONE_ON_NEW_HEARTBEAT variant: a renewer takes a new incarnation in the fenced node's
 *                         heartbeat (its agent restarted) for a reboot
 *   UNFENCE_UNCHECKED     variant: unfence --node without a new boot id and without --force
 *   OUTAGES               any outage of B and C at once, for any time (the limit of the protocol)
 *   OLD_AGENT=0           A's agent knows boot ids from the start (else it may predate them)
 *   FLEET                 the fleet's sweep: an agent at its due time skips its sweep of the pool
 *                         if another recorded one since its previous look (a sequence in the
 *                         pool's claim index), else it sweeps and records it. A record waives the
 *                         sweep duties (SR, the backstop) of every agent until the next tick (a tick
 *                         is a quarter of the fence's life: two sweep periods of fence_expiry/8);
 *                         the holder's renew round is never waived. Without FIX_SWEEP_MARK a sweep
 *                         is recorded even when a renewal it owed failed (its blocklist calls fail)
 *   FIX_SWEEP_MARK        (with FLEET) a sweep is recorded only once it made every renewal it owed
 *   HOLDER_SILENT         the holder of record never renews in its renew round: its claim check
 *                         (what feeds keepFences the record) never comes (no notice, the slow check
 *                         not yet due); its Acquire, its sweeps and its other calls work
 *
 * The takeover policy after-fence (AFTER_FENCE; docs/safety.md, "Takeover of a hold someone else
 * fenced"). Why here and not in rbd_owner.pml: what makes such a takeover safe is not the order of
 * blocklist call and compare-and-set (rbd_owner.pml checks that for every takeover, and its
 * ROLES/POLICY_AFTER only decide who may start one) but that the holder, alive and writing, stays
 * cut off for as long as its mapping may exist, while another party's entry comes and goes and
 * the taker's own entry has a life and must be renewed: entry lifetimes and renewal are this
 * model's subject (in rbd_owner.pml every entry is permanent and no one else's, so neither an
 * own entry that nobody renews nor another party's removal could fail there). Which holds a
 * policy lets a node take is a choice of when, not of whether the holder is cut off: COVER_ANY
 * (any hold taken at any moment) passes with exactly the states of the listing's rule.
 * With AFTER_FENCE the run starts before any takeover: A holds the image, alive (up, its agent
 * reaching the cluster, its heartbeat going on) and a1 mapped and writing; no fence yet. A third
 * party X (ceph-csi's out-of-service fencing, a csi-addons NetworkFence, an admin by hand) adds
 * one entry and lifts it, each at any moment, any number of times: a range ip/32 over A's node
 * (`osd blocklist range add`), A's node as ip:0/0 (`osd blocklist add <ip>`: ceph-csi where the
 * cluster has no ranges), or a1's exact address (an admin). X's entries of A's node cut A's
 * agent's own client too. X's entry is in no record and nobody renews it. B and C may take A's
 * hold over while it is live, under after-fence only when it is covered, in three steps of their
 * Acquire with anything in between:
 *   decide:    the claim read (A's hold), the listing read (`osd blocklist ls`): covered (every
 *              client of the hold: a1's address if the hold recorded it, else A's node), so the
 *              lease wait is waived (the listing is stale from here: X may lift its entry);
 *   blocklist: its own entry for A's hold (a1's address, else A's whole node ip:0/0), as any
 *              takeover (a failed call ends the Acquire: no claim);
 *   write:     the compare-and-set of epoch+1, failing if A's hold is no longer the record's
 *              (A released it, the other one took it); with FIX_CLAIM_RENEWS its own new fence is
 *              renewed first if it is due or ran out meanwhile (the agent's renewDue runs on the
 *              record to be written, the new fence in it), as the record's other fences are;
 *              the fence recorded (fences[]: with the boot id A's hold recorded), renewed from
 *              then on like any fence.
 * A is then what it is in the rest of this model: it may go on writing whenever no entry covers
 * a1, be frozen and resume, reboot, restart its agent, have a1 unmapped by hand (its agent then
 * records the fence gone, if it reaches the cluster) or release its hold once a1 is gone.
 *   AFTER_FENCE           the above; checked as everything else: never two unfenced writers, a1
 *                         writing while neither X's entry nor the taker's is in force
 *   SHARED_KEYS           (with AFTER_FENCE) the blocklist as Ceph keeps it: one entry per
 *                         address, whoever added it. X's ip:0/0 is the entry of a whole-node
 *                         fence of A, X's a1 that of a fence of a1: an add of it adds nothing,
 *                         X's removal removes the taker's fence with it, and it runs out with it.
 *                         Without: every party's entries are apart (the argument's premise)
 *   FIX_OWN_KEY           (F10's fix) the waiver only where the taker's own entry is an address a
 *                         node fencer never lists (A's hold recorded a1: a1's exact address), and
 *                         only on coverage by another entry than a1's own; otherwise the hold is
 *                         not taken here (the lease wait applies, as before)
 *   X_NO_EXACT            X lists nodes only (ranges, ip:0/0), never a client's exact address
 *   COVER_ANY             (with AFTER_FENCE) the listing read may show anything (a monitor that
 *                         lags, any policy's rule): B and C take A's live hold at any moment
 *   TRUST_X               variant: the taker adds no entry of its own and records no fence: X's
 *                         entry is all that cuts a1
 *   OWN_UNRECORDED        variant: the taker adds its own entry but does not record the fence in
 *                         the claim, so nobody renews it
 *   TAKE_NO_RENEW_OWN     variant: the takeover's own new fence is not renewed before its
 *                         compare-and-set (F6's renewal covers the record's older fences only)
 */

#ifndef LIFE
#define LIFE 4          /* ticks an entry lasts after it was added (fence_expiry) */
#endif
#ifndef HALF
#define HALF (LIFE / 2) /* a responsible live renewer renews before the entry is older */
#endif
#define LATE (LIFE - LIFE / 4)   /* FIX_BACKSTOP: any live agent renews before this */
#if LIFE < 2 || HALF < 1 || HALF >= LIFE
#error "0 < HALF < LIFE"
#endif
#if defined(FIX_BACKSTOP) && (LATE >= LIFE || LATE < HALF)
#error "FIX_BACKSTOP needs LIFE >= 4 (HALF <= 3/4 of LIFE < LIFE)"
#endif
#ifndef OLD_AGENT
#define OLD_AGENT 1     /* 1: A's agent may predate boot ids (chosen at the start); 0: it does not */
#endif

#define A    0
#define B    1
#define C    2
#define NONE 3          /* no holder: the record is free */
#define NM(n) ('A' + (n))

/* a node's state; st[NONE] is DOWN for good (a free record's "holder" is no one alive) */
#define UP   0          /* running, reaching the cluster */
#define CUT  1          /* frozen or cut off: does nothing; its kernel's mapping stays */
#define DOWN 2          /* dead: its kernel (and mapping) gone */

byte st[4];
bool km[4];             /* a kernel mapping of the image exists (A's: a1, the fenced one) */
bool acq[4];            /* B, C: its Acquire of its hold is done; its map may follow */
bool nobl[4];           /* NOBL: B's or C's blocklist calls fail */
byte holder;            /* the claim record's holder, NONE: free */

/* the fence of A in the record (fences[]) */
bool f_node;            /* ip:0/0, A's whole node (else a1's address) */
bool f_live;            /* not known gone */
byte f_boot;            /* the boot id recorded: A's heartbeat's at fence time (0: none shown) */
byte f_inc;             /* the incarnation in that heartbeat (only GONE_ON_NEW_HEARTBEAT reads it) */
/* its blocklist entry */
bool blk;               /* on the blocklist, in force */
byte age;               /* ticks since it was last added */

#ifdef AFTER_FENCE
/* X's entry (one at a time): none, or its address. The blocklist is Ceph's: one entry per
   address, whoever added it (SHARED_KEYS; without it every party's entries are apart) */
#define XR 1            /* a range, ip/32 (`osd blocklist range add`): a key of its own */
#define XN 2            /* A's whole node, ip:0/0 (`osd blocklist add <ip>`): a whole-node fence's key */
#define XA 3            /* a1's exact address: a client fence's key */
byte xk;
byte pend[4];           /* B, C: a takeover of A's live hold under way: 1 decided (covered as read),
                           2 its own entry added, its compare-and-set to come */
#define XCUT     (xk != 0)
#define XGONE    xk = 0
#define XNODE    (xk == XR || xk == XN)   /* A's agent's own client is cut too */
/* X's entry is the taker's fence's entry (the same address) */
#ifdef SHARED_KEYS
#define SAMEKEY  ((xk == XN && f_node) || (xk == XA && !f_node))
#else
#define SAMEKEY  0
#endif
#define PEND(n)  (pend[n] != 0)
#else
#define XCUT     0
#define XNODE    0
#define SAMEKEY  0
#define PEND(n)  0
#endif

/* A's kernel and agent, and A's heartbeat object */
byte boot;              /* A's current boot id (1, then 2 after its reboot) */
bool a_old;             /* A's agent predates boot ids and fences[]: its heartbeat has no boot id */
byte inc;               /* A's agent's incarnation (0, then 1 after its restart) */
byte hb_boot, hb_inc;   /* A's heartbeat as last written: boot id (0: none), incarnation */
bool two_unfenced_writers;
bool waived;            /* FLEET: a sweep of the pool was recorded since the last tick */

#define HB_BOOT    (a_old -> 0 : boot)
/* every client of A's hold covered, as the listing shows it now: by X's whole-node entry, or
   by its entry of a1's exact address where A's hold recorded a1 (f_node: it recorded none) */
#define LISTED     (XNODE || (xk == XA && !f_node))
#ifdef FIX_OWN_KEY
/* F10's fix: the waiver only where the taker's own entry is an address no node fencer lists
   (A's hold recorded a1: a1's exact address), and only on coverage by another entry than that */
#define OWN_OK     (!f_node && xk != XA)
#else
#define OWN_OK     1
#endif
#ifdef COVER_ANY
#define COVERED    OWN_OK
#else
#define COVERED    (LISTED && OWN_OK)
#endif
/* A's agent can reach the cluster: up, its node not cut off by a whole-node entry (the fence's,
   or X's) */
#define A_REACH    (st[A] == UP && !(f_node && blk) && !XNODE)
#define A_WRITES   (km[A] && !blk && !XCUT)
#define WRITERS    (A_WRITES + km[B] + km[C])
#define CHECK      two_unfenced_writers = (WRITERS >= 2); assert(!two_unfenced_writers)
#define WHAT       if :: f_node -> printf("A's whole node (ip:0/0)") :: else -> printf("a1's address") fi

/* n can renew: up, its blocklist calls work (A's agent: it knows fences and is not cut off) */
#define CAN(n) (st[n] == UP && !nobl[n] && ((n) != A || (!a_old && !(f_node && blk) && !XNODE)))
/* n must renew: the holder of record; or, while the record is free or its holder is not
   live, any live agent (A's too).
   RR(n): n's renew round (the holder of record; in the agent its claim check, checkClaim, and
   keepFences of the record it read); SR(n): n's sweep of the pool (any other live agent, while
   nobody renews as holder) */
#if defined(NO_RENEW)
#define RR(n) 0
#define SR(n) 0
#elif defined(HOLDER_ONLY)
#define RR(n) (holder == (n))
#define SR(n) 0
#elif defined(HOLDER_SILENT)
#define RR(n) 0
#define SR(n) (holder != (n) && st[holder] != UP)
#else
#define RR(n) (holder == (n))
#define SR(n) (holder != (n) && st[holder] != UP)
#endif
#define RESP(n) (RR(n) || SR(n))
#define FDUE (f_live && blk)
#ifdef FIX_BACKSTOP
#define BACKSTOP 1
#else
#define BACKSTOP 0
#endif
#ifdef FLEET
/* a sweep's duty (SR, and the backstop's at LATE) is waived while some node recorded a sweep
   of the pool since the last tick; the holder's renew round never is */
#define DUE_N(n) (CAN(n) && FDUE && ((RR(n) && age >= HALF) || \
                  (!waived && ((SR(n) && age >= HALF) || (BACKSTOP && age >= LATE)))))
#elif defined(FIX_BACKSTOP)
#define DUE_N(n) (CAN(n) && FDUE && (age >= LATE || (RESP(n) && age >= HALF)))
#else
#define DUE_N(n) (CAN(n) && FDUE && RESP(n) && age >= HALF)
#endif
#define DUE (DUE_N(A) || DUE_N(B) || DUE_N(C))
#if defined(FIX_BACKSTOP) && !defined(NO_RENEW)
#define MAY_RENEW(n) (CAN(n) && f_live && (!blk || age > 0) && (RESP(n) || !blk || age >= LATE))
#else
#define MAY_RENEW(n) (CAN(n) && f_live && (!blk || age > 0) && RESP(n))
#endif

#ifdef FLEET
/* what n's sweep owes the fence: a renewal due as sweeper (SR) or as backstop, or an entry that
   ran out */
#define SW_OWES(n) (f_live && ((SR(n) && (!blk || age >= HALF)) || (BACKSTOP && (!blk || age >= LATE))))
/* n may record its sweep (the "/swept" sequence in the pool's index): with FIX_SWEEP_MARK only
   once its sweep made every renewal it owed; without, also after a renewal that failed (its
   blocklist calls fail) */
#ifdef FIX_SWEEP_MARK
#define MAY_MARK(n) (!SW_OWES(n))
#else
#define MAY_MARK(n) (!SW_OWES(n) || nobl[n])
#endif
#define MARK(n) \
  waived = 1; \
  printf("%c: sweeps the pool and records it: the others skip theirs this period\n", NM(n)); \
  if :: SW_OWES(n) -> printf("%c: (though a renewal it owed FAILED)\n", NM(n)) :: else fi
#endif

/* a renewer finds the fenced node's heartbeat showing that the mapping is gone */
#define GONE_RIGHT (f_boot != 0 && hb_boot != 0 && hb_boot != f_boot)
#if defined(GONE_ON_UNKNOWN_BOOT)
#define HB_GONE (hb_boot != f_boot)
#elif defined(GONE_ON_NEW_HEARTBEAT)
#define HB_GONE (GONE_RIGHT || hb_inc != f_inc)
#else
#define HB_GONE GONE_RIGHT
#endif

#ifdef UNFENCE_UNCHECKED
#define UNFENCE_OK 1
#else
#define UNFENCE_OK (f_boot != 0 && boot != f_boot)   /* the node shows a new boot id */
#endif

/* the assumption: time passes only if B or C can renew, or neither of them is busy (a mapping,
   or a claim it may map at once) while it cannot */
#define BUSY(m)  (km[m] || acq[m])
#ifdef OUTAGES
#define ASSUMED 1
#else
#define ASSUMED (CAN(B) || CAN(C) || !((BUSY(B) && !CAN(B)) || (BUSY(C) && !CAN(C))))
#endif

#define RENEW(n) \
  printf("%c: renews the fence: re-blocklists ", NM(n)); WHAT; \
  if :: blk -> printf(" (the entry was %d old)\n", age) :: else -> printf(" (the entry had run out)\n") fi; \
  blk = 1; age = 0

#define MARK_GONE(n) \
  f_live = 0; \
  printf("%c: reads A's heartbeat (boot id %d, incarnation %d; the fence has %d, %d): marks the fence gone\n", \
         NM(n), hb_boot, hb_inc, f_boot, f_inc)

/* B and C: a holder's renew round or a pool sweep, Acquire, map, unmap, release, outages */
proctype Agent(byte n) {
end:
  do
  :: atomic { MAY_RENEW(n) -> RENEW(n) }
  :: atomic { CAN(n) && RESP(n) && f_live && HB_GONE -> MARK_GONE(n) }
  :: atomic {
       st[n] == UP && !acq[n] && !PEND(n) && (holder == n || st[holder] == DOWN) ->
#ifdef FIX_CLAIM_RENEWS
       if
       :: f_live && (!blk || age >= HALF) && nobl[n] ->
            printf("%c: Acquire refused: a due fence it cannot renew\n", NM(n)); goto refused
       :: else
       fi;
#endif
       if
       :: holder == n -> printf("%c: Acquire: its own hold again\n", NM(n))
       :: holder == NONE -> printf("%c: Acquire: claims the free record (fences kept)\n", NM(n))
       :: else -> printf("%c: Acquire: takes over from %c, dead (its mapping died with it)\n", NM(n), NM(holder))
       fi;
#ifdef FIX_CLAIM_RENEWS
       if
       :: f_live && (!blk || age >= HALF) -> printf("%c: (before its compare-and-set)\n", NM(n)); RENEW(n)
       :: else
       fi;
#endif
       holder = n; acq[n] = 1;
refused: skip
     }
  :: atomic {
       st[n] == UP && holder == n && acq[n] && !km[n] ->
       km[n] = 1; printf("%c: maps the image: its mapping writes\n", NM(n));
       CHECK
     }
  :: atomic { st[n] == UP && km[n] -> km[n] = 0; acq[n] = 0; printf("%c: unmaps the image\n", NM(n)) }
  :: atomic {
       st[n] == UP && holder == n && !km[n] ->
       holder = NONE; acq[n] = 0; printf("%c: Release: the record is free, its fences stay\n", NM(n))
     }
  :: atomic { st[n] == UP -> st[n] = CUT; printf("%c: FROZEN or cut off (its mapping: %d)\n", NM(n), km[n]) }
  :: atomic { st[n] == CUT -> st[n] = UP; printf("%c: back\n", NM(n)) }
  :: atomic {
       st[n] != DOWN ->
       st[n] = DOWN; km[n] = 0; acq[n] = 0;
#ifdef AFTER_FENCE
       pend[n] = 0;
#endif
       printf("%c: DIES (its kernel and any mapping with it)\n", NM(n))
     }
  :: atomic { st[n] == DOWN -> st[n] = UP; printf("%c: boots again: up, nothing mapped\n", NM(n)) }
#ifdef FLEET
  :: atomic { st[n] == UP && !waived && MAY_MARK(n) -> MARK(n) }
#endif
#ifdef AFTER_FENCE
  /* a takeover of A's live hold (after-fence): decide on the listing, blocklist, write */
  :: atomic {
       st[n] == UP && !acq[n] && !PEND(n) && holder == A && COVERED ->
#ifdef COVER_ANY
       printf("%c: Acquire: A holds it (alive); it takes it over whatever the listing shows", NM(n));
#else
       printf("%c: Acquire: A holds it (alive); the blocklist listing shows A's hold covered", NM(n));
#endif
       printf(" (X's entry: %d, 0 none, 1 range, 2 ip:0/0, 3 a1): no lease wait, TAKEOVER\n", xk);
#ifdef TRUST_X
       pend[n] = 2; printf("%c: (adds no entry of its own: X's covers A)\n", NM(n))
#else
       pend[n] = 1
#endif
     }
  :: atomic {
       st[n] == UP && pend[n] == 1 ->
       if
       :: nobl[n] -> pend[n] = 0; printf("%c: its blocklist call FAILS: the Acquire ends, no claim\n", NM(n))
       :: else ->
            printf("%c: blocklists A with its own entry: ", NM(n)); WHAT;
            if
            :: SAMEKEY -> printf(" (X's entry has that address: the same entry)\n")
            :: !SAMEKEY && blk -> printf(" (the entry was %d old)\n", age)
            :: else -> printf("\n")
            fi;
            blk = 1; age = 0; pend[n] = 2
       fi
     }
  :: atomic {
       st[n] == UP && pend[n] == 2 ->
       if
       :: holder != A ->
            pend[n] = 0; printf("%c: its compare-and-set fails: A's hold is no longer the record's\n", NM(n));
            goto took
       :: else
       fi;
#if defined(FIX_CLAIM_RENEWS) && !defined(TAKE_NO_RENEW_OWN) && !defined(TRUST_X) && !defined(OWN_UNRECORDED)
       /* renewDue on the record to be written: its own new fence among its fences */
       if
       :: !blk || age >= HALF ->
            if
            :: nobl[n] -> pend[n] = 0; printf("%c: Acquire refused: its new fence is due and it cannot renew it\n", NM(n)); goto took
            :: else -> printf("%c: (its new fence is due: before its compare-and-set)\n", NM(n)); RENEW(n)
            fi
       :: else
       fi;
#endif
#if defined(TRUST_X) || defined(OWN_UNRECORDED)
       printf("%c: writes epoch+1: holds it; NO fence recorded\n", NM(n));
#else
       f_live = 1;
       printf("%c: writes epoch+1: holds it; the fence of ", NM(n)); WHAT;
       printf(" recorded (boot id %d)", f_boot);
       if :: blk -> printf(", its entry %d old\n", age) :: else -> printf(", its entry RUN OUT\n") fi;
#endif
       holder = n; acq[n] = 1; pend[n] = 0;
took:  skip
     }
#endif
#ifdef NOBL
  :: atomic { !nobl[n] -> nobl[n] = 1; printf("%c: its blocklist calls FAIL from here (the rest works)\n", NM(n)) }
  :: atomic { nobl[n] -> nobl[n] = 0; printf("%c: its blocklist calls work again\n", NM(n)) }
#endif
  od
}

/* A, the fenced node: its kernel, its agent (heartbeat, gone, its own sweep) */
proctype Fenced() {
end:
  do
  :: atomic { st[A] == UP -> st[A] = CUT; printf("A: FROZEN or cut off\n") }
  :: atomic { st[A] == CUT -> st[A] = UP; printf("A: resumes (a1 mapped: %d)\n", km[A]) }
  :: atomic {
       boot == 1 ->
       boot = 2; km[A] = 0; st[A] = UP;
       printf("A: REBOOTS: a1's kernel client is gone; boot id 2\n")
     }
  :: atomic {
       st[A] == UP && inc == 0 ->
       inc = 1; a_old = 0; printf("A: its agent restarts, the same boot (an older agent is upgraded)\n")
     }
  :: atomic {
       A_REACH && (hb_boot != HB_BOOT || hb_inc != inc) ->
       hb_boot = HB_BOOT; hb_inc = inc;
       printf("A: writes its heartbeat: boot id %d, incarnation %d\n", hb_boot, hb_inc)
     }
  :: atomic { st[A] == UP && km[A] -> km[A] = 0; printf("A: a1 is unmapped (by hand): its kernel client is gone\n") }
  :: atomic {
       A_REACH && !a_old && !km[A] && f_live ->
       f_live = 0; printf("A: its agent records in the fence that the mapping is gone\n")
     }
  :: atomic { MAY_RENEW(A) -> RENEW(A) }
  :: atomic { CAN(A) && RESP(A) && f_live && HB_GONE -> MARK_GONE(A) }
#ifdef AFTER_FENCE
  :: atomic { A_REACH && holder == A && !km[A] -> holder = NONE; printf("A: releases its hold (a1 is gone)\n") }
#endif
#ifdef FLEET
  :: atomic { A_REACH && !a_old && !waived && MAY_MARK(A) -> MARK(A) }
#endif
  od
}

#ifdef AFTER_FENCE
/* X: another party's entry covering A's node, added and lifted at any moment */
proctype Third() {
end:
  do
  :: atomic {
       xk == 0 ->
       if
       :: xk = XR; printf("X: blocklists A's node: the range ip/32\n")
       :: xk = XN; printf("X: blocklists A's node: ip:0/0")
#ifndef X_NO_EXACT
       :: xk = XA; printf("X: blocklists a1's exact address")
#endif
       fi;
       if
       :: SAMEKEY && blk -> printf(" (listed already: the taker's fence; nothing added)\n")
       :: !(SAMEKEY && blk) && xk != XR -> printf("\n")
       :: else
       fi
     }
  :: atomic {
       xk != 0 ->
       printf("X: LIFTS its entry (a1 mapped: %d)", km[A]);
       if
       :: SAMEKEY && blk -> blk = 0; printf(": the same address as the taker's fence: THAT ENTRY IS REMOVED\n")
       :: else -> printf("\n")
       fi;
       xk = 0;
       CHECK
     }
  od
}
#endif

/* unfence --node A, once, at any moment (no --force) */
proctype Admin() {
end:
  atomic {
    f_node && f_live && UNFENCE_OK ->
#ifdef AFTER_FENCE
    if :: SAMEKEY -> XGONE :: else fi;   /* one entry: X's with it */
#endif
    blk = 0; f_live = 0;
    printf("admin: unfence --node A (A shows boot id %d, the fence %d): the entry removed, the fence gone\n",
           boot, f_boot);
    CHECK
  }
}

/* a tick of the fence's life: only while no live, responsible renewer is due (and within the
   assumption) */
proctype Time() {
end:
  do
  :: atomic {
       blk && !DUE && ASSUMED ->
       age++;
#ifdef FLEET
       waived = 0;
#endif
       if
       :: age == LIFE ->
#ifdef AFTER_FENCE
            if :: SAMEKEY -> XGONE; printf("time: (X's entry is that entry)\n") :: else fi;
#endif
            blk = 0; printf("time: the entry is %d old: it RUNS OUT (a1 mapped: %d)\n", age, km[A]);
            CHECK
       :: else -> printf("time: the entry is %d old\n", age)
       fi
     }
  od
}

init {
  atomic {
    st[NONE] = DOWN;
    st[A] = CUT; km[A] = 1; boot = 1;          /* A hung, a1 mapped */
    if :: a_old = 0 :: OLD_AGENT -> a_old = 1 fi;
    hb_boot = HB_BOOT; hb_inc = 0;
    if :: f_node = 0 :: f_node = 1 fi;
#ifdef AFTER_FENCE
    /* A holds the image, alive, a1 mapped and writing; no fence yet. The fence a takeover will
       record has the boot id A's hold recorded (that of a1's kernel, or none) */
    st[A] = UP; f_live = 0; f_boot = hb_boot; f_inc = hb_inc; blk = 0; age = 0;
    holder = A; st[B] = UP; st[C] = UP;
    printf("A: holds the image, alive, a1 mapped and writing; a takeover would fence ");
    WHAT; printf("\n");
    run Third();
#else
    /* B's takeover: the entry added, the fence recorded with B's claim */
    f_live = 1; f_boot = hb_boot; f_inc = hb_inc; blk = 1; age = 0;
    holder = B; acq[B] = 1; st[B] = UP; st[C] = UP;
    printf("B: TAKEOVER of A (hung, a1 mapped): blocklists "); WHAT;
    printf("; the fence recorded with boot id %d\n", f_boot);
#endif
    run Time(); run Fenced(); run Admin(); run Agent(B); run Agent(C)
  }
}

/*
 * fence.pml: the lifetime of a fence (a blocklist entry), for spin.
 *
 * rbd_owner.pml treats a blocklist entry as permanent. A real one (`osd blocklist add ADDR
 * EXPIRE`, fence_expiry) runs out: a node fenced by a takeover that stays hung or cut off for
 * longer than the entry's life gets a kernel client that can write again, beside the new
 * holder's. Other parties change the blocklist too: an operator's `osd blocklist rm` or `clear`,
 * another fencer lifting what it listed, librbd listing a client for an hour when it breaks its
 * lock. This model follows one such fence through the protocol meant to keep it in force:
 *
 *   - The fence is recorded in the image's claim record (fences[]: the fenced node, the
 *     address, the boot id of its kernel as its heartbeat showed it at fence time, the expiry as
 *     listed, gone or not). It stays there when the claim is released (the record is then free).
 *   - The blocklist is Ceph's (measured on 16.2, 18.2 and 20.2): one entry per address, whoever
 *     listed it; an add of an address not listed lists it for the whole life asked; an add of a
 *     listed address answers success and keeps the entry's expiry (it never lengthens it); a
 *     remove and an add are two map epochs, between which the address is off the blocklist.
 *   - Keeping (FIX_RECONCILE, issue 50; enforce.go): a fence not known gone is checked against
 *     the listing by the holder of record in its renew round; while nobody keeps it as holder
 *     (the record is free, or its holder is dead: its lease expired), by the sweep of the pool of
 *     any other live agent. An entry not listed is added again (listed fresh). An entry with less
 *     than 3/4 of its life left is short: a re-add (which Ceph answers with the old expiry), then
 *     a swap, a remove and an add (listed fresh), only while something else cuts the client off
 *     meanwhile: another entry for A's node (an ip:0/0 or a range, whoever listed it), or a cover
 *     the keeper lists for the swap and removes after it (2 minutes of life: for an ip:0/0 fence
 *     the range ip/32, always; for a1's address A's ip:0/0, only while A is not seen alive, its
 *     heartbeat unchanged for a lease; never A's own agent over its own node). Otherwise the entry
 *     is left as it is (reported); should it run out, the next check adds it again. Each keeper
 *     lengthens an entry at the latest at half its life. Before the hold the fence protects is
 *     written, nobody writes beside a1, and a short entry is swapped bare: a takeover whose add
 *     finds the address listed short, and an Acquire's check of the record's fences before its
 *     compare-and-set (FIX_CLAIM_RENEWS). Without FIX_RECONCILE: the keepers before issue 50,
 *     which re-blocklist each fence on the record's schedule (at half its life since the
 *     record's last renewal) and never read the listing.
 *   - Known gone (keeping ends; the entry then just runs out, and one this project listed at the
 *     fence is removed: FIX_RECONCILE): the fenced node's own agent, which can still reach the
 *     cluster when only the mapping's address was fenced, records that the mapping is gone once
 *     its device is unmapped; or a keeper reads the fenced node's heartbeat and finds a boot id
 *     other than the one in the fence (a reboot destroys every kernel client). A whole-node fence
 *     (ip:0/0) cuts the fenced node's agent too: only an admin lifts it (unfence --node, refused
 *     unless the node shows a new boot id, or --force; the admin learns it from the node itself,
 *     whose heartbeat cannot reach the cluster).
 *
 * Nodes: A (0), the fenced node: it held the image and its mapping a1 is still there; B (1),
 * whose takeover made the fence (the initial state); C (2), a third agent. A may be frozen or
 * cut off for any time and resume with a1 still mapped, reboot once (a1 gone, boot id 2), have
 * its agent restart once (the same boot; an agent of a version before boot ids is upgraded), and
 * have a1 unmapped by hand. B and C are alike: each may map (after an Acquire) and unmap,
 * release, claim the free record or take over a dead holder (whose mapping died with it), be
 * frozen or cut off (its mapping stays and counts as a writer) and come back, die and boot
 * again without a mapping. An admin may unfence A's node once (without --force). With REMOVALS,
 * PRELIST or SHORTEN a third party R acts on the blocklist (below).
 *
 * Time is counted in ticks of the fence's life (LIFE ticks; HALF = half of it): age is the time
 * since the entry was listed fresh (a re-add does not change it); at LIFE it has run out (off
 * the blocklist). A tick passes unless a keeper is due: one that is live (up, its calls
 * succeed), responsible (as above), finds the fence not known gone, and may lengthen its entry
 * (or, without FIX_RECONCILE, finds the record's last renewal at least HALF old), its entry at
 * least HALF old; or one in the middle of a swap. A keeper that is cut off, dead, not
 * responsible, or may not lengthen the entry does not hold time back. The margin from HALF to
 * LIFE is what covers the sweep period, the lease a sweeper waits before it judges a holder
 * dead, failed calls retried and clocks apart (keepers read an expiry another node wrote): each
 * well under half a life (3.5 days by default). A keeper's blocklist calls and its record write
 * are one step, but for a swap's remove and add, which are two. Everything else is untimed: any
 * step at any moment.
 *
 * Checked: never two unfenced writers (two_unfenced_writers): a mapping writes while its kernel
 * client exists, it is not unmapped and no entry cuts it (a1: its fence's entry, a keeper's
 * cover, X's entry below; B's and C's mappings are never fenced here). A frozen or cut-off
 * node's mapping counts (it writes as soon as it resumes). Asserted where a writer can appear:
 * the entry running out, a map, a swap's remove, a cover removed or lapsing, the admin's unfence,
 * a gone fence's entry removed, R's removal, and (AFTER_FENCE, below) a third party's lift. One
 * window is not counted: from R's removal of an entry that cut a1 to the next check that could
 * put it back (a keeper's add or check), or the next tick while B's or C's mapping runs. No
 * protocol closes that window (the removal is R's); the checks ask that the keepers close it
 * within a round (a tick is far longer), and open none of their own.
 *
 * Assumptions (dropping them makes the checks fences-all-out, alive-expiry, swap-cover-lapses,
 * swap-stalls and swap-after-claim fail: the limits of the protocol):
 *   - (OUTAGES drops it) while B or C holds a mapping or a claim it may map at once and cannot
 *     renew (cut off, or its blocklist calls fail), the other can, or less than a tick passes:
 *     some keeper reaches the cluster within the margin. Without it no keeping holds any
 *     expiring fence in force.
 *   - (ALIVE_LAPSE drops it; FIX_RECONCILE) A's agent does not reach the cluster in the second
 *     half of the life of an entry listed whole while its fence is live and a1 mapped: fence_expiry
 *     (10 years by default) is at least twice as long as a fenced node's agent runs beside a
 *     fenced mapping. While it runs, a1's entry may not be lengthened (A is seen alive, and its
 *     own agent has no cover), and its sweeps waive the others' (FLEET).
 *   - (COVER_RACES, SWAP_STALLS and CLAIM_RACES drop its parts; FIX_RECONCILE) a swap is short:
 *     a keeper's read of the listing and its remove are one step, and from its remove to its add
 *     nobody but R removes an entry that cuts a1 (X does not lift its entry, covers do not
 *     lapse) and no tick passes; the keeper does not die there, and a call that fails there is
 *     retried until it works (its cover lives 2 minutes); an Acquire's decision to remove and add
 *     an entry before its claim and that remove are one step, and a taker removes the entry only
 *     while the record still names the hold it read.
 *
 * Switches ("renew" is, with FIX_RECONCILE, a keeper's check as above):
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
 *                         sweep duties (SR, the backstop) of every other agent until the next tick
 *                         (a tick is a quarter of the fence's life: two sweep periods of
 *                         fence_expiry/8); the recorder sweeps again at its next due time (its own
 *                         record is its last look), and the holder's renew round is never waived.
 *                         Without FIX_SWEEP_MARK a sweep is recorded even when a renewal it owed
 *                         failed (its blocklist calls fail)
 *   FIX_SWEEP_MARK        (with FLEET) a sweep is recorded only once it made every renewal it owed
 *   FIX_SWEEP_SHORT       (with FIX_SWEEP_MARK, FIX_RECONCILE) nor once it left an entry short that
 *                         it could not lengthen (its node seen alive): the others sweep at their
 *                         next look (daemon/sweep.go)
 *   FIX_SWAP_MARK         (with CLAIM_RACES) an Acquire's decision to remove an entry before its
 *                         claim writes a swap mark into the record (claim/swapmark.go); no other
 *                         Acquire claims while it is there; it goes with the marker's claim or
 *                         failure, or lapses once the marker no longer acts under it
 *   HOLDER_SILENT         the holder of record never renews in its renew round: its claim check
 *                         (what feeds keepFences the record) never comes (no notice, the slow check
 *                         not yet due); its Acquire, its sweeps and its other calls work
 *   FIX_RECONCILE         issue 50's keepers (above): each check reads the listing, adds a missing
 *                         entry again, and swaps a short one under a cover; a takeover whose add
 *                         finds the address listed short, and an Acquire whose check finds the
 *                         entry HALF old or more, remove and add it before the claim; a gone
 *                         fence's entry that this project listed is removed (not an ip:0/0)
 *   LENGTHENS             an add of a listed address starts its life again (not Ceph: the
 *                         premise of this model before issue 50; variant (ak) only)
 *   REMOVALS              R removes the fence's entry (`osd blocklist rm`, another fencer's
 *                         unfence) or every entry (`osd blocklist clear`: the keepers' cover and
 *                         X's entry too) at any moment, any number of times
 *   PRELIST               the fence's address is listed already before the fence, by someone
 *                         else, for less than a fence's life (1 to LIFE-1 ticks old: librbd's
 *                         lock break lists a client for an hour, an operator, an older agent's
 *                         7-day fence); with AFTER_FENCE R lists it once, at any moment before a
 *                         taker adds its own entry
 *   SHORTEN               R replaces the fence's entry by one with less than a tick left, at any
 *                         moment (`rm`, then `add` for an hour): the limit alive-short
 *   BARE_SWAP             variant: a keeper removes and adds a short entry with no cover
 *   TAKE_KEEPS_SHORT      variant: a takeover records the fence of an address listed short
 *                         before it without removing and adding it first
 *   ALIVE_LAPSE, COVER_RACES, SWAP_STALLS, CLAIM_RACES: drop the assumptions above
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
 *              takeover (a failed call ends the Acquire: no claim); with FIX_RECONCILE an address
 *              it finds listed short is removed and added again here, before its claim;
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
#define LIFE 4          /* ticks an entry lasts after it was listed fresh (fence_expiry) */
#endif
#ifndef HALF
#define HALF (LIFE / 2) /* a responsible live keeper renews before the entry is older */
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
byte rage;              /* without FIX_RECONCILE: ticks since the record's last renewal, the old
                           keepers' schedule (they never read the listing) */
bool made;              /* FIX_RECONCILE: the fence records that this project listed its entry (the
                           address was not listed at the fence), and nobody has lifted it since
                           (B's takeover only: not followed with AFTER_FENCE) */
/* the blocklist entry of the fence's address: one entry per address, whoever listed it */
bool blk;               /* listed, in force */
byte age;               /* ticks since it was listed fresh; at LIFE it runs out */
bool whole;             /* listed fresh by an add of an address not listed (a whole life from
                           then); else listed short by someone else (R: PRELIST, SHORTEN) */
/* FIX_RECONCILE: the keepers' covers and swaps */
bool cov;               /* a keeper's cover of A's node (ip:0/0 over a1's fence, the range ip/32
                           over an ip:0/0 fence): one entry whoever listed it; 2 minutes of life */
byte sw[3];             /* keeper n's swap: 1 decided, a cover seen or listed (COVER_RACES: its
                           remove to come), 2 its entry removed (its add to come) */
bool mine[3];           /* n listed the cover for its swap (it removes it after its add) */
byte pre[3];            /* B, C: an Acquire's swap before its claim (swapBare): 1 decided
                           (CLAIM_RACES: its remove to come), 2 its entry removed (its add and its
                           compare-and-set to come) */
#ifdef FIX_SWAP_MARK
byte smark;             /* the record's swap mark (claim/swapmark.go): 0 none, else its marker
                           n + 1, written with the decision to remove (a compare-and-set on the
                           record decided on); no other Acquire claims while it is there */
#define MARK_LETS(n) (smark == 0 || smark == (n) + 1)
#define MARK_DROP(n) if :: smark == (n) + 1 -> smark = 0 :: else fi
#else
#define MARK_LETS(n) 1
#define MARK_DROP(n) skip
#endif
bool xgap;              /* REMOVALS: R removed an entry that cut a1, and no keeper has checked or
                           added since: a1's writes are not counted meanwhile */
bool prel;              /* AFTER_FENCE, PRELIST: R listed the fence's address before the fence */

#ifdef AFTER_FENCE
/* X's entry (one at a time): none, or its address. The blocklist is Ceph's: one entry per
   address, whoever added it (SHARED_KEYS; without it every party's entries are apart) */
#define XR 1            /* a range, ip/32 (`osd blocklist range add`): a key of its own */
#define XN 2            /* A's whole node, ip:0/0 (`osd blocklist add <ip>`): a whole-node fence's key */
#define XA 3            /* a1's exact address: a client fence's key */
byte xk;
byte pend[4];           /* B, C: a takeover of A's live hold under way: 1 decided (covered as read),
                           2 its own entry added, its compare-and-set to come; FIX_RECONCILE: 5
                           its add found the address listed short (CLAIM_RACES: its remove to
                           come), 6 removed, its add to come */
#define XCUT     (xk != 0)
#define XGONE    xk = 0
#define XNODE    (xk == XR || xk == XN)   /* A's agent's own client is cut too */
/* X's entry is the taker's fence's entry (the same address) */
#ifdef SHARED_KEYS
#define SAMEKEY  ((xk == XN && f_node) || (xk == XA && !f_node))
/* X's entry is the keepers' cover (the same address) */
#define COVKEY   (cov && ((xk == XN && !f_node) || (xk == XR && f_node)))
#else
#define SAMEKEY  0
#define COVKEY   0
#endif
#define PEND(n)  (pend[n] != 0)
/* the entries other than the fence's own that cut its client (coveringNode): for a1, an entry
   of A's node (X's range or ip:0/0, or a keeper's cover); for A's ip:0/0, a range */
#define OTHER_COVER (cov || (f_node && xk == XR) || (!f_node && XNODE))
#else
#define XCUT     0
#define XGONE    skip
#define XNODE    0
#define SAMEKEY  0
#define COVKEY   0
#define PEND(n)  0
#define OTHER_COVER cov
#endif

/* A's kernel and agent, and A's heartbeat object */
byte boot;              /* A's current boot id (1, then 2 after its reboot) */
bool a_old;             /* A's agent predates boot ids and fences[]: its heartbeat has no boot id */
byte inc;               /* A's agent's incarnation (0, then 1 after its restart) */
byte hb_boot, hb_inc;   /* A's heartbeat as last written: boot id (0: none), incarnation */
bool two_unfenced_writers;
byte waived;            /* FLEET: a sweep of the pool was recorded since the last tick: by node
                           waived-1 (0: none) */

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
   X's, or a keeper's cover). Its heartbeat then goes on: the keepers see A alive */
#define A_REACH    (st[A] == UP && !(f_node && blk) && !XNODE && !cov)
/* the keepers see A alive (fencedNode): its agent reaches the cluster, so its heartbeat goes on;
   not once its agent is another incarnation than the fence recorded (a fence with a boot id has
   the incarnation too): another agent says nothing of a1's kernel, and its silence goes on */
#define SEEN_ALIVE (A_REACH && !(f_boot != 0 && inc != f_inc))
/* a1 is cut off: by its fence's entry, a keeper's cover of A's node, or X's entry */
#define A1_CUT     (blk || cov || XCUT)
/* a1 writes; while R's removal is excused (xgap) it is not counted */
#define A_WRITES   (km[A] && !A1_CUT && !xgap)
#define WRITERS    (A_WRITES + km[B] + km[C])
#define CHECK      two_unfenced_writers = (WRITERS >= 2); assert(!two_unfenced_writers)
#define WHAT       if :: f_node -> printf("A's whole node (ip:0/0)") :: else -> printf("a1's address") fi

/* n can renew: up, its blocklist calls work (A's agent: it knows fences and is not cut off) */
#define CAN(n) (st[n] == UP && !nobl[n] && ((n) != A || (!a_old && !(f_node && blk) && !XNODE && !cov)))
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
#if defined(FIX_BACKSTOP) && !defined(NO_RENEW)
#define BACKSTOP 1
#else
#define BACKSTOP 0
#endif
#ifdef FLEET
#define WAIVED(n) (waived != 0 && waived != (n) + 1)
#else
#define WAIVED(n) 0
#endif
/* n is due at an entry (or a record) a old: as holder at HALF; as sweeper at HALF, and by F7's
   backstop at LATE, unless FLEET's waiver holds; the holder's renew round is never waived */
#define DUEAT(n, a) ((RR(n) && (a) >= HALF) || (!WAIVED(n) && ((SR(n) && (a) >= HALF) || (BACKSTOP && (a) >= LATE))))

#ifdef FIX_RECONCILE
/* n may lengthen a short entry: under another entry that cuts the same client, or under a
   cover of its own: a range over an ip:0/0 fence whatever A is, ip:0/0 over a1's fence only
   while A is not seen alive; never by A's own agent (its own node) */
#ifdef BARE_SWAP
#define LENGTHENABLE(n) 1
#else
#define LENGTHENABLE(n) (OTHER_COVER || ((n) != A && (f_node || !SEEN_ALIVE)))
#endif
/* n checks the fence (its renew round, its sweep, the backstop): something to do */
#if BACKSTOP
#define CHK_RESP(n) (RESP(n) || !blk || age >= LATE)
#else
#define CHK_RESP(n) RESP(n)
#endif
#define MAY_CHECK(n) (CAN(n) && f_live && sw[n] == 0 && CHK_RESP(n) && (!blk || (age > 0 && LENGTHENABLE(n))))
/* n is due (time waits for it): a swap under way, an entry R removed (the check comes within a
   round or a sweep, far less than a tick), a short entry it may lengthen by its deadline */
#define DUE_N(n) (CAN(n) && f_live && (sw[n] != 0 || (!blk && xgap && DUEAT(n, LIFE)) || \
                  (blk && age > 0 && LENGTHENABLE(n) && DUEAT(n, age))))
#else
/* the entry is known to have run out: by the record's expiry (the old keepers never read the
   listing; a removal they do not see) */
#ifdef REMOVALS
#define OFF (!blk && rage >= LIFE)
#else
#define OFF (!blk)
#endif
#define DUE_N(n) (CAN(n) && f_live && (blk || xgap) && DUEAT(n, rage))
#if BACKSTOP
#define MAY_RENEW(n) (CAN(n) && f_live && (OFF || rage > 0) && (RESP(n) || OFF || rage >= LATE))
#else
#define MAY_RENEW(n) (CAN(n) && f_live && (OFF || rage > 0) && RESP(n))
#endif
#endif
#define DUE (DUE_N(A) || DUE_N(B) || DUE_N(C))

#ifdef FLEET
/* what n's sweep owes the fence: a check due as sweeper (SR) or as backstop (an entry missing,
   or short and one it may lengthen; one of a node seen alive is reported, which is all the
   sweep can do) */
#ifdef FIX_RECONCILE
#define SW_OWES(n) (f_live && ((SR(n) && (!blk || (age >= HALF && LENGTHENABLE(n)))) || \
                               (BACKSTOP && (!blk || (age >= LATE && LENGTHENABLE(n))))))
#else
#define SW_OWES(n) (f_live && ((SR(n) && (OFF || rage >= HALF)) || (BACKSTOP && (OFF || rage >= LATE))))
#endif
/* n may record its sweep (the "/swept" sequence in the pool's index): with FIX_SWEEP_MARK only
   once its sweep made every renewal it owed; without, also after a renewal that failed (its
   blocklist calls fail) */
#if defined(FIX_SWEEP_MARK) && defined(FIX_RECONCILE) && defined(FIX_SWEEP_SHORT)
/* FIX_SWEEP_SHORT: nor once it left an entry short that it could not lengthen (its node seen
   alive; daemon/sweep.go): the others sweep at their next look */
#define SW_LEFT(n) (f_live && blk && age >= HALF && !LENGTHENABLE(n) && (SR(n) || BACKSTOP))
#define MAY_MARK(n) (!SW_OWES(n) && !SW_LEFT(n))
#elif defined(FIX_SWEEP_MARK)
#define MAY_MARK(n) (!SW_OWES(n))
#else
#define MAY_MARK(n) (!SW_OWES(n) || nobl[n])
#endif
#define MARK(n) \
  waived = (n) + 1; \
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

/* the assumption (ALIVE_LAPSE drops it): A's agent does not reach the cluster in the second half
   of the life of an entry listed whole, while its fence is live and a1 mapped: no tick passes
   while it does, and nothing makes it so (A resuming, X lifting its node entry, a cover lapsing).
   While A is seen alive no keeper may lengthen a1's entry (no cover of a node seen alive), A's own
   agent never can (no cover of its own node), and a sweep recorded then waives the others'
   (FLEET); once A is not, the keepers need the margin from HALF to LIFE, as for any renewal. So
   fence_expiry (10 years by default) is taken to be at least twice as long as a fenced node's agent
   runs beside a fenced mapping */
#define OLD_LIVE   (blk && whole && age >= HALF && f_live && km[A])
#if defined(FIX_RECONCILE) && !defined(ALIVE_LAPSE)
#define ALIVE_OK   (!(OLD_LIVE && A_REACH))
#define ANEW_OK    (!OLD_LIVE)
#else
#define ALIVE_OK   1
#define ANEW_OK    1
#endif

/* the assumption that a swap is short (COVER_RACES, SWAP_STALLS and CLAIM_RACES drop its parts):
   - between a keeper's read of the listing and its remove nothing happens (one step), and while
     its entry is off nobody but R removes an entry that cuts a1 (X does not lift its entry);
     COVER_RACES: read and remove are two steps, anything may happen between them, and X lifts
     and keepers remove their covers (the same entry whoever listed it) at any moment;
   - a keeper does not stop between its remove and its add for longer than its cover lives (2
     minutes): it does not die there, and a call that fails there is retried until it works;
     SWAP_STALLS: it may die there or its calls fail, and its cover then lapses;
   - an Acquire's decision to remove and add an entry before its claim and that remove are one
     step (no other claim is written between them); CLAIM_RACES: two steps */
#define SWAPPING   (sw[A] != 0 || sw[B] != 0 || sw[C] != 0)
#ifdef COVER_RACES
#define X_MAY_LIFT 1
#define SW_DECIDED 1    /* the swap's state after its read: its remove to come */
#else
#define X_MAY_LIFT (!SWAPPING)
#define SW_DECIDED 2    /* removed in the same step */
#endif
#ifdef SWAP_STALLS
#define STALLS 1
#define SWAP_TIME 1
#else
#define STALLS 0
#define SWAP_TIME (!SWAPPING)   /* no tick passes during a swap (it takes seconds) */
#endif
/* a cover lapses (2 minutes after it was listed) once no keeper that listed it swaps, or (SWAP_STALLS)
   once every such keeper has stopped or its calls fail */
#define WORKS(k)   (!STALLS || (st[k] == UP && !nobl[k]))
#define LISTS(k)   (mine[k] && sw[k] != 0 && WORKS(k))
#define COVER_MAY_LAPSE (!(LISTS(A) || LISTS(B) || LISTS(C)))
#ifdef CLAIM_RACES
#define PRE_DECIDED 1
#define PEND_SWAP   5
#else
#define PRE_DECIDED 2
#define PEND_SWAP   6
#endif
/* a taker's add would find the address listed short and remove it: under the assumption only
   while the record still names A's hold, as the taker read it */
#if defined(FIX_RECONCILE) && !defined(TAKE_KEEPS_SHORT) && !defined(LENGTHENS) && !defined(CLAIM_RACES)
#define TAKE_SWAPS (!nobl[n] && !SAMEKEY && blk && age > 0)
#else
#define TAKE_SWAPS 0
#endif

/* an add of the fence's address: an address not listed is listed fresh, for a whole life; a
   listed one keeps its expiry (Ceph), or with LENGTHENS starts a whole life again */
#ifdef LENGTHENS
#define READD  age = 0; whole = 1
#define READD_SAYS " (the entry was %d old: its life starts again)\n"
#else
#define READD  skip
#define READD_SAYS " (the entry is %d old: IT KEEPS ITS EXPIRY)\n"
#endif
#define ADD    if :: !blk -> blk = 1; age = 0; whole = 1 :: else -> READD fi

/* a keeper's check of the listing, or an add of the protocol: R's removal is excused no longer
   (a CHECK follows in the same step) */
#define KEEPER xgap = 0

#ifndef FIX_RECONCILE
/* the renewal as it was: the fence re-blocklisted and the new expiry recorded, on the record's
   schedule (the listing is never read) */
#define RENEW(n) \
  KEEPER; printf("%c: renews the fence: re-blocklists ", NM(n)); WHAT; \
  if :: blk -> printf(READD_SAYS, age) :: else -> printf(" (not listed: listed fresh)\n") fi; \
  ADD; rage = 0; CHECK
#endif

#define MARK_GONE(n) \
  f_live = 0; \
  printf("%c: reads A's heartbeat (boot id %d, incarnation %d; the fence has %d, %d): marks the fence gone\n", \
         NM(n), hb_boot, hb_inc, f_boot, f_inc)

#ifdef FIX_RECONCILE
/* n's check of the fence against the listing (ensure): an entry not listed is added again; a
   short one (less than 3/4 of its life left) is re-added, which Ceph answers with its old
   expiry, and then removed and added again under an entry that cuts the same client: another
   one listed, or a cover n lists for the swap */
inline check_fence(n) {
  KEEPER;
  if
  :: !blk ->
       printf("%c: checks the fence against the listing: NOT LISTED: adds ", NM(n)); WHAT;
       printf(" again (listed fresh)\n");
       ADD
  :: else ->
       printf("%c: checks the fence: its entry is %d old, short; a re-add", NM(n), age);
#ifdef LENGTHENS
       printf(" lengthens it\n"); READD
#else
       printf(" keeps its expiry; ");
       if
       :: OTHER_COVER ->
            printf("another entry cuts the same client (a keeper's cover %d", cov);
#ifdef AFTER_FENCE
            printf(", X's entry %d", xk);
#endif
            printf("): it removes and adds it again under that\n")
#ifdef BARE_SWAP
       :: else -> printf("it removes and adds it again with NO cover\n")
#else
       :: else ->
            mine[n] = 1; cov = 1;
            printf("it lists a cover of A's node for the swap (");
            if :: f_node -> printf("the range ip/32") :: else -> printf("ip:0/0: A not seen alive") fi;
            printf(")\n")
#endif
       fi;
       sw[n] = SW_DECIDED;
       if
       :: sw[n] == 2 -> blk = 0; printf("%c: REMOVES the fence's entry, to add it again (a1 cut by a cover: %d)\n", NM(n), A1_CUT)
       :: else
       fi
#endif
  fi;
  CHECK
}

/* the remove of n's swap */
inline swap_rm(n) {
  if
  :: STALLS && nobl[n] ->
       sw[n] = 0; mine[n] = 0;
       printf("%c: its remove FAILS: the swap ends (its cover lapses in 2 minutes)\n", NM(n))
  :: else ->
       blk = 0; sw[n] = 2;
       printf("%c: REMOVES the fence's entry, to add it again (a1 cut by a cover: %d)\n", NM(n), A1_CUT)
  fi;
  CHECK
}

/* the add of n's swap, then the removal of its cover */
inline swap_add(n) {
  if
  :: STALLS && nobl[n] ->
       sw[n] = 0; mine[n] = 0;
       printf("%c: its add FAILS, and once more: the entry stays off until a check adds it (its cover lapses in 2 minutes)\n", NM(n))
  :: else ->
       KEEPER;
       printf("%c: adds it again: ", NM(n));
       if :: blk -> printf("listed already (put back by another), %d old\n", age) :: else -> printf("listed for a whole life\n") fi;
       ADD; sw[n] = 0;
       if
       :: mine[n] ->
            if :: COVKEY -> XGONE; printf("%c: (X's entry is that address: removed with it)\n", NM(n)) :: else fi;
            cov = 0; printf("%c: removes its cover\n", NM(n))
       :: else
       fi;
       mine[n] = 0
  fi;
  CHECK
}

/* a gone fence's entry that this project listed is removed (not an ip:0/0: unfence --node) */
inline lift_gone(n) {
  blk = 0; made = 0;
  printf("%c: the fence is gone: removes the entry this project listed for it\n", NM(n));
  CHECK
}
#define LIFT_DUE (made && !f_live && blk && !f_node)
#endif

/* B and C: a holder's renew round or a pool sweep, Acquire, map, unmap, release, outages */
proctype Agent(byte n) {
end:
  do
#ifdef FIX_RECONCILE
  :: atomic { MAY_CHECK(n) -> check_fence(n) }
  :: atomic { sw[n] == 1 && (CAN(n) || (STALLS && st[n] == UP)) -> swap_rm(n) }
  :: atomic { sw[n] == 2 && (CAN(n) || (STALLS && st[n] == UP)) -> swap_add(n) }
  :: atomic { CAN(n) && LIFT_DUE -> lift_gone(n) }
#else
  :: atomic { MAY_RENEW(n) -> RENEW(n) }
#endif
  :: atomic { CAN(n) && RESP(n) && f_live && HB_GONE -> MARK_GONE(n) }
  :: atomic {
       st[n] == UP && !acq[n] && !PEND(n) && pre[n] == 0 && MARK_LETS(n) && (holder == n || st[holder] == DOWN) ->
#ifdef FIX_CLAIM_RENEWS
       if
#ifdef FIX_RECONCILE
       :: f_live && (!blk || age >= HALF) && nobl[n] ->
#else
       :: f_live && (OFF || rage >= HALF) && nobl[n] ->
#endif
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
#ifdef FIX_RECONCILE
       /* renewDue, before its compare-and-set: an entry missing, or HALF old or more (one this
          node checked within half a round is not checked again) */
       if
       :: f_live && !blk -> printf("%c: (before its compare-and-set)\n", NM(n)); check_fence(n)
       :: f_live && blk && age >= HALF ->
            printf("%c: (before its compare-and-set) its entry is %d old: a re-add keeps its expiry; no hold written yet, so it removes and adds it again\n", NM(n), age);
#ifdef LENGTHENS
            READD
#else
            pre[n] = PRE_DECIDED;
#ifdef FIX_SWAP_MARK
            smark = n + 1; printf("%c: writes its swap mark into the record first\n", NM(n));
#endif
            if
            :: pre[n] == 2 -> blk = 0; printf("%c: REMOVES the fence's entry, before its claim\n", NM(n)); CHECK
            :: else
            fi;
            goto refused
#endif
       :: else
       fi;
#else
       if
       :: f_live && (OFF || rage >= HALF) -> printf("%c: (before its compare-and-set)\n", NM(n)); RENEW(n)
       :: else
       fi;
#endif
#endif
       holder = n; acq[n] = 1;
refused: skip
     }
#ifdef FIX_RECONCILE
  /* the Acquire's swap before its claim (swapBare), then its compare-and-set */
  :: atomic {
       st[n] == UP && pre[n] == 1 ->
       if
       :: nobl[n] -> pre[n] = 0; MARK_DROP(n); printf("%c: its remove FAILS: no claim\n", NM(n))
       :: else -> blk = 0; pre[n] = 2; printf("%c: REMOVES the fence's entry, before its claim\n", NM(n))
       fi;
       CHECK
     }
  :: atomic {
       st[n] == UP && pre[n] == 2 ->
       if
       :: nobl[n] -> printf("%c: its add FAILS: no claim; the entry stays off until a check adds it\n", NM(n))
       :: else ->
            KEEPER; ADD; printf("%c: adds it again: listed for a whole life\n", NM(n));
            if
            :: holder == n || st[holder] == DOWN -> holder = n; acq[n] = 1; printf("%c: writes its claim\n", NM(n))
            :: else -> printf("%c: its compare-and-set fails: the record changed\n", NM(n))
            fi
       fi;
       pre[n] = 0; MARK_DROP(n);
       CHECK
     }
#endif
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
       st[n] != DOWN && (STALLS || sw[n] != 2) ->
       st[n] = DOWN; km[n] = 0; acq[n] = 0; sw[n] = 0; mine[n] = 0; pre[n] = 0;
#ifdef AFTER_FENCE
       pend[n] = 0;
#endif
       printf("%c: DIES (its kernel and any mapping with it)\n", NM(n))
     }
  :: atomic { st[n] == DOWN -> st[n] = UP; printf("%c: boots again: up, nothing mapped\n", NM(n)) }
#ifdef FIX_SWAP_MARK
  /* a mark its marker no longer acts under (it stopped, or its Acquire ended) lapses: the others
     honour it for 2 minutes from their first sight; the marker removes only in the first of them */
  :: atomic { smark == n + 1 && pre[n] == 0 -> smark = 0; printf("%c's swap mark lapses\n", NM(n)) }
#endif
#ifdef FLEET
  :: atomic { st[n] == UP && waived == 0 && MAY_MARK(n) -> MARK(n) }
#endif
#ifdef AFTER_FENCE
  /* a takeover of A's live hold (after-fence): decide on the listing, blocklist, write */
  :: atomic {
       st[n] == UP && !acq[n] && !PEND(n) && pre[n] == 0 && MARK_LETS(n) && holder == A && COVERED ->
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
       st[n] == UP && pend[n] == 1 && (holder == A || !TAKE_SWAPS) ->
       if
       :: nobl[n] -> pend[n] = 0; printf("%c: its blocklist call FAILS: the Acquire ends, no claim\n", NM(n))
       :: else ->
            KEEPER;
            printf("%c: blocklists A with its own entry: ", NM(n)); WHAT;
            pend[n] = 2;
            if
            :: SAMEKEY -> printf(" (X's entry has that address: the same entry)\n"); blk = 1; age = 0; whole = 1
            :: !SAMEKEY && blk ->
                 printf(READD_SAYS, age); READD;
#if defined(FIX_RECONCILE) && !defined(TAKE_KEEPS_SHORT)
                 if
                 :: age > 0 ->
                      printf("%c: listed short, before its claim: it removes and adds it again\n", NM(n));
                      pend[n] = PEND_SWAP;
                      if :: pend[n] == 6 -> blk = 0; printf("%c: REMOVES the entry, before its claim\n", NM(n)) :: else fi
                 :: else
                 fi
#endif
            :: else -> printf("\n"); ADD
            fi;
            rage = 0
       fi;
       CHECK
     }
#ifdef FIX_RECONCILE
  :: atomic {
       st[n] == UP && pend[n] == 5 ->
       if
       :: nobl[n] -> pend[n] = 0; printf("%c: its remove FAILS: the Acquire ends, no claim\n", NM(n))
       :: else -> blk = 0; pend[n] = 6; printf("%c: REMOVES the entry, before its claim\n", NM(n))
       fi;
       CHECK
     }
  :: atomic {
       st[n] == UP && pend[n] == 6 ->
       if
       :: nobl[n] -> pend[n] = 0; printf("%c: its add FAILS: the Acquire ends, no claim\n", NM(n))
       :: else -> KEEPER; ADD; pend[n] = 2; printf("%c: adds it again: listed for a whole life\n", NM(n))
       fi;
       CHECK
     }
#endif
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
#ifdef FIX_RECONCILE
       if
       :: !blk || age >= HALF ->
            if
            :: nobl[n] -> pend[n] = 0; printf("%c: Acquire refused: its new fence is due and it cannot renew it\n", NM(n)); goto took
            :: !blk -> printf("%c: (its new fence is due: before its compare-and-set)\n", NM(n)); check_fence(n)
            :: else ->
                 printf("%c: (its new fence is %d old, before its compare-and-set: it removes and adds it again)\n", NM(n), age);
                 pend[n] = PEND_SWAP;
                 if :: pend[n] == 6 -> blk = 0; printf("%c: REMOVES the entry, before its claim\n", NM(n)) :: else fi;
                 CHECK;
                 goto took
            fi
       :: else
       fi;
#else
       if
       :: OFF || rage >= HALF ->
            if
            :: nobl[n] -> pend[n] = 0; printf("%c: Acquire refused: its new fence is due and it cannot renew it\n", NM(n)); goto took
            :: else -> printf("%c: (its new fence is due: before its compare-and-set)\n", NM(n)); RENEW(n)
            fi
       :: else
       fi;
#endif
#endif
#if defined(TRUST_X) || defined(OWN_UNRECORDED)
       printf("%c: writes epoch+1: holds it; NO fence recorded\n", NM(n));
#else
       f_live = 1;
       printf("%c: writes epoch+1: holds it; the fence of ", NM(n)); WHAT;
       printf(" recorded (boot id %d)", f_boot);
       if :: blk -> printf(", its entry %d old\n", age) :: else -> printf(", its entry NOT LISTED\n") fi;
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
  :: atomic {
       st[A] == CUT && (ANEW_OK || (f_node && blk) || XNODE || cov) ->
       st[A] = UP; printf("A: resumes (a1 mapped: %d)\n", km[A])
     }
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
#ifdef FIX_RECONCILE
  /* A's agent checks its own fence when it must (a sweep): it puts a missing entry back; it never
     lengthens one (no cover of its own node; any other cover cuts its own client too) */
  :: atomic { MAY_CHECK(A) -> check_fence(A) }
  :: atomic { CAN(A) && LIFT_DUE -> lift_gone(A) }
#else
  :: atomic { MAY_RENEW(A) -> RENEW(A) }
#endif
  :: atomic { CAN(A) && RESP(A) && f_live && HB_GONE -> MARK_GONE(A) }
#ifdef AFTER_FENCE
  :: atomic { A_REACH && holder == A && !km[A] -> holder = NONE; printf("A: releases its hold (a1 is gone)\n") }
#endif
#ifdef FLEET
  :: atomic { A_REACH && !a_old && waived == 0 && MAY_MARK(A) -> MARK(A) }
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
       :: xk = XR; printf("X: blocklists A's node: the range ip/32")
       :: xk = XN; printf("X: blocklists A's node: ip:0/0")
#ifndef X_NO_EXACT
       :: xk = XA; printf("X: blocklists a1's exact address")
#endif
       fi;
       if
       :: SAMEKEY && blk -> printf(" (listed already: the taker's fence; nothing added)\n")
       :: COVKEY -> printf(" (listed already: a keeper's cover; nothing added)\n")
       :: else -> printf("\n")
       fi
     }
  :: atomic {
       xk != 0 && X_MAY_LIFT && (ANEW_OK || st[A] != UP || (f_node && blk) || cov || !XNODE) ->
       printf("X: LIFTS its entry (a1 mapped: %d)", km[A]);
       if
       :: SAMEKEY && blk -> blk = 0; printf(": the same address as the taker's fence: THAT ENTRY IS REMOVED\n")
       :: COVKEY -> cov = 0; printf(": the same address as a keeper's cover: THE COVER IS REMOVED\n")
       :: else -> printf("\n")
       fi;
       xk = 0;
       CHECK
     }
  od
}
#endif

#if defined(REMOVALS) || defined(SHORTEN) || (defined(PRELIST) && defined(AFTER_FENCE))
#define RPROC
#endif
#ifdef RPROC
/* R: another party. REMOVALS: it removes the fence's entry at any moment (`osd blocklist rm`,
   another fencer's unfence) or every entry (`osd blocklist clear`), any number of times. PRELIST
   (AFTER_FENCE; in the base model the initial state has it): it lists the fence's address short
   before the fence. SHORTEN: it replaces the fence's entry by one of a short life (`rm` and
   `add` with an hour) */
proctype Remover() {
end:
  do
#if defined(PRELIST) && defined(AFTER_FENCE)
  /* before any fence (no taker has added its entry yet): the fence's address listed for less
     than a fence's life (a lock break's hour, an operator's entry), 1 to LIFE-1 ticks old */
  :: atomic {
       !prel && !f_live && !blk && !SAMEKEY && pend[B] <= 1 && pend[C] <= 1 ->
       prel = 1; blk = 1; whole = 0; age = 1;
       do :: age < LIFE - 1 -> age++ :: break od;
       printf("R: lists "); WHAT; printf(" (no fence yet), short: %d ticks old\n", age)
     }
#endif
#ifdef REMOVALS
  :: atomic {
       blk ->
       if :: SAMEKEY -> XGONE :: else fi;   /* one entry: X's with it */
       blk = 0; xgap = 1;
       printf("R: REMOVES the fence's entry (osd blocklist rm; a1 mapped: %d)\n", km[A]);
       CHECK
     }
  :: atomic {
       blk || cov || XCUT ->
       blk = 0; cov = 0; xgap = 1;
#ifdef AFTER_FENCE
       xk = 0;
#endif
       printf("R: CLEARS the blocklist (a1 mapped: %d)\n", km[A]);
       CHECK
     }
#endif
#ifdef SHORTEN
  :: atomic {
       blk && (whole || age < LIFE - 1) ->
       age = LIFE - 1; whole = 0;
       printf("R: removes the fence's entry and lists the address again, SHORT: less than a tick left\n")
     }
#endif
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

/* a tick of the fence's life: only while no live, responsible keeper is due (and within the
   assumptions); and the monitors: a cover's 2 minutes */
proctype Time() {
end:
  do
  :: atomic {
       (blk || xgap) && !DUE && ASSUMED && ALIVE_OK && SWAP_TIME ->
#ifdef FLEET
       waived = 0;
#endif
#ifndef FIX_RECONCILE
       if :: rage < LIFE -> rage++ :: else fi;
#endif
       if
       :: xgap && ((km[B] && st[B] == UP) || (km[C] && st[C] == UP)) ->
            xgap = 0; printf("time: a tick while another mapping runs, and no keeper acted since R's removal\n")
       :: else
       fi;
       if
       :: blk ->
            age++;
            if
            :: age == LIFE ->
#ifdef AFTER_FENCE
                 if :: SAMEKEY -> XGONE; printf("time: (X's entry is that entry)\n") :: else fi;
#endif
                 blk = 0; printf("time: the entry is %d old: it RUNS OUT (a1 mapped: %d)\n", age, km[A])
            :: else -> printf("time: the entry is %d old\n", age)
            fi
       :: else
       fi;
       CHECK
     }
#ifdef FIX_RECONCILE
  :: atomic {
       cov && COVER_MAY_LAPSE && (ANEW_OK || st[A] != UP || (f_node && blk) || XNODE) ->
       if :: COVKEY -> XGONE :: else fi;
       cov = 0; printf("time: the cover of A's node lapses (its 2 minutes are up)\n");
       CHECK
     }
#endif
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
#ifdef PRELIST
    /* the fence's address listed already, for less than a fence's life (a lock break's hour, an
       operator's entry, an older agent's fence): 1 to LIFE-1 ticks old */
    if
    :: skip
    :: blk = 1; whole = 0; age = 1;
       do :: age < LIFE - 1 -> age++ :: break od;
       printf("R: lists "); WHAT; printf(" already, %d ticks old (short)\n", age)
    fi;
#endif
    /* B's takeover: the entry added, the fence recorded with B's claim */
    f_live = 1; f_boot = hb_boot; f_inc = hb_inc;
    holder = B; acq[B] = 1; st[B] = UP; st[C] = UP;
    printf("B: TAKEOVER of A (hung, a1 mapped): blocklists "); WHAT;
    if
    :: !blk -> blk = 1; age = 0; whole = 1; made = 1; printf("\n")
    :: else ->
         printf(READD_SAYS, age); READD;
#if defined(FIX_RECONCILE) && !defined(TAKE_KEEPS_SHORT)
         /* before its claim: nobody else writes yet (this is the initial state) */
         age = 0; whole = 1;
         printf("B: removes and adds it again before its claim: listed for a whole life\n")
#endif
    fi;
    printf("B: the fence recorded with boot id %d, its entry %d old\n", f_boot, age);
#endif
    run Time(); run Fenced(); run Admin(); run Agent(B); run Agent(C)
#ifdef RPROC
    ; run Remover()
#endif
  }
}

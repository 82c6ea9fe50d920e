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
 * entry running out, a map, the admin's unfence.
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

/* A's kernel and agent, and A's heartbeat object */
byte boot;              /* A's current boot id (1, then 2 after its reboot) */
bool a_old;             /* A's agent predates boot ids and fences[]: its heartbeat has no boot id */
byte inc;               /* A's agent's incarnation (0, then 1 after its restart) */
byte hb_boot, hb_inc;   /* A's heartbeat as last written: boot id (0: none), incarnation */
bool two_unfenced_writers;
bool waived;            /* FLEET: a sweep of the pool was recorded since the last tick */

#define HB_BOOT    (a_old -> 0 : boot)
#define A_REACH    (st[A] == UP && !(f_node && blk))   /* A's agent can reach the cluster */
#define A_WRITES   (km[A] && !blk)
#define WRITERS    (A_WRITES + km[B] + km[C])
#define CHECK      two_unfenced_writers = (WRITERS >= 2); assert(!two_unfenced_writers)
#define WHAT       if :: f_node -> printf("A's whole node (ip:0/0)") :: else -> printf("a1's address") fi

/* n can renew: up, its blocklist calls work (A's agent: it knows fences and is not cut off) */
#define CAN(n) (st[n] == UP && !nobl[n] && ((n) != A || (!a_old && !(f_node && blk))))
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
       st[n] == UP && !acq[n] && (holder == n || st[holder] == DOWN) ->
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
       st[n] = DOWN; km[n] = 0; acq[n] = 0; printf("%c: DIES (its kernel and any mapping with it)\n", NM(n))
     }
  :: atomic { st[n] == DOWN -> st[n] = UP; printf("%c: boots again: up, nothing mapped\n", NM(n)) }
#ifdef FLEET
  :: atomic { st[n] == UP && !waived && MAY_MARK(n) -> MARK(n) }
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
#ifdef FLEET
  :: atomic { A_REACH && !a_old && !waived && MAY_MARK(A) -> MARK(A) }
#endif
  od
}

/* unfence --node A, once, at any moment (no --force) */
proctype Admin() {
end:
  atomic {
    f_node && f_live && UNFENCE_OK ->
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
    /* B's takeover: the entry added, the fence recorded with B's claim */
    f_live = 1; f_boot = hb_boot; f_inc = hb_inc; blk = 1; age = 0;
    holder = B; acq[B] = 1; st[B] = UP; st[C] = UP;
    printf("B: TAKEOVER of A (hung, a1 mapped): blocklists "); WHAT;
    printf("; the fence recorded with boot id %d\n", f_boot);
    run Time(); run Fenced(); run Admin(); run Agent(B); run Agent(C)
  }
}

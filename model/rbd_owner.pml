/*
 * rbd_owner.pml: rbd-owner's claim and fencing protocol as the agent implements it
 * (agent/claim, agent/daemon), for spin. docs/safety.md explains the model, its bounds and
 * what it leaves out, and maps each step below to the Go function it stands for.
 *
 * Actors: NODES agents with one worker per image (the per-image saga lock: a map, an unmap or
 * a settle runs alone on its image), each of which may crash before any cluster or kernel call
 * and after any write of its state file; the kernels' mappings (noshare: one client and one
 * address each), which write until they are unmapped or blocklisted; one claim object per
 * image, changed only by compare-and-set; the blocklist; an admin who fences, force-releases
 * or unmaps a device by hand at any moment. A cluster call may be lost, or be applied and still
 * time out, or be applied and answered as a conflict. A holder's lease is judged expired
 * whenever a claimer likes: no clock appears, so nothing proved here rests on one
 * (model/lease.pml checks the lease rule itself).
 *
 * Every atomic block below is one step: it starts with one call to the cluster or the kernel
 * and goes on with what the agent does locally up to its next call (deciding, writing its state
 * file). A crash is offered before every step and after every state-file write inside one.
 *
 * Checked: invariants 1 and 4 where a mapping appears (an assertion) and in every state (the
 * never claim), 2 and 3 by assertions where the claim changes; with ROLES, 5 where a takeover
 * blocklists and where it drops a holder; with LEAK_CHECK, 6 where a state is forgotten and at
 * every crash; 7 where alreadyMapped answers a device; with LIVENESS, the liveness property at
 * the end.
 * Variants (-D), each of which must fail:
 *   READ_THEN_WRITE   a claim of a record read "free" is a plain write, compared with nothing
 *   WRITE_THEN_FENCE  a takeover writes the claim first and blocklists the old holder after
 *   RELEASE_FIRST     the unmap saga releases the claim before the device is gone
 * Other switches:
 *   NO_I2, NO_I3      leave invariant 2 or 3 unchecked (a variant must then show two writers)
 *   FIX_UNMAP_ADDR    the unmap saga persists the device it found by name (docs/safety.md, F1)
 *   FIX_AGAIN_ADDR    a repeated claim forgets an earlier mapping's address (docs/safety.md, F2)
 *   ONE_FSYNC         the map writes no state between its claim and the recorded device: the
 *                     phase stays CLAIMING through the kernel's map (no "persist-claim")
 *   FIX_CLAIMING_DEVICE  the settle and the unmap of a CLAIMING state look for the image's
 *                     device by name and take this node's hold whose recorded mapping is none
 *                     or that device (claimingEpoch with the device); the settle adopts the
 *                     device (SetMapping, then MAPPED) when that hold is there; with no
 *                     device, this node's hold whatever mapping it records is released.
 *                     ONE_FSYNC without it is variant (ae): the settle releases the claim of
 *                     a live mapping. CLAIMING_STRICT (variant af): with no device, only a
 *                     hold with no mapping recorded is released
 *   LEAK_CHECK        invariant 6: the state forgets a mapping only once this node's hold is
 *                     gone or fenced; and a crash never leaves this node's live hold with no
 *                     state that names the image
 *   INTENT_BESIDE_READS  the map's intent ("claiming") is written beside Acquire's reads and
 *                     made durable only before its first write (a fence or the claim): here,
 *                     after the read and the decision, as late as it may be. Variant (ah),
 *                     CLAIM_BEFORE_INTENT: the intent is written after the claim (the
 *                     ordering that remains, dropped): a crash in between leaves the hold with
 *                     no state (invariant 6)
 *   PARALLEL_RECORD   the map's record (SetMapping) and its persist ("mapped") run together:
 *                     the state's write may land first, and a crash may come in between
 *   FIX_MAPPED_RECORD alreadyMapped records a "mapped" mapping's address the claim lacks
 *                     before it answers the device, and the renewals' claim check records it
 *                     meanwhile. PARALLEL_RECORD without it is variant (ai): after a crash
 *                     between persist and record the device is answered while its claim
 *                     names no client (invariant 7)
 *   FIX_MAP_KEEPS_PREV  a refused map writes back the state it replaced (one an interrupted
 *                     saga left, "claiming" or "unmapping"), not nothing: variant (ag) without
 *                     it forgets the interrupted map's hold (invariant 6)
 *   LIVENESS          node 0 keeps asking for image 0 (rwo, no takeover); the LTL property
 *   RWO_ONLY          maps ask for rwo only (else rwo, rox and rwx)
 *   KEEP_FENCED       add the renewal round's keepFenced, asserting it finds its mapping
 *                     blocklisted already
 *   ROLES             a map request comes from a caller with the CSI or the admin role and may
 *                     ask for takeover; each node has a takeover_policy, manual or
 *                     after-lease-expiry; invariant 5 (below) is checked. The takeover rule as
 *                     fixed (docs/safety.md, F4): a request's takeover needs the admin role (a
 *                     CSI-role request asking for it is refused); otherwise a map takes over
 *                     only where the node's policy is after-lease-expiry or an admin fenced
 *                     every holder. With TAKEOVER_FROM_REQUEST (variant h, the code before F4):
 *                     the request's takeover is honoured whatever the caller's role.
 * Bounds: NODES, IMAGES, GENS, EMAX, CRASHES, FAULTS, ADMIN, HANDUNMAP, FOREIGN (below).
 */

#ifndef NODES
#define NODES 3
#endif
#ifndef IMAGES
#define IMAGES 1
#endif
#ifndef GENS
#define GENS 2          /* kernel clients (mappings) per node and image over a run; at most 2 */
#endif
#ifndef EMAX
#define EMAX 3          /* epochs per image over a run */
#endif
#ifndef CRASHES
#define CRASHES 1       /* agent crashes over a run */
#endif
#ifndef FAULTS
#define FAULTS 1        /* cluster calls lost or answered wrongly; kernel calls failed */
#endif
#ifndef ADMIN
#define ADMIN 2         /* admin fences and force-releases over a run */
#endif
#ifndef HANDUNMAP
#define HANDUNMAP 1     /* devices unmapped by hand (or lost with a reboot) over a run */
#endif
#if GENS > 2
#error "GENS is at most 2 (a fence target is 2 bits: a generation, or IPW)"
#endif
#ifndef FOREIGN
#if IMAGES == 1
#define FOREIGN 1       /* whole-node fences made by takeovers of other images */
#else
#define FOREIGN 0
#endif
#endif

#define W(n,i)  ((n)*IMAGES + (i))      /* node n's kernel slot for image i */
#define H(i,m)  ((i)*NODES + (m))       /* node m's holder entry in image i's claim */

/* access modes (claim.Access; 0 in r_acc: the claim is free) and persisted saga phases
   (state.Phase; 0: nothing persisted) */
mtype = { RWO, ROX, RWX, CLAIMING, CLAIMED, MAPPED, UNMAPPING };
/* a fence target: a client generation 1..GENS, or the whole node (ip:0/0) */
#define IPW 3
/* the operation a worker runs (its continuation after a shared step) */
#define OP_MAP    1
#define OP_UNMAP  2
#define OP_SETTLE 3
#define OP_REPAIR 4     /* the claim check records a mapped device's missing address */
/* results */
#define R_OK   1
#define R_AMB  3        /* timed out: may or may not have been applied */
/* acquire decisions */
#define P_AGAIN 1
#define P_NEW   2

/* ---- the cluster ---- */
mtype r_acc[IMAGES];            /* the claim's access, 0 when free */
byte r_epoch[IMAGES];
bool h_held[IMAGES*NODES];      /* one holder entry per node */
byte h_ep[IMAGES*NODES];
byte h_addr[IMAGES*NODES];      /* ClientAddr: the mapping's generation, 0 = none recorded */
bool h_fen[IMAGES*NODES];       /* Fenced, by an admin */
/* version semantics: bit a of vmask[i] says that actor a (node a's worker, or the admin as
   NODES) read image i's claim and nothing was written since, so its compare-and-set would
   land. Every write clears the mask. */
byte vmask[IMAGES];
#define VALID   ((vmask[i] >> n) & 1)
#define READ    vmask[i] = vmask[i] | (1 << n)
#define UNREAD  vmask[i] = vmask[i] & ~(1 << n)
/* the blocklist: a bit per client generation of (node, image); whole nodes */
byte blk[NODES*IMAGES];
bool blk_ip[NODES];

/* ---- the kernels ---- */
byte kdev[NODES*IMAGES];        /* the generation of node n's mapping of image i, 0 = none */
mtype kacc[NODES*IMAGES];       /* the access it was mapped for (ROX: read-only) */

/* ---- budgets, ghosts ---- */
byte crashes, faults, admins, handunmaps, foreign;
byte maxgrant[IMAGES];          /* the highest epoch granted so far, per image */
bool i2_epoch_reused;
bool i3_claim_dropped_under_live_mapping;
bool i6_hold_outlives_state;
/* invariant 7: a mapped device is handed to its caller (the map's reply, or alreadyMapped's
   answer) only while its claim names its client: else a takeover fences the whole node */
bool i7_answered_unrecorded;
bool i1_i4_violated;
#ifdef ROLES
/* takeover_policy per node: after-lease-expiry (1) or manual (0), set in init */
bool pol_after[NODES];
bool bl_new;                    /* the blocklist call just made added an entry */
/* invariant 5: on a node whose takeover_policy is manual, an Acquire drops another node's
   hold only for an admin-role request asking for takeover, or when an admin fenced that hold;
   and it adds a blocklist entry only for an admin-role request asking for takeover (taking
   over holds an admin fenced only blocklists again what the admin's fence blocklisted) */
bool i5_takeover_not_allowed;
#endif

#define BLOCKED(n,i,g)  (blk_ip[n] || ((blk[W(n,i)] >> ((g)-1)) & 1))
#define LIVE(n,i)       (kdev[W(n,i)] != 0 && !BLOCKED(n,i,kdev[W(n,i)]))
#define WRITER(n,i)     (LIVE(n,i) && kacc[W(n,i)] != ROX)
#define FREE(i)         (r_acc[i] == 0)
#define FENCE_TARGET(i,m) (h_addr[H(i,m)] != 0 -> h_addr[H(i,m)] : IPW)

/* invariant 1: no two live mappings of an image that can both write, unless both are rwx;
   invariant 4: no live rox mapping beside a live writer */
#define TWO_WRITERS(i,a,b) (WRITER(a,i) && WRITER(b,i) && !(kacc[W(a,i)] == RWX && kacc[W(b,i)] == RWX))
#define ROX_WRITER(i,a,b)  (LIVE(a,i) && kacc[W(a,i)] == ROX && WRITER(b,i))
#define BAD_PAIR(i,a,b)    (TWO_WRITERS(i,a,b) || ROX_WRITER(i,a,b) || ROX_WRITER(i,b,a))
#if NODES == 3
#define BAD_IMAGE(i)  (BAD_PAIR(i,0,1) || BAD_PAIR(i,0,2) || BAD_PAIR(i,1,2))
#elif NODES == 2
#define BAD_IMAGE(i)  BAD_PAIR(i,0,1)
#else
#error "NODES is 2 or 3"
#endif
#if IMAGES == 2
#define UNSAFE (BAD_IMAGE(0) || BAD_IMAGE(1))
#elif IMAGES == 1
#define UNSAFE BAD_IMAGE(0)
#else
#error "IMAGES is 1 or 2"
#endif

/* node m's holder entry leaves image i's claim (Record.without). Invariant 3: unless an admin
   forced it, never while node m still has a live mapping of the image. */
inline drop_holder(i, m, forced) {
#ifndef NO_I3
  i3_claim_dropped_under_live_mapping = (!forced && LIVE(m,i));
  assert(!i3_claim_dropped_under_live_mapping);
#endif
  printf("  claim of image %d: node %d's hold (epoch %d) dropped\n", i, m, h_ep[H(i,m)]);
  h_held[H(i,m)] = 0; h_ep[H(i,m)] = 0; h_addr[H(i,m)] = 0; h_fen[H(i,m)] = 0;
  if
  :: !h_held[H(i,0)] && !h_held[H(i,1)] && !h_held[H(i,NODES-1)] -> r_acc[i] = 0
  :: else
  fi
}

/* image i's epoch rises and node n holds it at the new one. Invariant 2: the epoch of image i
   only grows, and every hold gets an epoch that no earlier hold of image i had. */
inline grant(i, n, acc) {
  r_epoch[i]++;
#ifndef NO_I2
  i2_epoch_reused = (r_epoch[i] <= maxgrant[i]);
  assert(!i2_epoch_reused);
#endif
  maxgrant[i] = r_epoch[i];
  h_held[H(i,n)] = 1; h_ep[H(i,n)] = r_epoch[i]; h_addr[H(i,n)] = 0; h_fen[H(i,n)] = 0;
  r_acc[i] = acc;
  printf("  claim of image %d: node %d holds it at epoch %d (%e)\n", i, n, r_epoch[i], acc)
}

/* blocklist target tg (a generation or IPW) of node m's mapping of image i */
#ifdef ROLES
#define BL_NEW(e) bl_new = !(e)
#else
#define BL_NEW(e) skip
#endif
inline blocklist(m, i, tg) {
  if
  :: tg == IPW -> BL_NEW(blk_ip[m]); blk_ip[m] = 1; printf("  blocklist: node %d, whole node (ip:0/0)\n", m)
  :: else -> BL_NEW((blk[W(m,i)] >> (tg-1)) & 1); blk[W(m,i)] = blk[W(m,i)] | (1 << (tg-1));
     printf("  blocklist: node %d's mapping #%d of image %d\n", m, tg, i)
  fi
}

/* the write of a compare-and-set (Backend.CompareAndWrite): it lands only if nothing was
   written since this actor's read. A call may also be lost, or land and time out, or land and
   be answered as a conflict (a resent op). res: R_OK, R_AMB, or 0 (conflict: read again). */
#define CAS(APPLY) \
  if \
  :: !VALID -> res = 0 \
  :: VALID && faults < FAULTS -> faults++; res = R_AMB; printf("  (the write is lost: a timeout)\n") \
  :: VALID -> APPLY; vmask[i] = 0; \
     if \
     :: res = R_OK \
     :: faults < FAULTS -> faults++; res = R_AMB; printf("  (applied, but the reply times out)\n") \
     :: faults < FAULTS -> faults++; res = 0; printf("  (applied, but answered as a conflict)\n") \
     fi \
  fi; \
  UNREAD

/* one blocklist call for the first pending target in ev (2 bits per node); a failed call (lost,
   or applied and timed out) leaves res = R_AMB; CHECK runs after the call */
#define FENCE_ONE(CHECK) \
  t = 0; \
  do \
  :: ((ev >> (2*t)) & 3) == 0 -> t++ \
  :: else -> break \
  od; \
  g = (ev >> (2*t)) & 3; \
  ev = ev & ~(3 << (2*t)); \
  if \
  :: blocklist(t, i, g) \
  :: faults < FAULTS -> faults++; blocklist(t, i, g); res = R_AMB; printf("  (the reply times out)\n") \
  :: faults < FAULTS -> faults++; res = R_AMB; printf("  (the blocklist call is lost)\n") \
  fi; \
  CHECK; BL_RESET g = 0; t = 0

#ifdef ROLES
#define BL_RESET bl_new = 0;
/* invariant 5 at a takeover's blocklist call, and where it drops holder t */
#define I5_FENCE \
  i5_takeover_not_allowed = (!pol_after[n] && !(adm && tk) && bl_new); \
  assert(!i5_takeover_not_allowed)
#define I5_DROP(t) \
  i5_takeover_not_allowed = (!pol_after[n] && !(adm && tk) && !h_fen[H(i,t)]); \
  assert(!i5_takeover_not_allowed)
#if NODES == 3
#define ALL_FENCED(i) ((!h_held[H(i,0)] || h_fen[H(i,0)]) && (!h_held[H(i,1)] || h_fen[H(i,1)]) && (!h_held[H(i,2)] || h_fen[H(i,2)]))
#else
#define ALL_FENCED(i) ((!h_held[H(i,0)] || h_fen[H(i,0)]) && (!h_held[H(i,1)] || h_fen[H(i,1)]))
#endif
/* may this map take the image over (once the holders' leases expired, which is free here)? */
#ifdef TAKEOVER_FROM_REQUEST
#define TAKEOVER_ALLOWED (tk || pol_after[n])
#else
#define TAKEOVER_ALLOWED ((adm && tk) || pol_after[n] || ALL_FENCED(i))
#endif
#else
#define BL_RESET
#define I5_FENCE skip
#define I5_DROP(t) skip
#define TAKEOVER_ALLOWED 1
#endif

/* Acquire's write: a renewal of this node's hold (the lease fields only), or a new hold at
   epoch+1 after dropping the evicted holders */
#ifdef FIX_AGAIN_ADDR
#define AGAIN_REFRESH h_addr[H(i,n)] = 0
#else
#define AGAIN_REFRESH skip
#endif
#define ACQ_APPLY \
  if \
  :: plan == P_NEW -> \
     if \
     :: evicting -> \
          for (t : 0 .. NODES-1) { if :: h_held[H(i,t)] -> I5_DROP(t); drop_holder(i, t, 0) :: else fi } \
     :: else \
     fi; \
     grant(i, n, acc) \
  :: plan == P_AGAIN -> AGAIN_REFRESH \
  fi; \
  ep = h_ep[H(i,n)]

/* ---- the worker's own bookkeeping ---- */
/* forget the operation (a crash, or its end) */
#ifdef READ_THEN_WRITE
#define RESET_SNAP snap = 0;
#else
#define RESET_SNAP
#endif
#ifdef ROLES
#define RESET_ROLE adm = 0; tk = 0;
#else
#define RESET_ROLE
#endif
#define RESET \
  op = 0; acc = 0; plan = 0; ev = 0; wat = 0; ep = 0; res = 0; g = 0; t = 0; pend = 0; \
  out = 0; prevph = 0; pmep = 0; pmaddr = 0; evicting = 0; bad = 0; intent = 0; pdone = 0; RESET_SNAP RESET_ROLE UNREAD
#define DONE        RESET; goto idle
#ifdef LEAK_CHECK
/* invariant 6 at a crash: this node's live hold of the image is named by its state */
#define I6_CRASH \
  i6_hold_outlives_state = (ph == 0 && h_held[H(i,n)] && !h_fen[H(i,n)]); assert(!i6_hold_outlives_state);
#else
#define I6_CRASH
#endif
#define CRASH_NOW \
  crashes++; printf("node %d image %d: CRASH (the agent restarts)\n", n, i); I6_CRASH RESET; goto idle
/* a crash before the next step */
#define CRASH       :: atomic { crashes < CRASHES -> CRASH_NOW }
/* a crash right after a state-file write, inside a step */
#define MAY_CRASH   if :: crashes < CRASHES -> CRASH_NOW :: true -> skip fi
/* the state file (state.Store.Put, Delete: one atomic replacement each) */
#define PUT(P, E, A) \
  ph = P; mep = E; maddr = A; \
  printf("node %d image %d: state file: %e, epoch %d, device #%d\n", n, i, ph, mep, maddr); \
  MAY_CRASH
#ifdef LEAK_CHECK
/* invariant 6: the state file forgets a mapping only once this node's hold of the image is
   gone (released, or another node's now) or fenced (an admin's, to be taken over): else the
   claim is held by nobody's state, for ever */
#define I6_CHECK \
  i6_hold_outlives_state = (h_held[H(i,n)] && !h_fen[H(i,n)]); assert(!i6_hold_outlives_state);
#else
#define I6_CHECK
#endif
#define DELETE \
  I6_CHECK \
  ph = 0; mep = 0; maddr = 0; printf("node %d image %d: state file: mapping forgotten\n", n, i); \
  MAY_CRASH
#define DEVOK        (maddr != 0 && kdev[w] == maddr)
/* alreadyMapped answers only once the claim names the device (FIX_MAPPED_RECORD records it
   first); without it, whatever the claim names */
#ifdef FIX_MAPPED_RECORD
#define ANSWER_RECORDED (h_addr[H(i,n)] == maddr)
#else
#define ANSWER_RECORDED 1
#endif
/* claimingEpoch with no device of the image on this node: this node's hold whatever mapping
   it records (that mapping is gone); CLAIMING_STRICT (variant af): only one with none */
#ifdef CLAIMING_STRICT
#define CLAIMING_NO_DEVICE 0
#else
#define CLAIMING_NO_DEVICE (g == 0)
#endif

#ifdef LIVENESS
/* node 0's worker on image 0 is the client: it maps rwo without takeover (see the end) */
#define ANY (n != 0 || i != 0)
#else
#define ANY 1
#endif

proctype Worker(byte n; byte i) {
  byte w = W(n, i);
  /* the node's persisted mapping of image i (outlives crashes) and its kernel generations */
  mtype ph;
  byte mep, maddr, kgen;
  /* the operation under way (forgotten at a crash) */
  mtype acc, prevph;
  byte op, plan, ev, wat, ep, res, g, t, pend, out;
  byte pmep, pmaddr;            /* the state a map replaced (with prevph), for its undo */
  bool evicting, bad;
  bool intent;                  /* the map's intent is written (INTENT_BESIDE_READS) */
  bool pdone;                   /* the map's "mapped" is written already (PARALLEL_RECORD) */
#ifdef READ_THEN_WRITE
  byte snap;
#endif
#ifdef ROLES
  bool adm, tk;                 /* the map's caller has the admin role; it asks for takeover */
#endif

idle:
end_idle:
  do
  /* ---- daemon.Map: the map saga. alreadyMapped and FindBySpec refuse (without a step)
     when a device of the image is here; persist-intent; then Acquire's inspectImage. ---- */
  :: atomic {
         ph != MAPPED && kdev[w] == 0 ->
         op = OP_MAP;
         if
         :: acc = RWO
#ifndef RWO_ONLY
         :: ANY -> acc = ROX
         :: ANY -> acc = RWX
#endif
         fi;
#ifdef ROLES
         /* server/caller.go: the socket grants the caller's role; the request may ask for
            takeover */
         if :: adm = 0 :: adm = 1 fi;
         if :: tk = 0 :: tk = 1 fi;
         printf("node %d image %d: MAP as %e, caller %d (1: admin), takeover %d, policy %d (1: after-lease-expiry)\n",
                n, i, acc, adm, tk, pol_after[n]);
#ifndef TAKEOVER_FROM_REQUEST
         if
         :: !adm && tk -> printf("  refused (403): takeover needs the admin role\n"); DONE
         :: else
         fi;
#endif
#else
         printf("node %d image %d: MAP as %e\n", n, i, acc);
#endif
#ifdef FIX_MAP_KEEPS_PREV
         prevph = ph; pmep = mep; pmaddr = maddr;   /* a state left by an interrupted saga */
#endif
#if !defined(INTENT_BESIDE_READS) && !defined(CLAIM_BEFORE_INTENT)
         PUT(CLAIMING, 0, 0);
#endif
         wat = 0;                       /* inspectImage: the live watchers of the header */
         for (t : 0 .. NODES-1) {
           if
           :: LIVE(t,i) -> wat = wat | (kdev[W(t,i)] << (2*t));
              printf("  inspect: node %d's mapping #%d watches the image\n", t, kdev[W(t,i)])
           :: else
           fi
         };
         t = 0;
         goto acq_read
       }
  /* ---- daemon.deviceGone (alreadyMapped, a remove event, or the reconciler): the device of
     a mapped image went away without the agent: release its claim ---- */
  :: atomic {
       ph == MAPPED && !DEVOK -> op = OP_SETTLE; ep = mep;
       printf("node %d image %d: DEVICE GONE, release\n", n, i); goto rel_read_now
     }
  /* ---- alreadyMapped: a map of an image mapped here answers its device (handed to the
     caller) when the claim is this node's at the mapping's epoch. Invariant 7: only while the
     claim names the device's client. FIX_MAPPED_RECORD records it first (below). ---- */
  :: atomic {
       ph == MAPPED && DEVOK && h_held[H(i,n)] && h_ep[H(i,n)] == mep && !h_fen[H(i,n)] && ANSWER_RECORDED ->
       printf("node %d image %d: ANSWER device #%d (already mapped)\n", n, i, maddr);
       i7_answered_unrecorded = (h_addr[H(i,n)] != maddr);
       assert(!i7_answered_unrecorded)
     }
#ifdef FIX_MAPPED_RECORD
  /* alreadyMapped, and daemon.checkClaim (the renewals): the claim is this node's but names
     another client than the mapped device's (a crash between persist and record): record it */
  :: atomic {
       ph == MAPPED && DEVOK && h_held[H(i,n)] && h_ep[H(i,n)] == mep && !h_fen[H(i,n)] &&
       h_addr[H(i,n)] != maddr -> op = OP_REPAIR; ep = mep; g = maddr;
       printf("node %d image %d: REPAIR: record device #%d in the claim\n", n, i, g); goto sm_now
     }
#endif
  /* ---- daemon.Unmap: the unmap saga ---- */
  /* not the agent's mapping (found by name): unmap it, nothing to release */
  :: atomic {
       ANY && ph == 0 && kdev[w] != 0 -> op = OP_UNMAP; g = kdev[w];
       printf("node %d image %d: UNMAP (not rbd-owner's)\n", n, i); goto kunmap_now
     }
  :: atomic {
         ph == CLAIMING ->
         /* claimingEpoch: the epoch of a hold of this node with no mapping recorded yet */
         op = OP_UNMAP; prevph = ph; g = kdev[w];
#ifdef FIX_CLAIMING_DEVICE
         ep = (h_held[H(i,n)] && (h_addr[H(i,n)] == 0 || h_addr[H(i,n)] == g || CLAIMING_NO_DEVICE) -> h_ep[H(i,n)] : 0);
#else
         ep = (h_held[H(i,n)] && h_addr[H(i,n)] == 0 -> h_ep[H(i,n)] : 0);
#endif
         printf("node %d image %d: UNMAP (claiming; claimingEpoch %d)\n", n, i, ep);
         goto unmap_intent
       }
  :: atomic {
         ph == CLAIMED || ph == MAPPED || ph == UNMAPPING ->
         /* the recorded device (by id and client address), else by name (FindBySpec) */
         op = OP_UNMAP; prevph = ph; ep = mep;
         if
         :: ph == CLAIMED -> g = kdev[w]
         :: else -> g = (DEVOK -> kdev[w] : 0)
         fi;
         printf("node %d image %d: UNMAP (%e, device #%d)\n", n, i, ph, g);
unmap_intent:
#ifdef RELEASE_FIRST
         /* broken: the claim is released first, the device unmapped after */
         PUT(UNMAPPING, ep, maddr);
         goto rel_read_now
#else
#ifdef FIX_UNMAP_ADDR
         PUT(UNMAPPING, ep, g);
#else
         PUT(UNMAPPING, ep, maddr);     /* persist-intent */
#endif
         if
         :: g != 0 -> goto kunmap_now
         :: else -> goto rel_read_now
         fi
#endif
       }
  /* ---- daemon.settle: the reconciler finishes or undoes a persisted saga ---- */
  :: atomic {
         ph == CLAIMING ->
         op = OP_SETTLE;
#ifdef FIX_CLAIMING_DEVICE
         /* the device by name; claimingEpoch with it; adopt, release, or leave the device to
            the judgement of mappings made outside rbd-owner */
         g = kdev[w];
         ep = (h_held[H(i,n)] && (h_addr[H(i,n)] == 0 || h_addr[H(i,n)] == g || CLAIMING_NO_DEVICE) -> h_ep[H(i,n)] : 0);
         printf("node %d image %d: SETTLE claiming (device #%d, claimingEpoch %d)\n", n, i, g, ep);
         if
         :: g != 0 && ep != 0 -> goto sm_now
         :: g == 0 && ep != 0 -> goto rel_read_now
         :: else -> DELETE; DONE
         fi
#else
         /* claimingEpoch, then release */
         ep = (h_held[H(i,n)] && h_addr[H(i,n)] == 0 -> h_ep[H(i,n)] : 0);
         printf("node %d image %d: SETTLE claiming (claimingEpoch %d)\n", n, i, ep);
         if
         :: ep != 0 -> goto rel_read_now
         :: else -> DELETE; DONE
         fi
#endif
       }
  /* the map happened (the device found by name): record it in the claim and keep it */
  :: atomic {
       ph == CLAIMED && kdev[w] != 0 -> op = OP_SETTLE; ep = mep; g = kdev[w];
       printf("node %d image %d: SETTLE claimed, adopt device #%d\n", n, i, g); goto sm_now
     }
  /* interrupted before the device appeared: release */
  :: atomic {
       ph == CLAIMED && kdev[w] == 0 -> op = OP_SETTLE; ep = mep;
       printf("node %d image %d: SETTLE claimed, no device\n", n, i); goto rel_read_now
     }
  :: atomic {
       ph == UNMAPPING && DEVOK -> op = OP_SETTLE; ep = mep; g = maddr;
       printf("node %d image %d: SETTLE unmapping, device #%d\n", n, i, g); goto kunmap_now
     }
  :: atomic {
       ph == UNMAPPING && !DEVOK -> op = OP_SETTLE; ep = mep;
       printf("node %d image %d: SETTLE unmapping, no device found\n", n, i); goto rel_read_now
     }
  /* ---- daemon.Release (not --force): this node's own claim on an image it does not map
     (refused while a mapping is persisted) ---- */
  :: atomic {
       ANY && ph == 0 && h_held[H(i,n)] ->
       op = OP_SETTLE; ep = h_ep[H(i,n)];
       printf("node %d image %d: RELEASE (API) epoch %d\n", n, i, ep);
       goto rel_read_now
     }
#ifdef KEEP_FENCED
  /* ---- daemon.checkClaim + keepFenced (the renewal round): a mapping whose claim another
     node holds now, or an admin fenced, is blocklisted again by its own agent. With a
     blocklist that never expires this must find it blocklisted already. ---- */
  :: atomic {
       ph == MAPPED && maddr != 0 && kdev[w] != 0 && !FREE(i) &&
       !(h_held[H(i,n)] && h_ep[H(i,n)] == mep && !h_fen[H(i,n)]) ->
       assert(BLOCKED(n, i, maddr))
     }
#endif
  od;

/* ======== claim.Store.Acquire: read, decide, fence, compare-and-set ======== */
acq_read:
  if
  CRASH
  :: atomic {
       /* Store.update's read; Store.leases; decideAcquire */
       READ; plan = 0; ev = 0; evicting = 0; bad = 0;
       if
       :: h_held[H(i,n)] ->
            /* this node holds it already: renew, unless the access differs or it was fenced */
            bad = (r_acc[i] != acc || h_fen[H(i,n)]);
            plan = P_AGAIN
       :: else ->
            if
            :: !FREE(i) && !(r_acc[i] == acc && acc != RWO) ->
                 if
                 :: bad = 1        /* held: no takeover asked, or a lease live as this node sees it */
#ifndef LIVENESS
                 :: TAKEOVER_ALLOWED ->
                    evicting = 1;  /* takeover: every holder's lease expired as this node saw it */
                    for (t : 0 .. NODES-1) {
                      if
                      :: h_held[H(i,t)] -> ev = ev | (FENCE_TARGET(i,t) << (2*t))
                      :: else
                      fi
                    }
#else
                 :: ANY ->         /* the client asks without takeover */
                    evicting = 1;
                    for (t : 0 .. NODES-1) {
                      if
                      :: h_held[H(i,t)] -> ev = ev | (FENCE_TARGET(i,t) << (2*t))
                      :: else
                      fi
                    }
#endif
                 fi
            :: else
            fi;
            bad = bad || r_epoch[i] >= EMAX;            /* the model's epoch bound: refused */
            plan = P_NEW
       fi;
       if
       :: !bad ->
            /* unexplained: watchers that the kept holders' recorded addresses do not account
               for, more than the kept holders with none recorded yet; an evicted holder's
               address only drops its own watcher (withoutAddrsOf), and none is kept */
            pend = 0; out = 0;
            for (t : 0 .. NODES-1) {
              g = (wat >> (2*t)) & 3;
              if
              :: g != 0 && !(h_held[H(i,t)] && h_addr[H(i,t)] == g) -> out++
              :: else
              fi;
              if
              :: !evicting && h_held[H(i,t)] && h_addr[H(i,t)] == 0 -> pend++
              :: else
              fi
            };
            bad = (out > pend); g = 0; t = 0; pend = 0; out = 0
       :: else
       fi;
#if defined(INTENT_BESIDE_READS) || defined(CLAIM_BEFORE_INTENT)
       /* Acquire's Durable: the intent, written beside the reads, is durable before Acquire
          goes on (a refusal, a fence or the claim); written once, not again after a lost race */
       if
#ifdef CLAIM_BEFORE_INTENT
       :: !intent && bad -> intent = 1; PUT(CLAIMING, 0, 0)
#else
       :: !intent -> intent = 1; PUT(CLAIMING, 0, 0)
#endif
       :: else
       fi;
#endif
       if
       :: bad ->                        /* held, lost, busy, invalid: undo the intent */
            printf("node %d image %d: acquire: refused\n", n, i);
            /* undo the intent: FIX_MAP_KEEPS_PREV writes back a state an interrupted saga
               left (its hold is still to be settled); else it is forgotten */
            if
            :: prevph != 0 -> PUT(prevph, pmep, pmaddr)
            :: else -> DELETE
            fi;
            DONE
       :: else
       fi;
       if
       :: plan == P_AGAIN -> printf("node %d image %d: acquire: this node holds it already (epoch %d): renew\n", n, i, h_ep[H(i,n)])
       :: plan == P_NEW && evicting -> printf("node %d image %d: acquire: TAKEOVER (every holder's lease judged expired)\n", n, i)
       :: else -> printf("node %d image %d: acquire: free or shared: claim\n", n, i)
       fi;
#ifdef READ_THEN_WRITE
       snap = r_epoch[i];
#endif
#if defined(READ_THEN_WRITE)
       goto acq_write                   /* the broken variant keeps its read-write gap */
#elif defined(WRITE_THEN_FENCE)
       if
       :: ev != 0 -> goto acq_write
       :: else
       fi
#else
       if
       :: ev != 0 -> goto acq_fence     /* fence first, write after */
       :: else
       fi
#endif
       /* nothing to fence: the compare-and-set follows the read with nothing in between, so
          it is taken in the same step (a write by anyone else in between would only make it
          fail and the loop read again) */
       goto acq_cas
     }
  fi;
acq_fence:
  if
  CRASH
  :: atomic {
       FENCE_ONE(I5_FENCE);
       if
       :: res == R_AMB -> DONE          /* a timeout, may have applied: "claiming" stays */
       :: res != R_AMB && ev != 0 -> goto acq_fence
       :: else -> goto acq_write
       fi
     }
  fi;
acq_write:
  if
  CRASH
  :: atomic {
       op != 0;
acq_cas:
#ifdef READ_THEN_WRITE
       if
       :: plan == P_NEW && !evicting ->
            /* broken: it read "free", so it writes its claim without comparing */
            for (t : 0 .. NODES-1) {
              if
              :: h_held[H(i,t)] -> drop_holder(i, t, 0)
              :: else
              fi
            };
            r_epoch[i] = snap; grant(i, n, acc); ep = r_epoch[i];
            vmask[i] = 0; res = R_OK
       :: else -> CAS(ACQ_APPLY)
       fi;
#else
       CAS(ACQ_APPLY);
#endif
       t = 0;
       if
       :: res == 0 -> goto acq_read     /* lost the race: read again */
       :: res == R_AMB -> DONE          /* may have applied: "claiming" stays for the reconciler */
       :: else
       fi;
       plan = 0; evicting = 0; wat = 0;
#ifdef WRITE_THEN_FENCE
       if
       :: ev != 0 -> goto acq_fence_after
       :: else
       fi;
#endif
acquired:
#ifdef CLAIM_BEFORE_INTENT
       /* broken: the intent is made durable only after the claim was written (a step of its
          own: the agent may crash before it) */
       if
       :: !intent -> MAY_CRASH; intent = 1; PUT(CLAIMING, 0, 0)
       :: else
       fi;
#endif
#ifndef ONE_FSYNC
       PUT(CLAIMED, ep, 0);             /* persist-claim */
#endif
       goto kmap
     }
  fi;
#ifdef WRITE_THEN_FENCE
acq_fence_after:
  /* broken: the old holders are blocklisted after the claim was written */
  if
  CRASH
  :: atomic {
       FENCE_ONE(I5_FENCE);
       if
       :: res == R_AMB -> DONE
       :: res != R_AMB && ev != 0 -> goto acq_fence_after
       :: else -> goto acquired
       fi
     }
  fi;
#endif

/* ======== the map: krbd.Client.Map with noshare, a new client and a new address ======== */
kmap:
  if
  CRASH
  :: atomic {
       if
       :: kgen < GENS -> kgen++; kdev[w] = kgen; kacc[w] = acc; g = kgen;
          printf("node %d image %d: kernel maps it: mapping #%d (%e)\n", n, i, g, acc);
          /* invariants 1 and 4 can only break where a live mapping appears: here (the never
             claim below checks them in every state as well) */
          i1_i4_violated = UNSAFE;
          assert(!i1_i4_violated);
#ifdef PARALLEL_RECORD
          /* record and persist together: the state's write may land before the record */
          if
          :: pdone = 1; PUT(MAPPED, ep, g)
          :: true
          fi;
#endif
          goto sm
       :: kgen == GENS -> goto rel_read     /* the model's bound on mappings: map fails */
       :: faults < FAULTS -> faults++;                  /* the kernel refused: undo, release */
          printf("node %d image %d: the kernel map fails\n", n, i); goto rel_read
       fi
     }
  fi;

/* ======== claim.Store.SetMapping(ep, g): only the unfenced holder at ep may write. The read
   and the compare-and-set are one step (nothing happens in between). ======== */
sm:
  if
  CRASH
  :: atomic {
       op != 0;
sm_now:
       READ;
       if
       :: h_held[H(i,n)] && h_ep[H(i,n)] == ep && !h_fen[H(i,n)] ->
            printf("node %d image %d: SetMapping epoch %d -> mapping #%d\n", n, i, ep, g);
            CAS(h_addr[H(i,n)] = g)
       :: op == OP_REPAIR ->            /* lost: checkClaim reports it, the device stays */
            UNREAD; printf("node %d image %d: SetMapping: lost (left in place)\n", n, i); DONE
       :: else ->                       /* decideMine: LostError. The map saga undoes (unmap,
                                           release, forget); the settle removes the device. */
            UNREAD; printf("node %d image %d: SetMapping: lost\n", n, i); goto kunmap
       fi;
       if
       :: res == 0 -> goto sm              /* answered as a conflict: read again */
       :: res == R_AMB && op == OP_MAP -> goto kunmap   /* undo */
       :: res == R_AMB && op != OP_MAP -> DONE          /* retried by the reconciler */
       :: res == R_OK && (op == OP_REPAIR || pdone) -> DONE
       :: res == R_OK && !(op == OP_REPAIR || pdone) -> PUT(MAPPED, ep, g); DONE   /* persist */
       fi
     }
  fi;

/* ======== krbd unmap of device g: the map saga's undo, the unmap saga, the settle ======== */
kunmap:
  if
  CRASH
  :: atomic {
       op != 0;                          /* (an entry for a step begun at idle) */
kunmap_now:
       if
       :: kdev[w] == g -> kdev[w] = 0; kacc[w] = 0; res = R_OK;
          printf("node %d image %d: kernel unmaps mapping #%d\n", n, i, g)
       :: kdev[w] != g -> res = R_OK                            /* gone already */
       :: kdev[w] == g && faults < FAULTS -> faults++; res = 0; /* busy: refused */
          printf("node %d image %d: the kernel unmap fails\n", n, i)
       fi;
       if
       :: res == 0 && op == OP_UNMAP && prevph != 0 ->
            PUT(prevph, ep, maddr); DONE     /* undo the unmap's intent */
       :: res == 0 && !(op == OP_UNMAP && prevph != 0) ->
            DONE                             /* an undo that fails stops the undo */
       :: else
       fi;
#ifdef RELEASE_FIRST
       if
       :: op == OP_UNMAP && prevph != 0 -> DELETE; DONE
       :: else
       fi;
#endif
       if
       :: op == OP_UNMAP && prevph == 0 -> DONE                  /* nobody's claim */
       :: op == OP_SETTLE && (ph == CLAIMED || ph == CLAIMING) -> DELETE; DONE  /* a lost claim's device */
       :: else -> goto rel_read                                  /* then release */
       fi
     }
  fi;

/* ======== claim.Store.Release(ep), then forget the mapping. The read and the compare-and-set
   are one step (nothing happens in between). ======== */
rel_read:
  if
  CRASH
  :: atomic {
       op != 0;                          /* (an entry for a step begun at idle) */
rel_read_now:
       READ;
       if
       :: h_held[H(i,n)] && h_ep[H(i,n)] == ep ->
            printf("node %d image %d: Release epoch %d\n", n, i, ep);
            CAS(drop_holder(i, n, 0))
       :: else -> UNREAD; res = R_OK     /* not ours (any more): nothing to release */
       fi;
       if
       :: res == 0 -> goto rel_read      /* answered as a conflict: read again */
       :: res == R_AMB && ph == MAPPED -> /* deviceGone keeps it for the reconciler */
            PUT(UNMAPPING, mep, maddr); DONE
       :: res == R_AMB && ph != MAPPED -> DONE   /* retried by the reconciler */
       :: else
       fi;
#ifdef RELEASE_FIRST
       if
       :: op == OP_UNMAP && g != 0 -> goto kunmap
       :: else
       fi;
#endif
       DELETE; DONE
     }
  fi
}

/* the admin: rbd-owner fence and release --force (served by some agent), `rbd unmap` by hand,
   and (one image modelled) the whole-node fences of takeovers of other images */
active proctype Admin() {
  byte i, t, g, res, ev, n = NODES;
end_admin:
  do
  :: atomic {                          /* claim.Store.Fence */
         admins < ADMIN -> admins++;
         if
         :: i = 0
         :: IMAGES > 1 -> i = IMAGES - 1
         fi;
fence_read:
         printf("ADMIN: fence image %d\n", i);
         READ; ev = 0;
         if
         :: FREE(i) -> goto adone          /* no holder to fence */
         :: else
         fi;
         for (t : 0 .. NODES-1) {
           if
           :: h_held[H(i,t)] -> ev = ev | (FENCE_TARGET(i,t) << (2*t))
           :: else
           fi
         };
         t = 0
       };
fence_one:
       if
       :: goto adone                       /* the call stops here (the client went away) */
       :: atomic {
         FENCE_ONE(skip);
         if
         :: res == R_AMB -> goto adone
         :: res != R_AMB && ev != 0 -> goto fence_one
         :: else
         fi
         }
       fi;
       if
       :: goto adone
       :: atomic {
         CAS(for (t : 0 .. NODES-1) { if :: h_held[H(i,t)] -> h_fen[H(i,t)] = 1 :: else fi });
         t = 0;
         if
         :: res == 0 -> goto fence_read
         :: else -> goto adone
         fi
         }
       fi
  :: atomic {                          /* claim.Store.ForceRelease: fenced holders only */
         admins < ADMIN -> admins++;
         if
         :: i = 0
         :: IMAGES > 1 -> i = IMAGES - 1
         fi;
force_read:
         printf("ADMIN: release --force image %d\n", i);
         READ; g = 0;
         for (t : 0 .. NODES-1) {
           if
           :: h_held[H(i,t)] && !h_fen[H(i,t)] -> g = 1
           :: else
           fi
         };
         t = 0;
         if
         :: FREE(i) || g -> goto adone     /* nothing held, or a holder not fenced: refused */
         :: else
         fi;
         /* the write follows the read with nothing in between: one step */
         CAS(for (t : 0 .. NODES-1) { if :: h_held[H(i,t)] -> drop_holder(i, t, 1) :: else fi });
         t = 0;
         if
         :: res == 0 -> goto force_read
         :: else -> goto adone
         fi
       }
  :: atomic {                          /* a device unmapped outside the agent */
         handunmaps < HANDUNMAP -> handunmaps++;
         select (t : 0 .. NODES*IMAGES-1);
         printf("BY HAND: rbd unmap of slot %d (node*IMAGES+image)\n", t);
         kdev[t] = 0; kacc[t] = 0; t = 0
       }
  :: atomic {                          /* a takeover of another image fenced a whole node */
         foreign < FOREIGN -> foreign++;
         select (t : 0 .. NODES-1);
         printf("ELSEWHERE: a takeover of another image fences node %d whole\n", t);
         blk_ip[t] = 1; t = 0
       }
  od;
adone:
  atomic { i = 0; t = 0; g = 0; res = 0; ev = 0; UNREAD; goto end_admin }
}

init {
  byte n, i;
  atomic {
#ifdef ROLES
    /* POLICY_AFTER: a mask of the nodes whose takeover_policy is after-lease-expiry (the rest
       manual); without it each node's policy is chosen at the start */
    for (n : 0 .. NODES-1) {
#ifdef POLICY_AFTER
      pol_after[n] = (POLICY_AFTER >> n) & 1;
#else
      if :: pol_after[n] = 0 :: pol_after[n] = 1 fi;
#endif
      printf("node %d: takeover_policy %d (1: after-lease-expiry, 0: manual)\n", n, pol_after[n])
    };
#endif
    for (n : 0 .. NODES-1) {
      for (i : 0 .. IMAGES-1) { run Worker(n, i) }
    };
    n = 0; i = 0
  }
}

#ifndef LIVENESS
/* invariants 1 and 4, in every reachable state */
never {
  do
  :: !UNSAFE
  :: UNSAFE -> break
  od
}
#else
/* Liveness: whenever image 0 is free, some node eventually holds it, while node 0 keeps asking
   for it (under weak fairness: every worker that can move eventually moves), unless the run
   has used up the model's epochs. */
ltl free_image_is_claimed { [] (FREE(0) -> <> (!FREE(0) || r_epoch[0] >= EMAX)) }
#endif

/*
 * failover.pml: the Kubernetes failover controller of issue 53 (optional), for spin.
 *
 * The controller (a Deployment, leader-elected by a lease) watches node N. N runs pod P, whose
 * RWO volume is an RBD image that N holds, mapped by N's kernel client c. Two failure
 * detectors, each watched by the controller on its own monotonic clock from its own first look:
 * N's kubelet lease (renewed while N's kubelet reaches the API server) and N's rbd-owner agent
 * liveness (its heartbeat in Ceph, renewed while N's agent reaches Ceph). The controller declares
 * N dead only when neither has moved for a grace; then, in this order: it fences c (phase
 * "fencing" written with the entry's scope, then the blocklist add), reads the cluster's
 * blocklist back until the entry is in force (phase "fenced"), taints N out-of-service (the
 * taint and phase "tainted" in one Node update), force-deletes P (by its uid: Kubernetes starts
 * P on node M, which maps the image and writes), deletes the VolumeAttachment (phase "moved").
 * The way back: once N's heartbeat shows a new boot id, or N's agent records the fenced mapping
 * gone, it removes the entry it made, then (one Node update) the taint it added, phase "none".
 * Its progress is the Node annotation (phase, scope), written by compare-and-set on the Node's
 * resourceVersion (a conflict: read the Node again), so a standby that takes over mid-decision
 * goes on from the persisted phase; every step is idempotent, so it may be redone.
 *
 * N's state changes at any moment, to any other: up; frozen (nothing renews, c does not write
 * until resumed, then it does); cut off from the API server only (the agent renews, c writes);
 * cut off from Ceph only (the kubelet renews); cut off from both (and later healed, no reboot);
 * down for a reboot (once: c is gone for good, a new boot id), then any state again. N's agent,
 * while it reaches Ceph, unmaps a fenced c and records the mapping gone. c counts as a writer
 * while it exists and no entry covers it, whatever N's state: frozen or cut off, it writes as
 * soon as it resumes.
 *
 * The controller: two replicas, 0 and 1. The lease holder acts; it may stop at any step (a
 * freeze, a GC pause, a partition), the other take the lease over (HANDOVERS times in a run)
 * with a fresh view (it reads the Node first; its watches start at its own first look), and the
 * stopped one resume: it then believes it leads for one more step, taken from its stale view
 * (its Node view, its watches, where it was in its steps), before its lease renewal fails and it
 * forgets everything. A detector's watch (per replica): a look restarts it if the detector
 * renews now or moved since the previous look, and otherwise may find the grace passed (any
 * number of looks later: time is not counted here; lease.pml checks that a renewing holder is
 * never judged expired). The blocklist add may be applied or not and answer success or an error
 * either way (a silent failure: success, not applied), at every call. One decision per run:
 * after the lift (fin) the controller decides nothing more.
 *
 * Checked (the assertion's name gives model/check its kind):
 *   two_unfenced_writers (writers)  M writes while c exists and no entry covers it (a monitor,
 *                                   in every state)
 *   taint_unfenced (taint)          the taint added, or P deleted, while no entry is in force
 *   needless_fence (needless)       an entry added for N while N has always renewed at least one
 *                                   of the two (it has never been frozen, cut off from both, or
 *                                   down): a node whose agent renews (up, cut off from the API
 *                                   server only) or whose kubelet renews (cut off from Ceph only)
 *                                   is never fenced
 *   two_fence_scopes (scope)        entries of both scopes (c's exact address, N's whole address
 *                                   ip:0/0) added for the one decision
 *   stray_node_fence (stray)        an ip:0/0 entry added after the decision lifted its entry
 *                                   (nobody will lift it; it cuts N's agent off from Ceph)
 *
 * Switches (the design: none of them):
 *   NODE_SCOPE          the declaring replica may fence N's whole address instead of c's
 *   BLIND_WRITES        the Node annotation written without the resourceVersion (a patch)
 *   TAINT_BEFORE_FENCE  the taint goes with the declaration, before the blocklist add
 *   NO_TAINT_ASSERT     check writers, not taint_unfenced
 *   NO_STRAY_ASSERT     do not check stray_node_fence
 *   ONE_DETECTOR        dead when the kubelet lease alone has not moved for a grace
 *   AGENT_ONLY          dead when the agent's heartbeat alone has not moved for a grace
 *   LIFT_EARLY          the entry lifted also when N's kubelet lease moves again
 *   NO_VERIFY           the taint once the add answers success, the blocklist not read back
 */

#ifndef HANDOVERS
#define HANDOVERS 2     /* lease takeovers between the replicas in a run */
#endif

/* N's states */
#define UP       0
#define FROZEN   1
#define CUT_API  2      /* the agent renews (and c writes); the kubelet does not */
#define CUT_CEPH 3      /* the kubelet renews; the agent does not, c cannot reach Ceph */
#define CUT_BOTH 4
#define DOWN     5      /* rebooting: a new boot, c gone */

/* the Node annotation's phases */
#define NONE     0
#define FENCING  1
#define FENCED   2
#define TAINTED  3
#define MOVED    4

/* scopes */
#define EXACT    0      /* c's address (the client address rbd-owner's claim records) */
#define WHOLE    1      /* N's whole address, ip:0/0 */

/* ---- node N, its client c, what its agent writes to Ceph ---- */
byte nst = UP;
bool booted;            /* N rebooted once (a new boot id) */
bool c_gone;            /* c is gone: the reboot, or N's agent unmapped it */
bool gone_rep;          /* N's agent recorded the fenced mapping gone (in Ceph) */
bool hb_new;            /* N's heartbeat in Ceph shows the new boot id */
bool silent_ever;       /* ghost: N has been frozen, cut off from both, or down */

/* ---- the cluster's blocklist ---- */
bool bl_x;              /* the entry of c's exact address is in force */
bool bl_n;              /* the entry of N's whole address (ip:0/0) is in force */
bool added_x, added_n;  /* ghosts: added for the decision */
bool lifted;            /* ghost: the decision's entry was lifted */

/* ---- the Node object: the annotation and the taint, one resourceVersion ---- */
byte ph;                /* the phase */
byte pscope;            /* the scope of the decision's entry */
bool taint;             /* the out-of-service taint the controller added */
bool fin;               /* the decision is over: lifted (one decision per run) */
bool dirty[2];          /* the Node was written since replica r read it: r's compare-and-set fails */

/* ---- Kubernetes ---- */
bool pod_del;           /* P (on N, its uid) is deleted: by the controller, or by the taint */
bool m_writes;          /* P runs on M: M mapped the image and writes */

/* ---- leader election ---- */
byte lead;              /* the replica holding the lease */
bool frz[2];            /* replica r is stopped */
bool stale[2];          /* r resumed after the other took over: one more step, then it forgets */
byte hand;              /* takeovers so far */

/* ---- each replica's memory ---- */
bool known[2];          /* it read the Node (else its next step is the read) */
byte vph[2];            /* the phase as it believes it */
byte vscope[2];
bool vfin[2];
byte sub[2];            /* fencing: 0 add next, 1 read back next; tainted: 0 delete P, 1 then
                           the VolumeAttachment and "moved"; moved: 0 lift, 1 untaint */
bool okret[2];          /* its last add answered success */
byte wk[2], wa[2];      /* its watch of the kubelet lease, of the agent's heartbeat: 0 none,
                           1 watching (the same mark), 2 the grace passed */
bool mk[2], ma[2];      /* the detector moved since its last look */
bool decided[2];        /* its last look found N dead */
bool inforce;           /* scratch */

bool two_unfenced_writers, taint_unfenced, needless_fence, two_fence_scopes, stray_node_fence;

#define KREN (nst == UP || nst == CUT_CEPH)
#define AREN ((nst == UP || nst == CUT_API) && !bl_n)
#define ACT(r) (!frz[r] && (lead == r || stale[r]))

/* after a change of N's state or of the ip:0/0 entry: a detector that renews moves */
#define RENEWED \
  if :: KREN && wk[0] != 0 -> mk[0] = 1 :: else fi; \
  if :: KREN && wk[1] != 0 -> mk[1] = 1 :: else fi; \
  if :: AREN && wa[0] != 0 -> ma[0] = 1 :: else fi; \
  if :: AREN && wa[1] != 0 -> ma[1] = 1 :: else fi; \
  if :: AREN && booted -> hb_new = 1 :: else fi; \
  if :: nst == FROZEN || nst == CUT_BOTH || nst == DOWN -> silent_ever = 1 :: else fi

active proctype Node() {
end:
  do
  :: atomic { nst != DOWN ->
       if
       :: nst = UP;       printf("N: up\n")
       :: nst = FROZEN;   printf("N: frozen\n")
       :: nst = CUT_API;  printf("N: cut off from the API server\n")
       :: nst = CUT_CEPH; printf("N: cut off from Ceph\n")
       :: nst = CUT_BOTH; printf("N: cut off from both\n")
       fi;
       RENEWED }
  :: atomic { nst != DOWN && !booted -> nst = DOWN; booted = 1; c_gone = 1; RENEWED; printf("N: REBOOTS: c is gone\n") }
  :: atomic { nst == DOWN -> nst = UP; RENEWED; printf("N: up on its new boot\n") }
  :: atomic { AREN && !c_gone && bl_x -> c_gone = 1; gone_rep = 1; printf("N's agent: unmaps the fenced c, records the mapping gone\n") }
  od
}

active proctype Kube() {
end:
  do
  :: atomic { taint && !pod_del -> pod_del = 1; printf("kubernetes: the out-of-service taint: P deleted\n") }
  :: atomic { pod_del && !m_writes -> m_writes = 1; printf("kubernetes: P starts on M: M maps the image and WRITES\n") }
  od
}

active proctype Writers() {
end:
  atomic {
    m_writes && !c_gone && !bl_x && !bl_n ->
    two_unfenced_writers = 1;
    printf("MONITOR: M writes, and c may write (not blocklisted, N not rebooted)\n");
    assert(!two_unfenced_writers)
  }
}

#define FORGET(r) \
  known[r] = 0; vph[r] = NONE; vscope[r] = EXACT; vfin[r] = 0; sub[r] = 0; okret[r] = 0; \
  wk[r] = 0; wa[r] = 0; mk[r] = 0; ma[r] = 0; decided[r] = 0; stale[r] = 0; dirty[r] = 0

/* a replica's step ends: a stale one has had its step; its lease renewal fails */
#define DONE(r) if :: stale[r] -> printf("ctl %d: its lease is gone: it stops and forgets\n", r); FORGET(r) :: else fi

#ifdef BLIND_WRITES
#define CONFLICT(r) false
#else
#define CONFLICT(r) dirty[r]
#endif
/* a write of the Node that succeeded: the other replica's compare-and-set will fail */
#define WROTE(r) dirty[1 - r] = 1
#define RETRY(r) known[r] = 0; sub[r] = 0; decided[r] = 0; printf("ctl %d: conflict: it reads the Node again\n", r)

#ifdef NO_TAINT_ASSERT
#define TAINT_CHECK
#else
#define TAINT_CHECK taint_unfenced = (!bl_x && !bl_n); assert(!taint_unfenced)
#endif

#ifdef NO_STRAY_ASSERT
#define STRAY_CHECK(s) skip
#else
#define STRAY_CHECK(s) stray_node_fence = (s == WHOLE && lifted); assert(!stray_node_fence)
#endif

#define ADDED(s) \
  if :: s == EXACT -> bl_x = 1; added_x = 1 :: else -> bl_n = 1; added_n = 1 fi; \
  printf("blocklist: the entry of %d (0 c's address, 1 ip:0/0) is in force\n", s); \
  needless_fence = !silent_ever; assert(!needless_fence); \
  two_fence_scopes = (added_x && added_n); assert(!two_fence_scopes); \
  STRAY_CHECK(s)

proctype Ctl(byte r) {
end:
  do
  /* read the Node (after a takeover, after a conflict) */
  :: atomic { ACT(r) && !known[r] ->
       known[r] = 1; dirty[r] = 0; vph[r] = ph; vscope[r] = pscope; vfin[r] = fin; sub[r] = 0; okret[r] = 0; decided[r] = 0;
       printf("ctl %d: reads the Node: phase %d scope %d over %d\n", r, ph, pscope, fin);
       DONE(r) }
  /* look at both detectors */
  :: atomic { ACT(r) && known[r] && vph[r] == NONE && !vfin[r] ->
       if
       :: KREN || mk[r] -> wk[r] = 1; mk[r] = 0
       :: else ->
            if
            :: wk[r] == 0 -> wk[r] = 1
            :: wk[r] != 0 -> wk[r] = 2
            :: wk[r] == 1
            fi
       fi;
       if
       :: AREN || ma[r] -> wa[r] = 1; ma[r] = 0
       :: else ->
            if
            :: wa[r] == 0 -> wa[r] = 1
            :: wa[r] != 0 -> wa[r] = 2
            :: wa[r] == 1
            fi
       fi;
#if defined(ONE_DETECTOR)
       decided[r] = (wk[r] == 2);
#elif defined(AGENT_ONLY)
       decided[r] = (wa[r] == 2);
#else
       decided[r] = (wk[r] == 2 && wa[r] == 2);
#endif
       printf("ctl %d: looks: kubelet lease %d, agent heartbeat %d (2: the grace passed): dead %d\n", r, wk[r], wa[r], decided[r]);
       DONE(r) }
  /* declare N dead: phase fencing with the entry's scope */
  :: atomic { ACT(r) && known[r] && vph[r] == NONE && decided[r] ->
       if
       :: CONFLICT(r) -> RETRY(r)
       :: else ->
            vscope[r] = EXACT;
#ifdef NODE_SCOPE
            if :: vscope[r] = WHOLE :: skip fi;
#endif
            ph = FENCING; pscope = vscope[r]; WROTE(r); vph[r] = FENCING; sub[r] = 0; decided[r] = 0;
            wk[r] = 0; wa[r] = 0; mk[r] = 0; ma[r] = 0;
            printf("ctl %d: N DEAD: writes phase fencing, scope %d\n", r, pscope);
#ifdef TAINT_BEFORE_FENCE
            taint = 1; printf("ctl %d: taints N out-of-service\n", r); TAINT_CHECK;
#endif
            skip
       fi;
       DONE(r) }
  /* the blocklist add */
  :: atomic { ACT(r) && known[r] && vph[r] == FENCING && sub[r] == 0 ->
       printf("ctl %d: blocklist add (scope %d)\n", r, vscope[r]);
       if
       :: true -> ADDED(vscope[r]); okret[r] = 1; printf("ctl %d: (answered success)\n", r)
       :: true -> ADDED(vscope[r]); okret[r] = 0; printf("ctl %d: (applied, timed out)\n", r)
       :: okret[r] = 0; printf("ctl %d: (lost: an error)\n", r)
       :: okret[r] = 1; printf("ctl %d: (not applied, answered success)\n", r)
       fi;
       sub[r] = 1;
       DONE(r) }
  /* read the blocklist back: in force, phase fenced; else add again */
  :: atomic { ACT(r) && known[r] && vph[r] == FENCING && sub[r] == 1 ->
#ifdef NO_VERIFY
       inforce = okret[r];
#else
       inforce = (vscope[r] == EXACT && bl_x) || (vscope[r] == WHOLE && bl_n);
#endif
       if
       :: inforce ->
            if
            :: CONFLICT(r) -> RETRY(r)
            :: else -> ph = FENCED; WROTE(r); vph[r] = FENCED; sub[r] = 0;
                       printf("ctl %d: the entry is in force, as it knows: writes phase fenced\n", r)
            fi
       :: else -> sub[r] = 0; printf("ctl %d: the entry is not listed: add it again\n", r)
       fi;
       inforce = 0;
       DONE(r) }
  /* the taint and phase tainted: one Node update */
  :: atomic { ACT(r) && known[r] && vph[r] == FENCED ->
       if
       :: CONFLICT(r) -> RETRY(r)
       :: else -> taint = 1; ph = TAINTED; WROTE(r); vph[r] = TAINTED; sub[r] = 0;
                  printf("ctl %d: taints N out-of-service, phase tainted\n", r);
                  TAINT_CHECK
       fi;
       DONE(r) }
  /* force-delete P (its uid: a no-op once it is gone) */
  :: atomic { ACT(r) && known[r] && vph[r] == TAINTED && sub[r] == 0 ->
       if
       :: !pod_del -> pod_del = 1; printf("ctl %d: force-deletes P\n", r); TAINT_CHECK
       :: else -> printf("ctl %d: force-deletes P: gone already\n", r)
       fi;
       sub[r] = 1;
       DONE(r) }
  /* delete the VolumeAttachment (not modelled: M may start P once P is deleted), phase moved */
  :: atomic { ACT(r) && known[r] && vph[r] == TAINTED && sub[r] == 1 ->
       if
       :: CONFLICT(r) -> RETRY(r)
       :: else -> ph = MOVED; WROTE(r); vph[r] = MOVED; sub[r] = 0;
                  printf("ctl %d: deletes the VolumeAttachment, phase moved\n", r)
       fi;
       DONE(r) }
  /* the way back: a new boot id in N's heartbeat, or the mapping recorded gone: lift its entry */
  :: atomic { ACT(r) && known[r] && vph[r] == MOVED && sub[r] == 0 &&
#ifdef LIFT_EARLY
              (hb_new || gone_rep || KREN) ->
#else
              (hb_new || gone_rep) ->
#endif
       printf("ctl %d: N's new boot %d, mapping gone %d, kubelet renews %d: lifts its entry (scope %d)\n", r, hb_new, gone_rep, KREN, vscope[r]);
       if :: vscope[r] == EXACT -> bl_x = 0 :: else -> bl_n = 0 fi;
       lifted = 1; sub[r] = 1;
       RENEWED;
       DONE(r) }
  /* then its taint, phase none: the decision is over */
  :: atomic { ACT(r) && known[r] && vph[r] == MOVED && sub[r] == 1 ->
       if
       :: CONFLICT(r) -> RETRY(r)
       :: else -> taint = 0; ph = NONE; fin = 1; WROTE(r); vph[r] = NONE; vfin[r] = 1; sub[r] = 0;
                  printf("ctl %d: removes its taint, phase none\n", r)
       fi;
       DONE(r) }
  /* a stale replica with nothing to do: its lease renewal fails */
  :: atomic { stale[r] && !frz[r] -> DONE(r) }
  od
}

active proctype Election() {
end:
  do
  :: atomic { !frz[lead] -> frz[lead] = 1; printf("ctl %d: STOPS (a freeze, a pause, a partition)\n", lead) }
  :: atomic { frz[lead] && !frz[1 - lead] && hand < HANDOVERS ->
       hand++; lead = 1 - lead; FORGET(lead);
       printf("ctl %d: takes the lease over (a fresh start)\n", lead) }
  :: atomic { frz[0] -> frz[0] = 0;
       if
       :: lead != 0 && known[0] -> stale[0] = 1; printf("ctl 0: resumes, believing it leads\n")
       :: lead != 0 && !known[0] -> FORGET(0)
       :: else -> printf("ctl 0: resumes\n")
       fi }
  :: atomic { frz[1] -> frz[1] = 0;
       if
       :: lead != 1 && known[1] -> stale[1] = 1; printf("ctl 1: resumes, believing it leads\n")
       :: lead != 1 && !known[1] -> FORGET(1)
       :: else -> printf("ctl 1: resumes\n")
       fi }
  od
}

init {
  atomic { run Ctl(0); run Ctl(1) }
}

/*
 * lease.pml: the lease rule of rbd-owner (agent/claim/liveness.go), for spin.
 *
 * rbd_owner.pml lets a claimer judge a holder's lease expired whenever it likes, and shows that
 * no two writers follow from that (a takeover fences first). This model checks what the lease
 * rule itself promises: a holder that keeps renewing is never judged expired, whatever the
 * nodes' clocks say.
 *
 * One holder renews its heartbeat object (Store.Heartbeat); one claimer reads it
 * (Store.leases) and, at most D time units after the read, judges it (Observer.Look) on its own
 * monotonic clock: expired only once the same mark has been seen for a whole lease L since its
 * first look. Real time passes in units; the heartbeat's age, the claimer's watch and the
 * pending read's age are counted in those units (capped), so the model is finite and holds
 * every history. Monotonic clocks run at the rate of real time (their offsets are irrelevant:
 * only differences are used); wall clocks have any offset (SKEW).
 *
 * The holder is live while it renews: its heartbeat lands at most R units after the one before.
 * It may stop at any moment (a crash, a partition) and is then dead for good. The claimer may
 * restart (forget what it saw) at any moment.
 *
 * Checked: a live holder is never judged expired. It holds when R + D < L (here 2 + 1 < 6). The
 * agent's config enforces it (config.LeaseBound): R is renew_interval plus the longer of the
 * heartbeat's deadline and write (10 s + 10 s) and, when the OSD serving the heartbeat stops,
 * osd_failover (30 s); D the 10 s bound on a read. The defaults: 10 + 30 + 10 = 50 s < 60 s.
 *
 * Variant CLOCK_RULE: the rule before clock-free leases (Holder.Expired), the holder's
 * wall-clock renewal time compared with the claimer's wall clock (now > renewed_at + lease):
 * with the claimer's clock ahead, a live holder is judged expired.
 */

#ifndef L
#define L 6             /* the lease (lease_duration 60 s) */
#endif
#ifndef R
#define R 2             /* the longest gap between a live holder's heartbeats (renew_interval 20 s) */
#endif
#ifndef D
#define D 1             /* the longest time from a read at the OSD to its Look (a call's timeout) */
#endif
#ifndef SKEW
#define SKEW L          /* wall clocks differ by up to this, either way */
#endif
#define CAP (L + D + 1) /* ages are counted up to here */

bool alive = 1;         /* the holder still renews */
byte hb_age;            /* real time since the holder's last heartbeat landed */
bool seen;              /* the claimer has a mark for the holder (Observer.seen) */
bool cur_is_seen;       /* the heartbeat is still the one whose mark the claimer saw */
byte since;             /* real time since the claimer first saw that mark (its monotonic clock) */
bool pending;           /* a read whose Look has not run yet */
bool rd_is_seen;        /* that read returned the mark the claimer saw */
bool rd_is_cur;         /* no heartbeat landed since that read */
byte rd_age;            /* real time since that read */
byte rd_wage;           /* the age, at the read, of the heartbeat it returned */
short skew;             /* the claimer's wall clock minus the holder's */
bool expired;           /* the Look's verdict */
bool live_holder_judged_expired;

#define INC(x) if :: x < CAP -> x++ :: else fi

/* Store.Heartbeat: one write of the heartbeat object lands (at most one per time unit: more
   would change nothing the claimer can tell apart) */
active proctype Holder() {
end:
  do
  :: atomic { alive && hb_age > 0 -> hb_age = 0; cur_is_seen = 0; rd_is_cur = 0;
              printf("holder: a heartbeat lands\n") }
  :: atomic { alive -> alive = 0; printf("holder: stops renewing\n") }   /* for good */
  od
}

/* Store.leases and Observer.Look, one lease at a time */
active proctype Claimer() {
#ifdef CLOCK_RULE
  /* free clocks: any offset between the two wall clocks (the rule above reads none) */
  atomic { select (skew : -SKEW .. SKEW) };
#endif
end:
  do
  :: atomic {                                 /* the read of the heartbeat object */
       !pending -> pending = 1; rd_age = 0; rd_is_seen = seen && cur_is_seen; rd_is_cur = 1;
       rd_wage = hb_age;
       printf("claimer: reads the heartbeat (it landed %d ago)\n", hb_age)
     }
  :: atomic {                                 /* Observer.Look, on this node's clock */
       pending -> pending = 0;
#ifndef CLOCK_RULE
       if
       :: !seen || !rd_is_seen ->             /* a new mark: the watch starts, never expired */
            seen = 1; since = 0; cur_is_seen = rd_is_cur; expired = 0;
            printf("claimer: Look: a new mark, the watch starts\n")
       :: else -> expired = (since >= L);
            printf("claimer: Look: the same mark for %d: expired %d\n", since, expired)
       fi;
#else
       /* the old rule (Holder.Expired before clock-free leases): this node's wall clock now is
          after the holder's renewed_at (its wall clock at the write) plus the lease */
       expired = (rd_wage + rd_age + skew > L);
       printf("claimer: now > renewed_at + lease? the heartbeat is %d old, the claimer's clock %d ahead: expired %d\n",
              rd_wage + rd_age, skew, expired);
#endif
       live_holder_judged_expired = (expired && alive);
       assert(!live_holder_judged_expired);
       expired = 0; rd_is_seen = 0; rd_is_cur = 0; rd_age = 0; rd_wage = 0
     }
  :: atomic { !pending && seen -> seen = 0; cur_is_seen = 0; since = 0 }   /* a restart forgets */
  od
}

/* real time: one unit passes, unless a live holder is due (its next heartbeat lands first) or
   a pending read is due for its Look */
active proctype Time() {
end:
  do
  :: atomic {
       (!alive || hb_age < R) && (!pending || rd_age < D) ->
       printf("time: one unit passes\n");
       INC(hb_age);
       if :: seen -> INC(since) :: else fi;
       if :: pending -> INC(rd_age); INC(rd_wage) :: else fi
     }
  od
}

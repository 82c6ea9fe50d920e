/*
 * index.pml: the claim index of a pool and namespace (agent/claim/index.go), for spin.
 *
 * The index is one object, rbd-owner.claims, whose omap keys name the images that have a claim
 * object (rbd-owner.claim.<image>) beside it; the sweeps and the orphan removal find claims
 * through it instead of listing the pool. The index object's version changes at every write to
 * it (a key set, even one already there, or removed). The rules:
 *   I1 (a writer of the claim): before it creates the claim object (it read "no object") or
 *      rewrites a record of an older format (which an agent from before the index may have left
 *      unindexed), it sets the image's key (a blind write), THEN does its compare-and-set on the
 *      claim object (exclusive create, or assert-version). It may stop in between.
 *   I2 (the orphan removal of a free claim whose image is gone: no image of that name, or one
 *      with another id, as claim/ops.go isOrphan judges): it reads the index's version iv,
 *      compares-and-removes the claim object at the version of the free record it judged,
 *      then removes the key asserting that the index is still at iv (else the key stays).
 *   I3 (the sweep drops a stale key): it reads the index (iv and keys); for a key, it reads the
 *      claim object (none), checks that the image is gone by name, and removes the key asserting
 *      that the index is still at iv.
 *
 * One image name. Images are deleted and created again under the name, each with a new id (a
 * generation, 1..GENS); with RESTORE an id that left the name (`rbd trash mv`, a rename) may come
 * back under it (`rbd trash restore`, a rename back). A claim records the image id it was made
 * for; an acquirer inspects the image (gets its id) once per Acquire, before it reads the claim,
 * and acts on that inspection however stale it has become, through every retry of its
 * read-decide-write loop (claim/store.go update). Actors: ACQS acquirers (each ACQ_OPS Acquires,
 * each followed at any time by its release), one orphan remover (REMS rounds), one sweeper
 * (SWEEPS rounds), the image's owner; each agent may crash before any of its steps (CRASHES in
 * all), forgetting its operation (a hold it took stays, and is released later). With LEGACY, the
 * claim object may start as a record of an older format that is not indexed, and an agent from
 * before the index may create (or rewrite) such records without ever touching the index.
 *
 * Checked (live_claim_unindexed, by the monitor, in every state): a claim object of the current
 * format whose recorded image id is the id the name has now is indexed. (With ID_KEYS: indexed
 * under that id.) A key without an object blocks nothing: no acquirer reads the index, a key set
 * is a blind write, and the removers only ever remove keys.
 *
 * The fixes, found by this model (docs/safety.md, "The claim index"):
 *   FIX_GEN_KEY    I1 also covers a rewrite that changes the record's image id (a claim of the
 *                  record of a deleted image of the same name): the key is set first
 *   FIX_I2_NAME    I2 removes the key only if the image is gone by name (checked after it read
 *                  the record); an image that exists with another id keeps the key
 *   ID_KEYS        (for RESTORE) one key per image id (the name and the id); I1 sets the key of the id
 *                  it inspected; I2 and I3 remove a key only once that id is gone for good (no
 *                  image has it: rbd_header.<id> is gone), never by name
 * Variants, each of which must fail:
 *   INDEX_AFTER_CREATE      the key is set after the claim's compare-and-set
 *   INDEX_REMOVE_UNGUARDED  I2 and I3 remove the key without asserting the index's version
 *   INDEX_ONCE              the key is set once per update call, not before every write attempt
 *                           (claim/store.go update as first written: its `indexed` flag)
 *   INDEX_NOT_OLD           (with LEGACY) a rewrite of a record of the older format does not set
 *                           the key first
 *   INDEX_IF_ABSENT         the key is set only if a read of the index does not show it already
 *                           (no write, so the index's version does not move)
 * Other switches: LEGACY (above); RESTORE (above); ADMIN_REMOVE: I2 also removes held records (the
 * admin's `rbd-owner orphans remove`; the sweep removes free ones only).
 * Bounds: ACQS, ACQ_OPS, REMS, SWEEPS, GENS, CRASHES, RESTORES (below).
 */

#ifndef ACQS
#define ACQS 2          /* acquirers (agents, or one agent's successive Acquires) */
#endif
#ifndef ACQ_OPS
#define ACQ_OPS 2       /* Acquires per acquirer over a run */
#endif
#ifndef REMS
#define REMS 1          /* orphan removal rounds (I2) */
#endif
#ifndef SWEEPS
#define SWEEPS 1        /* stale-key rounds of the sweep (I3) */
#endif
#ifndef GENS
#define GENS 2          /* images created under the name over a run (ids 1..GENS) */
#endif
#ifndef CRASHES
#define CRASHES 1
#endif
#ifndef OLD_OPS
#define OLD_OPS 1       /* with LEGACY: writes the old agent tries over a run */
#endif
#ifndef RESTORES
#define RESTORES 1      /* with RESTORE: ids that come back under the name */
#endif
#ifdef ADMIN_REMOVE
#define REM_HELD 1      /* the admin's `orphans remove`: held records of deleted images too */
#else
#define REM_HELD 0      /* the sweep's SweepOrphan: free records only */
#endif
#if ACQS > 2 || GENS > 3
#error "ACQS <= 2, GENS <= 3"
#endif

/* actors, for the version masks: acquirers 0..ACQS-1, the remover, the sweeper */
#define REM   ACQS
#define SWP   (ACQS + 1)
#define BIT(a) (1 << (a))

/* ---- the image name ---- */
byte gen = 1;           /* the id the name has now; 0: no image of that name */
byte made = 1;          /* ids created so far (1..made); the run starts with image id 1 */
byte away;              /* RESTORE: an id that left the name but exists (trash, another name) */
byte restores;

/* ---- the claim object ---- */
bool o;                 /* it exists */
byte og;                /* the image id its record was made for */
byte oh;                /* its holder: 0 free, else acquirer+1 (OLDH: the legacy agent) */
bool oold;              /* a record of an older format */
byte omask;             /* version semantics: actor a read it and nothing was written since */

/* ---- the index ---- */
#ifdef ID_KEYS
byte keys;              /* bit g: the key <image>@<g> */
#define KEYED(g)   ((keys >> (g)) & 1)
#define SETKEY(g)  keys = keys | BIT(g)
#define RMKEY(g)   keys = keys & ~BIT(g)
#else
bool key;               /* the key <image> */
#define KEYED(g)   key
#define SETKEY(g)  key = 1
#define RMKEY(g)   key = 0
#endif
byte imask;             /* version semantics of the index object, as omask */

byte crashes;
bool live_claim_unindexed;

#define OLDH  (ACQS + 1)      /* the legacy agent as a holder */
#define OLDB  (ACQS + 2)      /* ... and as a reader, in omask */
#define GONE_FOR_GOOD(g) ((g) != 0 && (g) != gen && (g) != away)

/* the invariant: a claim object of the current format made for the id the name has now is
   indexed */
#define UNINDEXED (o && !oold && gen != 0 && og == gen && !KEYED(og))

active proctype Monitor() {
end:
  atomic {
    UNINDEXED ->
    live_claim_unindexed = 1;
    printf("MONITOR: the claim object of image id %d (the name's id now) is not indexed\n", og);
    assert(!live_claim_unindexed)
  }
}

/* the image's owner: rbd rm, rbd create (a new id), and with RESTORE trash mv / restore */
active proctype Images() {
end:
  do
  :: atomic { gen != 0 -> printf("IMAGE: id %d deleted (the name is free)\n", gen); gen = 0 }
  :: atomic { gen == 0 && made < GENS -> made++; gen = made; printf("IMAGE: created again under the name: id %d\n", gen) }
#ifdef RESTORE
  :: atomic { gen != 0 && away == 0 -> away = gen; gen = 0; printf("IMAGE: id %d moved to the trash (or renamed away)\n", away) }
  :: atomic { gen == 0 && away != 0 && restores < RESTORES -> restores++; gen = away; away = 0; printf("IMAGE: id %d restored under the name\n", gen) }
  :: atomic { away != 0 -> printf("IMAGE: id %d purged from the trash\n", away); away = 0 }
#endif
  od
}

/* a crash before the next step: the actor forgets its operation (WHO: its name in the narration) */
#define CRASH :: atomic { crashes < CRASHES -> crashes++; WHO; goto restart }

/* I1 and the claim's compare-and-set: one acquirer's Acquires, and its releases */
proctype Acquirer(byte me) {
  byte ops, g, rg;
  bool rnone, rold, need, indexed;
#define WHO printf("acquirer %d: CRASH (its agent restarts)\n", me)
restart:
  atomic { g = 0; rg = 0; rnone = 0; rold = 0; need = 0; indexed = 0; omask = omask & ~BIT(me) }
end:
  do
  :: atomic {                           /* Acquire: inspectImage, once per Acquire */
       ops < ACQ_OPS -> ops++; g = gen; indexed = 0;
       if
       :: g == 0 -> printf("acquirer %d: Acquire: no image of that name: refused\n", me)
       :: else -> printf("acquirer %d: Acquire: inspects the image: id %d\n", me, g); goto rd
       fi
     }
  :: atomic {                           /* the release of its hold (read and write: one step) */
       o && oh == me + 1 -> oh = 0; omask = 0; printf("acquirer %d: releases its hold (the record is free)\n", me)
     }
  od;
rd:
  if
  CRASH
  :: atomic {                           /* update's read, and the decision */
       omask = omask | BIT(me); rnone = !o; rg = og; rold = oold;
       if
       :: rnone -> printf("acquirer %d: reads the claim: none\n", me)
       :: else -> printf("acquirer %d: reads the claim: image id %d, holder %d, old format %d\n", me, og, oh, oold)
       fi;
       if
       :: !rnone && rg == g && oh != 0 && oh != me + 1 ->
            if
            :: printf("acquirer %d: held: refused\n", me); goto done
            :: printf("acquirer %d: held: takes it over\n", me)
            fi
       :: else
       fi;
#ifdef INDEX_NOT_OLD
       need = rnone;
#else
       need = rnone || rold;
#endif
#ifdef FIX_GEN_KEY
       need = need || rg != g;
#endif
#ifdef INDEX_ONCE
       need = need && !indexed;
#endif
#ifdef INDEX_AFTER_CREATE
       goto cas
#else
       if
       :: need -> goto setkey
       :: else -> goto cas
       fi
#endif
     }
  fi;
setkey:
  if
  CRASH
  :: atomic {
#ifdef INDEX_IF_ABSENT
       if
       :: KEYED(g) -> printf("acquirer %d: reads the index: the key is there, not set again\n", me); indexed = 1; goto cas
       :: else
       fi;
#endif
       SETKEY(g); imask = 0; indexed = 1;
       printf("acquirer %d: sets the key (image id %d) in the index\n", me, g);
#ifdef INDEX_AFTER_CREATE
       goto done
#else
       goto cas
#endif
     }
  fi;
cas:
  if
  CRASH
  :: atomic {
       if
       :: (rnone && !o) || (!rnone && ((omask >> me) & 1)) ->
            if
            :: rnone -> printf("acquirer %d: creates the claim (exclusive): image id %d, held\n", me, g)
            :: else -> printf("acquirer %d: writes the claim (assert-version): image id %d, held\n", me, g)
            fi;
            o = 1; og = g; oh = me + 1; oold = 0; omask = 0;
#ifdef INDEX_AFTER_CREATE
            if
            :: need -> goto setkey
            :: else
            fi;
#endif
            goto done
       :: else ->
            printf("acquirer %d: the compare fails: reads again\n", me);
            omask = omask & ~BIT(me); goto rd
       fi
     }
  fi;
done:
  atomic { g = 0; rg = 0; rnone = 0; rold = 0; need = 0; indexed = 0; omask = omask & ~BIT(me); goto end }
}

/* I2: the orphan removal of a free claim whose image is gone (agent/claim/ops.go removeOrphan:
   read the record, check the image, compare-and-remove), with the index's version read at any
   point before the object's removal */
proctype Remover() {
  byte me = REM, rounds, rg;
  bool ivr, namegone;
#undef WHO
#define WHO printf("remover: CRASH (its agent restarts)\n")
#define READ_IV atomic { imask = imask | BIT(me); ivr = 1; printf("remover: reads the index's version\n") }
restart:
  atomic { rg = 0; ivr = 0; namegone = 0; omask = omask & ~BIT(me); imask = imask & ~BIT(me) }
end:
  do
  :: atomic { rounds < REMS -> rounds++; printf("remover: round %d\n", rounds) }; break
  od;
  if :: READ_IV :: skip fi;
  if
  CRASH
  :: atomic {
       o && (oh == 0 || REM_HELD) -> omask = omask | BIT(me); rg = og;
       printf("remover: reads the claim: image id %d, holder %d\n", og, oh)
     }
  :: atomic { !(o && (oh == 0 || REM_HELD)) -> printf("remover: no claim to remove\n"); goto done }
  fi;
  if :: !ivr -> READ_IV :: skip fi;
  if
  CRASH
  :: atomic {                           /* isOrphan: gone, or recreated with another id */
       if
       :: gen == 0 || gen != rg ->
            namegone = (gen == 0);
            printf("remover: the image is gone (the name's id is %d): an orphan\n", gen)
       :: else -> printf("remover: the image exists: not an orphan\n"); goto done
       fi
     }
  fi;
  if :: !ivr -> READ_IV :: else fi;
  if
  CRASH
  :: atomic {
       if
       :: (omask >> me) & 1 -> o = 0; og = 0; oh = 0; oold = 0; omask = 0;
            printf("remover: removes the claim object (compare-and-remove)\n")
       :: else -> printf("remover: the claim changed: not removed\n"); goto done
       fi
     }
  fi;
#ifdef ID_KEYS
  if
  CRASH
  :: atomic {
       if
       :: GONE_FOR_GOOD(rg) ->
#ifdef INDEX_REMOVE_UNGUARDED
            RMKEY(rg); imask = 0; printf("remover: removes the key @%d\n", rg)
#else
            if
            :: (imask >> me) & 1 -> RMKEY(rg); imask = 0; printf("remover: removes the key @%d (the index unchanged)\n", rg)
            :: else -> printf("remover: the index changed: the key stays\n")
            fi
#endif
       :: else -> printf("remover: id %d still exists (trash, another name): its key stays\n", rg)
       fi
     }
  fi;
#else
  if
  CRASH
  :: atomic {
#ifdef FIX_I2_NAME
       if
       :: !namegone -> printf("remover: an image has the name: the key stays\n"); goto done
       :: else
       fi;
#endif
#ifdef INDEX_REMOVE_UNGUARDED
       RMKEY(0); imask = 0; printf("remover: removes the key\n")
#else
       if
       :: (imask >> me) & 1 -> RMKEY(0); imask = 0; printf("remover: removes the key (the index unchanged)\n")
       :: else -> printf("remover: the index changed: the key stays\n")
       fi
#endif
     }
  fi;
#endif
done:
  atomic { rg = 0; ivr = 0; namegone = 0; omask = omask & ~BIT(me); imask = imask & ~BIT(me); goto end }
}

/* I3: the sweep drops a stale key (agent/claim/index.go DropStaleKey) */
proctype Sweeper() {
  byte me = SWP, rounds, k;
#undef WHO
#define WHO printf("sweeper: CRASH (its agent restarts)\n")
restart:
  atomic { k = 0; omask = omask & ~BIT(me); imask = imask & ~BIT(me) }
end:
  do
  :: atomic { rounds < SWEEPS -> rounds++; printf("sweeper: round %d\n", rounds) }; break
  od;
  if
  CRASH
  :: atomic {                           /* ReadIndex: its version and keys */
       imask = imask | BIT(me);
#ifdef ID_KEYS
       if
       :: KEYED(1) -> k = 1
       :: KEYED(2) -> k = 2
       :: GENS > 2 && KEYED(3) -> k = 3
       :: keys == 0 -> printf("sweeper: the index has no key\n"); goto done
       fi;
       printf("sweeper: reads the index: the key @%d\n", k)
#else
       if
       :: key -> k = 1; printf("sweeper: reads the index: the key\n")
       :: else -> printf("sweeper: the index has no key\n"); goto done
       fi
#endif
     }
  fi;
  if
  CRASH
  :: atomic {
#ifdef ID_KEYS
       if
       :: !o || og != k -> printf("sweeper: reads the claim: none of id %d\n", k)
#else
       if
       :: !o -> printf("sweeper: reads the claim: none\n")
#endif
       :: else -> printf("sweeper: reads the claim: there\n"); goto done
       fi
     }
  fi;
  if
  CRASH
  :: atomic {
#ifdef ID_KEYS
       if
       :: GONE_FOR_GOOD(k) -> printf("sweeper: id %d is gone for good\n", k)
       :: else -> printf("sweeper: id %d still exists: the key stays\n", k); goto done
       fi
#else
       if
       :: gen == 0 -> printf("sweeper: the image is gone by name\n")
       :: else -> printf("sweeper: the image exists: the key stays\n"); goto done
       fi
#endif
     }
  fi;
  if
  CRASH
  :: atomic {
#ifdef INDEX_REMOVE_UNGUARDED
       RMKEY(k); imask = 0; printf("sweeper: removes the key\n")
#else
       if
       :: (imask >> me) & 1 -> RMKEY(k); imask = 0; printf("sweeper: removes the key (the index unchanged)\n")
       :: else -> printf("sweeper: the index changed: the key stays\n")
       fi
#endif
     }
  fi;
done:
  atomic { k = 0; omask = omask & ~BIT(me); imask = imask & ~BIT(me); goto end }
}

#ifdef LEGACY
/* an agent from before the index: it creates and rewrites records of the older format and never
   touches the index; it refuses (cannot read) a record of the current format */
proctype OldAgent() {
  byte me = OLDB, g, ops;
  bool rnone;
end:
  do
  :: atomic { o && oh == OLDH -> oh = 0; omask = 0; printf("old agent: releases its hold\n") }
  :: atomic {
       g == 0 && gen != 0 && ops < OLD_OPS -> ops++; g = gen; omask = omask | BIT(me); rnone = !o;
       printf("old agent: Acquire: inspects id %d, reads the claim (none %d)\n", g, rnone)
     }
  :: atomic {
       g != 0 ->
       if
       :: (rnone && !o) || (!rnone && oold && ((omask >> me) & 1)) ->
            o = 1; og = g; oh = OLDH; oold = 1; omask = 0;
            printf("old agent: writes the claim in the older format: image id %d (not indexed)\n", g)
       :: else -> printf("old agent: refused or lost the race\n")
       fi;
       g = 0; rnone = 0; omask = omask & ~BIT(me)
     }
  od
}
#endif

init {
  atomic {
#ifdef LEGACY
    /* a claim from before the index, of the image that exists, held or free, not indexed */
    if
    :: skip
    :: o = 1; og = 1; oold = 1; oh = 0; printf("start: an unindexed free record of the older format\n")
    :: o = 1; og = 1; oold = 1; oh = OLDH; printf("start: an unindexed record of the older format, held by an old agent\n")
    fi;
    run OldAgent();
#endif
    run Acquirer(0);
    if :: ACQS > 1 -> run Acquirer(1) :: else fi;
    if :: REMS > 0 -> run Remover() :: else fi;
    if :: SWEEPS > 0 -> run Sweeper() :: else fi
  }
}

/*
 * provider_batches/protocol.pml: a Promela model of the provider-batch submitter,
 * checked with Spin (tests/it/protocol_model.rs runs it, as it runs the job model in
 * src/jobs/protocol.pml). It describes src/jobs/provider_batches/ (submit.rs,
 * poll.rs, settle.rs, rows.rs), the provider's batch API (src/llm/batches/) and the
 * lease rescue's rule for items in a provider batch (queue/rescue.rs,
 * lifecycle::lease_is_lost); a comment at each step names the Rust function.
 *
 * WHAT IS MODELLED
 *   Two items of one closed PROVIDER_BATCH batch, two submitter processes (each
 *   worker process runs one; one of them may die and a new one takes its place), the
 *   provider, the lease rescue and the tenant.
 *   - Every database transaction is one `atomic` step. A row is owned by one
 *     submitter at a time (run_token, lease_until: rows::take); each write of a step
 *     re-checks the owner (rows::fenced). A dead submitter's rows come free (its
 *     lease lapses); so do a live one's that is paused past its leases (stopped,
 *     swapped out, cut off from the database), while a new process works beside it
 *     and resumes where it stopped. An upload renews its lease while it runs
 *     (rows::while_owned) and sends each creating request only through the gate,
 *     one step with the request: the row still owned (rows::OwnerGate).
 *   - submit_one: in one transaction, some queued items are claimed, their attempts
 *     started (`item_row`: the row, which is their run token) and the row written
 *     `preparing`, before anything is sent.
 *   - upload: `preparing` -> `uploading` (only while no other row is `uploading`:
 *     the partial unique index, which only Anthropic's rows take, as the search
 *     below is Anthropic's), then the upload, which lands or not, and whose
 *     answer is received or lost; the answer makes the row `submitted` (or, nothing
 *     having reached the provider, `preparing` again).
 *   - recover: a row found `uploading` is searched for at the provider first, as
 *     Anthropic's batches are found (the OpenAI search, by our id in the metadata,
 *     names the row outright and is the stronger): the one provider batch created
 *     since the upload began that no row records. Found: `submitted`; none: uploaded
 *     again under the same row; more than one: left unfound (unknown, below).
 *   - poll: a cancelled batch's provider batch is cancelled at the provider; a
 *     provider batch that ended makes its row `ended`.
 *   - settle: each item of an ended row, fenced by its attempt (it still runs, in
 *     this row): succeeded -> charged, SUCCEEDED; not run (expired, cancelled,
 *     missing) -> queued again, or CANCELLED if the tenant cancelled; then the row is
 *     `settled`. The submitter may die between any two items.
 *   - unknown: a row the provider cannot be read about past the bound ends `unknown`;
 *     its running items FAIL with their cost bounds, never sent again.
 *   - The provider ends a provider batch at any time, running each request (billed)
 *     or letting it expire (not billed); a cancel ends it, what it ran staying run.
 *   - The rescue: an item's lease may lapse at any time (its 48 h are abstracted
 *     away); it is taken back (queued again) only when its row is final.
 *   - The tenant may cancel the batch: queued items are CANCELLED at once.
 *
 * WHAT IS ABSTRACTED AWAY
 *   - Time, polls that find a batch still running, backoff, and the unknown-fate
 *     bound's clock: any submitted row may become unreadable past the bound.
 *   - Money: an item's request is billed or not; a charge is a count.
 *   - The OpenAI input file found without its batch (the batch is created from it:
 *     one more way for an upload to land), limits of requests and bytes, chunking.
 *   - An upload whose sender died lands, if at all, before the sender's row lease
 *     lapses (a provider processes a request it read whole within seconds; the lease
 *     is 30 s).
 *   - The gate and the request it opens are one step. A create already on its way
 *     when a pause let the row go is found by the new owner's search, which the
 *     model has; the rarer create that arrives after that search is watched and
 *     cancelled by its sender (orphans.rs), which the model has not.
 *   - Bounds, so that every run ends: ROWS rows, REMOTES provider batches, two
 *     mishaps of any kinds (at most one of them a submitter's death), one cancel.
 *     Items' leases lapse only in the mutant that takes them back (in the model as
 *     it is, no lapse is ever taken back: the row of a running item is never final).
 *     The model has no cycle, so the search for Q3 needs no fairness.
 *
 * PROPERTIES
 *   Q1 No item is sent while a provider batch that may bill it holds it: as a
 *      provider batch is created, none of its items is in another one still running
 *      or billed in one (`assert(!HELD_ELSEWHERE)`), and the provider bills an item
 *      at most once (`billed[i] <= 1`).
 *   Q2 No item is settled twice: `charged[i] <= 1` as each charge is written.
 *   Q3 No item is lost and every bill is accounted for: `ltl all_settled` says that
 *      eventually, for ever, every item is terminal, every row final, and each
 *      item's provider bills are its charges, or it carries an unknown bound.
 *
 * MUTANTS (-D defines; tests/it/protocol_model.rs checks each is caught, and by what)
 *   NO_FIND_AGAIN          a row found `uploading` is uploaded again unsearched -> Q1
 *   NO_ONE_UPLOAD          several rows may be `uploading` at once: a recovery
 *                          takes another row's upload for its own            -> Q1
 *   UPLOAD_BEFORE_ROW      the upload is made before the claim and the row are
 *                          written, and the submitter may die between         -> Q1
 *   NO_SETTLE_FENCE        a result settles its item whether or not the
 *                          attempt still runs: results read twice charge twice -> Q2
 *   NO_LIVE_BATCH_RULE     the rescue takes back an item of a live row        -> Q1
 *   UNKNOWN_SENT_AGAIN     an item of an unknown row is queued again          -> Q1
 *   NO_MISSING_RESULTS     only requests the provider ran are settled: an
 *                          expired or cancelled one stays running for ever    -> Q3
 *   NO_SEND_GATE           an upload is sent whether or not its row is still
 *                          owned: a submitter paused past its lease resumes
 *                          and sends what its row's new owner sent            -> Q1
 *   The mutants of Q1 and Q2 are found by a search for assertion violations alone
 *   (`-DSAFETY`, invalid end states not reported), which finds them in a fraction of
 *   a second; Q3's by the search for acceptance cycles.
 */

#define ITEMS 2
#define ROWS 3
#define REMOTES 3
#define SUBMITTERS 2    /* one at a time: the second replaces the first when it dies */

mtype:item = { QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED };
mtype:row = { PREPARING, UPLOADING, SUBMITTED, ENDED, SETTLED, ABANDONED, UNKNOWN };
mtype:remote = { IN_PROGRESS, DONE };
/* How an upload's answer came back: plain numbers, since Spin 6.5 gives the name
 * of an mtype subtype to a global, which a local of that name would be. */
#define ANSWERED 1
#define ANSWER_LOST 2
#define NOT_SENT 3
#define NOTHING_LANDED 4

/* ---- the items (job rows) and their attempts ------------------------------------ */
mtype:item item[ITEMS] = QUEUED;
byte item_row[ITEMS];           /* the row its running attempt is in (its run token) */
bool cancel_requested;          /* the batch's */

/* ---- the provider batch rows, 1..ROWS (0: none) ------------------------------------ */
mtype:row row_state[ROWS + 1];
byte row_remote[ROWS + 1];      /* the provider batch recorded; 0: none */
byte row_owner[ROWS + 1];       /* the submitter holding its lease; 0: free */
byte row_began[ROWS + 1];       /* provider batches created before its upload began */
bool row_cancel_sent[ROWS + 1];
byte rows;

/* ---- the provider's batches, 1..REMOTES (0: none) ------------------------------------ */
mtype:remote remote_state[REMOTES + 1];
byte remote_items[REMOTES + 1]; /* bit i: item i's request */
byte remote_ran[REMOTES + 1];   /* bit i: run, and billed */
byte remotes;

/* ---- the environment's supply of mishaps -------------------------------------------- */
bool dead[SUBMITTERS + 1];
/* Two mishaps per run, of any kinds: a submitter's death (one at most: there is one
 * replacement), an expired request, a failed upload, a row unreadable past the bound. */
byte mishaps = 2;
bool crashed;
bool cancel_left = true;

/* ---- ghosts, for the properties ------------------------------------------------------- */
byte billed[ITEMS];
byte charged[ITEMS];
bool bounded[ITEMS];            /* ended UNKNOWN (or LEASE_EXPIRED) with its cost bound */

#define BIT(i) (1 << (i))
#define OPEN_ROW(r) (row_state[r] == PREPARING || row_state[r] == UPLOADING || \
                     row_state[r] == SUBMITTED || row_state[r] == ENDED)
#define FINAL_ROW(r) (!OPEN_ROW(r))
#define TERMINAL(i) (item[i] == SUCCEEDED || item[i] == FAILED || item[i] == CANCELLED)
/* An item's attempt runs in row r: the fence of its settlement (queue::finish_attempts
 * under the attempt's run token). */
#define IN_ROW(i, r) (item[i] == RUNNING && item_row[i] == (r))
#ifdef NO_SETTLE_FENCE
#define STILL_RUNS(i, r) (remote_items[row_remote[r]] & BIT(i))
#else
#define STILL_RUNS(i, r) IN_ROW(i, r)
#endif
#define OWNS(r) (row_owner[r] == me && !dead[me])
#ifdef NO_SEND_GATE
#define GATE(r) true
#else
#define GATE(r) OWNS(r)
#endif
#define RAN(r, i) (remote_ran[row_remote[r]] & BIT(i))

#ifdef NO_ONE_UPLOAD
#define NONE_UPLOADING true
#else
#define NONE_UPLOADING (row_state[1] != UPLOADING && row_state[2] != UPLOADING && \
                        row_state[3] != UPLOADING)
#endif

/* A row free and with a step to take (rows::due, rows::take). */
#define READY(r) (row_owner[r] == 0 && r <= rows && \
    ((row_state[r] == PREPARING && (cancel_requested || NONE_UPLOADING)) || \
     row_state[r] == UPLOADING || row_state[r] == ENDED || \
     (row_state[r] == SUBMITTED && ((cancel_requested && !row_cancel_sent[r]) || \
        remote_state[row_remote[r]] == DONE || mishaps > 0))))

/* Whether a provider batch other than k holds item i and may still run it, or ran it. */
#define HELD_BY(k, i, other) ((other) != (k) && (remote_items[other] & BIT(i)) && \
    (remote_state[other] == IN_PROGRESS || (remote_ran[other] & BIT(i))))
#define HELD_ELSEWHERE(k, i) (HELD_BY(k, i, 1) || HELD_BY(k, i, 2) || HELD_BY(k, i, 3))

/* The provider takes in a batch of `mask` (BatchApi::submit): Q1, as it does. */
inline create_remote(mask, k) {
    remotes++;
    k = remotes;
    remote_state[k] = IN_PROGRESS;
    remote_items[k] = mask;
    assert(!((mask & BIT(0)) && HELD_ELSEWHERE(k, 0)));                  /* Q1 */
    assert(!((mask & BIT(1)) && HELD_ELSEWHERE(k, 1)))                   /* Q1 */
}

/* The requests of row r still running (upload::items). */
inline running_of(r, mask) {
    mask = 0;
    if :: IN_ROW(0, r) -> mask = mask | BIT(0) :: else fi;
    if :: IN_ROW(1, r) -> mask = mask | BIT(1) :: else fi
}

/* A submitter may die between any two of its transactions: a new process takes its
 * place, and its rows come free once their leases lapse. Or it is paused there past
 * its leases: its rows come free, a new process starts beside it, and it resumes. */
inline may_die() {
    if
    :: atomic { mishaps > 0 && !crashed -> mishaps--; crashed = true; dead[me] = true; run submitter(SUBMITTERS) };
       goto died
    :: atomic { mishaps > 0 && !crashed -> mishaps--; crashed = true;
                if :: row_owner[1] == me -> row_owner[1] = 0 :: else fi;
                if :: row_owner[2] == me -> row_owner[2] = 0 :: else fi;
                if :: row_owner[3] == me -> row_owner[3] = 0 :: else fi;
                run submitter(SUBMITTERS) }
    :: true
    fi
}

/* upload::send: the upload, then its answer. */
inline send(r) {
    atomic {
        running_of(r, mask);
        if
        :: !GATE(r) -> answer = NOT_SENT                    /* rows::OwnerGate */
        :: GATE(r) && remotes < REMOTES -> create_remote(mask, k); answer = ANSWERED
        :: GATE(r) && remotes < REMOTES && mishaps > 0 ->   /* landed, answer lost */
           mishaps--; create_remote(mask, k); answer = ANSWER_LOST
        :: GATE(r) && mishaps > 0 -> mishaps--; answer = NOT_SENT      /* connection refused */
        :: GATE(r) && mishaps > 0 -> mishaps--; answer = NOTHING_LANDED  /* timed out unsent */
        fi
    }
    may_die();
    atomic {
        if
        :: OWNS(r) && answer == ANSWERED ->                      /* record_submitted */
           row_state[r] = SUBMITTED; row_remote[r] = k
        :: OWNS(r) && answer == NOT_SENT -> row_state[r] = PREPARING
        :: else     /* a timeout: left uploading, to be found again */
        fi
    }
}

/* poll::unknown: every running item of the row fails with its cost bound. */
inline give_up_item(i, r) {
    if
    :: IN_ROW(i, r) ->
       bounded[i] = true;
#ifdef UNKNOWN_SENT_AGAIN
       item[i] = QUEUED; item_row[i] = 0
#else
       item[i] = FAILED
#endif
    :: else
    fi
}

inline give_up(r) {
    give_up_item(0, r);
    give_up_item(1, r);
    row_state[r] = UNKNOWN
}

/* settle::settle, one item, fenced by its attempt. */
inline settle_item(i, r) {
    atomic {
        if
        :: OWNS(r) && STILL_RUNS(i, r) && RAN(r, i) ->
           charged[i]++;
           assert(charged[i] <= 1);                                        /* Q2 */
           item[i] = SUCCEEDED
#ifndef NO_MISSING_RESULTS
        :: OWNS(r) && STILL_RUNS(i, r) && !RAN(r, i) ->   /* expired, cancelled, missing */
           if
           :: cancel_requested -> item[i] = CANCELLED
           :: else -> item[i] = QUEUED; item_row[i] = 0
           fi
#endif
        :: else
        fi
    }
}

inline claim(i) {
    item[i] = RUNNING; item_row[i] = r
}

proctype submitter(byte me) {
    byte r, k, mask;
    byte candidates, found;
    byte answer;

end:
    do
#ifdef UPLOAD_BEFORE_ROW
    /* ---- the mutant: upload the queued items, then claim them and write the row ---- */
    :: atomic { !cancel_requested && rows < ROWS && remotes < REMOTES &&
                (item[0] == QUEUED || item[1] == QUEUED) ->
        mask = 0;
        if :: item[0] == QUEUED -> mask = mask | BIT(0) :: else fi;
        if :: item[1] == QUEUED -> mask = mask | BIT(1) :: else fi;
        create_remote(mask, k) };
       may_die();
       atomic {
        rows++;
        r = rows;
        if :: (mask & BIT(0)) && item[0] == QUEUED -> claim(0) :: else fi;
        if :: (mask & BIT(1)) && item[1] == QUEUED -> claim(1) :: else fi;
        row_state[r] = SUBMITTED; row_remote[r] = k;
        r = 0; k = 0; mask = 0 }
#else
    /* ---- submit_one: claim, start the attempts and write the row, all at once ---- */
    :: atomic { !cancel_requested && rows < ROWS && (item[0] == QUEUED || item[1] == QUEUED) ->
        rows++;
        r = rows;
        /* all that is due, or one item only: a retry comes due apart from the rest */
        if
        :: item[0] == QUEUED -> claim(0)
        :: item[1] == QUEUED -> claim(1)
        :: item[0] == QUEUED && item[1] == QUEUED -> claim(0); claim(1)
        fi;
        row_state[r] = PREPARING;
        r = 0 }
#endif

    /* ---- rows::take, and one step (poll::advance), then rows::release ---- */
    :: atomic { (READY(1) || READY(2) || READY(3)) ->
        if
        :: READY(1) -> r = 1
        :: READY(2) -> r = 2
        :: READY(3) -> r = 3
        fi;
        row_owner[r] = me };
       if
       /* poll::abandon: cancelled before anything was sent */
       :: atomic { OWNS(r) && row_state[r] == PREPARING && cancel_requested ->
            if :: IN_ROW(0, r) -> item[0] = CANCELLED :: else fi;
            if :: IN_ROW(1, r) -> item[1] = CANCELLED :: else fi;
            row_state[r] = ABANDONED }
       /* upload::upload: one row uploading at a time */
       :: atomic { OWNS(r) && row_state[r] == PREPARING && !cancel_requested && NONE_UPLOADING ->
            row_state[r] = UPLOADING; row_began[r] = remotes };
          may_die();
          send(r)
       /* poll::recover: the provider is searched before anything is sent again */
       :: OWNS(r) && row_state[r] == UPLOADING ->
#ifdef NO_FIND_AGAIN
          send(r)
#else
          atomic {
            candidates = 0; found = 0;
            k = row_began[r] + 1;
            do
            :: k <= remotes ->
               if
               :: row_remote[1] != k && row_remote[2] != k && row_remote[3] != k ->
                  candidates++; found = k
               :: else
               fi;
               k++
            :: else -> break
            od
          };
          if
          :: atomic { candidates == 1 && OWNS(r) -> row_state[r] = SUBMITTED; row_remote[r] = found }
          :: candidates == 0 -> send(r)
          :: atomic { candidates > 1 && OWNS(r) -> give_up(r) }   /* unfound, then unknown */
          :: else
          fi
#endif
       /* poll::poll: cancel at the provider, then read */
       :: atomic { OWNS(r) && row_state[r] == SUBMITTED && cancel_requested && !row_cancel_sent[r] ->
            row_cancel_sent[r] = true;
            remote_state[row_remote[r]] = DONE }
       :: atomic { OWNS(r) && row_state[r] == SUBMITTED && remote_state[row_remote[r]] == DONE ->
            row_state[r] = ENDED }
       /* poll::unreadable past the bound: poll::unknown */
       :: atomic { OWNS(r) && row_state[r] == SUBMITTED && mishaps > 0 ->
            mishaps--; give_up(r) }
       /* poll::settle_results: item by item, then the row */
       :: OWNS(r) && row_state[r] == ENDED ->
          settle_item(0, r);
          may_die();
          settle_item(1, r);
          may_die();
          atomic {
            if
            :: OWNS(r) && !IN_ROW(0, r) && !IN_ROW(1, r) -> row_state[r] = SETTLED
            :: else
            fi }
       :: else
       fi;
       atomic {
        if :: row_owner[r] == me -> row_owner[r] = 0 :: else fi;   /* rows::release */
        /* the model's own: a step's locals are forgotten, not carried into the next */
        r = 0; k = 0; mask = 0; candidates = 0; found = 0; answer = ANSWERED }
    od;
died:
    skip
}

/* The provider ends a batch: each request run (billed) or, once, expired. */
inline run_or_expire(k, i) {
    if
    :: remote_items[k] & BIT(i) ->
       if
       :: remote_ran[k] = remote_ran[k] | BIT(i);
          billed[i]++;
          assert(billed[i] <= 1)                                           /* Q1 */
       :: mishaps > 0 -> mishaps--      /* expired: not billed */
       fi
    :: else
    fi
}

active proctype provider() {
    byte k;
end:
    do
    :: atomic {
        if
        :: remote_state[1] == IN_PROGRESS -> k = 1
        :: remote_state[2] == IN_PROGRESS -> k = 2
        :: remote_state[3] == IN_PROGRESS -> k = 3
        fi;
        run_or_expire(k, 0);
        run_or_expire(k, 1);
        remote_state[k] = DONE;
        k = 0 }
    od
}

/* A dead submitter's row leases lapse; an item's lease may lapse at any time
 * (queue::expire_leases), and it is taken back only as lifecycle::lease_is_lost says. */
#ifdef NO_LIVE_BATCH_RULE
#define LOST(i) true
#else
#define LOST(i) FINAL_ROW(item_row[i])
#endif
#define DEAD_OWNED(r) (row_owner[r] != 0 && dead[row_owner[r]])

active proctype rescue() {
    byte r;
end:
    do
    :: d_step { DEAD_OWNED(1) || DEAD_OWNED(2) || DEAD_OWNED(3) ->
        if
        :: DEAD_OWNED(1) -> r = 1
        :: DEAD_OWNED(2) -> r = 2
        :: DEAD_OWNED(3) -> r = 3
        fi;
        row_owner[r] = 0;
        r = 0 }
    :: atomic { item[0] == RUNNING && LOST(0) -> bounded[0] = true; item[0] = QUEUED; item_row[0] = 0 }
    :: atomic { item[1] == RUNNING && LOST(1) -> bounded[1] = true; item[1] = QUEUED; item_row[1] = 0 }
    od
}

/* cancelBatch: its queued items are cancelled at once, its running ones through
 * their rows. */
active proctype tenant() {
    atomic {
        cancel_left ->
        cancel_left = false;
        cancel_requested = true;
        if :: item[0] == QUEUED -> item[0] = CANCELLED :: else fi;
        if :: item[1] == QUEUED -> item[1] = CANCELLED :: else fi
    }
}

init {
    run submitter(1)
}

#define ACCOUNTED(i) (charged[i] == billed[i] || bounded[i])
ltl all_settled {
    <> [] (TERMINAL(0) && TERMINAL(1) && ACCOUNTED(0) && ACCOUNTED(1) &&
           FINAL_ROW(1) && FINAL_ROW(2) && FINAL_ROW(3))
}

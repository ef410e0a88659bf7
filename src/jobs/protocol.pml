/*
 * protocol.pml: a Promela model of jobledger's job / lease / billing protocol,
 * checked with Spin (tests/it/protocol_model.rs runs it). It describes
 * src/jobs/queue/ (renew_leases in mod.rs, start_attempt in start.rs, finish_attempt
 * and abandon_claim in finish.rs, expire_leases in rescue.rs; claim and claim_in_turn
 * in claim/mod.rs), src/jobs/worker/ (the judgement in judge.rs), src/jobs/service.rs,
 *  src/jobs/budget.rs, src/jobs/holds.rs and src/billing/ledger/; a comment at
 * each step names the Rust function it stands for. The provider-batch submitter, which
 * runs an item's attempt in a provider batch instead of a worker's call, has a model
 * of its own beside its code (provider_batches/protocol.pml): the two share only the
 * lease rescue, whose rule for items in a live provider batch that model checks.
 *
 * WHAT IS MODELLED
 *   One job with its credit hold, two workers, the lease sweeper and the tenant.
 *   - Every database transaction is one `atomic` step on the locked job row, and
 *     every fenced statement re-checks `status == RUNNING && run_token == <the
 *     claim's token>` inside that step, as its SQL does.
 *   - The job row: status, run_token (0 = no claim), cancel_requested, attempt_count,
 *     max_attempts (MAX_ATTEMPTS) and retry_unknown_outcome (both values are checked:
 *     init picks one). The reservation: HELD, then SETTLED or RELEASED. The attempt
 *     rows: run token, outcome, and whether the call may have been billed ("paid").
 *   - Whether the job can run at all (init picks that too). An unrunnable job is one
 *     whose attempt can never start, for a reason that never goes away: its stored
 *     input is unreadable, its model has no price, or the database refuses its
 *     attempt row for good (Worker::try_run_attempt). A worker that claims it takes
 *     the abandon step (Worker::abandon, queue::abandon_claim) instead of starting an
 *     attempt: one fenced transaction that ends the job FAILED (NOT_RUNNABLE) with
 *     no attempt row and resolves its hold. It may die before that step, as before
 *     start_attempt.
 *   - A worker claims, starts the attempt, calls the provider and finishes. The call
 *     ends in any way the worker can see: success, invalid output, a retryable or a
 *     permanent error status (not billed), an unknown outcome or timeout, a cancel
 *     learned from a notice or a lease renewal, a renewal that finds the lease lost,
 *     the shutdown abort after the grace period (hand-back), or the worker process
 *     dying. A finish the database refuses for good falls back to ending the job
 *     FAILED (RESULT_NOT_STORED) under the same fence.
 *   - The sweeper stands for queue::expire_leases and queue::fail_past_deadlines,
 *     which every worker process runs.
 *   - Waits: a call the provider refused without doing any work (a 429, a 503 or 529
 *     with Retry-After, a connection refused before the request was sent) is not
 *     billed and queues the job again without spending an attempt (JobOutcome::Wait,
 *     Worker::judge), any number of times. What bounds them is the job's deadline:
 *     the judge fails a wait (or a retry) that would come after it, a claim past it
 *     sends nothing, a call running at it is cancelled, and the sweep fails the job
 *     queued past it (DEADLINE_EXCEEDED).
 *
 * WHAT IS ABSTRACTED AWAY
 *   - Time. Leases, backoff and next_run_at are gone: a lease may lapse at any moment
 *     the sweeper looks. The deadline is two facts: it may pass at any moment (the
 *     clock), and each wait's backoff uses up time, of which WAITS waits' worth is
 *     left before the deadline (a wait's backoff is at least a second, so a finite
 *     deadline leaves room for finitely many); a wait judged with no time left would
 *     come after the deadline. A live worker (slow, frozen, cut off from the
 *     database) loses its lease at most `slow_lapses` times per run; the lease of a
 *     worker that died always lapses in the end. A retry is due at once. Which
 *     clock: one. The code writes and judges leases by the PostgreSQL server's clock
 *     (db::lease_clock, db::POSTGRES_CLOCK) and, on SQLite, by the clock of the one
 *     machine whose processes share the file; and a sweeper never takes back a job
 *     an attempt of its own process still holds. A process whose clock runs ahead is
 *     therefore no extra lapse here: only slow, frozen or cut-off workers are.
 *   - Money. Prices, amounts, cost bounds and the charging policy are gone: a call is
 *     paid (may have been billed) or not, the ceiling is a count of paid calls
 *     (CEILING = MAX_ATTEMPTS, jobs::budget), and a hold is HELD, SETTLED or RELEASED.
 *     A failed or cancelled job's hold becomes RELEASED here; whether the code
 *     settles it for the charges its attempts carry is a matter of amounts, and
 *     either way it is one resolution.
 *   - Events, notices, streaming, results, error codes that do not steer the
 *     protocol, other jobs and tenants, claim fairness and the tenant limit.
 *   - The invalid-output budget (two retries): with MAX_ATTEMPTS = 2 attempt_count
 *     always binds first, so an invalid output retries like a retryable error.
 *   - Worker::judge decides "attempts left" from the claim's copy of the row. That
 *     copy equals the locked row whenever the fenced finish can write, so the model
 *     decides it in finish_attempt.
 *   - Rounds are bounded so that every run ends: one worker crash (a new process
 *     takes its place), two shutdown aborts (a new process takes the place of each,
 *     as in a rolling restart), one lapse of a live worker's lease, one lease
 *     renewal per attempt, one cancel. `pan -l` (see
 *     below) confirms that the model has no cycle at all, so the liveness checks
 *     need no fairness assumption.
 *   - Run tokens are drawn modulo TOKENS, the most claims a run makes, so no token
 *     is drawn twice (an assertion at the claim checks it). Only under NO_ABANDON is
 *     an unrunnable job claimed without end: drawing tokens again is what lets that
 *     run come back to a state it was in, the cycle P6 reports. Nothing there can
 *     take an old claim for the new one: the job never has an attempt row, no worker
 *     writes to it, and only the sweeper hands it back.
 *
 * PROPERTIES (pan names the failed assertion, or reports an acceptance cycle for the
 * LTL claim it was run with: P3, or P6 with `-N unrunnable_ends`)
 *   P1 A stale attempt writes nothing: each write of an attempt (start or abandon,
 *      finish with its settle or release) takes effect only while the attempt's run
 *      token is the job's. `assert(OWNS(token))` restates the fence where the write happens, so
 *      a weakened fence fails it.
 *   P2 A hold resolves exactly once, when the job ends: `hold_resolutions <= 1`, the
 *      job ends once (`job_endings <= 1`: nothing overwrites an ended job), and the
 *      hold is held exactly while the job is not terminal. Checked after every step
 *      that can end a job.
 *   P3 A job is never lost: `ltl never_lost` says it is always eventually queued
 *      (runnable) or terminal, whoever crashes. A run that stops with the job running
 *      fails it too: Spin extends a finished run by stuttering.
 *   P4 At most one running attempt: `running_attempts <= 1`, checked as a row is
 *      inserted (the only step that adds one).
 *   P5 Paid calls never exceed the ceiling: the ghost `billable` counts requests
 *      sent that may have been billed; `billable <= CEILING + FREE_HAND_BACKS` as
 *      each is sent: the first FREE_HAND_BACKS calls aborted at shutdown count apart
 *      (budget::FREE_HAND_BACKS; the model allows one, and a second shutdown abort
 *      is a paid call).
 *   P6 An unrunnable job always ends: `ltl unrunnable_ends` says that once the job
 *      is unrunnable it is eventually terminal, whoever crashes. P3 alone would not
 *      see a job handed back uncounted for ever: it is queued again and again. The
 *      first claim is P3, which pan checks by default; P6 needs `-N unrunnable_ends`.
 *   P7 Waits end at the deadline: `waits <= WAITS` as each wait is recorded. A wait
 *      spends no attempt and no paid call, so nothing but the deadline bounds them;
 *      P3 would not see a job that waits for ever (it is queued again after every
 *      wait), and the model's bounds (rows, tokens) would only fail later.
 *
 * MUTANTS (-D defines; tests/it/protocol_model.rs checks each is caught, and by what)
 *   NO_FINISH_FENCE        finish_attempt fenced on status only, not run_token -> P1
 *   NO_CANCEL_LOCK         cancel_job decides on a plain read and then writes
 *                          `WHERE id = ?`, without locking the row first        -> P2
 *   NO_RESOLVE_ONCE        ledger::resolve without `WHERE status = 'held'`. Alone
 *                          it is never reached (every resolve runs under a fence
 *                          that lets a job end once); with NO_CANCEL_LOCK a
 *                          cancel racing a finish resolves the hold twice        -> P2
 *   NO_CLAIMLESS_TAKEBACK  expire_lease leaves alone a claim with no attempt row
 *                          (its worker died between claim and start)            -> P3
 *   NO_MARK_LEASE_EXPIRED  expire_lease requeues without marking the lost attempt -> P4
 *   NO_PAID_CEILING        the paid-call ceiling is never checked               -> P5
 *   HANDBACK_NOT_PAID      every handed-back call is free, past FREE_HAND_BACKS
 *                          too                                                  -> P5
 *   NO_ABANDON             no abandon step, as before Worker::abandon: a worker
 *                          that claims an unrunnable job just stops, and lease
 *                          expiry hands the claim back uncounted, for ever; the
 *                          hold stays held                                      -> P6
 *   NO_DEADLINE            the deadline is never checked (not by the judge, not
 *                          before or during the call, not by the sweep): waits,
 *                          which spend no attempt, go on past it                -> P7
 *
 * HOW TO RUN (in a scratch directory holding a copy; add e.g. -DNO_FINISH_FENCE to
 * `spin -a` for a mutant)
 *   spin -a protocol.pml && gcc -O0 -w -o pan pan.c && ./pan -a
 *       P1-P5, P7: "errors: 0" expected (about 10 million states, 20 s, 1 GB).
 *   ./pan -a -N unrunnable_ends     (the same pan)
 *       P6, and P1, P2, P4, P5 again: "errors: 0" expected.
 *   spin -a protocol.pml && gcc -O0 -w -DSAFETY -DNOCLAIM -o pan pan.c && ./pan
 *       No process is left blocked outside an `end` label.
 *   spin -a protocol.pml && gcc -O0 -w -DNP -o pan pan.c && ./pan -l
 *       No cycle at all (no progress labels exist, so any cycle would be reported):
 *       waits use up the time before the deadline.
 *   spin -t -p protocol.pml   (with the same -D defines)
 *       Replays the counterexample pan left in protocol.pml.trail.
 *   Wider bounds, by hand: MAX_ATTEMPTS 3, MAX_ROWS 6 and two of each mishap
 *   (CRASHES, SHUTDOWNS, SLOW_LAPSES) held before waits were modelled (with `gcc -O2
 *   -DCOLLAPSE` and `./pan -a -w26`, about 97 million states, 5.7 GB and some seven
 *   to nine minutes); with waits they take several times that and were not run.
 */

#define MAX_ATTEMPTS 2
/* Paid calls a job may make (jobs::budget::Spent::calls_left). */
#define CEILING MAX_ATTEMPTS
/* Calls aborted at shutdown that count apart from the paid calls
 * (jobs::budget::FREE_HAND_BACKS, three in the code; one here, fewer than SHUTDOWNS). */
#define FREE_HAND_BACKS 1
/* Room for the attempt rows: MAX_ATTEMPTS counted ones, the free hand-back, the
 * waits, and one more so that a mutant over the ceiling still fits. */
#define MAX_ROWS 6
/* Waits whose backoff fits before the deadline (see "Time" above). */
#define WAITS 1
/* The environment's supply of mishaps (see below). */
#define CRASHES 1
#define SHUTDOWNS 2
#define SLOW_LAPSES 1
/* The most claims a run makes: the counted ones, the waits, and one more for each
 * mishap (a hand-back, or a claim given back uncounted after a crash or a lapse
 * before its attempt row). Run tokens are drawn modulo this. */
#define TOKENS (MAX_ATTEMPTS + WAITS + CRASHES + SHUTDOWNS + SLOW_LAPSES)

mtype:job_status = { QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED };
mtype:reservation = { HELD, SETTLED, RELEASED };
mtype:attempt = {
    ATTEMPT_RUNNING, ATTEMPT_SUCCEEDED, RETRYABLE_ERROR, PERMANENT_ERROR,
    INVALID_OUTPUT, UNKNOWN, ATTEMPT_CANCELLED, LEASE_EXPIRED
};
/* lifecycle::JobOutcome, as Worker::judge asks for it. */
mtype:job_outcome = { SUCCEED, RETRY, HAND_BACK, WAIT, FAIL, CANCEL };

/* ---- the job row -------------------------------------------------------------- */
mtype:job_status status = QUEUED;
byte run_token;                 /* 0: no claim */
bool cancel_requested;
byte attempt_count;
bool retry_unknown_outcome;     /* picked by init */
bool unrunnable;                /* picked by init: no attempt of the job can start */

/* ---- its credit reservation ------------------------------------------------------ */
mtype:reservation hold = HELD;

/* ---- its attempt rows ------------------------------------------------------------ */
byte rows;
byte row_token[MAX_ROWS];
mtype:attempt row_outcome[MAX_ROWS];
bool row_paid[MAX_ROWS];        /* may have been billed (budget::may_have_been_billed) */
/* Sums over the rows, kept beside them so that no step loops over the rows. */
byte paid_calls;                /* rows with row_paid */
byte free_hand_backs;           /* rows aborted at shutdown that count apart */
byte running_attempts;          /* rows with outcome ATTEMPT_RUNNING */

/* ---- the last run token handed out (queue::claim draws fresh ones) ----------------- */
byte last_token;

/* ---- time: whether the job's deadline passed, and how many waits' backoff still fit
 * before it ---------------------------------------------------------------------------- */
bool past_deadline;
byte waits_left = WAITS;

/* ---- the environment's supply of mishaps ------------------------------------------ */
byte crashes = CRASHES;         /* worker processes that die (a new one takes the place) */
byte shutdowns = SHUTDOWNS;     /* grace periods that run out during a call */
byte slow_lapses = SLOW_LAPSES; /* leases of a live worker that lapse */
byte orphaned;          /* the run token no live worker holds: its lease will lapse */

/* ---- ghosts, for the properties ---------------------------------------------------- */
byte billable;          /* P5: requests sent that may have been billed */
byte waits;             /* P7: waits recorded */
byte hold_resolutions;  /* P2: resolutions that took effect */
byte job_endings;       /* P2: writes that gave the job a terminal status */

#define TERMINAL (status == SUCCEEDED || status == FAILED || status == CANCELLED)
/* The fence on every write of an attempt (queue::fenced_update). */
#define OWNS(t) (status == RUNNING && run_token == (t))
/* Whether the sweeper may find this claim's lease lapsed. */
#define MAY_LAPSE(t) ((t) == orphaned || slow_lapses > 0)

/* The paid-call ceiling is reached (!budget::Spent::calls_left). */
#ifdef NO_PAID_CEILING
#define AT_PAID_CEILING false
#else
#define AT_PAID_CEILING (paid_calls >= CEILING)
#endif

/* The deadline is checked (Worker::judge, Worker::try_run_attempt,
 * queue::fail_past_deadlines). */
#ifdef NO_DEADLINE
#define PAST_DEADLINE false
#else
#define PAST_DEADLINE past_deadline
#endif

#ifdef NO_FINISH_FENCE
#define FINISH_FENCE(t) (status == RUNNING)
#else
#define FINISH_FENCE(t) OWNS(t)
#endif

/* P2, after every step that can end the job or resolve its hold. */
inline check_hold() {
    assert(hold_resolutions <= 1);
    assert(job_endings <= 1);
    assert((hold == HELD) == !TERMINAL)
}

/* ledger::settle / ledger::release (resolve): the conditional UPDATE takes effect
 * only while the reservation is held. */
inline resolve(to) {
#ifdef NO_RESOLVE_ONCE
    hold = to;
    hold_resolutions++
#else
    if
    :: hold == HELD -> hold = to; hold_resolutions++
    :: else
    fi
#endif
}

/* The job ends, and its hold is resolved in the same transaction. */
inline end_job(to) {
    status = to;
    job_endings++;
    run_token = 0;
    if
    :: to == SUCCEEDED -> resolve(SETTLED)
    :: else -> resolve(RELEASED)
    fi
}

inline requeue() {
    status = QUEUED;
    run_token = 0
}

/* The worker process dies, if a crash is left: it writes nothing more, ever, and a
 * new process takes its place. Only a claim that is still the job's needs its lease
 * to lapse; one taken back already is no one's concern. */
inline crash() {
    atomic {
        crashes > 0 ->
        crashes--;
        if
        :: run_token == token -> orphaned = token
        :: else
        fi
    };
    goto next
}

inline maybe_crash() {
    if
    :: crash()
    :: true
    fi
}

proctype worker()
{
    byte token;                 /* this claim's run token */
    byte row;                   /* this attempt's row */
    bool started;               /* start_attempt inserted the row */
    bool cancel_seen;           /* the attempt learned that cancel was requested */
    bool renewed;               /* the one modelled lease renewal happened */
    bool lease_lost;            /* that renewal matched nothing */
    bool aborted;               /* the shutdown abort: hand back, then restart */
    bool not_billed;            /* the call ended in a way that cannot be billed */
    mtype:attempt ended;        /* how the call ended, for the attempt row */
    mtype:job_outcome wanted;   /* what Worker::judge asks for */

end_idle:
    /* queue::claim_in_turn (queue/claim/mod.rs) */
    atomic {
        status == QUEUED ->
#ifndef NO_ABANDON
        assert(last_token < TOKENS);    /* the model's bound: no token drawn twice */
#endif
        last_token = last_token % TOKENS + 1;
        token = last_token;
        run_token = token;
        status = RUNNING;
        attempt_count++
    };
    maybe_crash();      /* dies between claim and start: the claim has no row */

    /* queue::start_attempt (fenced); for a job that cannot run, Worker::abandon
     * instead (Worker::try_run_attempt tells which before any call) */
    atomic {
        if
        :: OWNS(token) && unrunnable ->
#ifdef NO_ABANDON
            /* the worker just stops, writing nothing: its lease will lapse */
            orphaned = token
#else
            /* queue::abandon_claim (fenced): FAILED (NOT_RUNNABLE), no row, no call */
            assert(OWNS(token));                                /* P1 */
            end_job(FAILED);
            check_hold()
#endif
        :: OWNS(token) && !unrunnable ->
            assert(OWNS(token));                                /* P1 */
            if
            :: AT_PAID_CEILING ->
                /* PAID_CALL_LIMIT: no row, no call. Never reached in this model:
                 * every step that queues the job checks the ceiling first. The
                 * code's check also bounds money, which is abstracted away. */
                end_job(FAILED);
                check_hold()
            :: else ->
                assert(rows < MAX_ROWS);                        /* the model's bound */
                row = rows;
                rows++;
                row_token[row] = token;
                row_outcome[row] = ATTEMPT_RUNNING;
                row_paid[row] = true;   /* counts until known not to be billed */
                paid_calls++;
                running_attempts++;
                assert(running_attempts <= 1);                  /* P4 */
                cancel_seen = cancel_requested;
                started = true
            fi
        :: else     /* the claim was taken back: write nothing */
        fi
    };
    if
    :: !started -> goto next    /* abandoned, or the claim was taken back */
    :: else
    fi;

    if
    :: cancel_seen ->
        /* CallEnd::CancelledBeforeSending: no call is made */
        ended = ATTEMPT_CANCELLED; not_billed = true; wanted = CANCEL
    :: !cancel_seen && PAST_DEADLINE ->
        /* CallEnd::PastDeadlineBeforeSending: no call is made */
        ended = ATTEMPT_CANCELLED; not_billed = true; wanted = FAIL
    :: !cancel_seen && !PAST_DEADLINE ->
        maybe_crash();  /* dies with a row and no request sent */
        /* the provider call: from here the request may be billed */
        billable++;
        assert(billable <= CEILING + FREE_HAND_BACKS);          /* P5 */
waiting:
        if
        :: /* CallEnd::Answered(Ok), accepted */
           ended = ATTEMPT_SUCCEEDED; wanted = SUCCEED
        :: /* CallEnd::Answered(Ok), off-schema */
           ended = INVALID_OUTPUT; wanted = RETRY
        :: /* ProviderError::Transient that is not a refusal without work */
           ended = RETRYABLE_ERROR; not_billed = true; wanted = RETRY
        :: /* a refusal without work (429, 503/529 with Retry-After, NotSent): a wait */
           ended = RETRYABLE_ERROR; not_billed = true; wanted = WAIT
#ifndef NO_DEADLINE
        :: /* CallEnd::PastDeadline: the deadline comes during the call, which is
            * dropped as a cancel drops it */
           past_deadline = true;
           ended = ATTEMPT_CANCELLED; wanted = FAIL
#endif
        :: /* ProviderError::Permanent */
           ended = PERMANENT_ERROR; not_billed = true; wanted = FAIL
        :: /* ProviderError::OutcomeUnknown, CallEnd::TimedOut */
           ended = UNKNOWN;
           wanted = (retry_unknown_outcome -> RETRY : FAIL)
        :: /* CallEnd::Cancelled, from the CancelRequested notice */
           cancel_requested ->
           ended = ATTEMPT_CANCELLED; wanted = CANCEL
        :: /* Worker::run — shutdown hand-back (JobOutcome::HandBack): CallEnd::Aborted */
           atomic { shutdowns > 0 -> shutdowns--; aborted = true };
           ended = UNKNOWN;
           wanted = (retry_unknown_outcome -> HAND_BACK : FAIL)
        :: crash()      /* dies during the call */
        :: !renewed ->
           /* queue::renew_leases (fenced) */
           atomic {
               renewed = true;
               if
               :: OWNS(token) -> cancel_seen = cancel_requested
               :: else -> lease_lost = true
               fi
           };
           if
           :: lease_lost -> goto next       /* Renewal::Lost: write nothing more */
           :: cancel_seen ->                /* Renewed { cancel_requested: true } */
              ended = ATTEMPT_CANCELLED; wanted = CANCEL
           :: else -> goto waiting
           fi
        fi;
        if
        :: not_billed -> billable--     /* refused with an error status */
        :: else
        fi
    fi;

    /* queue::finish_attempt (fenced). A finish the database refuses for good is
     * followed by Worker's fallback (RESULT_NOT_STORED), a second fenced
     * transaction; the branch that ends the job FAILED below stands for the pair. */
    atomic {
        if
        :: FINISH_FENCE(token) ->
            assert(OWNS(token));                                /* P1 */
            row_outcome[row] = ended;
            running_attempts--;
            if
            :: not_billed -> row_paid[row] = false; paid_calls--
#ifdef HANDBACK_NOT_PAID
            :: !not_billed && aborted -> row_paid[row] = false; paid_calls--;
               free_hand_backs++
#else
            :: !not_billed && aborted && free_hand_backs < FREE_HAND_BACKS ->
               row_paid[row] = false; paid_calls--; free_hand_backs++
#endif
            :: else
            fi;
            /* Worker::judge (before_deadline), decided here as "attempts left" is: a
             * wait or a retry due after the deadline fails the job instead
             * (DEADLINE_EXCEEDED); each wait's backoff uses up time. */
#ifndef NO_DEADLINE
            if
            :: wanted == WAIT && (past_deadline || waits_left == 0) ->
               past_deadline = true; wanted = FAIL
            :: wanted == WAIT && !past_deadline && waits_left > 0 -> waits_left--
            :: wanted == RETRY && past_deadline -> wanted = FAIL
            :: else
            fi;
#endif
            /* overrides, decided on the locked row */
            if
            :: wanted == RETRY || wanted == HAND_BACK || wanted == WAIT ->
                if
                :: cancel_requested -> wanted = CANCEL
                :: else ->
                    if
                    :: AT_PAID_CEILING -> wanted = FAIL     /* PAID_CALL_LIMIT */
                    :: (!AT_PAID_CEILING && wanted == RETRY
                        && attempt_count >= MAX_ATTEMPTS) -> wanted = FAIL
                    :: else
                    fi
                fi
            :: else
            fi;
            if
            :: true                     /* stored */
            :: wanted = FAIL            /* refused: the RESULT_NOT_STORED fallback */
            fi;
            if
            :: wanted == SUCCEED -> end_job(SUCCEEDED)          /* ledger::settle */
            :: wanted == RETRY -> requeue()
            :: wanted == HAND_BACK -> requeue(); attempt_count--
            :: wanted == WAIT ->
               requeue(); attempt_count--;
               waits++;
               assert(waits <= WAITS)                          /* P7 */
            :: wanted == FAIL -> end_job(FAILED)                /* ledger::release */
            :: wanted == CANCEL -> end_job(CANCELLED)           /* ledger::release */
            fi;
            check_hold()
        :: else     /* the claim was taken back: write nothing */
        fi
    };
next:
    /* claim again, as a new task (or as the new process after a crash, or after a
     * shutdown: a rolling restart starts the next process) */
    token = 0; row = 0; started = false; cancel_seen = false; renewed = false;
    lease_lost = false; aborted = false; not_billed = false; ended = ATTEMPT_RUNNING;
    wanted = SUCCEED;
    goto end_idle
}

active proctype sweeper()
{
    byte seen;      /* the run token the scan read */

end_sweep:
    do
#ifndef NO_DEADLINE
    :: /* queue::fail_past_deadlines: one transaction on the queued rows */
       atomic { status == QUEUED && past_deadline -> end_job(FAILED); check_hold() }
#endif
    :: /* queue::expire_leases: the scan, outside any transaction */
       atomic { status == RUNNING && MAY_LAPSE(run_token) -> seen = run_token };
       /* queue::expire_lease: one transaction, fenced on the token the scan read and
        * on the lease having lapsed */
       atomic {
           if
           :: OWNS(seen) && MAY_LAPSE(seen) ->
               if
               :: rows > 0 && row_token[rows - 1] == seen ->
                   /* the lost attempt: its call may have been billed */
#ifndef NO_MARK_LEASE_EXPIRED
                   if
                   :: row_outcome[rows - 1] == ATTEMPT_RUNNING ->
                       row_outcome[rows - 1] = LEASE_EXPIRED;
                       running_attempts--
                   :: else
                   fi;
#endif
                   if
                   :: seen != orphaned -> slow_lapses--
                   :: else
                   fi;
                   if
                   :: cancel_requested -> end_job(CANCELLED)
                   :: (!cancel_requested && (attempt_count >= MAX_ATTEMPTS
                       || AT_PAID_CEILING || !retry_unknown_outcome)) -> end_job(FAILED)
                   :: else -> requeue()
                   fi
               :: else ->
#ifdef NO_CLAIMLESS_TAKEBACK
                   skip     /* a claim without a row is left as it is */
#else
                   /* no row: nothing was sent, so the claim is given back uncounted */
                   if
                   :: seen != orphaned -> slow_lapses--
                   :: else
                   fi;
                   if
                   :: cancel_requested -> end_job(CANCELLED)
                   :: else -> requeue(); attempt_count--
                   fi
#endif
               fi;
               check_hold()
           :: else      /* renewed or finished meanwhile: not lost after all */
           fi;
           seen = 0
       }
    od
}

active proctype tenant()
{
#ifdef NO_CANCEL_LOCK
    mtype:job_status read_status;
    bool read_requested;
#endif
    if
    :: skip     /* never cancels */
    :: /* jobs::service::cancel_job */
#ifdef NO_CANCEL_LOCK
       atomic { read_status = status; read_requested = cancel_requested };
       atomic {
           if
           :: read_status == QUEUED -> cancel_requested = true; end_job(CANCELLED)
           :: read_status == RUNNING && !read_requested -> cancel_requested = true
           :: else
           fi;
           check_hold()
       }
#else
       atomic {
           if
           :: status == QUEUED -> cancel_requested = true; end_job(CANCELLED)
           :: status == RUNNING && !cancel_requested -> cancel_requested = true
           :: else      /* already ended, or already asked */
           fi;
           check_hold()
       }
#endif
    fi
}

init {
    atomic {
        if
        :: retry_unknown_outcome = true
        :: retry_unknown_outcome = false
        fi;
        if
        :: unrunnable = true
        :: unrunnable = false
        fi;
        run worker();
        run worker()
    }
}

/* P3; the first claim, which pan checks unless told otherwise */
ltl never_lost { [] <> (status != RUNNING) }
/* P6 */
ltl unrunnable_ends { [] (unrunnable -> <> TERMINAL) }

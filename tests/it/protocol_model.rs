//! The job / lease / billing protocol model, `src/jobs/protocol.pml`, checked with
//! Spin: the model holds, and each mutant (the model with one guard or step removed,
//! chosen by a `-D` define) is caught by the property that guard or step protects.
//!
//! Each check copies the model into a temporary directory and there runs `spin -a`,
//! `gcc` on the verifier Spin generates, and the verifier `pan`. The verifier is
//! built without optimisation: at `-O2` compiling it takes longer than the search
//! saves. These tests need `spin` and `gcc` (`apt-get install spin gcc`); without
//! them they fail, saying so, rather than pass without checking anything.

use std::ffi::OsStr;
use std::io::ErrorKind;
use std::path::Path;
use std::process::Command;

/// The model, beside the code it describes.
const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/jobs/protocol.pml");

/// A violation of one of the model's properties, as pan reports it.
#[derive(Clone, Copy)]
enum Violation {
    /// A failed assertion, named by its text.
    Assertion(&'static str),
    /// An acceptance cycle of an LTL claim. pan checks one claim per search, so the
    /// search has to be run with the claim the property is.
    Cycle(Claim),
}

/// P1: a write of an attempt took effect while its run token was not the job's.
const P1_STALE_WRITE: Violation = Violation::Assertion("(run_token==token)");
/// P2: a job that had ended was ended again.
const P2_JOB_ENDS_ONCE: Violation = Violation::Assertion("(job_endings<=1)");
/// P2: a hold was resolved twice.
const P2_HOLD_RESOLVES_ONCE: Violation = Violation::Assertion("(hold_resolutions<=1)");
/// P3: a run in which the job stays running for ever.
const P3_NEVER_LOST: Violation = Violation::Cycle(Claim::NeverLost);
/// P4: two attempts of the job were running at once.
const P4_ONE_RUNNING_ATTEMPT: Violation = Violation::Assertion("(running_attempts<=1)");
/// P5: the job sent more requests that may be billed than its ceiling allows.
const P5_PAID_CALL_CEILING: Violation = Violation::Assertion("(billable<=");
/// P6: a run in which a job that cannot run never ends.
const P6_UNRUNNABLE_ENDS: Violation = Violation::Cycle(Claim::UnrunnableEnds);
/// P7: the job waited past its deadline.
const P7_WAITS_END_AT_THE_DEADLINE: Violation = Violation::Assertion("(waits<=");

impl Violation {
    /// The claim to search with: the property's own, or for an assertion any, since
    /// every search checks the assertions on the way.
    fn claim(self) -> Claim {
        match self {
            Self::Assertion(_) => Claim::NeverLost,
            Self::Cycle(claim) => claim,
        }
    }

    /// What pan's first error line says.
    fn report(self) -> &'static str {
        match self {
            Self::Assertion(text) => text,
            Self::Cycle(_) => "acceptance cycle",
        }
    }
}

/// The model's LTL claims.
#[derive(Clone, Copy)]
enum Claim {
    /// P3 `never_lost`: the job is always eventually queued or terminal.
    NeverLost,
    /// P6 `unrunnable_ends`: a job that cannot run is always eventually terminal.
    UnrunnableEnds,
}

/// Which search pan runs.
#[derive(Clone, Copy)]
enum Search {
    /// The assertions (P1, P2, P4, P5, P7) and one LTL claim (P3 or P6): a search for
    /// acceptance cycles, which checks the assertions on the way.
    Properties(Claim),
    /// No process is left blocked anywhere but at an `end` label. A search with an
    /// LTL claim does not check this, so it runs without one.
    EndStates,
}

impl Search {
    fn gcc_flags(self) -> &'static [&'static str] {
        match self {
            Self::Properties(_) => &[],
            Self::EndStates => &["-DSAFETY", "-DNOCLAIM"],
        }
    }

    /// The claim is always named: without `-N`, pan checks whichever the model
    /// declares first.
    fn pan_flags(self) -> &'static [&'static str] {
        match self {
            Self::Properties(Claim::NeverLost) => &["-a", "-N", "never_lost"],
            Self::Properties(Claim::UnrunnableEnds) => &["-a", "-N", "unrunnable_ends"],
            Self::EndStates => &[],
        }
    }
}

/// Builds the verifier for the model with `defines`, runs `search`, and returns
/// pan's report.
fn verify(search: Search, defines: &[&str]) -> String {
    verify_model(MODEL, search.gcc_flags(), search.pan_flags(), defines)
}

/// Builds the verifier for `model` with `defines` and `gcc_flags`, runs it with
/// `pan_flags`, and returns pan's report.
pub fn verify_model(
    model: &str,
    gcc_flags: &[&str],
    pan_flags: &[&str],
    defines: &[&str],
) -> String {
    let directory = tempfile::tempdir().expect("a temporary directory");
    let dir = directory.path();
    std::fs::copy(model, dir.join("protocol.pml")).expect("the model is readable");
    let defines = defines.iter().map(|define| format!("-D{define}"));
    run(
        dir,
        "spin",
        ["-a".to_owned()]
            .into_iter()
            .chain(defines)
            .chain(["protocol.pml".to_owned()]),
    );
    let gcc_flags = ["-O0", "-w"].iter().chain(gcc_flags);
    run(dir, "gcc", gcc_flags.chain(&["-o", "pan", "pan.c"]));
    run(dir, dir.join("pan"), pan_flags)
}

/// Runs `program` in `dir` and returns what it printed; panics if it is missing or
/// fails.
fn run(
    dir: &Path,
    program: impl AsRef<OsStr>,
    args: impl IntoIterator<Item = impl AsRef<OsStr>>,
) -> String {
    let program = program.as_ref();
    let name = program.to_string_lossy();
    let output = match Command::new(program).args(args).current_dir(dir).output() {
        Ok(output) => output,
        Err(error) if error.kind() == ErrorKind::NotFound => panic!(
            "`{name}` is not installed, so the protocol model cannot be checked: \
             install Spin and a C compiler with `apt-get install spin gcc`"
        ),
        Err(error) => panic!("cannot run `{name}`: {error}"),
    };
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "`{name}` failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The number of errors pan reports.
pub fn errors(report: &str) -> u64 {
    report
        .split_once("errors: ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("pan's report has no error count:\n{report}"))
}

/// Asserts that `search` of the unmodified model finds nothing, over every state.
fn assert_holds(search: Search) {
    let report = verify(search, &[]);
    assert_eq!(errors(&report), 0, "the protocol model fails:\n{report}");
    // A search cut off at its depth bound says nothing of the states beyond it.
    assert!(
        !report.contains("max search depth too small"),
        "the search was cut short:\n{report}"
    );
}

/// Asserts that the model with `defines` fails, and first by `violation`.
fn assert_caught(defines: &[&str], violation: Violation) {
    let report = verify(Search::Properties(violation.claim()), defines);
    assert!(
        errors(&report) > 0,
        "the mutant {defines:?} went unnoticed:\n{report}"
    );
    let first = report
        .lines()
        .find(|line| line.starts_with("pan:1:"))
        .unwrap_or_default();
    let expected = violation.report();
    assert!(
        first.contains(expected),
        "the mutant {defines:?} was caught, but not by `{expected}`:\n{report}"
    );
}

/// The assertions (P1, P2, P4, P5, P7) and P3.
#[test]
fn the_model_holds() {
    assert_holds(Search::Properties(Claim::NeverLost));
}

/// P6, in a search of its own (pan checks one LTL claim at a time), which checks the
/// assertions again on the way.
#[test]
fn a_job_that_cannot_run_always_ends() {
    assert_holds(Search::Properties(Claim::UnrunnableEnds));
}

#[test]
fn no_process_of_the_model_is_left_blocked() {
    assert_holds(Search::EndStates);
}

/// P1: an attempt whose lease lapsed finishes over the claim another worker made since.
#[test]
fn without_the_run_token_fence_a_stale_attempt_finishes() {
    assert_caught(&["NO_FINISH_FENCE"], P1_STALE_WRITE);
}

/// P2: a cancel that read the job queued, and did not lock it, writes CANCELLED over
/// the job a worker claimed and finished in between.
#[test]
fn a_cancel_deciding_on_an_unlocked_read_ends_a_finished_job_again() {
    assert_caught(&["NO_CANCEL_LOCK"], P2_JOB_ENDS_ONCE);
}

/// P2: `WHERE status = 'held'` is the second guard against that race. Without it
/// alone nothing goes wrong (every resolution runs under a fence that lets a job end
/// once); without the cancel's row lock too, the hold is settled and then released.
#[test]
fn without_the_held_condition_a_cancel_racing_a_finish_resolves_the_hold_twice() {
    assert_caught(
        &["NO_CANCEL_LOCK", "NO_RESOLVE_ONCE"],
        P2_HOLD_RESOLVES_ONCE,
    );
}

/// P3: the job of a worker that died between its claim and its attempt row stays
/// running for ever.
#[test]
fn without_the_claimless_takeback_a_crashed_workers_job_is_lost() {
    assert_caught(&["NO_CLAIMLESS_TAKEBACK"], P3_NEVER_LOST);
}

/// P4: the attempt whose lease lapsed stays running while the next claim starts one.
#[test]
fn without_marking_the_lost_attempt_two_attempts_run_at_once() {
    assert_caught(&["NO_MARK_LEASE_EXPIRED"], P4_ONE_RUNNING_ATTEMPT);
}

/// P5: a retry, two hand-backs and one more attempt make four calls of two paid and
/// one free.
#[test]
fn without_the_paid_call_ceiling_a_job_pays_for_too_many_calls() {
    assert_caught(&["NO_PAID_CEILING"], P5_PAID_CALL_CEILING);
}

/// P5: a hand-back does not count against maxAttempts, and the first ones not as
/// paid calls either, but past those its call is a paid call like any other.
#[test]
fn counting_every_hand_back_as_free_lets_a_job_pay_for_too_many_calls() {
    assert_caught(&["HANDBACK_NOT_PAID"], P5_PAID_CALL_CEILING);
}

/// P6: a worker that claims a job it can never start just stops; lease expiry hands
/// the claim back uncounted, the next claim stops the same way, and the job is never
/// terminal, nor its hold resolved. P3 misses this: the job is queued again each time.
#[test]
fn without_the_abandon_step_a_job_that_cannot_run_comes_back_for_ever() {
    assert_caught(&["NO_ABANDON"], P6_UNRUNNABLE_ENDS);
}

/// P7: a wait spends neither an attempt nor a paid call, so without the deadline's
/// checks — the judge's, the worker's before and during the call, the sweep's — a
/// provider that keeps refusing keeps the job waiting past its deadline.
#[test]
fn without_the_deadline_a_job_waits_past_it() {
    assert_caught(&["NO_DEADLINE"], P7_WAITS_END_AT_THE_DEADLINE);
}

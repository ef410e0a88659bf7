//! The provider-batch submitter's model, `src/jobs/provider_batches/protocol.pml`,
//! checked with Spin as the job model is (`protocol_model.rs`, whose harness this
//! uses): the model holds — no item is sent while a provider batch that may bill it
//! holds it, none is settled twice, none is lost — and each mutant is caught by the
//! property its guard or step protects. Needs `spin` and `gcc`, as that one does.

use crate::protocol_model::{errors, verify_model};

const MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/src/jobs/provider_batches/protocol.pml"
);

/// Q1, as pan prints the assertion at a provider batch's creation.
const Q1_SENT_TWICE: &str = "!(((mask&(1<<";
/// Q2.
const Q2_SETTLED_TWICE: &str = "(charged[";
/// Q3: a run in which an item never ends, or a bill is never accounted for.
const Q3_LOST: &str = "acceptance cycle";

/// The assertions and the LTL claim `all_settled` (Q3), over every state.
const PROPERTIES: (&[&str], &[&str]) = (&[], &["-a"]);
/// The assertions alone, invalid end states not reported: finds a mutant of Q1 or Q2
/// in a fraction of a second.
const ASSERTIONS: (&[&str], &[&str]) = (&["-DSAFETY", "-DNOCLAIM"], &["-E"]);
/// No process left blocked anywhere but at an `end` label.
const END_STATES: (&[&str], &[&str]) = (&["-DSAFETY", "-DNOCLAIM"], &[]);

fn assert_holds((gcc, pan): (&[&str], &[&str])) {
    let report = verify_model(MODEL, gcc, pan, &[]);
    assert_eq!(errors(&report), 0, "the submitter model fails:\n{report}");
    assert!(
        !report.contains("max search depth too small"),
        "the search was cut short:\n{report}"
    );
}

fn assert_caught(define: &str, (gcc, pan): (&[&str], &[&str]), expected: &str) {
    let report = verify_model(MODEL, gcc, pan, &[define]);
    assert!(
        errors(&report) > 0,
        "the mutant {define} went unnoticed:\n{report}"
    );
    let first = report
        .lines()
        .find(|line| line.starts_with("pan:1:"))
        .unwrap_or_default();
    assert!(
        first.contains(expected),
        "the mutant {define} was caught, but not by `{expected}`:\n{report}"
    );
}

/// Q1, Q2 and Q3.
#[test]
fn the_submitter_model_holds() {
    assert_holds(PROPERTIES);
}

#[test]
fn no_submitter_of_the_model_is_left_blocked() {
    assert_holds(END_STATES);
}

/// Q1: a row left `uploading` by a lost answer is uploaded again while the provider
/// runs the first upload.
#[test]
fn without_finding_the_upload_again_an_item_is_sent_twice() {
    assert_caught("NO_FIND_AGAIN", ASSERTIONS, Q1_SENT_TWICE);
}

/// Q1: two rows upload at once; one dies, and its recovery takes the other's upload,
/// whose own recovery then finds nothing and sends it again.
#[test]
fn with_two_uploads_in_flight_a_recovery_takes_the_wrong_batch() {
    assert_caught("NO_ONE_UPLOAD", ASSERTIONS, Q1_SENT_TWICE);
}

/// Q1: the submitter dies between an upload and the transaction that claims its
/// items, which are still queued, and go out again.
#[test]
fn uploading_before_writing_the_row_sends_an_item_twice_after_a_crash() {
    assert_caught("UPLOAD_BEFORE_ROW", ASSERTIONS, Q1_SENT_TWICE);
}

/// Q2: results read again after a crash charge the items settled before it again.
#[test]
fn without_the_attempts_fence_results_read_twice_charge_twice() {
    assert_caught("NO_SETTLE_FENCE", ASSERTIONS, Q2_SETTLED_TWICE);
}

/// Q1: the lease rescue takes back an item of a provider batch that still runs.
#[test]
fn taking_back_a_lapsed_item_of_a_live_provider_batch_sends_it_twice() {
    assert_caught("NO_LIVE_BATCH_RULE", ASSERTIONS, Q1_SENT_TWICE);
}

/// Q1: an item whose fate is unknown goes out again while the provider may run it.
#[test]
fn sending_an_unknown_item_again_may_bill_it_twice() {
    assert_caught("UNKNOWN_SENT_AGAIN", ASSERTIONS, Q1_SENT_TWICE);
}

/// Q3: an expired or cancelled request left unsettled keeps its item running.
#[test]
fn without_settling_requests_the_provider_never_ran_an_item_is_lost() {
    assert_caught("NO_MISSING_RESULTS", PROPERTIES, Q3_LOST);
}

/// Q1: a submitter paused past its lease between marking its row `uploading` and
/// sending resumes and sends what the row's new owner already sent.
#[test]
fn without_the_send_gate_a_paused_submitter_sends_an_item_twice() {
    assert_caught("NO_SEND_GATE", ASSERTIONS, Q1_SENT_TWICE);
}

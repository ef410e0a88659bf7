//! The unit tests of parsing and checking a job's input.

use super::*;
use serde_json::json;

fn request() -> JobRequest {
    JobRequest {
        idempotency_key: "key-1".into(),
        model: "gpt-4o-mini".into(),
        messages: vec![MessageRequest::text("user", "Summarise this")],
        max_output_tokens: 100,
        response_schema: None,
        max_attempts: None,
        retry_unknown_outcome: None,
        metadata: Some(json!({"b": 1, "a": {"y": 2, "x": 3}})),
        stream_output: None,
        priority: None,
        run_at: None,
        deadline: None,
        default_deadline: DEFAULT_DEADLINE,
        charging: ChargingPolicy::default(),
        labels: Vec::new(),
        parameters: Default::default(),
        tools: Default::default(),
        fallback_models: Vec::new(),
    }
}

#[test]
fn a_named_deadline_is_part_of_the_fingerprint_and_the_default_is_not() {
    let first = NewJob::parse(request()).unwrap().fingerprint();
    let mut shorter_default = request();
    shorter_default.default_deadline = Duration::from_secs(60);
    assert_eq!(first, NewJob::parse(shorter_default).unwrap().fingerprint());
    let mut named = request();
    named.deadline = Some(Timestamp::now().plus(chrono::Duration::hours(1)));
    assert_ne!(first, NewJob::parse(named).unwrap().fingerprint());
}

#[test]
fn fallback_models_and_their_order_are_part_of_the_fingerprint() {
    let none = NewJob::parse(request()).unwrap().fingerprint();
    let mut one = request();
    one.fallback_models = vec!["gpt-4o".into(), "gpt-4.1".into()];
    let one = NewJob::parse(one).unwrap().fingerprint();
    let mut swapped = request();
    swapped.fallback_models = vec!["gpt-4.1".into(), "gpt-4o".into()];
    let swapped = NewJob::parse(swapped).unwrap().fingerprint();
    assert_ne!(none, one);
    assert_ne!(one, swapped);
}

#[test]
fn key_order_in_json_does_not_change_the_fingerprint() {
    let first = NewJob::parse(request()).unwrap();
    let mut reordered = request();
    reordered.metadata = Some(json!({"a": {"x": 3, "y": 2}, "b": 1}));
    assert_eq!(
        first.fingerprint(),
        NewJob::parse(reordered).unwrap().fingerprint()
    );
}

#[test]
fn any_change_to_the_request_changes_the_fingerprint() {
    let first = NewJob::parse(request()).unwrap().fingerprint();
    let mut other = request();
    other.max_output_tokens = 101;
    assert_ne!(first, NewJob::parse(other).unwrap().fingerprint());
    let mut other = request();
    other.retry_unknown_outcome = Some(false);
    assert_ne!(first, NewJob::parse(other).unwrap().fingerprint());
}

#[test]
fn defaults_are_three_attempts_and_retrying_unknown_outcomes() {
    let job = NewJob::parse(request()).unwrap();
    assert_eq!(job.max_attempts, DEFAULT_MAX_ATTEMPTS);
    assert!(job.retry_unknown_outcome);
}

#[test]
fn the_bytes_bound_counts_bytes_and_overhead() {
    let mut job = request();
    job.messages = vec![MessageRequest::text("user", "héllo")];
    let job = NewJob::parse(job).unwrap();
    let bound = job
        .input
        .call_bound(PromptCounting::Bytes(None), &job.model);
    assert_eq!(
        bound.input_tokens,
        6 + crate::jobs::tokens::MESSAGE_OVERHEAD_TOKENS
    );
    assert_eq!(bound.input_estimate, bound.input_tokens.div_ceil(4));
}

/// `{"a": {"a": … 1}}`, `levels` objects deep.
fn nested(levels: usize) -> Value {
    (0..levels).fold(json!(1), |inner, _| json!({ "a": inner }))
}

#[test]
fn nesting_depth_counts_arrays_and_objects_up_to_past_the_limit() {
    assert_eq!(nesting_depth(&json!("text"), 32), 0);
    assert_eq!(nesting_depth(&json!({"a": [1, {"b": []}], "c": 2}), 32), 4);
    assert_eq!(nesting_depth(&nested(32), 32), 32);
    assert_eq!(nesting_depth(&nested(1_000), 32), 33);
}

#[test]
fn free_json_is_refused_past_32_levels() {
    let mut deep = request();
    deep.metadata = Some(nested(MAX_JSON_DEPTH));
    assert!(NewJob::parse(deep).is_ok());
    for levels in [MAX_JSON_DEPTH + 1, 200] {
        let mut deep = request();
        deep.metadata = Some(nested(levels));
        assert!(matches!(
            NewJob::parse(deep),
            Err(ServiceError::Validation(message)) if message.contains("metadata") && message.contains("32")
        ));
        let mut deep = request();
        deep.response_schema = Some(json!({"type": "object", "properties": {"a": nested(levels)}}));
        assert!(matches!(
            NewJob::parse(deep),
            Err(ServiceError::Validation(message)) if message.contains("responseSchema") && message.contains("32")
        ));
    }
}

#[test]
fn bad_requests_are_refused_with_a_reason() {
    type BreakRequest = fn(&mut JobRequest);
    let cases: Vec<(BreakRequest, &str)> = vec![
        (|r| r.idempotency_key = String::new(), "idempotencyKey"),
        (|r| r.model = " ".into(), "model"),
        (|r| r.messages.clear(), "messages"),
        (|r| r.messages[0].role = "robot".into(), "role"),
        (|r| r.messages[0].content = Some("  ".into()), "content"),
        (|r| r.max_output_tokens = 0, "maxOutputTokens"),
        (|r| r.max_output_tokens = 200_001, "maxOutputTokens"),
        (|r| r.max_attempts = Some(0), "maxAttempts"),
        (|r| r.max_attempts = Some(11), "maxAttempts"),
        (|r| r.priority = Some(10), "priority"),
        (|r| r.priority = Some(-1), "priority"),
        (
            |r| r.run_at = Some(Timestamp::now().plus(chrono::Duration::days(400))),
            "runAt",
        ),
        (
            |r| {
                let at = Timestamp::now().plus(chrono::Duration::hours(1));
                r.run_at = Some(at);
                r.deadline = Some(at);
            },
            "runAt",
        ),
        (|r| r.response_schema = Some(json!([1])), "responseSchema"),
        (
            |r| r.response_schema = Some(json!({"type": "no-such-type"})),
            "responseSchema",
        ),
    ];
    for (break_it, field) in cases {
        let mut request = request();
        break_it(&mut request);
        match NewJob::parse(request) {
            Err(ServiceError::Validation(message)) => {
                assert!(message.contains(field), "{message:?} should name {field}")
            }
            other => panic!("expected a validation error naming {field}, got {other:?}"),
        }
    }
}

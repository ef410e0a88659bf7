//! Tight holds: a prompt counted with the model's tokenizer (or the simulator's own
//! rule), a hold that follows the charging policy instead of `maxAttempts` whole
//! calls, and the context window checked before anything is held.

use crate::helpers::{AppOptions, Backend, decimal, error_code, spawn_app_with};
use crate::invariants::assert_billing_invariants;
use crate::parts::app_with_real_providers;
use rust_decimal::Decimal;
use serde_json::{Value, json};
use std::time::Duration;

on_both_backends!(
    a_plain_text_job_is_held_under_twice_its_charge,
    a_tenant_with_a_cent_runs_gpt_4o_on_a_short_prompt,
    a_job_past_the_context_window_is_refused_before_any_hold,
    the_default_policy_holds_one_call_and_absorbs_the_failed_ones,
    the_prompt_policy_holds_the_prompts_of_the_failed_calls,
    the_call_bound_policy_holds_every_call,
);

/// English prose of about `bytes` bytes.
fn prose(bytes: usize) -> String {
    const SENTENCES: [&str; 4] = [
        "The quarterly report shows that revenue grew by eleven percent, driven mostly by the new subscription plans. ",
        "Costs rose as well, although more slowly, because the team moved two services to cheaper machines. ",
        "Customers in the northern region asked for faster delivery, and the warehouse added an evening shift. ",
        "Next year the company plans to hire twenty engineers and rewrite the billing system that has grown fragile. ",
    ];
    let mut text = String::new();
    for sentence in SENTENCES.iter().cycle() {
        if text.len() >= bytes {
            break;
        }
        text.push_str(sentence);
    }
    text
}

fn job(key: &str, model: &str, content: &str, max_output_tokens: u32) -> Value {
    json!({
        "idempotencyKey": key,
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "maxOutputTokens": max_output_tokens,
        "maxAttempts": 3,
    })
}

/// gpt-4o reached through the OpenAI-compatible client at the simulator: counted
/// with o200k_base and at a quarter of the bytes, the larger (the simulator's rule,
/// for English). Under the default policy the hold is one call, so what the job is
/// held for is at most twice what it is charged for 20 KB of prose with 1,000
/// output tokens allowed — it was 14× with a byte per token, held three times.
async fn a_plain_text_job_is_held_under_twice_its_charge(backend: Backend) {
    let (app, _config) = app_with_real_providers(backend).await;
    let tenant = app.funded_tenant("writer", "5").await;
    let content = prose(20 * 1024);
    let id = app
        .create_job_ok(&tenant, job("prose", "gpt-4o", &content, 1_000))
        .await;
    let done = app
        .wait_until_finished(&tenant, id, Duration::from_secs(20))
        .await;
    assert_eq!(done["status"], "SUCCEEDED", "{done}");
    // The simulator's count, not cut: the bound is at least what it reports.
    assert_eq!(
        done["attempts"][0]["inputTokens"],
        (content.len() as u64).div_ceil(4),
        "{done}"
    );
    let hold = decimal(&done["reservation"]["amount"]);
    let charged = decimal(&done["charge"]["amount"]);
    let ratio = hold / charged;
    println!("hold ÷ charge for 20 KB of English prose, maxAttempts 3: {ratio:.2}");
    assert!(
        ratio <= Decimal::TWO,
        "held {hold} for a charge of {charged}: {ratio}"
    );
    assert_billing_invariants(&app.app.db).await;
}

/// 0.01 credits run gpt-4o for a 10-byte prompt and 300 output tokens: held for one
/// call (about 0.0038), where three calls at a byte per token (0.0115) were refused.
async fn a_tenant_with_a_cent_runs_gpt_4o_on_a_short_prompt(backend: Backend) {
    let (app, _config) = app_with_real_providers(backend).await;
    let tenant = app.funded_tenant("frugal", "0.01").await;
    let id = app
        .create_job_ok(&tenant, job("cent", "gpt-4o", "Say hello", 300))
        .await;
    let done = app
        .wait_until_finished(&tenant, id, Duration::from_secs(20))
        .await;
    assert_eq!(done["status"], "SUCCEEDED", "{done}");
    assert!(
        decimal(&done["reservation"]["amount"]) < Decimal::new(4, 3),
        "{done}"
    );
    assert_billing_invariants(&app.app.db).await;
}

/// gpt-4o's window is 128,000 tokens and claude-sonnet-4-5's 200,000: a prompt
/// whose count and maxOutputTokens pass it is refused, nothing held and nothing
/// sent; one that fits is admitted.
async fn a_job_past_the_context_window_is_refused_before_any_hold(backend: Backend) {
    let (app, _config) = app_with_real_providers(backend).await;
    let tenant = app.funded_tenant("verbose", "50").await;
    for (model, bytes) in [("gpt-4o", 480 * 1024), ("claude-sonnet-4-5", 760 * 1024)] {
        let response = app
            .create_job(
                &tenant,
                job(&format!("long-{model}"), model, &prose(bytes), 16_000),
            )
            .await;
        assert_eq!(error_code(&response), "VALIDATION", "{model}: {response}");
        let message = response["errors"][0]["message"].as_str().unwrap();
        assert!(message.contains("context window"), "{message}");
        let balance = app.balance(&tenant).await;
        assert_eq!(decimal(&balance["held"]), Decimal::ZERO, "{balance}");
    }
    assert!(app.simulator.calls().is_empty());
    let fits = app
        .create_job_ok(&tenant, job("fits", "gpt-4o", &prose(300 * 1024), 16_000))
        .await;
    let done = app
        .wait_until_finished(&tenant, fits, Duration::from_secs(30))
        .await;
    assert_eq!(done["status"], "SUCCEEDED", "{done}");
    assert_billing_invariants(&app.app.db).await;
}

/// gpt-4o-mini at the customer price (0.15 and 0.60 per million × 1.25), in nanos:
/// a prompt of `input` tokens, rounded up, and `output` tokens.
fn customer_nanos(input: i64, output: i64) -> i64 {
    (input * 187_500 + 999) / 1_000 + output * 750
}

const FLAKY: &str = "[mock:drop][mock:fail_first=2] summarise the minutes";

/// Under `policy` (a `[charging]` unknown_outcome), a job whose first two calls are
/// dropped after the simulator billed them and whose third succeeds: its hold is
/// `expected_hold`, its unknown calls charged `unknown_charge` each, its charge
/// within its hold, the provider billed three calls, and the audit stays clean.
async fn held_under(backend: Backend, policy: &str, expected_hold: i64, unknown_charge: i64) {
    let folder = tempfile::tempdir().unwrap();
    let config = folder.path().join("jobledger.toml");
    std::fs::write(
        &config,
        format!("[charging]\nunknown_outcome = \"{policy}\"\n"),
    )
    .unwrap();
    let app = spawn_app_with(
        backend,
        AppOptions {
            config_file: Some(config),
            ..AppOptions::default()
        },
    )
    .await;
    let tenant = app.funded_tenant("unlucky", "5").await;
    let id = app
        .create_job_ok(&tenant, job("flaky", "gpt-4o-mini", FLAKY, 100))
        .await;
    let done = app
        .wait_until_finished(&tenant, id, Duration::from_secs(40))
        .await;
    assert_eq!(done["status"], "SUCCEEDED", "{done}");
    let nanos = |value: &Value| {
        (decimal(value) * Decimal::new(1_000_000_000, 0))
            .try_into()
            .unwrap_or(i64::MAX)
    };
    assert_eq!(
        nanos(&done["reservation"]["amount"]),
        expected_hold,
        "{done}"
    );
    let charges = app
        .graphql(
            Some(&tenant.key),
            "query($id: UUID!) { job(id: $id) { attempts { outcome customerCharge } } }",
            json!({"id": id}),
        )
        .await;
    let attempts = charges["data"]["job"]["attempts"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(attempts.len(), 3, "{charges}");
    for attempt in &attempts[..2] {
        assert_eq!(attempt["outcome"], "UNKNOWN", "{charges}");
        assert_eq!(
            nanos(&attempt["customerCharge"]),
            unknown_charge,
            "{charges}"
        );
    }
    let charged = nanos(&done["charge"]["amount"]);
    assert!(
        charged <= expected_hold,
        "charged {charged} of {expected_hold}"
    );
    assert_eq!(app.billed_calls(), 3);
    assert_billing_invariants(&app.app.db).await;
}

/// The simulator's count of the flaky prompt, which the hold is counted by.
fn flaky_tokens() -> i64 {
    (FLAKY.len() as i64 + 3) / 4
}

async fn the_default_policy_holds_one_call_and_absorbs_the_failed_ones(backend: Backend) {
    let call = customer_nanos(flaky_tokens(), 100);
    held_under(backend, "delivered_output", call, 0).await;
}

async fn the_prompt_policy_holds_the_prompts_of_the_failed_calls(backend: Backend) {
    let prompt = customer_nanos(flaky_tokens(), 0);
    let call = customer_nanos(flaky_tokens(), 100);
    held_under(backend, "prompt", call + 2 * prompt, prompt).await;
}

async fn the_call_bound_policy_holds_every_call(backend: Backend) {
    let call = customer_nanos(flaky_tokens(), 100);
    held_under(backend, "call_bound", 3 * call, call).await;
}

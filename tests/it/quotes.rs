//! `quoteJob`: the hold `createJob` then takes, computed by the same code and
//! writing nothing — for a text job with a fallback chain and a streamed reply, and
//! for a job with an image part — and the same refusals as `createJob`.

use crate::helpers::{Backend, TestApp, TestTenant, decimal, error_code};
use crate::parts::app_with_real_providers;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use entity::{LedgerEntryKind, jobs, ledger_entries};
use rust_decimal::Decimal;
use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
use serde_json::{Value, json};
use uuid::Uuid;

on_both_backends!(
    a_quote_is_the_hold_the_create_takes,
    a_quote_refuses_what_the_create_refuses,
);

const QUOTE: &str = "query QuoteJob($input: CreateJobInput!) {
  quoteJob(input: $input) { hold model inputTokenBound maxOutputTokens }
}";

async fn quote(app: &TestApp, tenant: &TestTenant, input: &Value) -> Value {
    app.graphql(Some(&tenant.key), QUOTE, json!({"input": input}))
        .await
}

/// A PNG's signature and header, `width` × `height`: all a provider's count needs.
fn png(width: u32, height: u32) -> Vec<u8> {
    let mut bytes = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
    bytes.extend(width.to_be_bytes());
    bytes.extend(height.to_be_bytes());
    bytes.extend([8, 6, 0, 0, 0, 0, 0, 0, 0]);
    bytes
}

/// The HOLD ledger entry of the job, as a positive amount.
async fn held_in_ledger(app: &TestApp, job_id: Uuid) -> Decimal {
    let entries = ledger_entries::Entity::find()
        .filter(ledger_entries::Column::JobId.eq(job_id))
        .filter(ledger_entries::Column::Kind.eq(LedgerEntryKind::Hold))
        .all(&app.app.db)
        .await
        .unwrap();
    assert_eq!(entries.len(), 1, "{entries:?}");
    jobledger::billing::Credits::from_nanos(entries[0].amount_nanos.abs()).to_decimal()
}

/// Jobs and holds in the ledger (a worker meanwhile writes charges and releases).
async fn jobs_and_holds(app: &TestApp) -> (u64, u64) {
    let jobs = jobs::Entity::find().count(&app.app.db).await.unwrap();
    let holds = ledger_entries::Entity::find()
        .filter(ledger_entries::Column::Kind.eq(LedgerEntryKind::Hold))
        .count(&app.app.db)
        .await
        .unwrap();
    (jobs, holds)
}

/// Quotes `input`, checks nothing was written, creates it with the same key (not
/// used up by the quote) and returns the quote with the hold the ledger took.
async fn quote_then_create(app: &TestApp, tenant: &TestTenant, input: Value) -> (Value, Decimal) {
    let before = jobs_and_holds(app).await;
    let quoted = quote(app, tenant, &input).await;
    assert!(quoted["errors"].is_null(), "{quoted}");
    assert_eq!(jobs_and_holds(app).await, before, "a quote writes nothing");
    let created = app.create_job(tenant, input).await;
    assert!(created["errors"].is_null(), "{created}");
    assert_eq!(created["data"]["createJob"]["replayed"], false, "{created}");
    let id: Uuid = created["data"]["createJob"]["job"]["id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let held = held_in_ledger(app, id).await;
    let job = app
        .wait_until_finished(tenant, id, std::time::Duration::from_secs(30))
        .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    assert_eq!(decimal(&job["reservation"]["amount"]), held, "{job}");
    (quoted["data"]["quoteJob"].clone(), held)
}

async fn a_quote_is_the_hold_the_create_takes(backend: Backend) {
    let (app, _config) = app_with_real_providers(backend).await;
    let tenant = app.funded_tenant("quoter", "50").await;

    // Text, streamed (so every attempt's whole call is held), on a chain whose
    // fallback counts prompts by another rule.
    let prompt = "Summarise the quarterly report in three sentences, for the board.";
    let text = json!({
        "idempotencyKey": "quote-text",
        "model": "gpt-4o",
        "fallbackModels": ["claude-sonnet-4-5"],
        "messages": [{"role": "user", "content": prompt}],
        "maxOutputTokens": 300,
        "maxAttempts": 2,
        "streamOutput": true,
        "labels": [{"key": "doc", "value": "q3"}],
    });
    let (quoted, held) = quote_then_create(&app, &tenant, text).await;
    assert_eq!(decimal(&quoted["hold"]), held, "{quoted}");
    assert!(held > Decimal::ZERO);
    assert_eq!(quoted["model"], "gpt-4o");
    assert_eq!(quoted["maxOutputTokens"], 300);
    // Anthropic's rule (a token per byte and 16 per message) bounds the chain.
    assert_eq!(
        quoted["inputTokenBound"],
        prompt.len() as u64 + 16,
        "{quoted}"
    );

    // An image part: held by the provider's image rule.
    let image = json!({
        "idempotencyKey": "quote-image",
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "Describe it.", "parts": [
            {"type": "IMAGE", "data": STANDARD.encode(png(1024, 1024)), "mediaType": "image/png"},
        ]}],
        "maxOutputTokens": 100,
    });
    let (quoted, held) = quote_then_create(&app, &tenant, image).await;
    assert_eq!(decimal(&quoted["hold"]), held, "{quoted}");
    // 1024² becomes 768²: 85 + 4 tiles of 170, beside the text.
    let bound = quoted["inputTokenBound"].as_u64().unwrap();
    assert!(bound >= 85 + 170 * 4, "{quoted}");
    crate::invariants::assert_billing_invariants(&app.app.db).await;
}

async fn a_quote_refuses_what_the_create_refuses(backend: Backend) {
    let (app, _config) = app_with_real_providers(backend).await;
    let tenant = app.funded_tenant("refused", "5").await;
    let base = json!({
        "idempotencyKey": "quote-bad",
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "Hello"}],
        "maxOutputTokens": 50,
    });
    let with = |field: &str, value: Value| {
        let mut input = base.clone();
        input[field] = value;
        input
    };
    let bad = [
        with("maxOutputTokens", json!(0)),
        with("model", json!("no-such-model")),
        with("deadline", json!("2020-01-01T00:00:00Z")),
        with(
            "labels",
            json!([{"key": "a", "value": "1"}, {"key": "a", "value": "2"}]),
        ),
        with("temperature", json!(7.5)),
        with(
            "messages",
            json!([{"role": "user", "content": "x", "parts": [{"type": "IMAGE", "data": "bm90IGFuIGltYWdl"}]}]),
        ),
    ];
    for input in bad {
        let quoted = quote(&app, &tenant, &input).await;
        let created = app.create_job(&tenant, input.clone()).await;
        assert_eq!(error_code(&quoted), "VALIDATION", "{quoted}");
        assert_eq!(error_code(&created), error_code(&quoted), "{created}");
        assert_eq!(
            created["errors"][0]["message"], quoted["errors"][0]["message"],
            "{input}"
        );
    }
    assert_eq!(jobs_and_holds(&app).await.0, 0);
    // Not an access token's business without CREATE_JOBS, nor anyone's without a key.
    let anonymous = app.graphql(None, QUOTE, json!({"input": base})).await;
    assert_eq!(error_code(&anonymous), "UNAUTHENTICATED", "{anonymous}");
}

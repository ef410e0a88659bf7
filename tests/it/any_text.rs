//! Any text a client or a provider sends is stored exactly or refused with a reason —
//! never an internal error — on both backends. The NUL character is the sharp case:
//! PostgreSQL's `text` and `jsonb` cannot hold it, SQLite can.

use crate::helpers::{ADMIN_TOKEN, AppOptions, Backend, error_code, job_input, spawn_app_with};
use crate::invariants::assert_billing_invariants;
use jobledger::db::storable_text;
use serde_json::json;
use std::time::Duration;

on_both_backends!(
    a_reply_with_a_nul_character_is_stored_and_charged,
    nul_characters_in_requests_are_accepted_or_refused_never_internal,
);

async fn a_reply_with_a_nul_character_is_stored_and_charged(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::default()).await;
    let tenant = app.funded_tenant("binary-ish", "5").await;
    // Structured output whose JSON holds the escape \u0000, and plain text holding
    // the character itself.
    let mut structured = job_input(
        "structured-nul",
        r#"[mock:reply={"a":"x\u0000y"}] answer in JSON"#,
    );
    structured["responseSchema"] = json!({
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "required": ["a"],
    });
    let plain = job_input("plain-nul", "[mock:reply=before\u{0}after]");
    for (input, expected) in [
        (structured, json!({"a": "x\u{0}y"})),
        (plain, json!("before\u{0}after")),
    ] {
        let id = app.create_job_ok(&tenant, input).await;
        let job = app
            .wait_until_finished(&tenant, id, Duration::from_secs(20))
            .await;
        assert_eq!(job["status"], "SUCCEEDED", "{job}");
        assert_eq!(job["result"], expected);
        assert_eq!(job["attempts"].as_array().unwrap().len(), 1, "{job}");
        assert!(job["charge"]["amount"].is_string(), "charged: {job}");
    }
    let billed = app.simulator.calls().iter().filter(|c| c.billed).count();
    assert_eq!(billed, 2, "one paid call per job, none lost to a retry");
    assert_billing_invariants(&app.app.db).await;
}

async fn nul_characters_in_requests_are_accepted_or_refused_never_internal(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let tenant = app.funded_tenant("hostile", "5").await;

    // Inside JSON (content, metadata keys and values) the character is data: kept.
    let mut accepted = job_input("nul-content", "a\u{0}b");
    accepted["metadata"] = json!({"k\u{0}ey": "v\u{0}alue"});
    let id = app.create_job_ok(&tenant, accepted).await;
    let response = app
        .graphql(
            Some(&tenant.key),
            "query($id: UUID!) { job(id: $id) { input } }",
            json!({"id": id}),
        )
        .await;
    let job = &response["data"]["job"];
    assert_eq!(job["input"]["messages"][0]["content"], "a\u{0}b");
    assert_eq!(job["input"]["metadata"], json!({"k\u{0}ey": "v\u{0}alue"}));

    // In names, keys and identifiers it is refused, naming the field.
    let mut bad_model = job_input("nul-model", "hello");
    bad_model["model"] = json!("gpt-4o\u{0}-mini");
    let bad_key = job_input("nul\u{0}key", "hello");
    for (input, field) in [(bad_model, "model"), (bad_key, "idempotencyKey")] {
        let response = app.create_job(&tenant, input).await;
        assert_eq!(error_code(&response), "VALIDATION", "{response}");
        assert!(
            response["errors"][0]["message"]
                .as_str()
                .unwrap()
                .contains(field),
            "{response}"
        );
    }
    let tenant_name = app
        .operation(
            Some(ADMIN_TOKEN),
            "CreateTenant",
            json!({"name": "ac\u{0}me"}),
        )
        .await;
    assert_eq!(error_code(&tenant_name), "VALIDATION", "{tenant_name}");
    for (key, reason) in [("grant\u{0}key", "top-up"), ("grant-key", "re\u{0}ason")] {
        let grant = app
            .operation(
                Some(ADMIN_TOKEN),
                "GrantCredits",
                json!({"input": {
                    "tenantId": tenant.id, "amount": "1",
                    "idempotencyKey": key, "reason": reason,
                }}),
            )
            .await;
        assert_eq!(error_code(&grant), "VALIDATION", "{grant}");
    }
    assert_billing_invariants(&app.app.db).await;
}

#[test]
fn provider_text_with_nul_is_made_storable() {
    assert_eq!(storable_text("a\u{0}b".into()), "a\u{FFFD}b");
    assert_eq!(storable_text("plain".into()), "plain");
}

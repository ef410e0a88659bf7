//! What a tenant reads of a provider's error, through the whole service.
use std::time::Duration;

use crate::helpers::{AppOptions, Backend, job_input, spawn_app_with};
use serde_json::json;
use wiremock::matchers::{body_string_contains, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

on_both_backends!(a_providers_error_text_never_reaches_the_tenant);

/// Everything a tenant can read about a job that ends in a provider error.
const JOB_AS_THE_TENANT_SEES_IT: &str = r#"
query ($id: UUID!) {
  job(id: $id) {
    status
    error { code message }
    attempts { outcome errorCode errorMessage provider providerRequestId }
    events { seq kind status data }
  }
}
"#;

/// A config file sending every `gpt-*` model to the OpenAI-compatible `server`.
fn routed_to(server: &MockServer) -> (tempfile::TempDir, AppOptions) {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("jobledger.toml");
    let text = format!(
        "[providers.upstream]\nkind = \"openai\"\nbase_url = \"{}/v1\"\n\n[routes]\n\"gpt-*\" = \"upstream\"\n",
        server.uri()
    );
    std::fs::write(&path, text).unwrap();
    let options = AppOptions {
        config_file: Some(path),
        ..AppOptions::default()
    };
    (folder, options)
}

/// Answers chat calls whose prompt contains `marker` with `response`.
async fn answer_prompts_with(server: &MockServer, marker: &str, response: ResponseTemplate) {
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(body_string_contains(marker))
        .respond_with(response)
        .mount(server)
        .await;
}

/// A 429 that names our OpenAI organisation and a gateway's 502 page that names an
/// internal host: the tenant reads a fixed sentence per class with the provider's
/// request id — on the job, its attempts and its events — and none of the provider's
/// words. A context-window refusal is told apart by its error code.
async fn a_providers_error_text_never_reaches_the_tenant(backend: Backend) {
    let server = MockServer::start().await;
    answer_prompts_with(
        &server,
        "rate-limited",
        ResponseTemplate::new(429)
            .insert_header("x-request-id", "req_429_abc")
            .set_body_json(json!({"error": {
                "message": "Rate limit reached for gpt-4o-mini in organization org-SECRET123 on requests per min (RPM): Limit 3, Used 3.",
                "type": "requests",
                "code": "rate_limit_exceeded",
            }})),
    )
    .await;
    answer_prompts_with(
        &server,
        "behind-a-gateway",
        ResponseTemplate::new(502)
            .insert_header("x-request-id", "req_502_def")
            .insert_header("content-type", "text/html")
            .set_body_string(
                "<html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1><p>upstream internal-gw-7.corp:8443 did not answer</p></body></html>",
            ),
    )
    .await;
    answer_prompts_with(
        &server,
        "far-too-long",
        ResponseTemplate::new(400)
            .insert_header("x-request-id", "req_400_ghi")
            .set_body_json(json!({"error": {
                "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in 912345 tokens (see org-SECRET123 usage).",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }})),
    )
    .await;
    let (_config, options) = routed_to(&server);
    let app = spawn_app_with(backend, options).await;
    let tenant = app.funded_tenant("acme", "5").await;

    for (prompt, request_id, code, sentence) in [
        (
            "rate-limited",
            "req_429_abc",
            "PROVIDER_UNAVAILABLE",
            "provider answered 429: rate limited by the provider",
        ),
        (
            "behind-a-gateway",
            "req_502_def",
            "PROVIDER_UNAVAILABLE",
            "provider answered 502: the provider failed",
        ),
        (
            "far-too-long",
            "req_400_ghi",
            "PROVIDER_REJECTED",
            "provider refused the request with 400: the prompt exceeds the model's context window",
        ),
    ] {
        let mut input = job_input(prompt, prompt);
        // One attempt: the job fails on the provider's first answer — except after a
        // 429, a wait that spends no attempt: a short deadline ends that one.
        input["maxAttempts"] = json!(1);
        let waits = request_id == "req_429_abc";
        if waits {
            input["deadline"] =
                json!((chrono::Utc::now() + chrono::Duration::seconds(3)).to_rfc3339());
        }
        let id = app.create_job_ok(&tenant, input).await;
        app.wait_until_finished(&tenant, id, Duration::from_secs(15))
            .await;
        let response = app
            .graphql(
                Some(&tenant.key),
                JOB_AS_THE_TENANT_SEES_IT,
                json!({"id": id}),
            )
            .await;
        assert!(response["errors"].is_null(), "{response}");
        let job = &response["data"]["job"];
        let seen = job.to_string();
        for secret in ["org-SECRET123", "internal-gw-7.corp", "Bad Gateway", "RPM"] {
            assert!(!seen.contains(secret), "{prompt}: {secret} leaked in {job}");
        }
        assert_eq!(job["status"], "FAILED", "{job}");
        let expected = format!("{sentence} (provider request id {request_id})");
        if waits {
            assert_eq!(job["error"]["code"], "DEADLINE_EXCEEDED", "{job}");
            assert_eq!(job["attempts"][0]["errorCode"], code, "{job}");
        } else {
            assert_eq!(job["error"]["code"], code, "{job}");
            assert_eq!(job["error"]["message"], expected.as_str(), "{job}");
        }
        let attempt = &job["attempts"][0];
        assert_eq!(attempt["errorMessage"], expected.as_str(), "{job}");
        assert_eq!(attempt["providerRequestId"], request_id, "{job}");
        assert_eq!(attempt["provider"], "upstream", "{job}");
        let failed = job["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|event| event["kind"] == "FAILED")
            .unwrap_or_else(|| panic!("no FAILED event in {job}"));
        // The deadline's end names no provider call; the others name theirs.
        assert!(
            waits || failed["data"].to_string().contains(request_id),
            "the event names the request id: {failed}"
        );
    }
}

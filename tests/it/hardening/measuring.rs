//! Everyone else while requests carry PDFs that take seconds to measure (issue 24,
//! finding 2). Measuring ran on the API's async threads: four requests of twenty
//! small deflate bombs each kept `/healthz` waiting 49 s and another tenant's tiny
//! `createJob` 39 s. Now it runs on blocking threads behind a few permits, and a
//! request's documents share one inflate budget.

use crate::helpers::{Backend, decimal, error_code, job_input};
use crate::parts::app_with_real_providers;
use crate::pdf_holds::bomb_pdf;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use std::time::Duration;

on_both_backends!(others_are_served_while_documents_are_measured);

/// Requests of bombs at once: more than the permits (one per core), so some wait.
const HEAVY_REQUESTS: usize = 4;

async fn others_are_served_while_documents_are_measured(backend: Backend) {
    let _alone = super::LOAD_TEST.lock().await;
    let (app, _config) = app_with_real_providers(backend).await;
    let heavy = app.funded_tenant("heavy", "50").await;
    let bystander = app.funded_tenant("bystander", "5").await;
    // Twenty documents of 4 MiB inflated each: 80 MiB, past the request's 64 MiB.
    let document = STANDARD.encode(bomb_pdf(2, 2));
    let parts: Vec<Value> = (0..20)
        .map(|_| json!({"type": "DOCUMENT", "data": document}))
        .collect();
    let create = crate::contract::operation("CreateJob");
    let heavy_requests: Vec<_> = (0..HEAVY_REQUESTS)
        .map(|index| {
            let request = app.http.post(app.url()).bearer_auth(&heavy.key).json(
                &json!({"query": create, "variables": {"input": {
                    "idempotencyKey": format!("heavy-{index}"),
                    "model": "claude-sonnet-4-5",
                    "messages": [{"role": "user", "content": "Read them.", "parts": parts}],
                    "maxOutputTokens": 100,
                }}}),
            );
            tokio::spawn(
                async move { request.send().await.unwrap().json::<Value>().await.unwrap() },
            )
        })
        .collect();
    // Let them reach their measuring.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let served = async {
        let healthz = app
            .http
            .get(format!("http://{}/healthz", app.address))
            .send()
            .await
            .unwrap();
        assert_eq!(healthz.status(), 200);
        app.create_job_ok(&bystander, job_input("tiny", "hello"))
            .await;
    };
    tokio::time::timeout(Duration::from_secs(60), served)
        .await
        .expect("the bystander was served within 60 s");
    // Not a timing threshold: the others were answered while every request of bombs
    // was still being measured (or waiting for its turn).
    let finished = heavy_requests
        .iter()
        .filter(|request| request.is_finished())
        .count();
    assert_eq!(
        finished, 0,
        "requests of bombs ended before the bystander was answered"
    );

    for request in heavy_requests {
        let response = request.await.unwrap();
        assert_eq!(error_code(&response), "VALIDATION", "{response}");
        let message = response["errors"][0]["message"].as_str().unwrap();
        assert!(
            message.contains(&(64 * 1024 * 1024).to_string()),
            "{message}"
        );
    }
    let balance = app.balance(&heavy).await;
    assert_eq!(decimal(&balance["held"]), rust_decimal::Decimal::ZERO);
}

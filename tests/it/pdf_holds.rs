//! What a PDF is held for when its text is drawn more often than it is written —
//! form XObjects drawn many times, nested, or drawing themselves — and the inflate
//! budget that all the documents of one request share (issue 24's attacks).
//!
//! The simulator bills a document by the same measuring the hold uses, so it cannot
//! see an undercount: these tests compare the bound with the text a reader shows,
//! computed here.

use crate::helpers::{Backend, TestApp, TestTenant, decimal, error_code};
use crate::parts::app_with_real_providers;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use std::io::Write;

on_both_backends!(
    a_form_drawn_many_times_is_held_for_every_draw,
    the_documents_of_a_request_share_one_inflate_budget,
    the_items_of_one_call_share_one_inflate_budget,
);

const QUOTE: &str = "query QuoteJob($input: CreateJobInput!) {
  quoteJob(input: $input) { inputTokenBound }
}";

/// The tokens of one page at its allowance.
const PAGE_TOKENS: i64 = 3_000;

fn deflated(bytes: &[u8]) -> Vec<u8> {
    let mut deflate = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    deflate.write_all(bytes).unwrap();
    deflate.finish().unwrap()
}

/// A one-page PDF: the page draws what `resources` names with `content`; then
/// `objects`, each a number, a dictionary and the data of its stream, deflated.
fn pdf_with(resources: &str, content: &str, objects: &[(u32, String, Vec<u8>)]) -> Vec<u8> {
    let mut file = format!(
        "%PDF-1.5\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n2 0 obj\n<< /Type /Pages /Kids [3 0 R] /Count 1 >>\nendobj\n3 0 obj\n<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources {resources} /Contents 4 0 R >>\nendobj\n"
    )
    .into_bytes();
    let page = (4, "<< >>".to_owned(), deflated(content.as_bytes()));
    for (number, dictionary, data) in std::iter::once(&page).chain(objects) {
        let dictionary = dictionary.replacen(
            "<<",
            &format!("<< /Filter /FlateDecode /Length {}", data.len()),
            1,
        );
        file.extend(format!("{number} 0 obj\n{dictionary}\nstream\n").as_bytes());
        file.extend(data);
        file.extend(b"\nendstream\nendobj\n");
    }
    file.extend(b"trailer\n<< /Root 1 0 R >>\n%%EOF\n");
    file
}

/// A form XObject's dictionary, its names bound by `xobjects`.
fn form(xobjects: &str) -> String {
    format!(
        "<< /Type /XObject /Subtype /Form /BBox [0 0 612 792] /Resources << /XObject << {xobjects} >> >> >>"
    )
}

/// Content that shows `bytes` bytes of text, then `more`; deflated.
fn shows(bytes: usize, more: &str) -> Vec<u8> {
    deflated(format!("BT /F1 1 Tf ({}) Tj ET\n{more}", "w".repeat(bytes)).as_bytes())
}

fn input(key: &str, documents: &[Vec<u8>]) -> Value {
    let parts: Vec<Value> = documents
        .iter()
        .map(|document| json!({"type": "DOCUMENT", "data": STANDARD.encode(document)}))
        .collect();
    json!({
        "idempotencyKey": key,
        "model": "claude-sonnet-4-5",
        "messages": [{"role": "user", "content": "Read it.", "parts": parts}],
        "maxOutputTokens": 100,
    })
}

async fn quote(app: &TestApp, tenant: &TestTenant, input: &Value) -> Value {
    app.graphql(Some(&tenant.key), QUOTE, json!({"input": input}))
        .await
}

/// The input token bound `createJob` would hold `document` for.
async fn bound_of(app: &TestApp, tenant: &TestTenant, document: Vec<u8>) -> i64 {
    let quoted = quote(app, tenant, &input("forms", &[document])).await;
    assert!(quoted["errors"].is_null(), "{quoted}");
    quoted["data"]["quoteJob"]["inputTokenBound"]
        .as_i64()
        .unwrap()
}

/// Before the fix a form of 2,000 bytes of text drawn 200 times was held for about
/// 5,000 tokens, and a text extractor outputs it on every draw: some 100,000.
/// Every token covers at least one character, so a bound of the text shown is its
/// bytes, once per draw. (Scaled down to stay within the model's context window.)
async fn a_form_drawn_many_times_is_held_for_every_draw(backend: Backend) {
    let (app, _config) = app_with_real_providers(backend).await;
    let tenant = app.funded_tenant("forms", "50").await;
    let text = 2_000;

    let draws = 40;
    let flat = pdf_with(
        "<< /XObject << /Fm0 10 0 R >> >>",
        &"q /Fm0 Do Q\n".repeat(draws),
        &[(10, form(""), shows(text, ""))],
    );
    let shown = (draws * text) as i64;
    let bound = bound_of(&app, &tenant, flat).await;
    assert!(bound >= PAGE_TOKENS + shown, "{bound} < {shown} shown");

    // Nested: the page draws form 10 ten times, each drawing form 11 (bound by the
    // same name in form 10's own resources) five times.
    let nested = pdf_with(
        "<< /XObject << /Fm0 10 0 R >> >>",
        &"/Fm0 Do\n".repeat(10),
        &[
            (
                10,
                form("/Fm0 11 0 R"),
                deflated("/Fm0 Do\n".repeat(5).as_bytes()),
            ),
            (11, form(""), shows(text, "")),
        ],
    );
    let shown = (10 * 5 * text) as i64;
    let bound = bound_of(&app, &tenant, nested).await;
    assert!(bound >= PAGE_TOKENS + shown, "{bound} < {shown} shown");

    // A form that draws itself (twice, with text) shows text without end: refused,
    // and the refusal comes at once.
    let itself = pdf_with(
        "<< /XObject << /Fm0 10 0 R >> >>",
        "/Fm0 Do",
        &[(10, form("/Fm0 10 0 R"), shows(text, "/Fm0 Do /Fm0 Do"))],
    );
    let response = app.create_job(&tenant, input("itself", &[itself])).await;
    assert_eq!(error_code(&response), "VALIDATION", "{response}");
    let message = response["errors"][0]["message"].as_str().unwrap();
    assert!(message.contains("cycle"), "{message}");
    let balance = app.balance(&tenant).await;
    assert_eq!(decimal(&balance["held"]), rust_decimal::Decimal::ZERO);
}

/// A PDF of `streams` streams, each `megabytes` MiB of zeros deflated to about a
/// kilobyte: tiny to send, costly to inflate.
pub fn bomb_pdf(streams: u32, megabytes: usize) -> Vec<u8> {
    let zeros = deflated(&vec![0; megabytes * 1024 * 1024]);
    let objects: Vec<_> = (0..streams)
        .map(|stream| (stream + 10, "<< >>".to_owned(), zeros.clone()))
        .collect();
    pdf_with("<< >>", "", &objects)
}

/// The cap was per PDF, and a job takes 20: one request inflated 1.25 GiB. Now the
/// documents of a request inflate to 64 MiB together: ten documents of 4 MiB each
/// are measured, twenty are refused, naming the limit.
async fn the_documents_of_a_request_share_one_inflate_budget(backend: Backend) {
    let (app, _config) = app_with_real_providers(backend).await;
    let tenant = app.funded_tenant("budget", "50").await;
    let document = bomb_pdf(2, 2);
    let within = quote(&app, &tenant, &input("ten", &vec![document.clone(); 10])).await;
    assert!(within["errors"].is_null(), "{within}");
    let response = app
        .create_job(&tenant, input("twenty", &vec![document; 20]))
        .await;
    assert_eq!(error_code(&response), "VALIDATION", "{response}");
    let message = response["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.contains(&(64 * 1024 * 1024).to_string()) && message.contains("per request"),
        "{message}"
    );
    let balance = app.balance(&tenant).await;
    assert_eq!(decimal(&balance["held"]), rust_decimal::Decimal::ZERO);
}

/// An `addBatchItems` call is one request: its items' documents share the budget,
/// so two items of 40 MiB each (each within it alone) are refused together.
async fn the_items_of_one_call_share_one_inflate_budget(backend: Backend) {
    let (app, _config) = app_with_real_providers(backend).await;
    let tenant = app.funded_tenant("batcher", "50").await;
    let created = app
        .operation(
            Some(&tenant.key),
            "CreateBatch",
            json!({"input": {"idempotencyKey": "pdfs", "name": "pdfs", "model": "claude-sonnet-4-5", "maxOutputTokens": 50}}),
        )
        .await;
    assert!(created["errors"].is_null(), "{created}");
    let batch = created["data"]["createBatch"]["batch"]["id"].clone();
    let document = STANDARD.encode(bomb_pdf(2, 2));
    let parts: Vec<Value> = (0..10)
        .map(|_| json!({"type": "DOCUMENT", "data": document}))
        .collect();
    let item = |id: &str| {
        json!({
            "customId": id,
            "messages": [{"role": "user", "content": "Read them.", "parts": parts}],
        })
    };
    let response = app
        .operation(
            Some(&tenant.key),
            "AddBatchItems",
            json!({"batchId": batch, "items": [item("first"), item("second")]}),
        )
        .await;
    assert_eq!(error_code(&response), "VALIDATION", "{response}");
    let message = response["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.starts_with("items[1]") && message.contains(&(64 * 1024 * 1024).to_string()),
        "{message}"
    );
    let balance = app.balance(&tenant).await;
    assert_eq!(decimal(&balance["held"]), rust_decimal::Decimal::ZERO);
}

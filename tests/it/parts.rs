//! Message parts beyond text — images and PDF documents — through the whole service,
//! in both providers' shapes: sent as each provider takes them (the simulator's
//! request log), held by each provider's token rules, billed within the hold, and
//! refused at creation when they cannot be sent.

use crate::helpers::{
    AppOptions, Backend, TestApp, TestTenant, decimal, error_code, spawn_app_with_simulator,
};
use crate::invariants::assert_billing_invariants;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::Duration;

on_both_backends!(
    an_image_part_is_sent_held_and_billed_in_each_shape,
    a_pdf_part_is_sent_held_and_billed_in_each_shape,
    a_pdf_dense_with_text_is_held_for_its_text,
    a_pdf_that_inflates_without_end_is_refused,
    an_image_by_url_is_held_at_the_most_an_image_counts,
    bad_parts_are_refused_before_anything_is_held,
);

/// A config file whose real providers are the app's simulator: `gpt-*` through the
/// OpenAI-compatible client, `claude-*` through the Anthropic one.
pub fn real_providers_at_the_simulator(address: SocketAddr) -> (tempfile::TempDir, AppOptions) {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("jobledger.toml");
    let text = format!(
        "[providers.upstream]\nkind = \"openai\"\nbase_url = \"http://{address}/v1\"\n\n\
         [providers.claude]\nkind = \"anthropic\"\nbase_url = \"http://{address}\"\n\n\
         [routes]\n\"gpt-*\" = \"upstream\"\n\"claude-*\" = \"claude\"\n"
    );
    std::fs::write(&path, text).unwrap();
    let options = AppOptions {
        config_file: Some(path),
        ..AppOptions::default()
    };
    (folder, options)
}

/// The app with both shapes served by its simulator; the folder holds its config.
pub async fn app_with_real_providers(backend: Backend) -> (TestApp, tempfile::TempDir) {
    let mut folder = None;
    let app = spawn_app_with_simulator(backend, |address| {
        let (kept, options) = real_providers_at_the_simulator(address);
        folder = Some(kept);
        options
    })
    .await;
    (app, folder.unwrap())
}

/// A PNG's signature and header, `width` × `height`: all a provider's count needs.
fn png(width: u32, height: u32) -> Vec<u8> {
    let mut bytes = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
    bytes.extend(width.to_be_bytes());
    bytes.extend(height.to_be_bytes());
    bytes.extend([8, 6, 0, 0, 0, 0, 0, 0, 0]);
    bytes
}

/// A PDF of `pages` empty pages.
fn pdf(pages: u32) -> Vec<u8> {
    let kids: Vec<String> = (0..pages).map(|page| format!("{} 0 R", page + 3)).collect();
    let mut text = format!(
        "%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n2 0 obj\n<< /Type /Pages /Kids [{}] /Count {pages} >>\nendobj\n",
        kids.join(" ")
    );
    for page in 0..pages {
        text.push_str(&format!(
            "{} 0 obj\n<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>\nendobj\n",
            page + 3
        ));
    }
    text.push_str("%%EOF\n");
    text.into_bytes()
}

/// A one-page PDF whose page shows `lines` lines of `line` each, in one deflated
/// content stream: tiny text, as much as the page's bytes hold.
fn pdf_of_text(line: &str, lines: usize) -> Vec<u8> {
    use std::io::Write;
    let content: String = (0..lines)
        .map(|index| format!("BT /F1 1 Tf 0 {index} Td ({line}) Tj ET\n"))
        .collect();
    let mut deflate = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    deflate.write_all(content.as_bytes()).unwrap();
    let mut file = b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n2 0 obj\n<< /Type /Pages /Kids [3 0 R] /Count 1 >>\nendobj\n3 0 obj\n<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >>\nendobj\n4 0 obj\n<< /Filter /FlateDecode >>\nstream\n".to_vec();
    file.extend(deflate.finish().unwrap());
    file.extend(b"\nendstream\nendobj\ntrailer\n<< /Root 1 0 R >>\n%%EOF\n");
    file
}

const PROMPT: &str = "Describe what you see.";

fn input_with(key: &str, model: &str, parts: Value) -> Value {
    json!({
        "idempotencyKey": key,
        "model": model,
        "messages": [{"role": "user", "content": PROMPT, "parts": parts}],
        "maxOutputTokens": 100,
    })
}

/// Runs `input` to its end and returns the job, its hold, and the simulator's record
/// of the call it made.
async fn run(app: &TestApp, tenant: &TestTenant, input: Value) -> (Value, Value) {
    let id = app.create_job_ok(tenant, input).await;
    let job = app
        .wait_until_finished(tenant, id, Duration::from_secs(20))
        .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    let calls = app.simulator.calls();
    let call = calls.last().expect("the simulator was called");
    let call = json!({"input_tokens": call.input_tokens, "request": call.request});
    (job, call)
}

/// The job's attempt used exactly `input_tokens` (as the simulator counted them, so
/// not cut to the bound), and its charge stayed within its hold.
async fn billed_within_hold(
    app: &TestApp,
    tenant: &TestTenant,
    job: &Value,
    call: &Value,
    input_tokens: u64,
) {
    assert_eq!(call["input_tokens"], input_tokens, "{call}");
    assert_eq!(job["attempts"][0]["inputTokens"], input_tokens, "{job}");
    let hold = decimal(&job["reservation"]["amount"]);
    let charged = decimal(&job["charge"]["amount"]);
    assert!(
        charged > rust_decimal::Decimal::ZERO && charged <= hold,
        "charged {charged} of {hold}"
    );
    let balance = app.balance(tenant).await;
    assert_eq!(
        decimal(&balance["held"]),
        rust_decimal::Decimal::ZERO,
        "{balance}"
    );
    assert_billing_invariants(&app.app.db).await;
}

/// The tokens of the prompt text as the simulator counts them.
fn text_tokens() -> u64 {
    (PROMPT.len() as u64).div_ceil(4)
}

async fn an_image_part_is_sent_held_and_billed_in_each_shape(backend: Backend) {
    let (app, _config) = app_with_real_providers(backend).await;
    let tenant = app.funded_tenant("looker", "5").await;
    let data = STANDARD.encode(png(1024, 1024));
    let image = json!([{"type": "IMAGE", "data": data}]);

    let (job, call) = run(
        &app,
        &tenant,
        input_with("openai-image", "gpt-4o", image.clone()),
    )
    .await;
    let content = &call["request"]["messages"][0]["content"];
    assert_eq!(
        content[0],
        json!({"type": "text", "text": PROMPT}),
        "{call}"
    );
    assert_eq!(content[1]["type"], "image_url", "{call}");
    assert_eq!(
        content[1]["image_url"]["url"],
        format!("data:image/png;base64,{data}")
    );
    // 1024² becomes 768²: four tiles.
    billed_within_hold(&app, &tenant, &job, &call, text_tokens() + 85 + 170 * 4).await;

    let (job, call) = run(
        &app,
        &tenant,
        input_with("anthropic-image", "claude-sonnet-4-5", image),
    )
    .await;
    let content = &call["request"]["messages"][0]["content"];
    assert_eq!(content[1]["type"], "image", "{call}");
    assert_eq!(
        content[1]["source"],
        json!({"type": "base64", "media_type": "image/png", "data": data})
    );
    // 1024 × 1024 / 750, rounded up.
    billed_within_hold(&app, &tenant, &job, &call, text_tokens() + 1399).await;
}

async fn a_pdf_part_is_sent_held_and_billed_in_each_shape(backend: Backend) {
    let (app, _config) = app_with_real_providers(backend).await;
    let tenant = app.funded_tenant("reader", "5").await;
    let data = STANDARD.encode(pdf(2));
    let document = json!([{"type": "DOCUMENT", "data": data, "mediaType": "application/pdf"}]);

    let (job, call) = run(
        &app,
        &tenant,
        input_with("openai-pdf", "gpt-4o", document.clone()),
    )
    .await;
    let part = &call["request"]["messages"][0]["content"][1];
    assert_eq!(part["type"], "file", "{call}");
    assert_eq!(
        part["file"]["file_data"],
        format!("data:application/pdf;base64,{data}")
    );
    billed_within_hold(&app, &tenant, &job, &call, text_tokens() + 2 * 3_000).await;

    let (job, call) = run(
        &app,
        &tenant,
        input_with("anthropic-pdf", "claude-sonnet-4-5", document),
    )
    .await;
    let part = &call["request"]["messages"][0]["content"][1];
    assert_eq!(part["type"], "document", "{call}");
    assert_eq!(part["source"]["media_type"], "application/pdf");
    billed_within_hold(&app, &tenant, &job, &call, text_tokens() + 2 * 3_000).await;

    // What Job.input shows of it: the part as stored, with its measured pages.
    let id: uuid::Uuid = job["id"].as_str().unwrap().parse().unwrap();
    let shown = app
        .graphql(
            Some(&tenant.key),
            "query($id: UUID!) { job(id: $id) { input } }",
            json!({"id": id}),
        )
        .await;
    assert!(shown["errors"].is_null(), "{shown}");
    assert_eq!(
        shown["data"]["job"]["input"]["messages"][0]["parts"][0]["pages"], 2,
        "{shown}"
    );
}

/// A page of tiny text costs its text's tokens at a provider, not a page's image: the
/// hold counts the text the document shows, and the simulator bills it as it bills
/// text, so what is billed stays within the hold.
async fn a_pdf_dense_with_text_is_held_for_its_text(backend: Backend) {
    let (app, _config) = app_with_real_providers(backend).await;
    let tenant = app.funded_tenant("dense", "20").await;
    let line = "The quick brown fox jumps over the lazy dog, again and again and again, tiny.";
    let lines = 1_000;
    let data = STANDARD.encode(pdf_of_text(line, lines));
    let shown = (line.len() * lines) as u64;
    let document = json!([{"type": "DOCUMENT", "data": data}]);
    // A page at its allowance, its text as the simulator counts text.
    let billed = text_tokens() + 3_000 + shown.div_ceil(4);
    for (key, model) in [
        ("dense-openai", "gpt-4o"),
        ("dense-anthropic", "claude-sonnet-4-5"),
    ] {
        let (job, call) = run(&app, &tenant, input_with(key, model, document.clone())).await;
        billed_within_hold(&app, &tenant, &job, &call, billed).await;
    }
}

/// Streams that inflate to more than the cap — here many small deflated streams of
/// zeros, the cap counting across all of them — are refused at create, naming it.
async fn a_pdf_that_inflates_without_end_is_refused(backend: Backend) {
    use std::io::Write;
    let (app, _config) = app_with_real_providers(backend).await;
    let tenant = app.funded_tenant("bomber", "5").await;
    let mut deflate = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    deflate.write_all(&vec![0; 1024 * 1024]).unwrap();
    let megabyte = deflate.finish().unwrap();
    let mut file = pdf(1);
    for object in 0..80 {
        file.extend(
            format!(
                "{} 0 obj\n<< /Filter /FlateDecode >>\nstream\n",
                object + 10
            )
            .as_bytes(),
        );
        file.extend(&megabyte);
        file.extend(b"\nendstream\nendobj\n");
    }
    let document = json!([{"type": "DOCUMENT", "data": STANDARD.encode(&file)}]);
    let response = app
        .create_job(&tenant, input_with("bomb", "claude-sonnet-4-5", document))
        .await;
    assert_eq!(error_code(&response), "VALIDATION", "{response}");
    let message = response["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.contains(&(64 * 1024 * 1024).to_string()),
        "{message}"
    );
    let balance = app.balance(&tenant).await;
    assert_eq!(decimal(&balance["held"]), rust_decimal::Decimal::ZERO);
    assert_eq!(app.simulator.calls().len(), 0);
}

/// An image the service cannot measure is held, and counted by the simulator, at
/// the most any image counts for the provider: never above its hold.
async fn an_image_by_url_is_held_at_the_most_an_image_counts(backend: Backend) {
    let (app, _config) = app_with_real_providers(backend).await;
    let tenant = app.funded_tenant("linker", "5").await;
    let image = json!([{"type": "IMAGE", "url": "https://images.example.com/cat.png"}]);
    let (job, call) = run(
        &app,
        &tenant,
        input_with("openai-url", "gpt-4o", image.clone()),
    )
    .await;
    let part = &call["request"]["messages"][0]["content"][1];
    assert_eq!(
        part["image_url"]["url"], "https://images.example.com/cat.png",
        "{call}"
    );
    billed_within_hold(&app, &tenant, &job, &call, text_tokens() + 85 + 170 * 8).await;
    let (job, call) = run(
        &app,
        &tenant,
        input_with("anthropic-url", "claude-sonnet-4-5", image),
    )
    .await;
    let part = &call["request"]["messages"][0]["content"][1];
    assert_eq!(
        part["source"],
        json!({"type": "url", "url": "https://images.example.com/cat.png"})
    );
    billed_within_hold(&app, &tenant, &job, &call, text_tokens() + 3_279).await;
}

async fn bad_parts_are_refused_before_anything_is_held(backend: Backend) {
    let (app, _config) = app_with_real_providers(backend).await;
    let tenant = app.funded_tenant("careless", "5").await;
    let secret = STANDARD.encode(b"SECRET-BYTES-SECRET-BYTES");
    let cases = [
        (
            "gpt-4o",
            json!([{"type": "IMAGE", "data": "@@not base64@@"}]),
            "base64",
        ),
        (
            "gpt-4o",
            json!([{"type": "IMAGE", "data": secret}]),
            "not a PNG",
        ),
        (
            "gpt-4o",
            json!([{"type": "IMAGE", "data": STANDARD.encode(png(8, 8)), "mediaType": "image/bmp"}]),
            "mediaType",
        ),
        (
            "gpt-4o",
            json!([{"type": "DOCUMENT", "data": secret}]),
            "not a PDF",
        ),
        (
            "gpt-4o",
            json!([{"type": "DOCUMENT", "url": "https://example.com/a.pdf"}]),
            "URL",
        ),
        (
            "gpt-3.5-turbo",
            json!([{"type": "IMAGE", "data": STANDARD.encode(png(8, 8))}]),
            "takes no images",
        ),
        (
            "claude-3-haiku-20240307",
            json!([{"type": "DOCUMENT", "data": STANDARD.encode(pdf(1))}]),
            "takes no documents",
        ),
        (
            "gpt-4o",
            json!(vec![json!({"type": "TEXT", "text": "x"}); 21]),
            "at most 20",
        ),
    ];
    for (index, (model, parts, reason)) in cases.into_iter().enumerate() {
        let response = app
            .create_job(&tenant, input_with(&format!("bad-{index}"), model, parts))
            .await;
        assert_eq!(error_code(&response), "VALIDATION", "{response}");
        let message = response["errors"][0]["message"].as_str().unwrap();
        assert!(
            message.contains(reason),
            "{message:?} should say {reason:?}"
        );
        assert!(
            !message.contains("SECRET") && !message.contains(&secret),
            "{message:?} shows the data"
        );
    }
    // A system message's image too: images come from the user.
    let mut input = input_with("bad-system", "gpt-4o", json!([]));
    input["messages"] = json!([{"role": "system", "parts": [{"type": "IMAGE", "data": STANDARD.encode(png(8, 8))}]}, {"role": "user", "content": "hi"}]);
    assert_eq!(
        error_code(&app.create_job(&tenant, input).await),
        "VALIDATION"
    );
    let balance = app.balance(&tenant).await;
    assert_eq!(
        decimal(&balance["held"]),
        rust_decimal::Decimal::ZERO,
        "{balance}"
    );
    assert_eq!(app.simulator.calls().len(), 0);
    assert_billing_invariants(&app.app.db).await;
}

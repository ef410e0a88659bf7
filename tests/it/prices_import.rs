//! `jobledger prices import FILE`: a price map in LiteLLM's format adds models that
//! then run, routed by their provider, at exactly the imported prices; it reports each
//! entry's fate; importing again adds nothing; a changed price is a new version that
//! leaves the version an attempt used as it was; a restart does not put built-in
//! prices back over imported ones; the config file's prices win over an import; and
//! `models` lists built-in and imported models with the caller's own prices.

use crate::helpers::{
    ADMIN_TOKEN, AppOptions, Backend, TestApp, TestTenant, decimal, job_input, spawn_app_with,
};
use entity::{PriceOrigin, model_prices};
use rust_decimal::Decimal;
use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder};
use serde_json::{Value, json};
use std::str::FromStr;
use std::time::{Duration, Instant};

on_both_backends!(
    an_imported_model_runs_at_exactly_its_prices_and_stays_imported,
    the_config_file_wins_over_an_import,
    an_entry_without_limits_or_a_cache_price_keeps_the_newest_versions,
    an_imported_model_of_another_provider_has_no_batch_price_without_one,
);

/// A small map in LiteLLM's format: an OpenAI and an Anthropic chat model of names no
/// family claims, a new price of a built-in model, and entries to skip.
fn price_map(chat_input_per_token: f64) -> Value {
    json!({
        "sample_spec": {
            "max_tokens": "LEGACY parameter. set to max_output_tokens if provider specifies it.",
            "input_cost_per_token": 0.0,
            "output_cost_per_token": 0.0,
            "litellm_provider": "one of https://docs.litellm.ai/docs/providers",
            "mode": "one of: chat, embedding, completion, image_generation",
        },
        "acme-chat-1": {
            "litellm_provider": "openai", "mode": "chat",
            "input_cost_per_token": chat_input_per_token, "output_cost_per_token": 8e-06,
            "cache_read_input_token_cost": 5e-07,
            "input_cost_per_token_batches": 1e-06, "output_cost_per_token_batches": 4e-06,
            "max_input_tokens": 100000, "max_output_tokens": 4000, "max_tokens": 4000,
            "supports_function_calling": true,
        },
        "acme-claude-1": {
            "litellm_provider": "anthropic", "mode": "chat",
            "input_cost_per_token": 3e-06, "output_cost_per_token": 1.5e-05,
            "cache_read_input_token_cost": 3e-07,
            "max_input_tokens": 200000, "max_output_tokens": 8000,
        },
        "gpt-4o-mini": {
            "litellm_provider": "openai", "mode": "chat",
            "input_cost_per_token": 2e-07, "output_cost_per_token": 8e-07,
            "max_input_tokens": 128000, "max_output_tokens": 16384,
        },
        "text-embedding-acme": {
            "litellm_provider": "openai", "mode": "embedding",
            "input_cost_per_token": 1e-08, "output_cost_per_token": 0.0,
        },
        "bedrock/acme": {
            "litellm_provider": "bedrock", "mode": "chat",
            "input_cost_per_token": 1e-06, "output_cost_per_token": 1e-06,
        },
        "broken-model": {
            "litellm_provider": "openai", "mode": "chat",
            "input_cost_per_token": -1e-06, "output_cost_per_token": 1e-06,
        },
    })
}

/// Runs `jobledger prices import` on `map` against the app's database: its exit
/// code and stdout.
async fn import(app: &TestApp, map: &str, config: Option<&std::path::Path>) -> (i32, String) {
    let folder = tempfile::tempdir().unwrap();
    let file = folder.path().join("model_prices_and_context_window.json");
    std::fs::write(&file, map).unwrap();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobledger"));
    command
        .args(["prices", "import"])
        .arg(&file)
        .args(["--database-url", &app.database_url()])
        .env_remove("JOBLEDGER_CONFIG")
        .env("RUST_LOG", "warn");
    if let Some(config) = config {
        command.arg("--config").arg(config);
    }
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("the import ends")
        .expect("the binary runs");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !stderr.contains("ERROR"),
        "the import logged an error: {stderr}"
    );
    (output.status.code().unwrap(), stdout)
}

fn lines(stdout: &str) -> Vec<&str> {
    stdout.lines().collect()
}

fn d(text: &str) -> Decimal {
    Decimal::from_str(text).unwrap()
}

/// `models` as `key` sees it.
async fn models(app: &TestApp, key: &str) -> Vec<Value> {
    let response = app
        .graphql(
            Some(key),
            "{ models { name provider source price { inputPerMillion cachedInputPerMillion outputPerMillion } batchPrice { inputPerMillion outputPerMillion } customerPrice { inputPerMillion outputPerMillion } } }",
            json!({}),
        )
        .await;
    assert!(response["errors"].is_null(), "{response}");
    response["data"]["models"].as_array().unwrap().clone()
}

fn find<'a>(models: &'a [Value], name: &str) -> Option<&'a Value> {
    models.iter().find(|model| model["name"] == name)
}

/// Waits until the app routes `name` (it reads imported routes every few seconds).
async fn wait_until_listed(app: &TestApp, key: &str, name: &str) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let listed = models(app, key).await;
        if find(&listed, name).is_some() {
            return listed;
        }
        assert!(Instant::now() < deadline, "{name} never listed: {listed:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs one job of `model` to success; its single attempt's usage, provider cost and
/// the job's charge.
async fn run_job(
    app: &TestApp,
    tenant: &TestTenant,
    key: &str,
    model: &str,
) -> (u64, u64, Decimal, Decimal) {
    let mut input = job_input(
        key,
        "Summarise: the quarter went well, and the next may too.",
    );
    input["model"] = json!(model);
    let id = app.create_job_ok(tenant, input).await;
    let job = app
        .wait_until_finished(tenant, id, Duration::from_secs(30))
        .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    let attempts = job["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{job}");
    let attempt = &attempts[0];
    let tokens = |field: &str| attempt[field].as_u64().unwrap();
    assert_eq!(tokens("cachedInputTokens"), 0);
    (
        tokens("inputTokens"),
        tokens("outputTokens"),
        decimal(&attempt["providerCost"]),
        decimal(&job["charge"]["amount"]),
    )
}

/// What `tokens` cost at `per_million`.
fn cost(tokens: u64, per_million: &str) -> Decimal {
    Decimal::from(tokens) * d(per_million) / Decimal::from(1_000_000)
}

async fn versions(app: &TestApp, model: &str) -> Vec<model_prices::Model> {
    model_prices::Entity::find()
        .filter(model_prices::Column::Model.eq(model))
        .order_by_asc(model_prices::Column::Version)
        .all(&app.app.db)
        .await
        .unwrap()
}

fn real_providers() -> AppOptions {
    // Both providers configured: a model is served only when a route claims it, so
    // the imported ones run only if their provider routes them.
    AppOptions {
        anthropic_shape: true,
        openai_endpoint: true,
        ..AppOptions::default()
    }
}

async fn an_imported_model_runs_at_exactly_its_prices_and_stays_imported(backend: Backend) {
    let app = spawn_app_with(backend, real_providers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    assert!(find(&models(&app, &tenant.key).await, "acme-chat-1").is_none());

    let (code, stdout) = import(&app, &price_map(2e-06).to_string(), None).await;
    assert_eq!(code, 0, "{stdout}");
    assert_eq!(
        lines(&stdout),
        [
            "added acme-chat-1",
            "added acme-claude-1",
            "skipped bedrock/acme: provider \"bedrock\" is not one jobledger can call",
            "skipped broken-model: input_cost_per_token is negative",
            "new version gpt-4o-mini (version 2)",
            "skipped sample_spec: describes the format, not a model",
            "skipped text-embedding-acme: mode \"embedding\" is not chat",
            "2 added, 1 new versions, 0 unchanged, 0 kept for the config file, 4 skipped (1 not chat, 1 of a provider jobledger cannot call, 2 malformed, 0 given more than once)",
        ],
        "{stdout}"
    );

    // Listed with the caller's own prices: a tenant sees what it pays (1.25 times the
    // provider's), the admin what the provider bills and what tenants pay.
    let as_tenant = wait_until_listed(&app, &tenant.key, "acme-claude-1").await;
    let chat = find(&as_tenant, "acme-chat-1").expect("listed");
    assert_eq!(chat["provider"], "openai", "{chat}");
    assert_eq!(decimal(&chat["price"]["inputPerMillion"]), d("2.5"));
    assert_eq!(decimal(&chat["price"]["cachedInputPerMillion"]), d("0.625"));
    assert_eq!(decimal(&chat["price"]["outputPerMillion"]), d("10"));
    assert_eq!(decimal(&chat["batchPrice"]["inputPerMillion"]), d("1.25"));
    assert!(chat["customerPrice"].is_null(), "{chat}");
    let claude = find(&as_tenant, "acme-claude-1").unwrap();
    assert_eq!(claude["provider"], "anthropic", "{claude}");
    // No batch price in the map: Anthropic's batch API bills half the list price.
    assert_eq!(
        decimal(&claude["batchPrice"]["outputPerMillion"]),
        d("9.375")
    );
    for built_in in [
        "gpt-4o",
        "gpt-4.1",
        "o3",
        "claude-sonnet-4-5",
        "claude-opus-4-5",
    ] {
        let model = find(&as_tenant, built_in).unwrap_or_else(|| panic!("{built_in}"));
        assert!(decimal(&model["price"]["inputPerMillion"]) > Decimal::ZERO);
    }
    let as_admin = models(&app, ADMIN_TOKEN).await;
    let chat = find(&as_admin, "acme-chat-1").unwrap();
    assert_eq!(decimal(&chat["price"]["inputPerMillion"]), d("2"));
    assert_eq!(decimal(&chat["customerPrice"]["inputPerMillion"]), d("2.5"));
    assert!(
        chat["source"]
            .as_str()
            .unwrap()
            .contains("LiteLLM price map")
    );

    // Each runs through its provider's API at exactly the imported prices.
    let (input, output, provider_cost, charge) =
        run_job(&app, &tenant, "chat-1", "acme-chat-1").await;
    assert_eq!(provider_cost, cost(input, "2") + cost(output, "8"));
    assert_eq!(charge, cost(input, "2.5") + cost(output, "10"));
    let (input, output, provider_cost, charge) =
        run_job(&app, &tenant, "claude-1", "acme-claude-1").await;
    assert_eq!(provider_cost, cost(input, "3") + cost(output, "15"));
    assert_eq!(charge, cost(input, "3.75") + cost(output, "18.75"));
    let calls = app.simulator.calls();
    let sent = |model: &str| {
        calls
            .iter()
            .find(|call| call.model == model)
            .unwrap_or_else(|| panic!("no call of {model}"))
            .request
            .clone()
    };
    // In each provider's shape: Anthropic's Messages API takes `max_tokens`.
    assert_eq!(
        sent("acme-claude-1")["max_tokens"],
        100,
        "{}",
        sent("acme-claude-1")
    );
    assert!(sent("acme-chat-1")["messages"].is_array());
    let first_attempt = entity::attempts::Entity::find()
        .filter(entity::attempts::Column::Model.eq("acme-chat-1"))
        .one(&app.app.db)
        .await
        .unwrap()
        .unwrap();
    let used = model_prices::Entity::find_by_id(first_attempt.model_price_id)
        .one(&app.app.db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(used.origin, PriceOrigin::Import);

    // The same map again adds nothing.
    let rows = model_prices::Entity::find()
        .count(&app.app.db)
        .await
        .unwrap();
    let (code, stdout) = import(&app, &price_map(2e-06).to_string(), None).await;
    assert_eq!(code, 0, "{stdout}");
    for model in ["acme-chat-1", "acme-claude-1", "gpt-4o-mini"] {
        assert!(
            lines(&stdout).contains(&format!("unchanged {model}").as_str()),
            "{stdout}"
        );
    }
    assert!(
        stdout.contains("0 added, 0 new versions, 3 unchanged"),
        "{stdout}"
    );
    assert_eq!(
        model_prices::Entity::find()
            .count(&app.app.db)
            .await
            .unwrap(),
        rows
    );

    // A changed price is a new version; the version the attempt used stays as it was.
    let (code, stdout) = import(&app, &price_map(4e-06).to_string(), None).await;
    assert_eq!(code, 0, "{stdout}");
    assert!(
        lines(&stdout).contains(&"new version acme-chat-1 (version 2)"),
        "{stdout}"
    );
    let chat_versions = versions(&app, "acme-chat-1").await;
    assert_eq!(chat_versions.len(), 2);
    assert_eq!(
        chat_versions[0], used,
        "the version an attempt used is never rewritten"
    );
    assert_eq!(
        chat_versions[1].provider_input_nanos_per_million,
        4_000_000_000
    );

    // A restart stores the built-in prices again, but not over the imported ones, and
    // routes the imported models from its start.
    let mini = versions(&app, "gpt-4o-mini").await;
    assert_eq!(mini.last().unwrap().origin, PriceOrigin::Import);
    let app = app.restart(real_providers()).await;
    assert_eq!(versions(&app, "gpt-4o-mini").await, mini);
    assert_eq!(versions(&app, "acme-chat-1").await, chat_versions);
    let (input, output, provider_cost, charge) =
        run_job(&app, &tenant, "chat-2", "acme-chat-1").await;
    assert_eq!(provider_cost, cost(input, "4") + cost(output, "8"));
    assert_eq!(charge, cost(input, "5") + cost(output, "10"));
    crate::invariants::assert_billing_invariants(&app.app.db).await;

    // A file that is no price map stores nothing, and says so.
    let (code, stdout) = import(&app, "[1, 2, 3]", None).await;
    assert_eq!(code, 1, "{stdout}");
    assert_eq!(versions(&app, "acme-chat-1").await, chat_versions);
}

async fn the_config_file_wins_over_an_import(backend: Backend) {
    let folder = tempfile::tempdir().unwrap();
    let config = folder.path().join("jobledger.toml");
    std::fs::write(
        &config,
        "customer_markup = \"2\"\n\n[models.\"gpt-4o\"]\nprice = { input = \"3\", cached_input = \"1.5\", output = \"12\" }\n",
    )
    .unwrap();
    let options = AppOptions {
        config_file: Some(config.clone()),
        ..AppOptions::no_workers()
    };
    let app = spawn_app_with(backend, options).await;
    let configured = versions(&app, "gpt-4o").await;
    assert_eq!(configured.last().unwrap().origin, PriceOrigin::Config);
    let map = json!({
        "gpt-4o": {
            "litellm_provider": "openai", "mode": "chat",
            "input_cost_per_token": 2.5e-06, "output_cost_per_token": 1e-05,
        },
        "acme-chat-1": {
            "litellm_provider": "openai", "mode": "chat",
            "input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06,
        },
    });
    let (code, stdout) = import(&app, &map.to_string(), Some(&config)).await;
    assert_eq!(code, 0, "{stdout}");
    assert_eq!(
        lines(&stdout)[..2],
        [
            "added acme-chat-1",
            "kept gpt-4o: the config file prices it"
        ],
        "{stdout}"
    );
    assert_eq!(versions(&app, "gpt-4o").await, configured);
    // The config file's markup sells the imported model.
    let added = versions(&app, "acme-chat-1").await;
    assert_eq!(added[0].customer_input_nanos_per_million, 2_000_000_000);
}

/// A new list price that gives neither limits nor a cache price keeps the built-in
/// version's (erasing them would lift the context window and output checks and bill
/// cached input at the full price); a cache price above the new input price is not
/// carried over.
async fn an_entry_without_limits_or_a_cache_price_keeps_the_newest_versions(backend: Backend) {
    let app = spawn_app_with(backend, AppOptions::no_workers()).await;
    let built_in = versions(&app, "gpt-4o-mini").await.pop().unwrap();
    assert!(built_in.context_window.is_some() && built_in.max_output_tokens.is_some());
    let map = json!({
        "gpt-4o-mini": {
            "litellm_provider": "openai", "mode": "chat",
            "input_cost_per_token": 2e-07, "output_cost_per_token": 8e-07,
        },
        "gpt-4o": {
            "litellm_provider": "openai", "mode": "chat",
            "input_cost_per_token": 1e-09, "output_cost_per_token": 1e-05,
            "max_output_tokens": 1000,
        },
    });
    let before_gpt_4o = versions(&app, "gpt-4o").await.pop().unwrap();
    let (code, stdout) = import(&app, &map.to_string(), None).await;
    assert_eq!(code, 0, "{stdout}");
    let imported = versions(&app, "gpt-4o-mini").await.pop().unwrap();
    assert_eq!(imported.origin, PriceOrigin::Import, "{stdout}");
    assert_eq!(imported.provider_input_nanos_per_million, 200_000_000);
    assert_eq!(imported.context_window, built_in.context_window);
    assert_eq!(imported.max_output_tokens, built_in.max_output_tokens);
    assert_eq!(
        imported.provider_cached_input_nanos_per_million,
        built_in.provider_cached_input_nanos_per_million
    );
    assert!(
        imported.customer_cached_input_nanos_per_million
            < imported.customer_input_nanos_per_million
    );
    // What an entry gives wins; an older cache price dearer than the new input is not
    // kept: cached input is billed as input.
    let cheap = versions(&app, "gpt-4o").await.pop().unwrap();
    assert_eq!(cheap.max_output_tokens, Some(1000));
    assert_eq!(cheap.context_window, before_gpt_4o.context_window);
    assert_eq!(cheap.provider_cached_input_nanos_per_million, 1_000_000);
}

/// What `docs/api.md` and `docs/configuration.md` both say of `batchPrice`: an imported
/// entry without `*_batches` prices gets half its list price only from `openai` or
/// `anthropic` (whose batch APIs bill half); a model of another provider gets none,
/// and refuses `PROVIDER_BATCH`.
async fn an_imported_model_of_another_provider_has_no_batch_price_without_one(backend: Backend) {
    let app = spawn_app_with(backend, real_providers()).await;
    let tenant = app.funded_tenant("acme", "5").await;
    let map = json!({
        "groq/acme-fast": {
            "litellm_provider": "groq", "mode": "chat",
            "input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06,
        },
        "acme-openai-2": {
            "litellm_provider": "openai", "mode": "chat",
            "input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06,
        },
    });
    let (code, stdout) = import(&app, &map.to_string(), None).await;
    assert_eq!(code, 0, "{stdout}");
    wait_until_listed(&app, ADMIN_TOKEN, "groq/acme-fast").await;
    let listed = wait_until_listed(&app, ADMIN_TOKEN, "acme-openai-2").await;
    let groq = find(&listed, "groq/acme-fast").unwrap();
    assert!(groq["batchPrice"].is_null(), "{groq}");
    let openai = find(&listed, "acme-openai-2").unwrap();
    assert_eq!(
        decimal(&openai["batchPrice"]["inputPerMillion"]),
        d("0.5"),
        "{openai}"
    );
    assert_eq!(
        decimal(&openai["batchPrice"]["outputPerMillion"]),
        d("1"),
        "{openai}"
    );
    let response = app
        .operation(
            Some(&tenant.key),
            "CreateBatch",
            json!({"input": {"idempotencyKey": "groq-batch", "mode": "PROVIDER_BATCH",
                "model": "groq/acme-fast", "maxOutputTokens": 50}}),
        )
        .await;
    assert_eq!(
        crate::helpers::error_code(&response),
        "VALIDATION",
        "{response}"
    );
}

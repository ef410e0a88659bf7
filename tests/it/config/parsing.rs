//! The file itself: parsing, validation errors that name the key, exact prices, and
//! routing composed with the environment.

use super::{
    PATH, assert_refused, error, example_path, parse, per_million, price_of, rates,
    settings_without_database,
};
use jobledger::billing::prices::{BatchRates, Rates};
use jobledger::billing::{ChargingPolicy, UnfinishedCall};
use jobledger::config::ProviderEndpoint;
use jobledger::config::file::{ConfigFile, CustomerPolicy, ProviderKind};
use jobledger::config::providers::provider_registry;
use jobledger::llm::TokenUsage;
use jobledger::llm::routing::ModelPattern;
use rust_decimal::Decimal;
use std::path::Path;
use std::str::FromStr;

#[test]
fn the_example_config_parses() {
    let text = std::fs::read_to_string(example_path()).unwrap();
    // Its keys come from the environment; any value will do here.
    let config = ConfigFile::parse(&text, &example_path(), |_| Some("sk-test".to_owned()))
        .unwrap_or_else(|error| panic!("{error}"));

    assert_eq!(
        config.customer_markup,
        Some(Decimal::from_str("1.3").unwrap())
    );
    let kinds: Vec<_> = config
        .providers
        .iter()
        .map(|(name, provider)| (name.as_str(), provider.kind))
        .collect();
    assert_eq!(
        kinds,
        [
            ("claude", ProviderKind::Anthropic),
            ("ollama", ProviderKind::OpenAi),
            ("openrouter", ProviderKind::OpenAi),
            ("sim", ProviderKind::Simulator),
        ]
    );
    assert_eq!(config.providers["openrouter"].api_key(), Some("sk-test"));
    assert_eq!(config.providers["ollama"].api_key(), None);
    assert!(
        config.routes.contains(&(
            ModelPattern::Exact("llama3-local".to_owned()),
            "ollama".to_owned()
        )),
        "{:?}",
        config.routes
    );
    assert!(config.routes.contains(&(
        ModelPattern::Prefix("gpt-".to_owned()),
        "openrouter".to_owned()
    )));

    let prices = config.prices(Decimal::from_str("1.25").unwrap()).unwrap();
    // A custom model at its own markup; cached input defaults to input.
    let llama = price_of(&prices, "llama3-local");
    assert_eq!(llama.provider, rates("0.02", "0.02", "0.04"));
    assert_eq!(llama.customer, rates("0.06", "0.06", "0.12"));
    assert_eq!(llama.source, "our GPU hours per token, measured 2026-11");
    // A built-in model keeps its provider price and sells at the explicit rates.
    let mini = price_of(&prices, "gpt-4o-mini");
    assert_eq!(mini.provider, rates("0.15", "0.075", "0.60"));
    assert_eq!(mini.customer, rates("0.20", "0.10", "0.80"));
    // Other built-in models follow the file's global markup (1.3), not the default.
    let sonnet = price_of(&prices, "claude-sonnet-4-5");
    assert_eq!(sonnet.customer, rates("3.9", "0.39", "19.5"));

    // Batch prices: a custom model without one has none; one set in the file, sold
    // at explicit rates; a built-in at half its list price, its explicit customer
    // rates at the same discount; another built-in at the global markup of half.
    let batch = |input: &str, output: &str| BatchRates {
        input: per_million(input),
        output: per_million(output),
    };
    assert_eq!(llama.batch, None);
    let custom = price_of(&prices, "claude-custom").batch.unwrap();
    assert_eq!(custom.provider, batch("1", "5"));
    assert_eq!(custom.customer, batch("1.2", "6"));
    let mini = mini.batch.unwrap();
    assert_eq!(mini.provider, batch("0.075", "0.30"));
    assert_eq!(mini.customer, batch("0.10", "0.40"));
    let sonnet = sonnet.batch.unwrap();
    assert_eq!(sonnet.provider, batch("1.5", "7.5"));
    assert_eq!(sonnet.customer, batch("1.95", "9.75"));
}

#[test]
fn the_example_config_needs_the_keys_it_names() {
    let text = std::fs::read_to_string(example_path()).unwrap();
    let message = ConfigFile::parse(&text, &example_path(), |_| None)
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("`providers.claude.api_key_env`")
            && message.contains("ANTHROPIC_API_KEY")
            && message.contains("jobledger.example.toml"),
        "{message}"
    );
}

#[test]
fn no_file_content_means_the_built_in_prices() {
    let config = parse("").unwrap();
    assert!(config.providers.is_empty() && config.routes.is_empty());
    let markup = Decimal::from_str("1.25").unwrap();
    assert_eq!(
        config.prices(markup).unwrap(),
        jobledger::billing::prices::built_in_prices(markup)
    );
}

#[test]
fn each_invalid_config_is_refused_naming_its_key() {
    let provider = "[providers.local]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:1/v1\"\n";
    let with_provider = |rest: &str| format!("{provider}{rest}");

    // A model naming a provider that does not exist; a route likewise.
    assert_refused(
        &with_provider("[models.llama3-local]\nprovider = \"lokal\"\n"),
        "models.llama3-local.provider",
        "unknown provider \"lokal\" (defined in [providers]: \"local\")",
    );
    assert_refused(
        "[routes]\n\"gpt-*\" = \"openrouter\"\n",
        "routes.\"gpt-*\"",
        "unknown provider \"openrouter\"",
    );
    // A key variable that is not set (or empty).
    assert_refused(
        &with_provider("api_key_env = \"JOBLEDGER_TEST_SURELY_UNSET\"\n"),
        "providers.local.api_key_env",
        "JOBLEDGER_TEST_SURELY_UNSET is not set",
    );
    // An unknown kind.
    assert_refused(
        "[providers.local]\nkind = \"openia\"\nbase_url = \"http://x/v1\"\n",
        "providers.local.kind",
        "unknown kind \"openia\"",
    );
    // Prices: too precise, negative, a float, not a number.
    let model = |price: &str| {
        with_provider(&format!(
            "[models.m]\nprovider = \"local\"\nprice = {{ {price} }}\n"
        ))
    };
    assert_refused(
        &model("input = \"0.0000000001\", output = \"1\""),
        "models.m.price.input",
        "more than 9 decimals",
    );
    assert_refused(
        &model("input = \"1\", output = \"-0.5\""),
        "models.m.price.output",
        "-0.5 is negative",
    );
    assert_refused(
        &model("input = \"1\", cached_input = 0.1, output = \"1\""),
        "models.m.price.cached_input",
        "write it as a string",
    );
    assert_refused(
        &model("input = \"one\", output = \"1\""),
        "models.m.price.input",
        "\"one\" is not a decimal",
    );
    assert_refused(
        &with_provider(
            "[models.m]\nprice = { input = \"1\", output = \"1\" }\ncustomer_price = { input = \"1\", output = \"0.0000000005\" }\n",
        ),
        "models.m.customer_price.output",
        "more than 9 decimals",
    );
    // Markups above zero only.
    assert_refused(
        "customer_markup = \"0\"",
        "customer_markup",
        "not above zero",
    );
    assert_refused(
        &model("input = \"1\", output = \"1\"").replace(
            "provider = \"local\"\n",
            "provider = \"local\"\ncustomer_markup = \"-2\"\n",
        ),
        "models.m.customer_markup",
        "not above zero",
    );
    // A policy needs a price; one policy at a time.
    assert_refused(
        "[models.unknown-model]\ncustomer_markup = \"2\"\n",
        "models.unknown-model",
        "needs a provider price",
    );
    assert_refused(
        "[models.gpt-4o]\ncustomer_markup = \"2\"\ncustomer_price = { input = \"1\", output = \"1\" }\n",
        "models.gpt-4o",
        "not both",
    );
    // Prices are per exact name; `*` only ends a pattern.
    assert_refused(
        "[models.\"gpt-*\"]\nprice = { input = \"1\", output = \"1\" }\n",
        "models.\"gpt-*\"",
        "one exact model name",
    );
    assert_refused(
        &with_provider("[routes]\n\"g*t\" = \"local\"\n"),
        "routes.\"g*t\"",
        "`*` may only end a pattern",
    );
    // A model routed two ways.
    assert_refused(
        &with_provider(
            "[providers.other]\nkind = \"simulator\"\n[routes]\nllama = \"other\"\n[models.llama]\nprovider = \"local\"\n",
        ),
        "models.llama.provider",
        "but `routes.llama` says \"other\"",
    );
    // Providers: a missing or bad base URL, a simulator with one.
    assert_refused(
        "[providers.local]\nkind = \"openai\"\n",
        "providers.local.base_url",
        "is missing",
    );
    assert_refused(
        "[providers.local]\nkind = \"anthropic\"\nbase_url = \"api.anthropic.com\"\n",
        "providers.local.base_url",
        "not an http:// or https:// URL",
    );
    assert_refused(
        "[providers.sim]\nkind = \"simulator\"\nbase_url = \"http://x/v1\"\n",
        "providers.sim.base_url",
        "the simulator is built in",
    );
    // Batch prices: one needs a list price, a sold one needs a batch price, rates as
    // any price's.
    assert_refused(
        &with_provider(
            "[models.m]\nprovider = \"local\"\nbatch_price = { input = \"1\", output = \"2\" }\n",
        ),
        "models.m.batch_price",
        "a batch price needs a provider price",
    );
    assert_refused(
        &with_provider(
            "[models.m]\nprovider = \"local\"\nprice = { input = \"1\", output = \"2\" }\n\
             customer_batch_price = { input = \"1\", output = \"2\" }\n",
        ),
        "models.m.customer_batch_price",
        "set `batch_price`",
    );
    assert_refused(
        "[models.gpt-4o-mini]\nbatch_price = { input = \"-1\", output = \"2\" }\n",
        "models.gpt-4o-mini.batch_price.input",
        "is negative",
    );
}

#[test]
fn a_key_written_into_the_file_is_refused_without_being_repeated() {
    for text in [
        "[providers.p]\nkind = \"openai\"\nbase_url = \"http://x/v1\"\napi_key = \"sk-secret-123\"\n",
        "[providers.p]\nkind = \"openai\"\nbase_url = \"http://x/v1\"\napi_key_env = \"sk-secret-123\"\n",
    ] {
        let message = error(text);
        assert!(message.contains("`providers.p.api_key"), "{message}");
        assert!(
            !message.contains("sk-secret-123"),
            "the key leaked: {message}"
        );
    }
}

#[test]
fn the_charging_policy_is_read_from_the_file() {
    assert_eq!(parse("").unwrap().charging, ChargingPolicy::default());
    let both = parse(
        "[charging]\nunknown_outcome = \"call_bound\"\ncancelled_during_call = \"delivered_output\"\n",
    )
    .unwrap();
    assert_eq!(
        both.charging,
        ChargingPolicy {
            unknown_outcome: UnfinishedCall::CallBound,
            cancelled_during_call: UnfinishedCall::DeliveredOutput,
        }
    );
    assert_refused(
        "[charging]\ncancelled_during_call = \"everything\"\n",
        "charging.cancelled_during_call",
        "expected \"delivered_output\", \"prompt\" or \"call_bound\"",
    );
    let prompt = parse("[charging]\nunknown_outcome = \"prompt\"\n").unwrap();
    assert_eq!(prompt.charging.unknown_outcome, UnfinishedCall::Prompt);
    assert_eq!(
        ChargingPolicy::default(),
        ChargingPolicy {
            unknown_outcome: UnfinishedCall::DeliveredOutput,
            cancelled_during_call: UnfinishedCall::Prompt,
        },
        "a cancel during the call charges its prompt by default"
    );
}

#[test]
fn typos_and_wrong_types_are_errors_naming_the_key() {
    for (text, named) in [
        ("custmer_markup = \"1.5\"\n", "custmer_markup"),
        (
            "[providers.local]\nkind = \"openai\"\nbase_ur = \"http://x/v1\"\n",
            "base_ur",
        ),
        (
            "[models.m]\nprice = { input = \"1\", outptu = \"1\" }\n",
            "outptu",
        ),
        ("[models.m]\nprice = { input = \"1\" }\n", "output"),
        ("[models.m]\nsorce = \"x\"\n", "sorce"),
        ("[routes]\nllama = 3\n", "llama"),
        (
            "[charging]\nunknown_outcomes = \"call_bound\"\n",
            "unknown_outcomes",
        ),
        ("[providers.local]\nkind = \"openai\"\n[[broken\n", "line 3"),
    ] {
        let message = error(text);
        assert!(message.contains(named), "{named} not named: {message}");
    }
    let missing = Path::new("/nonexistent/jobledger.toml");
    let message = ConfigFile::load(missing).unwrap_err().to_string();
    assert!(
        message.contains("/nonexistent/jobledger.toml") && message.contains("cannot read"),
        "{message}"
    );
}

#[test]
fn prices_are_exact_to_nine_decimals() {
    let config = parse(
        r#"
        customer_markup = "1.000000001"

        [models.exact]
        price = { input = "0.123456789", cached_input = "0.000000001", output = "123456.987654321" }
        customer_markup = "3"

        [models.explicit]
        price = { input = 2, output = "4.5" }
        customer_price = { input = "2.000000001", cached_input = "0.1", output = "9" }
        source = "a test"

        [models.global]
        price = { input = "0.3", output = "0.000000007" }
        "#,
    )
    .unwrap();
    let prices = config.prices(Decimal::from_str("1.25").unwrap()).unwrap();
    let nanos =
        |rates: &Rates| [rates.input, rates.cached_input, rates.output].map(|rate| rate.0.nanos());

    let exact = price_of(&prices, "exact");
    assert_eq!(
        nanos(&exact.provider),
        [123_456_789, 1, 123_456_987_654_321]
    );
    assert_eq!(
        nanos(&exact.customer),
        [370_370_367, 3, 370_370_962_962_963]
    );
    assert_eq!(exact.source, format!("config file {PATH}"));

    let explicit = price_of(&prices, "explicit");
    assert_eq!(
        nanos(&explicit.provider),
        [2_000_000_000, 2_000_000_000, 4_500_000_000]
    );
    assert_eq!(
        nanos(&explicit.customer),
        [2_000_000_001, 100_000_000, 9_000_000_000]
    );
    assert_eq!(explicit.source, "a test");

    // The file's global markup, rounded up to the nano-credit: 0.3 × 1.000000001 =
    // 0.3000000003 → 0.300000001; 0.000000007 × 1.000000001 → 0.000000008.
    let global = price_of(&prices, "global");
    assert_eq!(nanos(&global.customer), [300_000_001, 300_000_001, 8]);
    assert_eq!(
        config.models["global"].customer,
        CustomerPolicy::GlobalMarkup
    );

    // The cost of a call at such a price, to the nano-credit.
    let usage = TokenUsage {
        input_tokens: 1_000_001,
        cached_input_tokens: 1,
        output_tokens: 3,
    };
    // 1,000,000 × 0.123456789/M + 1 × 0.000000001/M (rounds up to a nano) + 3 ×
    // 123456.987654321/M = 0.123456789 + 0.000000001 + 0.370370963 (rounded up).
    assert_eq!(exact.provider.cost(&usage).to_string(), "0.493827753");
}

#[test]
fn the_file_routes_what_it_names_and_the_environment_the_rest() {
    let config = parse(
        r#"
        [providers.local]
        kind = "openai"
        base_url = "http://127.0.0.1:11434/v1"

        [providers.router]
        kind = "openai"
        base_url = "https://openrouter.ai/api/v1"
        api_key_env = "PRESENT_KEY"

        [providers.sim]
        kind = "simulator"

        [routes]
        "gpt-4o*" = "router"
        "test-*" = "sim"

        [models.llama3-local]
        provider = "local"
        price = { input = "0.1", output = "0.2" }
        "#,
    )
    .unwrap();
    let endpoint = |url: &str| ProviderEndpoint {
        base_url: url.to_owned(),
        api_key: Some("env-key".to_owned()),
    };
    let mut settings = settings_without_database();
    settings.providers.openai = Some(endpoint("https://api.openai.com/v1"));
    settings.providers.anthropic = Some(endpoint("https://api.anthropic.com"));

    let registry = provider_registry(&settings, Some(&config), Some("http://127.0.0.1:9/v1"));
    let served_by = |model| {
        registry
            .provider_for(model)
            .map(|provider| provider.name().to_owned())
    };
    let served = |name: &str| Some(name.to_owned());
    assert_eq!(served_by("llama3-local"), served("local"));
    assert_eq!(served_by("gpt-4o-mini"), served("router"));
    assert_eq!(served_by("test-echo"), served("sim"));
    // Not named by the file: the environment's providers; with real providers
    // configured, nothing else (the simulator serves only what the file routes to it).
    assert_eq!(served_by("gpt-4.1-mini"), served("openai"));
    assert_eq!(served_by("o3-mini"), served("openai"));
    assert_eq!(served_by("claude-sonnet-4-5"), served("anthropic"));
    assert_eq!(served_by("mistral"), None);

    // Without a file, exactly the environment's routing.
    let registry = provider_registry(&settings, None, Some("http://127.0.0.1:9/v1"));
    let served_by = |model| {
        registry
            .provider_for(model)
            .map(|provider| provider.name().to_owned())
    };
    assert_eq!(served_by("gpt-4o-mini"), served("openai"));
    assert_eq!(served_by("claude-sonnet-4-5"), served("anthropic"));
    assert_eq!(served_by("llama3-local"), None);

    // With no real provider at all, the simulator serves every model.
    let registry = provider_registry(
        &settings_without_database(),
        None,
        Some("http://127.0.0.1:9/v1"),
    );
    assert_eq!(
        registry
            .provider_for("llama3-local")
            .map(|provider| provider.name().to_owned()),
        served("simulator")
    );
}

#[test]
fn the_default_deadline_is_a_whole_positive_number_of_seconds() {
    let text = std::fs::read_to_string(example_path()).unwrap();
    let config = ConfigFile::parse(&text, &example_path(), |_| Some("sk-test".to_owned()))
        .unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(
        config.default_deadline,
        Some(std::time::Duration::from_secs(86_400))
    );
    assert_eq!(parse("").unwrap().default_deadline, None);
    for bad in ["0", "-5"] {
        assert_refused(
            &format!("default_deadline_seconds = {bad}"),
            "default_deadline_seconds",
            "above 0",
        );
    }
}

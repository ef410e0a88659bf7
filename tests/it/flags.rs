//! Every command-line flag has an environment twin and a `--help` line, and a bad
//! config file stops the start naming the file and the key.

use clap::{CommandFactory, Parser};
use jobledger::cli::Cli;
use jobledger::config::{OperationsSettings, ProviderSettings, Settings};
use jobledger::startup::{Application, StartupError};
use rust_decimal::Decimal;

#[test]
fn every_flag_has_an_environment_twin_and_a_help_line() {
    let cli = Cli::command();
    let mut checked = Vec::new();
    for command in cli.get_subcommands() {
        for argument in command.get_arguments() {
            let id = argument.get_id().as_str();
            if ["help", "version"].contains(&id) {
                continue;
            }
            let name = format!("{} --{id}", command.get_name());
            assert!(argument.get_env().is_some(), "{name} has no env twin");
            assert!(
                argument
                    .get_help()
                    .is_some_and(|help| !help.to_string().trim().is_empty()),
                "{name} has no help line"
            );
            checked.push(name);
        }
    }
    for expected in [
        "serve metrics_listen",
        "worker metrics_listen",
        "serve retention_days",
        "worker retention_days",
    ] {
        let expected = expected.replace(' ', " --");
        assert!(
            checked.contains(&expected),
            "{expected} missing: {checked:?}"
        );
    }
    let mut help = Vec::new();
    cli.find_subcommand("worker")
        .unwrap()
        .clone()
        .write_long_help(&mut help)
        .unwrap();
    let help = String::from_utf8(help).unwrap();
    for twin in ["JOBLEDGER_METRICS_LISTEN", "JOBLEDGER_RETENTION_DAYS"] {
        assert!(help.contains(twin), "{twin} not in --help:\n{help}");
    }
}

/// Settings whose database would be created if the start got that far.
fn settings(folder: &std::path::Path, config: std::path::PathBuf) -> Settings {
    Settings {
        listen: None,
        database_url: format!("sqlite:{}", folder.join("never.db").display()),
        listen_database_url: None,
        admin_token: None,
        worker: None,
        providers: ProviderSettings::default(),
        customer_markup: Decimal::ONE,
        config_file: Some(config),
        operations: OperationsSettings::default(),
        allow_private_webhooks: false,
        cors_origins: Vec::new(),
        default_deadline: None,
    }
}

#[tokio::test]
async fn a_bad_config_file_is_refused_at_start_naming_the_file_and_the_key() {
    // The file is read before the database is touched, so one backend is enough.
    let folder = tempfile::tempdir().unwrap();
    for (text, key) in [
        ("retention_dayz = 3\n", "retention_dayz"),
        (
            "[models.m]\nprice = { input = \"cheap\", output = \"1\" }\nsource = \"x\"\n",
            "models.m.price.input",
        ),
        (
            "[providers.local]\nkind = \"openai\"\nbase_url = \"ftp://example.com\"\n",
            "providers.local.base_url",
        ),
    ] {
        let path = folder.path().join("bad.toml");
        std::fs::write(&path, text).unwrap();
        let Err(error) = Application::build(settings(folder.path(), path.clone())).await else {
            panic!("the application started with {text:?}");
        };
        assert!(matches!(error, StartupError::Config(_)), "{error:?}");
        let message = error.to_string();
        assert!(
            message.contains(&path.display().to_string()) && message.contains(key),
            "{key} or the file not named: {message}"
        );
        assert!(
            !folder.path().join("never.db").exists(),
            "the database was touched"
        );
    }
}

/// `--help` shows where each flag's environment twin is, never a secret it holds: a
/// database URL carries its password.
#[test]
fn help_does_not_print_the_database_password_from_the_environment() {
    for command in ["serve", "worker", "migrate", "audit"] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_jobledger"))
            .args([command, "--help"])
            .env(
                "DATABASE_URL",
                "postgres://jobledger:S3cretDbPassw0rd@db/jobledger",
            )
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&output.stdout);
        assert!(help.contains("DATABASE_URL"), "{command}: {help}");
        assert!(
            !help.contains("S3cretDbPassw0rd"),
            "{command} printed the password"
        );
    }
}

/// A retention of 0 days or of more days than a timestamp can step back would prune
/// every finished job at once: such values are refused at start.
#[test]
fn retention_outside_a_century_is_refused() {
    for days in ["0", "36501", "200000000"] {
        let parsed = Cli::try_parse_from(["jobledger", "serve", "--retention-days", days]);
        assert!(parsed.is_err(), "--retention-days {days} was accepted");
    }
    assert!(Cli::try_parse_from(["jobledger", "serve", "--retention-days", "30"]).is_ok());
    // And a step back too long for microseconds stays in the past.
    let now = entity::Timestamp::now();
    assert!(now.plus(-chrono::Duration::days(200_000_000)) < now);
}

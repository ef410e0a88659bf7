use clap::Parser;
use jobledger::cli::Cli;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    jobledger::telemetry::init();
    match Cli::parse().run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = %error, "jobledger stopped with an error");
            eprintln!("error: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

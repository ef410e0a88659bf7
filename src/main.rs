use clap::Parser;
use jobledger::cli::Cli;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let traces = jobledger::telemetry::init();
    let code = match Cli::parse().run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            jobledger::telemetry::report_fatal(&error);
            std::process::ExitCode::FAILURE
        }
    };
    // Sends the spans still batched; on its own thread, as the exporter blocks.
    if let Some(traces) = traces {
        let _ = std::thread::spawn(move || traces.shutdown()).join();
    }
    code
}

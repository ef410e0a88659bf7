//! Logging: a message plus queryable fields (`job.id`, `duration_ms`), as text for a
//! terminal or JSON (`JOBLEDGER_LOG_FORMAT=json`) for a log pipeline.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber; `RUST_LOG` filters (default `info`).
pub fn init() {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,sea_orm=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if std::env::var("JOBLEDGER_LOG_FORMAT").is_ok_and(|format| format == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
}

//! The `sandbox-operator` binary: parses its configuration and runs the controllers.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let config = sandboxd_operator::config::Config::parse();
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    if config.json_logs {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    } else {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    }
    match sandboxd_operator::run::run(config).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandbox-operator: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

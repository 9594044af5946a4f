//! The `sandbox-operator` binary: parses its configuration and runs the controllers.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let config = sandboxd_operator::config::Config::parse();
    let _traces =
        sandboxd_telemetry::init("sandbox-operator", &["sandboxd_operator"], config.json_logs);
    match sandboxd_operator::run::run(config).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandbox-operator: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

//! The `kubectl-sandbox` binary (`kubectl sandbox …` once on PATH).

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = kubectl_sandbox::Cli::parse();
    match kubectl_sandbox::run(cli).await {
        Ok(status) => std::process::ExitCode::from(status),
        Err(e) => {
            eprintln!("kubectl sandbox: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

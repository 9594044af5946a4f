//! The `sandboxd` binary: parses its configuration and runs the service, or the one command
//! it names.

use clap::Parser;
use sandboxd::config::Command;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let _traces = sandboxd_telemetry::init("sandboxd", &["sandboxd"], false);
    let config = sandboxd::config::Config::parse();
    match &config.command {
        None => match sandboxd::server::run(config).await {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sandboxd: {e:#}");
                std::process::ExitCode::FAILURE
            }
        },
        Some(Command::Prepare) => match sandboxd::server::prepare(&config).await {
            Ok(failed) if failed.is_empty() => std::process::ExitCode::SUCCESS,
            Ok(failed) => {
                eprintln!(
                    "sandboxd prepare: these runtimes could not be built: {}",
                    failed.join(", ")
                );
                std::process::ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("sandboxd prepare: {e:#}");
                std::process::ExitCode::FAILURE
            }
        },
        Some(Command::AdminToken { node }) => match admin_token(&config, node) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sandboxd admin-token: {e}");
                std::process::ExitCode::FAILURE
            }
        },
        Some(Command::Enrol {
            node,
            node_ip,
            dir,
            signer_name,
            wait_seconds,
        }) => {
            sandboxd::tls::install_provider();
            let request = sandboxd::enrol::Request {
                node: node.clone(),
                node_ip: *node_ip,
                signer_name: signer_name.clone(),
                dir: dir.clone(),
                wait: std::time::Duration::from_secs(*wait_seconds),
            };
            match sandboxd::enrol::enrol(&request).await {
                Ok(name) => {
                    eprintln!(
                        "sandboxd enrol: certificate of CertificateSigningRequest {name} written to {}",
                        dir.display()
                    );
                    std::process::ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("sandboxd enrol: {e}");
                    std::process::ExitCode::FAILURE
                }
            }
        }
        Some(Command::Openapi { wire }) => {
            if *wire {
                print!("{}", sandboxd::http::wire::openapi::json());
            } else {
                print!("{}", sandboxd::http::v1::openapi::json());
            }
            std::process::ExitCode::SUCCESS
        }
        Some(Command::RemoveNetwork) => match sandboxd::server::remove_network(&config).await {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sandboxd remove-network: {e:#}");
                std::process::ExitCode::FAILURE
            }
        },
    }
}

/// Prints the admin token of `node`, derived from the master in SANDBOXD_TOKEN (`--token`).
fn admin_token(config: &sandboxd::config::Config, node: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let master = config.master_token().map_err(|_| {
        anyhow::anyhow!(
            "SANDBOXD_TOKEN (--token) is required: the master admin token that node tokens are derived from"
        )
    })?;
    let node = sandboxd::config::check_node_name("--node", node)?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{}",
        sandboxd::service::auth::node_token(&master, node)
    )?;
    out.flush()?;
    Ok(())
}

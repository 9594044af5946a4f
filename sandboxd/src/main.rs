//! The `sandboxd` binary: parses its configuration and runs the service.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let config = sandboxd::config::Config::parse();
    if config.command == Some(sandboxd::config::Command::Prepare) {
        return match sandboxd::server::prepare(&config).await {
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
        };
    }
    if let Some(sandboxd::config::Command::AdminToken { node }) = &config.command {
        return match admin_token(&config, node) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sandboxd admin-token: {e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    if let Some(sandboxd::config::Command::Enrol {
        node,
        node_ip,
        dir,
        signer_name,
        wait_seconds,
    }) = &config.command
    {
        sandboxd::tls::install_provider();
        let request = sandboxd::enrol::Request {
            node: node.clone(),
            node_ip: *node_ip,
            signer_name: signer_name.clone(),
            dir: dir.clone(),
            wait: std::time::Duration::from_secs(*wait_seconds),
        };
        return match sandboxd::enrol::enrol(&request).await {
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
        };
    }
    if let Some(sandboxd::config::Command::Openapi { wire }) = config.command {
        if wire {
            print!("{}", sandboxd::http::wire::openapi::json());
        } else {
            print!("{}", sandboxd::http::openapi::json());
        }
        return std::process::ExitCode::SUCCESS;
    }
    if config.command == Some(sandboxd::config::Command::RemoveNetwork) {
        return match sandboxd::server::remove_network(&config).await {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sandboxd remove-network: {e:#}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    match sandboxd::server::run(config).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandboxd: {e:#}");
            std::process::ExitCode::FAILURE
        }
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

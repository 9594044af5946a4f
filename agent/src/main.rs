//! `sandbox-agent [--socket PATH] [--session ID] [--user UID:GID]`: PID 1 of a sandbox (see the
//! crate docs).

fn main() -> std::process::ExitCode {
    let mut socket = std::path::PathBuf::from(sandbox_agent::proto::RUN_DIR)
        .join(sandbox_agent::proto::SOCKET_NAME);
    let mut session = std::env::var(sandbox_agent::proto::SESSION_ENV).unwrap_or_default();
    let mut user = None;
    let mut args = std::env::args().skip(1);
    if std::env::args().nth(1).as_deref() == Some(sandbox_agent::pause::BINDER_ARG) {
        let socket = std::env::args().nth(2).unwrap_or_default();
        return match sandbox_agent::pause::binder_main(std::path::Path::new(&socket)) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sandbox-agent binder: {e}");
                std::process::ExitCode::from(1)
            }
        };
    }
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--socket", Some(v)) => socket = v.into(),
            ("--session", Some(v)) => session = v,
            ("--user", Some(v)) => match v
                .split_once(':')
                .and_then(|(u, g)| Some((u.parse().ok()?, g.parse().ok()?)))
            {
                Some(ids) => user = Some(ids),
                None => {
                    eprintln!("sandbox-agent: --user takes UID:GID (numbers), not {v:?}");
                    return std::process::ExitCode::from(2);
                }
            },
            _ => {
                eprintln!("usage: sandbox-agent [--socket PATH] [--session ID] [--user UID:GID]");
                return std::process::ExitCode::from(2);
            }
        }
    }
    match sandbox_agent::server::main(sandbox_agent::server::Options {
        socket,
        session,
        user,
        resumable: std::env::var(sandbox_agent::pause::RESUMABLE_ENV).is_ok_and(|v| v == "1"),
    }) {
        Ok(code) => std::process::ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("sandbox-agent: {e}");
            std::process::ExitCode::from(1)
        }
    }
}

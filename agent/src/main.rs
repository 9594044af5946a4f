//! `sandbox-agent [--socket PATH] [--session ID] [--user UID:GID]`: PID 1 of a sandbox (see the
//! crate docs). The agent starts its own binary again as its binder (`--binder`, see
//! `sandbox_agent::pause`) and as a terminal's trampoline (`--pty-exec`, see
//! `sandbox_agent::terminal`).

fn main() -> std::process::ExitCode {
    let mut socket = std::path::PathBuf::from(sandbox_agent::proto::RUN_DIR)
        .join(sandbox_agent::proto::SOCKET_NAME);
    let mut session = std::env::var(sandbox_agent::proto::SESSION_ENV).unwrap_or_default();
    let mut user = None;
    // A terminal's trampoline: nothing else may run first (its arguments are the program's,
    // not necessarily UTF-8).
    let argv: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if argv.first().and_then(|a| a.to_str()) == Some(sandbox_agent::terminal::PTY_EXEC_ARG) {
        return std::process::ExitCode::from(sandbox_agent::terminal::exec_main(&argv[1..]));
    }
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

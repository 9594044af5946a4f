//! What the egress tests share (`egress.rs`, `credentials.rs`): a catalog of one runtime
//! `egress`, opening a session of it, running a command in it, and waiting up to 5 s for a
//! command's outcome.

use std::time::{Duration, Instant};

use sandboxd_api::client::Client;

use super::Daemon;

/// A catalog of one runtime, `egress`, of `image` with the egress policy `egress` (JSON).
pub fn catalog(image: &str, egress: &str) -> String {
    format!(r#"[{{"alias": "egress", "image": "{image}", "egress": {egress}}}]"#)
}

/// Opens session `name` of the runtime `egress` for tenant `org-a`; a client with its token.
pub async fn open(d: &Daemon, name: &str) -> Client {
    let opened = d
        .admin()
        .open(name, "org-a", Some("egress"), None)
        .await
        .unwrap_or_else(|e| panic!("open {name}: {e}"));
    d.client(opened.token.as_deref().expect("a token on create"))
}

/// Runs `command` in `session`; its exit code and output (stdout then stderr).
pub async fn sh(c: &Client, session: &str, command: &str) -> (i64, String) {
    let out = c
        .run(session, command, Some(60), None, None)
        .await
        .unwrap_or_else(|e| panic!("run {command}: {e}"));
    (out.exit_code, format!("{}{}", out.stdout, out.stderr))
}

/// Runs `command` in `session` until its exit code is what `want` takes, within 5 s.
pub async fn within_5_s(
    c: &Client,
    session: &str,
    command: &str,
    want: impl Fn(i64) -> bool,
    what: &str,
) {
    let started = Instant::now();
    loop {
        let (code, out) = sh(c, session, command).await;
        if want(code) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{what} within 5 s: {out}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

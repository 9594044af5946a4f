//! `kubectl sandbox shell` and `kubectl sandbox terminals` end to end: the real binary under a
//! real pseudo-terminal (`script`), against a real sandboxd on the project's dockerd, the real
//! operator and the API server from `make up`, as plugin.rs sets them up. Asserts what a person
//! sees: the terminal's output, the exit status, raw mode (Ctrl-C reaches the sandbox), a
//! terminal left running and found again with its scrollback, and one ended with --kill.

mod common;

use std::process::Command;

use common::{PLUGIN, Running, TestScope, ok_stdout, plugin_command, plugin_with_input, text};
use sandboxd_tests::host::Host;

/// POSIX single-quoting for the line `script` runs.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The plugin with `args` under a pseudo-terminal of its own (`script`): stdin and stdout are a
/// terminal; this test types into `script`'s stdin and reads its stdout.
fn under_pty(ns: &str, args: &str) -> Running {
    let line = format!("{} -n {ns} {args}", quote(PLUGIN));
    let mut cmd = Command::new("script");
    cmd.args(["-qefc", &line, "/dev/null"]);
    Running::start(cmd)
}

/// The terminal id a message names after `--attach `.
fn attach_id(message: &str) -> String {
    message
        .split("--attach ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no --attach TID in {message:?}"))
        .to_owned()
}

/// The row of `tid` in `kubectl sandbox terminals`' table.
fn row<'a>(table: &'a str, tid: &str) -> &'a str {
    table
        .lines()
        .find(|l| l.starts_with(&format!("{tid} ")))
        .unwrap_or_else(|| panic!("no row of {tid} in:\n{table}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_works_in_a_terminal_leaves_it_running_and_comes_back_to_it() {
    let test = TestScope::new("shell", "shell").await;
    let (ns, scope) = (test.ns.clone(), test.scope.clone());
    let host_name = format!("shell-host-{scope}");

    // One sandboxd, registered as a SandboxHost with its admin token, a default Runtime and
    // the operator; then the session.
    let sandboxd_host = Host::start(&host_name, &[]);
    test.register_host(&sandboxd_host).await;
    test.create_base_runtime().await;
    let operator = test.operator();
    test.open("s1");

    // A command on a terminal: its output, then its status as the plugin's.
    let (code, out, err) = under_pty(&ns, "shell s1 -- 'echo $((6*7)); exit 7'").wait();
    assert_eq!(code, 7, "{out:?} {err:?}");
    assert!(out.contains("42\r\n"), "{out:?}");
    // The size asked for is the terminal's.
    let (code, out, _) = under_pty(&ns, "shell s1 --rows 30 --cols 100 -- 'stty size'").wait();
    assert_eq!(code, 0, "{out:?}");
    assert!(out.contains("30 100\r\n"), "{out:?}");

    // Raw mode: Ctrl-C goes to the sandbox (its program ends by SIGINT, 128 + 2), not to the
    // plugin.
    let mut interrupted = under_pty(&ns, "shell s1 -- 'echo ready; sleep 600'");
    interrupted.wait_for_output("ready");
    interrupted.type_in(b"\x03");
    let (code, out, err) = interrupted.wait();
    assert_eq!(code, 130, "{out:?} {err:?}");
    assert!(!out.contains("stopped by"), "{out:?}");

    // Piped input: a login shell reads it, then the end of input.
    let piped = plugin_with_input(&ns, &["shell", "s1"], b"echo piped-$((2+3)); exit 4\n");
    let (out, err) = text(&piped);
    assert_eq!(piped.status.code(), Some(4), "{out:?} {err:?}");
    assert!(out.contains("piped-5"), "{out:?}");

    // Left running: the plugin stopped by a signal says how to come back; the terminal is
    // listed as running.
    let left = Running::start(plugin_command(
        &ns,
        &["shell", "s1", "--", "echo marker-$((40+2)); sleep 600"],
    ));
    left.wait_for_output("marker-42");
    left.send_sigterm();
    let (code, _, err) = left.wait();
    assert_eq!(code, 1, "{err:?}");
    let tid = attach_id(&err);
    assert_eq!(
        err,
        format!(
            "kubectl sandbox: stopped by SIGTERM; terminal {tid} of session s1 runs on: kubectl sandbox shell s1 --attach {tid}\n"
        )
    );
    let table = ok_stdout(&ns, &["terminals", "s1"]);
    assert!(
        table.starts_with("ID  ") && table.contains("STATE"),
        "{table}"
    );
    let listed = row(&table, &tid);
    assert!(listed.contains(" running "), "{listed}");
    assert!(listed.contains("sleep 600"), "{listed}");

    // Attached again: its scrollback first; killed from another command, the attached plugin
    // exits with the status the kill gave it (128 + the signal).
    let back = under_pty(&ns, &format!("shell s1 --attach {tid}"));
    back.wait_for_output("marker-42");
    let killed = ok_stdout(&ns, &["terminals", "s1", "--kill", &tid]);
    assert_eq!(
        killed,
        format!("killed terminal {tid} of session s1: its program and everything it started\n")
    );
    let (code, out, err) = back.wait();
    assert!(code > 128, "{code} {out:?} {err:?}");
    let table = ok_stdout(&ns, &["terminals", "s1"]);
    assert!(
        row(&table, &tid).contains(&format!(" killed {code} ")),
        "{table}"
    );

    // A terminal the session does not have: sandboxd's words and where to look.
    let missing = plugin_with_input(&ns, &["shell", "s1", "--attach", "term-nope"], b"");
    let (_, err) = text(&missing);
    assert_eq!(missing.status.code(), Some(1), "{err}");
    assert!(err.contains("terminal_not_found (404)"), "{err}");
    assert!(
        err.ends_with("List the terminals of session s1 with `kubectl sandbox terminals s1`\n"),
        "{err}"
    );

    // Clean up: the operator is stopped first, so drop finalizers.
    drop(operator);
    drop(sandboxd_host);
    let base = test.base_runtime();
    test.clean_up(&[&host_name], &[&base], &["s1"]).await;
}

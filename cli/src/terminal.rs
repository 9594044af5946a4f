//! Terminals in a session's sandbox: `shell` opens one (or goes back to one with `--attach`)
//! and is its keyboard and screen, as `kubectl exec -it` is; `terminals` lists them and ends one.
//!
//! With a terminal on stdin, `shell` puts it in raw mode (every key goes to the sandbox, Ctrl-C
//! included) and restores it on every way out, a panic included; the remote terminal follows
//! the local one's size. With stdin piped, it sends stdin, then an end of input (Ctrl-D), and
//! shows the output until the terminal's program ends. It exits with that program's status.

use std::io::{IsTerminal as _, Read as _, Write as _};

use rustix::termios::{self, OptionalActions, Termios};
use sandboxd_api::ErrorCode;
use sandboxd_api::client::ClientError;
use sandboxd_api::terminal::{DEFAULT_COLS, DEFAULT_ROWS, Terminal, TerminalRequest};
use sandboxd_api::ws::{TerminalEvent, TerminalSocket};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::error::Error;
use crate::render;
use crate::session::Target;

/// The end of input a terminal's line discipline takes (Ctrl-D), sent when piped stdin ends.
const END_OF_INPUT: u8 = 0x04;

/// The largest size sandboxd takes, each way.
const MAX_SIZE: u16 = 1000;

/// Bytes read from stdin at a time.
const READ_CHUNK: usize = 8192;

/// `shell`: opens a terminal (or takes `--attach`'s), attaches to it and relays this terminal
/// to it until its program ends; returns its exit status.
pub async fn shell(t: &Target, args: &crate::ShellArgs) -> Result<u8, Error> {
    let interactive = std::io::stdin().is_terminal();
    let fixed = args.rows.is_some() || args.cols.is_some();
    let local = local_size();
    let (rows, cols) = size(args.rows, args.cols, local);
    let (client, id) = t.sandbox(&args.name).await?;
    let name = args.name.as_str();
    let (tid, socket) = match &args.attach {
        Some(tid) => {
            let socket = client
                .attach_terminal(&id, tid)
                .await
                .map_err(|e| not_found_hint(e, name))?;
            (tid.clone(), socket)
        }
        None => {
            let request = TerminalRequest {
                command: command_line(&args.command),
                rows,
                cols,
                ..TerminalRequest::default()
            };
            let opened = client.open_terminal(&id, &request).await?;
            let socket = client
                .attach_terminal(&id, &opened.id)
                .await
                .map_err(|source| Error::TerminalUnattached {
                    name: name.to_owned(),
                    tid: opened.id.clone(),
                    source,
                })?;
            (opened.id, socket)
        }
    };
    let relay = Relay {
        name,
        tid: &tid,
        piped: !interactive,
        // A terminal attached to again takes this one's size; one just opened has it.
        resize_first: (args.attach.is_some() && (fixed || local.is_some())).then_some((rows, cols)),
        follow_size: !fixed && local.is_some(),
    };
    // Raw mode from here to the end: the guard restores the terminal when `relay` returns,
    // fails or panics.
    let _raw = if interactive {
        Some(RawMode::enter().map_err(|source| Error::Local {
            path: "stdin (setting the terminal to raw mode)".into(),
            source,
        })?)
    } else {
        None
    };
    relay.run(socket).await
}

/// What `shell` relays between this process and one terminal.
struct Relay<'a> {
    /// The session, for messages.
    name: &'a str,
    /// The terminal.
    tid: &'a str,
    /// Stdin is not a terminal: its end is sent as an end of input.
    piped: bool,
    /// A size to give the terminal once attached.
    resize_first: Option<(u16, u16)>,
    /// Whether the terminal follows this one's size (SIGWINCH).
    follow_size: bool,
}

impl Relay<'_> {
    async fn run(&self, mut socket: TerminalSocket) -> Result<u8, Error> {
        let signals = |kind: SignalKind| -> Result<Signal, Error> {
            signal(kind).map_err(|source| Error::Local {
                path: "signal handler".into(),
                source,
            })
        };
        let mut window = signals(SignalKind::window_change())?;
        let mut interrupt = signals(SignalKind::interrupt())?;
        let mut terminate = signals(SignalKind::terminate())?;
        let mut hangup = signals(SignalKind::hangup())?;
        if let Some((rows, cols)) = self.resize_first {
            socket.resize(rows, cols).await.map_err(|_| self.broke())?;
        }
        let mut input = read_stdin();
        let mut input_open = true;
        let mut out = std::io::stdout();
        loop {
            tokio::select! {
                event = socket.next() => match event {
                    Some(TerminalEvent::Output(bytes)) => {
                        // A closed stdout (`| head`) is no reason to stop the terminal's program.
                        let _ = out.write_all(&bytes).and_then(|()| out.flush());
                    }
                    Some(TerminalEvent::Attached { .. }) => {}
                    Some(TerminalEvent::Exit { exit_code, .. }) => return Ok(exit_status(exit_code)),
                    Some(TerminalEvent::Error { code, message }) => {
                        return Err(Error::TerminalUnfollowed {
                            name: self.name.to_owned(),
                            tid: self.tid.to_owned(),
                            code,
                            message,
                        });
                    }
                    Some(TerminalEvent::Closed { .. }) | None => return Err(self.broke()),
                },
                chunk = input.recv(), if input_open => {
                    let sent = match chunk {
                        Some(bytes) => socket.send_input(&bytes).await,
                        None => {
                            input_open = false;
                            if self.piped {
                                socket.send_input(&[END_OF_INPUT]).await
                            } else {
                                Ok(())
                            }
                        }
                    };
                    sent.map_err(|_| self.broke())?;
                }
                _ = window.recv(), if self.follow_size => {
                    if let Some(local) = local_size() {
                        let (rows, cols) = size(None, None, Some(local));
                        socket.resize(rows, cols).await.map_err(|_| self.broke())?;
                    }
                }
                _ = interrupt.recv() => return Err(self.left("SIGINT")),
                _ = terminate.recv() => return Err(self.left("SIGTERM")),
                _ = hangup.recv() => return Err(self.left("SIGHUP")),
            }
        }
    }

    fn broke(&self) -> Error {
        Error::TerminalBroke {
            name: self.name.to_owned(),
            tid: self.tid.to_owned(),
        }
    }

    fn left(&self, signal: &'static str) -> Error {
        Error::TerminalLeft {
            name: self.name.to_owned(),
            tid: self.tid.to_owned(),
            signal,
        }
    }
}

/// Stdin's bytes as they come, read on a thread of its own: a plain thread, not the runtime's
/// blocking pool, so a read that never returns does not hold up the exit.
fn read_stdin() -> tokio::sync::mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buf = vec![0u8; READ_CHUNK];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    });
    rx
}

/// The terminal on stdin in raw mode while this lives; its settings as they were after.
struct RawMode {
    saved: Termios,
}

impl RawMode {
    fn enter() -> std::io::Result<Self> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(&stdin)?;
        let mut raw = saved.clone();
        raw.make_raw();
        termios::tcsetattr(&stdin, OptionalActions::Flush, &raw)?;
        Ok(Self { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // Output still queued is written first (Drain); nothing more can be done on failure.
        let _ = termios::tcsetattr(std::io::stdin(), OptionalActions::Drain, &self.saved);
    }
}

/// The size of the local terminal (stdout's, else stdin's), when there is one that knows it.
fn local_size() -> Option<(u16, u16)> {
    let of = |ws: rustix::io::Result<termios::Winsize>| {
        ws.ok()
            .filter(|w| w.ws_row > 0 && w.ws_col > 0)
            .map(|w| (w.ws_row, w.ws_col))
    };
    let stdout = std::io::stdout();
    let stdin = std::io::stdin();
    (stdout
        .is_terminal()
        .then(|| of(termios::tcgetwinsize(&stdout)))
        .flatten())
    .or_else(|| {
        stdin
            .is_terminal()
            .then(|| of(termios::tcgetwinsize(&stdin)))
            .flatten()
    })
}

/// The terminal's size: `--rows` and `--cols` where given, else the local terminal's (held to
/// what sandboxd takes), else 24 by 80.
pub fn size(rows: Option<u16>, cols: Option<u16>, local: Option<(u16, u16)>) -> (u16, u16) {
    let (local_rows, local_cols) = local
        .map(|(r, c)| (r.clamp(1, MAX_SIZE), c.clamp(1, MAX_SIZE)))
        .unwrap_or((DEFAULT_ROWS, DEFAULT_COLS));
    (rows.unwrap_or(local_rows), cols.unwrap_or(local_cols))
}

/// The shell command of `shell`'s words (as `exec` takes them), or none for a login shell.
pub fn command_line(words: &[String]) -> Option<String> {
    (!words.is_empty()).then(|| render::shell_command(words))
}

/// The process's exit status for a terminal's: the same from 0 to 255, else 1.
pub fn exit_status(code: i64) -> u8 {
    u8::try_from(code).unwrap_or(1)
}

/// A refusal naming a terminal the session does not have says where to find its terminals.
fn not_found_hint(e: ClientError, name: &str) -> Error {
    if e.code() == Some(&ErrorCode::TerminalNotFound) {
        Error::Usage(format!(
            "{e}. List the terminals of session {name} with `kubectl sandbox terminals {name}`"
        ))
    } else {
        Error::Sandbox(e)
    }
}

/// `terminals`: the session's terminals, running ones first.
pub async fn list(t: &Target, name: &str) -> Result<(), Error> {
    let (client, id) = t.sandbox(name).await?;
    let terminals = client.terminals(&id).await?;
    if terminals.is_empty() {
        println!("No terminals in session {name}. Open one with `kubectl sandbox shell {name}`.");
        return Ok(());
    }
    print!("{}", table(&terminals));
    Ok(())
}

/// The table of `terminals`: STATE is `running` or how it ended with its exit status.
pub fn table(terminals: &[Terminal]) -> String {
    let rows: Vec<Vec<String>> = terminals
        .iter()
        .map(|t| {
            vec![
                t.id.clone(),
                t.pid.to_string(),
                state(t),
                format!("{}x{}", t.rows, t.cols),
                t.attached.to_string(),
                render::span(t.idle_seconds),
                t.argv
                    .iter()
                    .map(|a| render::quote(a))
                    .collect::<Vec<_>>()
                    .join(" "),
            ]
        })
        .collect();
    render::table(
        &["ID", "PID", "STATE", "SIZE", "ATTACHED", "IDLE", "COMMAND"],
        &rows,
    )
}

fn state(t: &Terminal) -> String {
    if t.running {
        return "running".to_owned();
    }
    let how = t.reason.as_deref().unwrap_or("ended");
    match t.exit_code {
        Some(code) => format!("{how} {code}"),
        None => how.to_owned(),
    }
}

/// `terminals --kill`: ends one terminal, its program and everything it started.
pub async fn kill(t: &Target, name: &str, tid: &str) -> Result<(), Error> {
    let (client, id) = t.sandbox(name).await?;
    let killed = client
        .kill_terminal(&id, tid)
        .await
        .map_err(|e| not_found_hint(e, name))?;
    println!(
        "killed terminal {} of session {name}: its program and everything it started",
        killed.id
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terminal(id: &str, running: bool, exit: Option<(i64, &str)>) -> Terminal {
        Terminal {
            id: id.into(),
            pid: 17,
            argv: vec!["/bin/sh".into(), "-c".into(), "echo hi; sleep 9".into()],
            rows: 24,
            cols: 80,
            running,
            exit_code: exit.map(|(c, _)| c),
            reason: exit.map(|(_, r)| r.to_owned()),
            attached: u32::from(running),
            input_bytes: 0,
            output_bytes: 3,
            idle_seconds: 190,
            age_seconds: 200,
        }
    }

    #[test]
    fn the_size_is_the_flags_then_the_local_terminal_then_24_by_80() {
        assert_eq!(size(None, None, None), (24, 80));
        assert_eq!(size(None, None, Some((50, 200))), (50, 200));
        assert_eq!(size(Some(30), None, Some((50, 200))), (30, 200));
        assert_eq!(size(None, Some(100), None), (24, 100));
        assert_eq!(size(None, None, Some((5000, 0))), (1000, 1));
    }

    #[test]
    fn exit_statuses_outside_a_byte_are_1() {
        assert_eq!(exit_status(0), 0);
        assert_eq!(exit_status(7), 7);
        assert_eq!(exit_status(137), 137);
        assert_eq!(exit_status(255), 255);
        assert_eq!(exit_status(256), 1);
        assert_eq!(exit_status(-1), 1);
    }

    #[test]
    fn no_words_is_a_login_shell_and_words_are_a_shell_line() {
        assert_eq!(command_line(&[]), None);
        assert_eq!(
            command_line(&["echo $((6*7)); exit 7".into()]).as_deref(),
            Some("echo $((6*7)); exit 7")
        );
        assert_eq!(
            command_line(&["ls".into(), "my dir".into()]).as_deref(),
            Some("ls 'my dir'")
        );
    }

    #[test]
    fn terminals_are_a_table_with_their_state() {
        let t = table(&[
            terminal("term-a", true, None),
            terminal("term-b", false, Some((137, "killed"))),
        ]);
        assert_eq!(
            t,
            "ID      PID  STATE       SIZE   ATTACHED  IDLE  COMMAND\n\
             term-a  17   running     24x80  1         3m    /bin/sh -c 'echo hi; sleep 9'\n\
             term-b  17   killed 137  24x80  0         3m    /bin/sh -c 'echo hi; sleep 9'\n"
        );
    }

    #[test]
    fn the_messages_say_how_to_go_back_to_the_terminal() {
        let broke = Error::TerminalBroke {
            name: "s1".into(),
            tid: "term-1".into(),
        };
        assert_eq!(
            broke.to_string(),
            "the connection to terminal term-1 of session s1 broke; it runs on: kubectl sandbox shell s1 --attach term-1"
        );
        let missing = not_found_hint(
            ClientError::Api {
                status: 404,
                code: ErrorCode::TerminalNotFound,
                message: "no terminal term-9".into(),
            },
            "s1",
        );
        assert_eq!(
            missing.to_string(),
            "terminal_not_found (404): no terminal term-9. List the terminals of session s1 with `kubectl sandbox terminals s1`"
        );
    }
}

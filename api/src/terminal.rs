//! Terminals: a login shell (or a command) on a pseudo-terminal in a sandbox, that outlives the
//! connection watching it. Opened, listed and killed with JSON; watched and typed into over a
//! WebSocket whose messages are [`TerminalMessage`] (text) and raw bytes (binary).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// Rows of a terminal opened without a size.
pub const DEFAULT_ROWS: u16 = 24;
/// Columns of a terminal opened without a size.
pub const DEFAULT_COLS: u16 = 80;

fn default_rows() -> u16 {
    DEFAULT_ROWS
}

fn default_cols() -> u16 {
    DEFAULT_COLS
}

/// The body of `POST /v1/sessions/{id}/terminals`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TerminalRequest {
    /// A shell command to run on the terminal (`/bin/sh -c`); absent: a login shell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Its size in rows (1 to 1000).
    #[serde(default = "default_rows")]
    pub rows: u16,
    /// Its size in columns (1 to 1000).
    #[serde(default = "default_cols")]
    pub cols: u16,
    /// Extra environment, as a run takes it (the terminal starts in `/workspace`, as a run).
    #[serde(default, skip_serializing_if = "HashMap::is_empty")]
    pub env: HashMap<String, String>,
}

impl Default for TerminalRequest {
    fn default() -> Self {
        Self {
            command: None,
            rows: DEFAULT_ROWS,
            cols: DEFAULT_COLS,
            env: HashMap::new(),
        }
    }
}

/// A terminal of a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Terminal {
    /// The terminal id (`term-…`).
    pub id: String,
    /// Its program's pid in the sandbox.
    pub pid: i32,
    /// What it runs (the login shell, or `/bin/sh -c COMMAND`).
    pub argv: Vec<String>,
    /// Its size in rows.
    pub rows: u16,
    /// Its size in columns.
    pub cols: u16,
    /// Whether its program still runs.
    pub running: bool,
    /// Its exit status, once it ended (128 + n after signal n).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    /// Why it ended: `exited`, `killed` or `idle`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Connections attached to it now.
    pub attached: u32,
    /// Bytes typed into it.
    pub input_bytes: u64,
    /// Bytes it printed.
    pub output_bytes: u64,
    /// Seconds since its last input or output.
    pub idle_seconds: u64,
    /// Seconds since it started.
    pub age_seconds: u64,
}

/// The body of `GET /v1/sessions/{id}/terminals`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TerminalList {
    /// Running terminals first, then recently ended ones.
    pub terminals: Vec<Terminal>,
}

/// The body of `DELETE /v1/sessions/{id}/terminals/{terminal_id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TerminalKilled {
    /// The terminal.
    pub id: String,
    /// Always true: its program and everything it started are being ended.
    pub killed: bool,
}

/// A text message on a terminal's WebSocket (`GET /v1/sessions/{id}/terminals/{terminal_id}/attach`).
/// Binary messages are the terminal's bytes: its output from sandboxd (first its scrollback, the
/// last 1 MiB it printed, then what it prints), and input from the client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TerminalMessage {
    /// From sandboxd, first: the terminal, and how many bytes of scrollback follow.
    Attached {
        /// The terminal.
        terminal: Terminal,
        /// Bytes of kept output sent before the live output.
        scrollback: u64,
    },
    /// From the client: the terminal's new size.
    Resize {
        /// Rows (1 to 1000).
        rows: u16,
        /// Columns (1 to 1000).
        cols: u16,
    },
    /// From the client: input as text (binary messages carry bytes).
    Input {
        /// The text typed.
        data: String,
    },
    /// From sandboxd, last: the terminal's program ended.
    Exit {
        /// Its exit status (128 + n after signal n).
        exit_code: i64,
        /// Why: `exited`, `killed` or `idle`.
        reason: String,
    },
    /// From sandboxd, last: the terminal could not be followed further (the session stopped
    /// or sandboxd is leaving); the terminal may run on, re-attach to find out.
    Error {
        /// A stable code.
        code: String,
        /// In words.
        message: String,
    },
}

/// Whether a terminal size is one sandboxd accepts, else the words that refuse it.
pub fn check_size(rows: u16, cols: u16) -> Result<(), String> {
    if (1..=1000).contains(&rows) && (1..=1000).contains(&cols) {
        Ok(())
    } else {
        Err(format!(
            "a terminal is 1 to 1000 rows by 1 to 1000 columns, not {rows}x{cols}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_without_a_size_is_24_by_80_and_unknown_fields_are_refused() {
        let r: TerminalRequest = serde_json::from_str("{}").expect("an empty request");
        assert_eq!((r.rows, r.cols, r.command), (24, 80, None));
        assert!(serde_json::from_str::<TerminalRequest>(r#"{"comand": "x"}"#).is_err());
    }

    #[test]
    fn messages_are_tagged_by_type() {
        let m: TerminalMessage =
            serde_json::from_str(r#"{"type":"resize","rows":33,"cols":101}"#).expect("resize");
        assert_eq!(
            m,
            TerminalMessage::Resize {
                rows: 33,
                cols: 101
            }
        );
        assert!(check_size(33, 101).is_ok());
        assert_eq!(
            check_size(0, 80).err().as_deref(),
            Some("a terminal is 1 to 1000 rows by 1 to 1000 columns, not 0x80")
        );
    }
}

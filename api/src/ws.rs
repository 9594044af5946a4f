//! The client end of a terminal's WebSocket (`GET /v1/sessions/{id}/terminals/{terminal_id}/attach`),
//! opened by [`Client::attach_terminal`](crate::client::Client::attach_terminal) over the
//! client's own connection: what sandboxd sends comes out as typed [`TerminalEvent`]s, and input
//! bytes and sizes go in.

use futures::{SinkExt, StreamExt};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::{Bytes, Message};

use crate::client::ClientError;
use crate::terminal::{Terminal, TerminalMessage};

/// What a terminal's WebSocket brings, in order: [`TerminalEvent::Attached`], the output (its
/// scrollback, then what it prints), then one of [`TerminalEvent::Exit`] or
/// [`TerminalEvent::Error`], then [`TerminalEvent::Closed`]. A connection that breaks comes to
/// [`TerminalEvent::Closed`] early.
#[derive(Debug, Clone, PartialEq)]
pub enum TerminalEvent {
    /// First: the terminal, and how many bytes of scrollback follow.
    Attached {
        /// The terminal as it was when attached.
        terminal: Terminal,
        /// Bytes of kept output sent before the live output.
        scrollback: u64,
    },
    /// Bytes the terminal printed.
    Output(Vec<u8>),
    /// The terminal's program ended.
    Exit {
        /// Its exit status (128 + n after signal n).
        exit_code: i64,
        /// Why: `exited`, `killed` or `idle`.
        reason: String,
    },
    /// sandboxd could not follow the terminal further; it may run on (attach again to know).
    Error {
        /// A stable code.
        code: String,
        /// In words.
        message: String,
    },
    /// The connection ended (last): after an [`TerminalEvent::Exit`] or
    /// [`TerminalEvent::Error`] as it should, before one when it broke.
    Closed {
        /// How it ended, in words.
        why: String,
    },
}

/// The event one WebSocket message stands for: `None` for what a client skips (pings, pongs,
/// messages meant for sandboxd, text this client does not know); `Closed` for a close frame.
fn event(message: Message) -> Option<TerminalEvent> {
    match message {
        Message::Binary(bytes) => Some(TerminalEvent::Output(Vec::from(bytes))),
        Message::Text(text) => match serde_json::from_str::<TerminalMessage>(text.as_str()) {
            Ok(TerminalMessage::Attached {
                terminal,
                scrollback,
            }) => Some(TerminalEvent::Attached {
                terminal,
                scrollback,
            }),
            Ok(TerminalMessage::Exit { exit_code, reason }) => {
                Some(TerminalEvent::Exit { exit_code, reason })
            }
            Ok(TerminalMessage::Error { code, message }) => {
                Some(TerminalEvent::Error { code, message })
            }
            // Resize and Input go to sandboxd; anything else is of a newer sandboxd.
            Ok(TerminalMessage::Resize { .. } | TerminalMessage::Input { .. }) | Err(_) => None,
        },
        Message::Close(frame) => Some(TerminalEvent::Closed {
            why: match frame {
                Some(f) if !f.reason.is_empty() => format!(
                    "sandboxd closed the connection ({}: {})",
                    u16::from(f.code),
                    f.reason.as_str()
                ),
                Some(f) => format!("sandboxd closed the connection ({})", u16::from(f.code)),
                None => "sandboxd closed the connection".to_owned(),
            },
        }),
        Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => None,
    }
}

/// A client's WebSocket to one terminal. Reading ([`TerminalSocket::next`]) and writing
/// ([`TerminalSocket::send_input`], [`TerminalSocket::resize`]) take turns on one value: a
/// `tokio::select!` over `next()` and the input is the intended use (`next` is cancel-safe).
pub struct TerminalSocket {
    ws: WebSocketStream<reqwest::Upgraded>,
    base: String,
    terminal_id: String,
    closed: bool,
}

impl std::fmt::Debug for TerminalSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TerminalSocket")
            .field("base", &self.base)
            .field("terminal_id", &self.terminal_id)
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

impl TerminalSocket {
    /// The socket of terminal `terminal_id` on the sandboxd at `base`, over `ws`.
    pub(crate) fn new(
        ws: WebSocketStream<reqwest::Upgraded>,
        base: &str,
        terminal_id: &str,
    ) -> Self {
        Self {
            ws,
            base: base.to_owned(),
            terminal_id: terminal_id.to_owned(),
            closed: false,
        }
    }

    /// The terminal's id.
    pub fn terminal_id(&self) -> &str {
        &self.terminal_id
    }

    /// The next event; [`TerminalEvent::Closed`] once, then `None`. Cancel-safe: a message is
    /// taken from the connection only when it is returned.
    pub async fn next(&mut self) -> Option<TerminalEvent> {
        if self.closed {
            return None;
        }
        loop {
            let found = match self.ws.next().await {
                Some(Ok(message)) => event(message),
                Some(Err(e)) => Some(TerminalEvent::Closed {
                    why: format!("reading from it failed: {e}"),
                }),
                None => Some(TerminalEvent::Closed {
                    why: "the connection ended without a close".to_owned(),
                }),
            };
            if let Some(ev) = found {
                self.closed = matches!(ev, TerminalEvent::Closed { .. });
                return Some(ev);
            }
        }
    }

    /// Types `bytes` into the terminal (a binary message); nothing is sent for none.
    pub async fn send_input(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.send(Message::Binary(Bytes::copy_from_slice(bytes)), "input")
            .await
    }

    /// Gives the terminal a new size, `rows` by `cols` (sandboxd takes 1 to 1000 of each).
    pub async fn resize(&mut self, rows: u16, cols: u16) -> Result<(), ClientError> {
        let text = serde_json::to_string(&TerminalMessage::Resize { rows, cols })
            .map_err(|e| self.failed("a resize", e))?;
        self.send(Message::text(text), "a resize").await
    }

    /// Closes the connection politely (a close frame); the terminal runs on.
    pub async fn close(mut self) -> Result<(), ClientError> {
        self.closed = true;
        self.ws
            .close(None)
            .await
            .map_err(|e| self.failed("a close", e))
    }

    async fn send(&mut self, message: Message, what: &str) -> Result<(), ClientError> {
        let sent = self.ws.send(message).await;
        sent.map_err(|e| self.failed(what, e))
    }

    fn failed(&self, what: &str, e: impl std::fmt::Display) -> ClientError {
        ClientError::Transport {
            base: self.base.clone(),
            message: format!(
                "sending {what} to terminal {} failed: {e}",
                self.terminal_id
            ),
            untrusted: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

    fn terminal() -> Terminal {
        Terminal {
            id: "term-1".into(),
            pid: 42,
            argv: vec!["/bin/sh".into(), "-l".into()],
            rows: 24,
            cols: 80,
            running: true,
            exit_code: None,
            reason: None,
            attached: 1,
            input_bytes: 0,
            output_bytes: 5,
            idle_seconds: 0,
            age_seconds: 3,
        }
    }

    fn text(m: &TerminalMessage) -> Message {
        Message::text(serde_json::to_string(m).expect("a message serializes"))
    }

    #[test]
    fn messages_become_typed_events() {
        assert_eq!(
            event(text(&TerminalMessage::Attached {
                terminal: terminal(),
                scrollback: 5
            })),
            Some(TerminalEvent::Attached {
                terminal: terminal(),
                scrollback: 5
            })
        );
        assert_eq!(
            event(Message::Binary(Bytes::from_static(b"hi\r\n\xff"))),
            Some(TerminalEvent::Output(b"hi\r\n\xff".to_vec()))
        );
        assert_eq!(
            event(Message::text(
                r#"{"type":"exit","exit_code":7,"reason":"exited"}"#
            )),
            Some(TerminalEvent::Exit {
                exit_code: 7,
                reason: "exited".into()
            })
        );
        assert_eq!(
            event(text(&TerminalMessage::Error {
                code: "session_stopped".into(),
                message: "the session stopped".into()
            })),
            Some(TerminalEvent::Error {
                code: "session_stopped".into(),
                message: "the session stopped".into()
            })
        );
    }

    #[test]
    fn what_a_client_does_not_need_is_skipped_and_a_close_says_how() {
        for skipped in [
            Message::Ping(Bytes::from_static(b"p")),
            Message::Pong(Bytes::new()),
            text(&TerminalMessage::Resize { rows: 3, cols: 4 }),
            Message::text(r#"{"type":"something_newer"}"#),
            Message::text("not json"),
        ] {
            assert_eq!(event(skipped.clone()), None, "{skipped:?}");
        }
        assert_eq!(
            event(Message::Close(None)),
            Some(TerminalEvent::Closed {
                why: "sandboxd closed the connection".into()
            })
        );
        assert_eq!(
            event(Message::Close(Some(CloseFrame {
                code: CloseCode::Away,
                reason: "leaving".into()
            }))),
            Some(TerminalEvent::Closed {
                why: "sandboxd closed the connection (1001: leaving)".into()
            })
        );
    }
}

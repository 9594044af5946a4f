//! A run's output as it streams: each stream capped (the rest drained and dropped, the run
//! marked truncated), cut at whole characters.

use super::*;

use tokio::sync::mpsc;

/// Which output stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub(super) fn event(self, data: String) -> RunEvent {
        match self {
            Self::Stdout => RunEvent::Stdout { data },
            Self::Stderr => RunEvent::Stderr { data },
        }
    }
}

/// One output stream, kept up to a cap; `sent` is where in it the next event starts.
pub(super) struct Capture {
    kept: Vec<u8>,
    cap: usize,
    sent: usize,
    truncated: bool,
}

impl Capture {
    pub(super) fn new(cap: usize) -> Self {
        Self {
            kept: Vec::new(),
            cap,
            sent: 0,
            truncated: false,
        }
    }

    /// Keeps what fits under the cap; the rest is dropped and the stream marked truncated.
    pub(super) fn keep(&mut self, bytes: &[u8]) {
        let room = self.cap.saturating_sub(self.kept.len());
        let take = bytes.len().min(room);
        if take < bytes.len() {
            self.truncated = true;
        }
        self.kept.extend_from_slice(&bytes[..take]);
    }

    /// Where the next event would end: after the last whole character kept, or (`all`, once
    /// the run is over) after everything kept, a cut-off character included (as U+FFFD).
    pub(super) fn end(&self, all: bool) -> usize {
        if all {
            self.kept.len()
        } else {
            self.sent + whole_chars(&self.kept[self.sent..])
        }
    }

    /// The text from `sent` to `end`, now counted as sent.
    pub(super) fn take(&mut self, end: usize) -> String {
        let text = String::from_utf8_lossy(&self.kept[self.sent..end]).into_owned();
        self.sent = end;
        text
    }

    pub(super) fn text(self) -> String {
        String::from_utf8(self.kept)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }
}

/// The length of `bytes` without a UTF-8 sequence cut off at its end.
pub(super) fn whole_chars(bytes: &[u8]) -> usize {
    for back in 1..=bytes.len().min(3) {
        let b = bytes[bytes.len() - back];
        if b & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back for its lead
        }
        let need = match b {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if need > back {
            bytes.len() - back
        } else {
            bytes.len()
        };
    }
    bytes.len()
}

/// A run's output: each stream kept up to a cap (the rest is dropped and the run marked
/// truncated), and streamed to `events` as it comes, never waiting for whoever reads them.
///
/// While the events channel is full (a client that reads slowly, or not at all), what is
/// kept and not yet sent waits here and goes out as one event as soon as there is room
/// ([`Output::room`], [`Output::send_waiting`]). So a run's loop never blocks on its consumer
/// (its stop, timeout and kill are always seen), and a run holds at most the cap per stream
/// and the channel's few events, whatever the consumer does. Streamed events carry whole
/// characters: a UTF-8 sequence split between two chunks of output waits for its rest, so the
/// events of each stream put together are exactly its (lossy) output.
pub(crate) struct Output {
    out: Capture,
    err: Capture,
    events: Option<mpsc::Sender<RunEvent>>,
    /// Streams holding kept bytes not yet sent, in the order those bytes came.
    waiting: Vec<Stream>,
}

impl Output {
    /// Output kept up to `cap` bytes per stream, streamed to `events` if given.
    pub(crate) fn new(cap: usize, events: Option<mpsc::Sender<RunEvent>>) -> Self {
        Self {
            out: Capture::new(cap),
            err: Capture::new(cap),
            events,
            waiting: Vec::with_capacity(2),
        }
    }

    pub(super) fn capture(&mut self, stream: Stream) -> &mut Capture {
        match stream {
            Stream::Stdout => &mut self.out,
            Stream::Stderr => &mut self.err,
        }
    }

    /// Bytes on stdout; never waits.
    pub(crate) fn stdout(&mut self, bytes: &[u8]) {
        self.push(Stream::Stdout, bytes);
    }

    /// Bytes on stderr; never waits.
    pub(crate) fn stderr(&mut self, bytes: &[u8]) {
        self.push(Stream::Stderr, bytes);
    }

    pub(super) fn push(&mut self, stream: Stream, bytes: &[u8]) {
        let streaming = self.events.is_some();
        let c = self.capture(stream);
        c.keep(bytes);
        if streaming && c.kept.len() > c.sent && !self.waiting.contains(&stream) {
            self.waiting.push(stream);
        }
        self.send(false);
    }

    /// Sends what waits, oldest first, while the channel has room; never waits. `all`: the
    /// run is over, a cut-off character goes too.
    pub(super) fn send(&mut self, all: bool) {
        let Self {
            out,
            err,
            events,
            waiting,
        } = self;
        while let Some(&stream) = waiting.first() {
            let Some(tx) = events.as_ref() else {
                waiting.clear();
                return;
            };
            let c = match stream {
                Stream::Stdout => &mut *out,
                Stream::Stderr => &mut *err,
            };
            let end = c.end(all);
            if end > c.sent {
                let closed = match tx.try_reserve() {
                    Ok(permit) => {
                        permit.send(stream.event(c.take(end)));
                        false
                    }
                    Err(mpsc::error::TrySendError::Full(())) => return,
                    Err(mpsc::error::TrySendError::Closed(())) => true,
                };
                if closed {
                    // The client went away: the run goes on, its events are dropped.
                    *events = None;
                    waiting.clear();
                    return;
                }
            }
            // Sent, or only part of a character waits (it goes with its rest).
            waiting.remove(0);
        }
    }

    /// Whether kept output waits for room in the events channel.
    pub(crate) fn waiting(&self) -> bool {
        self.events.is_some() && !self.waiting.is_empty()
    }

    /// Resolves when the events channel has room (or is closed); pending forever when
    /// nothing is streamed. Then [`Output::send_waiting`].
    pub(crate) async fn room(&self) {
        match &self.events {
            Some(tx) => drop(tx.reserve().await),
            None => std::future::pending().await,
        }
    }

    /// Sends what waits while there is room; never waits.
    pub(crate) fn send_waiting(&mut self) {
        self.send(false);
    }

    /// Whether either stream was cut at the cap.
    pub(crate) fn truncated(&self) -> bool {
        self.out.truncated || self.err.truncated
    }

    /// Ends the output: what is kept goes out (a cut-off character as U+FFFD), and stdout and
    /// stderr are returned. What the channel has no room for is handed to a task of its own,
    /// which sends it, in order, as the consumer reads (or drops it when the consumer goes
    /// away): the run ends now, whatever its consumer does.
    pub(crate) fn finish(mut self) -> (String, String) {
        for stream in [Stream::Stdout, Stream::Stderr] {
            let c = self.capture(stream);
            if c.kept.len() > c.sent && !self.waiting.contains(&stream) {
                self.waiting.push(stream);
            }
        }
        self.send(true);
        if let Some(tx) = self.events.take()
            && !self.waiting.is_empty()
        {
            let mut rest = Vec::with_capacity(2);
            for stream in std::mem::take(&mut self.waiting) {
                let c = self.capture(stream);
                let end = c.end(true);
                if end > c.sent {
                    rest.push(stream.event(c.take(end)));
                }
            }
            tokio::spawn(async move {
                for event in rest {
                    if tx.send(event).await.is_err() {
                        break;
                    }
                }
            });
        }
        (self.out.text(), self.err.text())
    }
}

//! The client end of a port's WebSocket (`GET /v1/sessions/{id}/ports/{port}`), opened by
//! [`Client::connect_port`](crate::client::Client::connect_port) over the client's own
//! connection: a TCP connection to the port, made by sandboxd inside the sandbox, as bytes
//! each way.
//!
//! Its ends close apart, as a TCP connection's do: [`PortSocket::finish`] says this side has
//! nothing more to send (an empty binary message: sandboxd ends its input to the port), and the port may
//! still answer, read with [`PortSocket::recv`] until it returns `None` (the port closed its
//! side, and sandboxd the WebSocket). [`PortSocket::into_split`] gives the two directions to
//! two tasks, so neither waits on the other.

use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::{self, Bytes, Message};

use crate::client::ClientError;

type Socket = WebSocketStream<reqwest::Upgraded>;

/// A TCP connection to one port of a session's sandbox, through sandboxd.
#[derive(Debug)]
pub struct PortSocket {
    writer: PortWriter,
    reader: PortReader,
}

impl PortSocket {
    /// The socket to `port` on the sandboxd at `base`, over `ws`.
    pub(crate) fn new(ws: Socket, base: &str, port: u16) -> Self {
        let (sink, stream) = ws.split();
        Self {
            writer: PortWriter {
                sink,
                base: base.to_owned(),
                port,
                finished: false,
            },
            reader: PortReader {
                stream,
                base: base.to_owned(),
                port,
                ended: false,
            },
        }
    }

    /// The port in the sandbox.
    pub fn port(&self) -> u16 {
        self.writer.port
    }

    /// Sends `bytes` to the port; nothing is sent for none.
    pub async fn send(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.writer.send(bytes).await
    }

    /// Says this side has nothing more to send (an empty binary message, which sandboxd passes
    /// on as a half-close); the port may still answer.
    pub async fn finish(&mut self) -> Result<(), ClientError> {
        self.writer.finish().await
    }

    /// The next bytes the port sent; `None` once the port closed its side (sandboxd closed the
    /// WebSocket), and after an error. Cancel-safe.
    pub async fn recv(&mut self) -> Option<Result<Vec<u8>, ClientError>> {
        self.reader.recv().await
    }

    /// The two directions apart, for two tasks: the sending end and the receiving end.
    pub fn into_split(self) -> (PortWriter, PortReader) {
        (self.writer, self.reader)
    }
}

/// The sending end of a [`PortSocket`].
pub struct PortWriter {
    sink: SplitSink<Socket, Message>,
    base: String,
    port: u16,
    finished: bool,
}

impl std::fmt::Debug for PortWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortWriter")
            .field("base", &self.base)
            .field("port", &self.port)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl PortWriter {
    /// Sends `bytes` to the port; nothing is sent for none. Refused after
    /// [`PortWriter::finish`].
    pub async fn send(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        if bytes.is_empty() {
            return Ok(());
        }
        if self.finished {
            return Err(self.failed(
                "bytes",
                "this side already said it has nothing more to send",
            ));
        }
        let sent = self
            .sink
            .send(Message::Binary(Bytes::copy_from_slice(bytes)))
            .await;
        sent.map_err(|e| self.failed("bytes", e))
    }

    /// Says this side has nothing more to send (an empty binary message): sandboxd ends the
    /// port's input;
    /// the port may still answer. A second call does nothing.
    pub async fn finish(&mut self) -> Result<(), ClientError> {
        if std::mem::replace(&mut self.finished, true) {
            return Ok(());
        }
        // An empty binary message is the end of the input: sandboxd half-closes toward the
        // port and goes on sending its answer (a Close would end the connection both ways).
        match self.sink.send(Message::Binary(Vec::new().into())).await {
            // sandboxd closed first: there is no one left to tell.
            Ok(())
            | Err(
                tungstenite::Error::ConnectionClosed
                | tungstenite::Error::AlreadyClosed
                | tungstenite::Error::Protocol(tungstenite::error::ProtocolError::SendAfterClosing),
            ) => Ok(()),
            Err(e) => Err(self.failed("the end of input", e)),
        }
    }

    fn failed(&self, what: &str, e: impl std::fmt::Display) -> ClientError {
        ClientError::Transport {
            base: self.base.clone(),
            message: format!("sending {what} to port {} failed: {e}", self.port),
            untrusted: false,
        }
    }
}

/// The receiving end of a [`PortSocket`].
pub struct PortReader {
    stream: SplitStream<Socket>,
    base: String,
    port: u16,
    ended: bool,
}

impl std::fmt::Debug for PortReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortReader")
            .field("base", &self.base)
            .field("port", &self.port)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl PortReader {
    /// The next bytes the port sent; `None` once the port closed its side (sandboxd closed the
    /// WebSocket), and after an error. Cancel-safe: a message is taken from the connection only
    /// when it is returned.
    pub async fn recv(&mut self) -> Option<Result<Vec<u8>, ClientError>> {
        if self.ended {
            return None;
        }
        loop {
            match self.stream.next().await {
                Some(Ok(message)) => match bytes(message) {
                    Read::Bytes(b) => return Some(Ok(b)),
                    Read::Skip => {}
                    Read::Closed => break,
                },
                Some(Err(e)) => {
                    self.ended = true;
                    return Some(Err(ClientError::Transport {
                        base: self.base.clone(),
                        message: format!(
                            "the WebSocket to port {} ended before sandboxd closed it: {e}",
                            self.port
                        ),
                        untrusted: false,
                    }));
                }
                None => break,
            }
        }
        self.ended = true;
        None
    }
}

/// What one WebSocket message is to a port's reader.
#[derive(Debug, PartialEq)]
enum Read {
    /// The port's bytes.
    Bytes(Vec<u8>),
    /// Nothing of the port's (a ping, a pong, an empty message).
    Skip,
    /// sandboxd closed the socket: the port closed its side.
    Closed,
}

fn bytes(message: Message) -> Read {
    match message {
        Message::Binary(b) if !b.is_empty() => Read::Bytes(Vec::from(b)),
        Message::Text(t) if !t.is_empty() => Read::Bytes(t.as_bytes().to_vec()),
        Message::Close(_) => Read::Closed,
        Message::Binary(_)
        | Message::Text(_)
        | Message::Ping(_)
        | Message::Pong(_)
        | Message::Frame(_) => Read::Skip,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Client;
    use crate::error::ErrorCode;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;

    #[test]
    fn messages_are_the_ports_bytes_and_a_close_its_end() {
        assert_eq!(
            bytes(Message::Binary(Bytes::from_static(b"\x00hi\xff"))),
            Read::Bytes(b"\x00hi\xff".to_vec())
        );
        assert_eq!(bytes(Message::text("hi")), Read::Bytes(b"hi".to_vec()));
        assert_eq!(bytes(Message::Binary(Bytes::new())), Read::Skip);
        assert_eq!(bytes(Message::Ping(Bytes::from_static(b"p"))), Read::Skip);
        assert_eq!(bytes(Message::Close(None)), Read::Closed);
    }

    /// A sandboxd of one connection on a loopback port: `serve` gets the accepted connection.
    async fn server<F, Fut>(serve: F) -> (String, tokio::task::JoinHandle<()>)
    where
        F: FnOnce(tokio::net::TcpStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let (conn, _) = listener.accept().await.expect("accept");
            serve(conn).await;
        });
        (format!("http://{addr}"), task)
    }

    #[tokio::test]
    async fn bytes_go_both_ways_and_the_port_answers_after_the_end_of_input() {
        let (base, task) = server(|conn| async move {
            let mut ws = tokio_tungstenite::accept_async(conn)
                .await
                .expect("upgrade");
            // What the client sends, up to its end of input (an empty message); then the
            // answer, then the server's close, as sandboxd does after a half-close.
            let mut got = Vec::new();
            while let Some(Ok(m)) = ws.next().await {
                match m {
                    Message::Binary(b) if b.is_empty() => break,
                    Message::Binary(b) => got.extend_from_slice(&b),
                    _ => {}
                }
            }
            assert_eq!(got, b"ping\x00");
            ws.send(Message::Binary(Bytes::from_static(b"pong")))
                .await
                .expect("answer");
            let _ = ws.close(None).await;
            while let Some(Ok(_)) = ws.next().await {}
        })
        .await;
        let client = Client::new(&base, "sbx_token");
        let mut socket = client.connect_port("s1", 3000).await.expect("connected");
        assert_eq!(socket.port(), 3000);
        socket.send(b"pi").await.expect("sent");
        socket.send(b"").await.expect("nothing sent");
        socket.send(b"ng\x00").await.expect("sent");
        socket.finish().await.expect("finished");
        socket.finish().await.expect("a second finish does nothing");
        assert!(socket.send(b"late").await.is_err());
        let mut answer = Vec::new();
        while let Some(chunk) = socket.recv().await {
            answer.extend_from_slice(&chunk.expect("bytes"));
        }
        assert_eq!(answer, b"pong");
        assert!(socket.recv().await.is_none());
        drop(socket);
        task.await.expect("the server ends");
    }

    #[tokio::test]
    async fn a_refusal_before_the_upgrade_is_the_servers_error() {
        let (base, task) = server(|mut conn| async move {
            let mut buf = vec![0u8; 4096];
            let _ = conn.read(&mut buf).await;
            let body = r#"{"code":"port_not_open","message":"Port 3000 of session 's1' is not open"}"#;
            let answer = format!(
                "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            conn.write_all(answer.as_bytes()).await.expect("answer");
        })
        .await;
        let refused = Client::new(&base, "sbx_token")
            .connect_port("s1", 3000)
            .await
            .expect_err("refused");
        assert_eq!(refused.code(), Some(&ErrorCode::PortNotOpen));
        assert_eq!(
            refused.to_string(),
            "port_not_open (404): Port 3000 of session 's1' is not open"
        );
        task.await.expect("the server ends");
    }
}

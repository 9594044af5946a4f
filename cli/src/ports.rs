//! Ports of a session's sandbox: `ports` lists them, and opens and closes them; `port-forward`
//! listens on local ports and carries each connection to a port in the sandbox, as
//! `kubectl port-forward` does for a pod.
//!
//! A port in the sandbox is reached through sandboxd, which makes the connection inside the
//! sandbox (a sandbox without network is reached too), once the session has opened it.
//! `port-forward` opens none by itself: it refuses to start on a port not open, naming the
//! command that opens it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use sandboxd_api::ErrorCode;
use sandboxd_api::client::{Client, ClientError};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{SignalKind, signal};

use crate::error::Error;
use crate::session::Target;

/// Bytes read from a local connection at a time.
const READ_CHUNK: usize = 64 * 1024;

/// How long to wait before accepting again after accepting failed (no file descriptor left…).
const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(200);

/// One `[LOCAL:]REMOTE` of `port-forward`: listen on `local` here, reach `remote` in the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    /// The local port; 0 is any free one, chosen when listening.
    pub local: u16,
    /// The port in the sandbox.
    pub remote: u16,
}

/// Parses `8080:3000` (local 8080 to remote 3000), `3000` (the same port here and there) and
/// `:3000` or `0:3000` (a free local port to remote 3000), as `kubectl port-forward` does.
pub fn parse_mapping(s: &str) -> Result<Mapping, String> {
    let port = |which: &str, p: &str| -> Result<u16, String> {
        p.parse::<u16>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("'{s}': the {which} port '{p}' is not a number from 1 to 65535"))
    };
    match s.split_once(':') {
        None if s.is_empty() => Err(
            "an empty port mapping: use REMOTE, LOCAL:REMOTE or :REMOTE (for example 3000, 8080:3000 or :3000)".to_owned(),
        ),
        None => {
            let remote = port("remote", s)?;
            Ok(Mapping {
                local: remote,
                remote,
            })
        }
        Some((_, remote)) if remote.contains(':') => Err(format!(
            "'{s}' is not a port mapping: use REMOTE, LOCAL:REMOTE or :REMOTE (for example 3000, 8080:3000 or :3000)"
        )),
        Some((local, remote)) => {
            let remote = port("remote", remote)?;
            let local = match local {
                "" | "0" => 0,
                l => port("local", l)?,
            };
            Ok(Mapping { local, remote })
        }
    }
}

/// Parses `--address`: an IP address, or `localhost` for 127.0.0.1.
pub fn parse_address(s: &str) -> Result<IpAddr, String> {
    if s == "localhost" {
        return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    s.parse().map_err(|_| {
        format!("'{s}' is not an IP address to listen on (for example 127.0.0.1, 0.0.0.0 or ::1)")
    })
}

/// What `ports` prints: one open port a line, or that none is.
pub fn listing(name: &str, ports: &[u16]) -> String {
    if ports.is_empty() {
        return format!("no port of session {name} is open\n");
    }
    ports.iter().map(|p| format!("{p}\n")).collect()
}

/// `ports`: opens the ports of `open`, closes those of `close`, then prints the open ones.
pub async fn ports(t: &Target, name: &str, open: &[u16], close: &[u16]) -> Result<(), Error> {
    if let Some(p) = open.iter().find(|p| close.contains(p)) {
        return Err(Error::Usage(format!(
            "port {p} is given to both --open and --close: give it to one"
        )));
    }
    let (client, id) = t.sandbox(name).await?;
    let mut now = None;
    for p in open {
        now = Some(client.open_port(&id, *p).await?);
    }
    for p in close {
        now = Some(client.close_port(&id, *p).await?);
    }
    let now = match now {
        Some(ports) => ports,
        None => client.ports(&id).await?,
    };
    print!("{}", listing(name, &now));
    Ok(())
}

/// `ports NAME --preview PORT`: a signed preview link to the open port, its URL on a line of
/// its own (for a browser, or a script), then until when it works.
pub async fn preview(t: &Target, name: &str, port: u16, seconds: Option<u64>) -> Result<(), Error> {
    let r = t.reach(name).await?;
    let client = Client::with_trust(&r.endpoint, &r.token, &r.trust);
    let link = client.preview(&r.id, port, seconds).await?;
    println!("{}{}", r.endpoint.trim_end_matches('/'), link.path);
    println!(
        "reaches port {port} of session {name} with no token until {}",
        link.expires_at
    );
    Ok(())
}

/// `mcp`: the URL of the session's MCP server, then a configuration an agent (Claude Code,
/// Cursor, any client of Streamable HTTP) takes as it is.
pub async fn mcp(t: &Target, name: &str, show_token: bool) -> Result<(), Error> {
    let r = t.reach(name).await?;
    print!("{}", mcp_text(name, &t.namespace, &r, show_token));
    Ok(())
}

/// What `mcp` prints.
pub fn mcp_text(
    name: &str,
    namespace: &str,
    r: &crate::session::Reach,
    show_token: bool,
) -> String {
    let url = format!(
        "{}/v1/sessions/{}/mcp",
        r.endpoint.trim_end_matches('/'),
        r.id
    );
    let bearer = if show_token {
        format!("Bearer {}", r.token)
    } else {
        "Bearer ${SANDBOX_TOKEN}".to_owned()
    };
    let config = serde_json::json!({
        "mcpServers": {
            format!("sandbox-{name}"): {
                "type": "http",
                "url": url,
                "headers": {"Authorization": bearer},
            }
        }
    });
    let mut out = format!(
        "MCP server of session {name}: {url}\n\n{}\n",
        serde_json::to_string_pretty(&config).unwrap_or_default()
    );
    if !show_token {
        out.push_str(&format!(
            "\nSANDBOX_TOKEN is the session token, in Secret {namespace}/{}:\n  export SANDBOX_TOKEN=\"$(kubectl get secret -n {namespace} {} -o jsonpath='{{.data.token}}' | base64 -d)\"\n(or run this command with --show-token to write it into the configuration)\n",
            r.secret, r.secret
        ));
    }
    out
}

/// `port-forward`: checks every remote port is open, listens on each local one, prints
/// `Forwarding from ADDRESS:PORT -> REMOTE` for each, then carries every connection until
/// interrupted (SIGINT or SIGTERM: exit status 0).
pub async fn forward(t: &Target, args: &crate::PortForwardArgs) -> Result<u8, Error> {
    let name = args.name.as_str();
    let (client, id) = t.sandbox(name).await?;
    let open = client.ports(&id).await?;
    let mut closed: Vec<u16> = args
        .mappings
        .iter()
        .map(|m| m.remote)
        .filter(|p| !open.contains(p))
        .collect();
    closed.sort_unstable();
    closed.dedup();
    if !closed.is_empty() {
        return Err(Error::PortsNotOpen {
            name: name.to_owned(),
            ports: closed,
        });
    }

    let mut listeners = Vec::with_capacity(args.mappings.len());
    for m in &args.mappings {
        let address = SocketAddr::new(args.address, m.local);
        let listen_error = |source| Error::Listen { address, source };
        let listener = TcpListener::bind(address).await.map_err(listen_error)?;
        let bound = listener.local_addr().map_err(listen_error)?;
        listeners.push((listener, bound, m.remote));
    }
    for (_, bound, remote) in &listeners {
        say(&format!("Forwarding from {bound} -> {remote}"));
    }

    let signals = |kind: SignalKind| {
        signal(kind).map_err(|source| Error::Local {
            path: "signal handler".into(),
            source,
        })
    };
    let mut interrupt = signals(SignalKind::interrupt())?;
    let mut terminate = signals(SignalKind::terminate())?;
    let sandbox = Arc::new(Sandbox {
        client,
        id,
        name: name.to_owned(),
    });
    let mut accepting = tokio::task::JoinSet::new();
    for (listener, bound, remote) in listeners {
        accepting.spawn(accept(listener, bound, remote, sandbox.clone()));
    }
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    Ok(0)
}

/// Prints one line on stdout now (a script reads it while the command runs).
fn say(line: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    // A closed stdout is no reason to stop forwarding.
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// The session whose ports are reached.
struct Sandbox {
    client: Client,
    id: String,
    name: String,
}

/// Accepts connections on `listener` (bound to `bound`) forever, each carried to `remote` on a
/// task of its own.
async fn accept(listener: TcpListener, bound: SocketAddr, remote: u16, sandbox: Arc<Sandbox>) {
    loop {
        match listener.accept().await {
            Ok((conn, _)) => {
                say(&format!("Handling connection for {}", bound.port()));
                let sandbox = sandbox.clone();
                tokio::spawn(async move {
                    if let Err(e) = sandbox.carry(conn, bound.port(), remote).await {
                        eprintln!("kubectl sandbox: {e}");
                    }
                });
            }
            Err(e) => {
                eprintln!("kubectl sandbox: accepting a connection on {bound} failed: {e}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

impl Sandbox {
    /// Carries one local connection to `remote` in the sandbox and back: the local end of input
    /// is passed on as the end of the port's input, and the port's answer is read until the port
    /// closes; then the local connection is closed.
    async fn carry(&self, mut conn: TcpStream, local: u16, remote: u16) -> Result<(), Error> {
        let socket = self
            .client
            .connect_port(&self.id, remote)
            .await
            .map_err(|source| Error::PortRefused {
                name: self.name.clone(),
                local,
                remote,
                source,
            })?;
        let (mut to_port, mut from_port) = socket.into_split();
        let (mut from_here, mut to_here) = conn.split();
        let up = async {
            let mut buf = vec![0u8; READ_CHUNK];
            loop {
                match from_here.read(&mut buf).await {
                    // The local program is done sending, or gone.
                    Ok(0) | Err(_) => break,
                    Ok(n) => to_port.send(&buf[..n]).await?,
                }
            }
            to_port.finish().await
        };
        let down = async {
            while let Some(bytes) = from_port.recv().await {
                if to_here.write_all(&bytes?).await.is_err() {
                    // The local program is gone: nothing more to carry.
                    return Ok(());
                }
            }
            let _ = to_here.shutdown().await;
            Ok::<(), ClientError>(())
        };
        tokio::pin!(up, down);
        let carried = tokio::select! {
            // The port closed: nothing sent from here can reach it any more.
            received = &mut down => received,
            // The local program is done sending: the port may still answer.
            sent = &mut up => {
                let received = down.await;
                received.and(sent)
            }
        };
        carried.map_err(|source| Error::PortBroke {
            name: self.name.clone(),
            local,
            remote,
            source,
        })
    }
}

/// The words added to a refused connection: how to open a port that is not.
pub fn refusal_hint(e: &ClientError, name: &str, remote: u16) -> Option<String> {
    (e.code() == Some(&ErrorCode::PortNotOpen))
        .then(|| format!("Open it from here with `kubectl sandbox ports {name} --open {remote}`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(local: u16, remote: u16) -> Mapping {
        Mapping { local, remote }
    }

    #[test]
    fn mappings_are_kubectl_port_forwards() {
        assert_eq!(parse_mapping("8080:3000"), Ok(mapping(8080, 3000)));
        assert_eq!(parse_mapping("3000"), Ok(mapping(3000, 3000)));
        assert_eq!(parse_mapping(":3000"), Ok(mapping(0, 3000)));
        assert_eq!(parse_mapping("0:3000"), Ok(mapping(0, 3000)));
        assert_eq!(parse_mapping("65535:1"), Ok(mapping(65535, 1)));
    }

    #[test]
    fn a_bad_mapping_says_what_is_wrong() {
        for (bad, why) in [
            (
                "",
                "an empty port mapping: use REMOTE, LOCAL:REMOTE or :REMOTE (for example 3000, 8080:3000 or :3000)",
            ),
            (
                "http",
                "'http': the remote port 'http' is not a number from 1 to 65535",
            ),
            (
                "0",
                "'0': the remote port '0' is not a number from 1 to 65535",
            ),
            (
                "8080:",
                "'8080:': the remote port '' is not a number from 1 to 65535",
            ),
            (
                "8080:70000",
                "'8080:70000': the remote port '70000' is not a number from 1 to 65535",
            ),
            (
                "-1:3000",
                "'-1:3000': the local port '-1' is not a number from 1 to 65535",
            ),
            (
                "1:2:3",
                "'1:2:3' is not a port mapping: use REMOTE, LOCAL:REMOTE or :REMOTE (for example 3000, 8080:3000 or :3000)",
            ),
        ] {
            assert_eq!(parse_mapping(bad), Err(why.to_owned()), "{bad:?}");
        }
    }

    #[test]
    fn the_address_is_an_ip_or_localhost() {
        assert_eq!(
            parse_address("localhost"),
            Ok(IpAddr::V4(Ipv4Addr::LOCALHOST))
        );
        assert_eq!(
            parse_address("0.0.0.0"),
            Ok(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
        );
        assert_eq!(
            parse_address("::1"),
            Ok(IpAddr::V6(std::net::Ipv6Addr::LOCALHOST))
        );
        assert_eq!(
            parse_address("example.com"),
            Err(
                "'example.com' is not an IP address to listen on (for example 127.0.0.1, 0.0.0.0 or ::1)"
                    .to_owned()
            )
        );
    }

    #[test]
    fn the_listing_is_one_port_a_line_or_says_none_is_open() {
        assert_eq!(listing("s1", &[]), "no port of session s1 is open\n");
        assert_eq!(listing("s1", &[3000, 8080]), "3000\n8080\n");
    }

    #[test]
    fn the_messages_name_the_command_that_opens_a_port() {
        let one = Error::PortsNotOpen {
            name: "s1".into(),
            ports: vec![3000],
        };
        assert_eq!(
            one.to_string(),
            "port 3000 of session s1 is not open: open it with `kubectl sandbox ports s1 --open 3000`"
        );
        let two = Error::PortsNotOpen {
            name: "s1".into(),
            ports: vec![3000, 4000],
        };
        assert_eq!(
            two.to_string(),
            "ports 3000 and 4000 of session s1 are not open: open them with `kubectl sandbox ports s1 --open 3000 --open 4000`"
        );
        let refused = Error::PortRefused {
            name: "s1".into(),
            local: 8080,
            remote: 3000,
            source: ClientError::Api {
                status: 404,
                code: ErrorCode::PortNotOpen,
                message: "Port 3000 of session 's1' is not open".into(),
            },
        };
        assert_eq!(
            refused.to_string(),
            "connection for 8080 to port 3000 of session s1 refused: port_not_open (404): Port 3000 of session 's1' is not open. Open it from here with `kubectl sandbox ports s1 --open 3000`"
        );
    }
}

//! Ports: a TCP connection to a port on the sandbox's loopback, made by the agent inside the
//! sandbox's network namespace and carried over its socket to sandboxd (see
//! [`crate::proto::Msg::PortConnect`]). Two threads copy the bytes, one each way; each passes
//! its side's end on as a half-close, so a request-then-response protocol ends cleanly.

use std::io::{self, Write};
use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use crate::pause::Tracked;
use crate::proto::{self, FrameError, Msg};
use crate::server::{error, spawn_thread};

/// How long a connect to the sandbox's own loopback may take: it answers at once or not at all
/// (a listener whose backlog is full).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects `conn` to `port` in the sandbox, or answers why not.
pub(crate) fn connect(
    port: u16,
    mut conn: UnixStream,
    tracked: &Arc<Tracked>,
) -> Result<(), FrameError> {
    if port == 0 {
        proto::write_msg(&mut conn, &error("bad_request", "port 0 is no port"))?;
        return Ok(());
    }
    let mut failures = Vec::new();
    let mut tcp = None;
    for addr in [
        SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        SocketAddr::from((Ipv6Addr::LOCALHOST, port)),
    ] {
        match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
            Ok(s) => {
                tcp = Some(s);
                break;
            }
            Err(e) => failures.push(format!("{addr}: {e}")),
        }
    }
    let Some(tcp) = tcp else {
        proto::write_msg(
            &mut conn,
            &error(
                "port_closed",
                format!(
                    "nothing in the sandbox answers on port {port} ({})",
                    failures.join("; ")
                ),
            ),
        )?;
        return Ok(());
    };
    let _ = tcp.set_nodelay(true);
    proto::write_msg(&mut conn, &Msg::PortConnected)?;
    conn.flush()?;
    let (mut from_port, mut to_port) = (tcp.try_clone()?, tcp);
    let (mut from_host, mut to_host) = (conn.try_clone()?, conn);
    // The inbound copy holds the connection too: a quiesce waits for it to let go.
    let held = tracked.clone();
    spawn_thread(move || {
        let _held = held;
        let _ = io::copy(&mut from_host, &mut to_port);
        let _ = to_port.shutdown(Shutdown::Write);
    });
    let _ = io::copy(&mut from_port, &mut to_host);
    let _ = to_host.shutdown(Shutdown::Write);
    Ok(())
}

//! The resolver of the egress network: every DNS query a sandbox sends (the firewall
//! redirects UDP and TCP port 53 here, whatever address it was sent to) is answered only for
//! names its policies allow. A denied name is answered `REFUSED` at once and never leaves the
//! node, whatever the query's type (so a TXT lookup cannot carry data out in the name); an
//! allowed one is forwarded to the upstream resolver as it came, but AAAA, answered empty
//! (the network carries no IPv6, so a client goes straight to IPv4).

use std::net::SocketAddr;
use std::sync::Arc;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::RecordType;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};
use tracing::{debug, warn};

use super::log::Verdict;
use super::resolve::Upstream;
use super::{Gate, Kind};

/// The port a query is logged under.
const DNS_PORT: u16 = 53;

/// The answer to one query (a DNS message), or `None` when it is not one (dropped).
pub async fn answer(
    gate: &Gate,
    upstream: &Upstream,
    peer: SocketAddr,
    query: &[u8],
) -> Option<Vec<u8>> {
    let message = Message::from_vec(query).ok()?;
    if message.metadata.message_type != MessageType::Query {
        return None;
    }
    let reply = |code: ResponseCode| {
        let mut m = Message::error_msg(message.metadata.id, message.metadata.op_code, code);
        m.metadata.recursion_desired = message.metadata.recursion_desired;
        m.metadata.recursion_available = true;
        m.add_queries(message.queries.clone());
        m.to_vec().ok()
    };
    // A message with no question or several is not what a stub resolver sends.
    let [question] = message.queries.as_slice() else {
        return reply(ResponseCode::FormErr);
    };
    let name = question.name().to_ascii();
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let Some(who) = gate.principal(peer.ip()).await else {
        debug!(%peer, %name, "a DNS query from an address of no session: refused");
        return reply(ResponseCode::Refused);
    };
    let policies = gate.policies(&who);
    let allowed = policies.allows_name(&name);
    gate.count(Kind::Query, &who.runtime, allowed);
    gate.log.record(
        &who,
        &name,
        DNS_PORT,
        if allowed {
            Verdict::Resolved
        } else {
            Verdict::Refused
        },
        0,
        0,
    );
    if !allowed {
        return reply(ResponseCode::Refused);
    }
    if question.query_type() == RecordType::AAAA {
        return reply(ResponseCode::NoError);
    }
    match upstream.forward(query).await {
        Ok(answer) => Some(answer),
        Err(e) => {
            warn!(%name, error = %e, "the upstream resolver failed an allowed query");
            reply(ResponseCode::ServFail)
        }
    }
}

/// Serves DNS over UDP on `socket` until the task is dropped.
pub async fn serve_udp(socket: UdpSocket, gate: Arc<Gate>, upstream: Arc<Upstream>) {
    let socket = Arc::new(socket);
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        let query = buf[..n].to_vec();
        // A sandbox with its cap of queries in flight loses this one, as a lost datagram.
        let Some(held) = gate.hold(peer.ip(), Kind::Query) else {
            continue;
        };
        let (socket, gate, upstream) = (socket.clone(), gate.clone(), upstream.clone());
        tokio::spawn(async move {
            let _held = held;
            if let Some(answer) = answer(&gate, &upstream, peer, &query).await {
                let _ = socket.send_to(&answer, peer).await;
            }
        });
    }
}

/// Serves DNS over TCP (two-byte length, then the message; several per connection) on
/// `listener` until the task is dropped.
pub async fn serve_tcp(listener: TcpListener, gate: Arc<Gate>, upstream: Arc<Upstream>) {
    loop {
        let Ok((mut stream, peer)) = listener.accept().await else {
            continue;
        };
        let Some(held) = gate.hold(peer.ip(), Kind::Query) else {
            continue;
        };
        let (gate, upstream) = (gate.clone(), upstream.clone());
        tokio::spawn(async move {
            let _held = held;
            loop {
                let read =
                    tokio::time::timeout(std::time::Duration::from_secs(10), stream.read_u16())
                        .await;
                let Ok(Ok(len)) = read else {
                    return;
                };
                let mut query = vec![0u8; usize::from(len)];
                if stream.read_exact(&mut query).await.is_err() {
                    return;
                }
                let Some(answer) = answer(&gate, &upstream, peer, &query).await else {
                    return;
                };
                let Ok(len) = u16::try_from(answer.len()) else {
                    return;
                };
                if stream.write_u16(len).await.is_err() || stream.write_all(&answer).await.is_err()
                {
                    return;
                }
            }
        });
    }
}

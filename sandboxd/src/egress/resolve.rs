//! The upstream resolver (`SANDBOXD_EGRESS_RESOLVER`): the [`dns`](super::dns) resolver
//! forwards the queries it allows to it, and the [`proxy`](super::proxy) resolves the names it
//! dials with it, keeping each answer for its TTL (at most a minute), so a name is asked once
//! however many connections go to it.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use tokio::net::UdpSocket;

/// How long an upstream answer is waited for.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(3);
/// The longest an answer is kept, whatever its TTL.
const MAX_TTL: Duration = Duration::from_secs(60);
/// Names kept at most; the cache is emptied when full.
const MAX_NAMES: usize = 4096;

/// Why a name did not resolve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The upstream resolver did not answer in time, or not at all.
    #[error("the resolver {0} did not answer")]
    Silent(SocketAddr),
    /// It answered with an error code (NXDOMAIN, SERVFAIL, …).
    #[error("the resolver {resolver} answered {code}")]
    Refused {
        /// The resolver.
        resolver: SocketAddr,
        /// Its response code.
        code: String,
    },
    /// It answered with no IPv4 address.
    #[error("the name has no IPv4 address")]
    NoAddress,
    /// The name is not a DNS name.
    #[error("'{0}' is not a DNS name")]
    BadName(String),
}

/// The upstream resolver and the answers it gave.
pub struct Upstream {
    addr: SocketAddr,
    cache: Mutex<HashMap<String, (Vec<Ipv4Addr>, Instant)>>,
}

impl Upstream {
    /// The resolver at `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            cache: Mutex::default(),
        }
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sends a query as it came (a DNS message) and returns the answer as it came, with the
    /// query's id.
    pub async fn forward(&self, query: &[u8]) -> Result<Vec<u8>, ResolveError> {
        let silent = || ResolveError::Silent(self.addr);
        let bind: SocketAddr = if self.addr.is_ipv4() {
            (Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let socket = UdpSocket::bind(bind).await.map_err(|_| silent())?;
        socket.connect(self.addr).await.map_err(|_| silent())?;
        socket.send(query).await.map_err(|_| silent())?;
        let mut buf = vec![0u8; 65_535];
        let deadline = tokio::time::Instant::now() + UPSTREAM_TIMEOUT;
        loop {
            let n = tokio::time::timeout_at(deadline, socket.recv(&mut buf))
                .await
                .map_err(|_| silent())?
                .map_err(|_| silent())?;
            // An answer to another query (a stray datagram) is not this one's.
            if n >= 2 && query.len() >= 2 && buf[..2] == query[..2] {
                buf.truncate(n);
                return Ok(buf);
            }
        }
    }

    /// The IPv4 addresses of `name`, from the cache while its answer is fresh.
    pub async fn lookup(&self, name: &str) -> Result<Vec<Ipv4Addr>, ResolveError> {
        let key = name.trim_end_matches('.').to_ascii_lowercase();
        if let Some((addrs, until)) = self.lock().get(&key)
            && *until > Instant::now()
        {
            return Ok(addrs.clone());
        }
        let fqdn =
            Name::from_ascii(format!("{key}.")).map_err(|_| ResolveError::BadName(key.clone()))?;
        let mut query = Message::new(rand::random(), MessageType::Query, OpCode::Query);
        query.metadata.recursion_desired = true;
        query.add_query(Query::query(fqdn, RecordType::A));
        let bytes = query
            .to_vec()
            .map_err(|_| ResolveError::BadName(key.clone()))?;
        let answer = self.forward(&bytes).await?;
        let answer = Message::from_vec(&answer).map_err(|_| ResolveError::Silent(self.addr))?;
        if answer.metadata.response_code != ResponseCode::NoError {
            return Err(ResolveError::Refused {
                resolver: self.addr,
                code: answer.metadata.response_code.to_string(),
            });
        }
        let mut ttl = MAX_TTL;
        let addrs: Vec<Ipv4Addr> = answer
            .answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::A(a) => {
                    ttl = ttl.min(Duration::from_secs(u64::from(r.ttl)));
                    Some(a.0)
                }
                _ => None,
            })
            .collect();
        if addrs.is_empty() {
            return Err(ResolveError::NoAddress);
        }
        let mut cache = self.lock();
        if cache.len() >= MAX_NAMES {
            cache.clear();
        }
        cache.insert(
            key,
            (
                addrs.clone(),
                Instant::now() + ttl.max(Duration::from_secs(1)),
            ),
        );
        Ok(addrs)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Vec<Ipv4Addr>, Instant)>> {
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The first nameserver of a `resolv.conf` text (the default upstream), port 53.
pub fn from_resolv_conf(text: &str) -> Option<SocketAddr> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.trim().parse::<std::net::IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_upstream_is_the_first_nameserver() {
        let text =
            "# made by hand\nsearch example\nnameserver 198.51.100.53\nnameserver 203.0.113.53\n";
        assert_eq!(
            from_resolv_conf(text),
            Some("198.51.100.53:53".parse().expect("an address"))
        );
        assert_eq!(from_resolv_conf("search only\n"), None);
    }
}

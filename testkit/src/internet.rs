//! A fake internet on this machine only, for the tests of egress policy: DNS, HTTP, HTTPS, TCP
//! echo and UDP servers (the `test-internet` binary) in a network namespace the test makes,
//! reached from the root namespace through a veth pair of its own.
//!
//! Its rules: every address is in the documentation ranges 198.51.100.0/24 (TEST-NET-2) and
//! 203.0.113.0/24 (TEST-NET-3), never 192.0.2.0/24 (this machine's uplink) nor any other; the
//! names are under `.test`; nothing off the machine is ever dialled (the servers only answer).
//!
//! Tests run in parallel processes, so an internet takes one of [`SLOTS`] slots: slot `k` is the
//! namespace `sbxinet<k>`, the veth `sbxi<k>r` (root side) / `sbxi<k>n` (namespace side) and the
//! sub-blocks `198.51.100.(32k)/27` and `203.0.113.(32k)/27`, routed in the root namespace
//! through that veth, so two internets never overlap. A slot is held with a lock on
//! `/run/sandboxd-test-internet/slot<k>.lock` for the life of the [`Internet`]; the kernel
//! releases it when the test process dies, and the next test to take the slot removes what the
//! dead one left (its processes, veth, routes and namespace) first.
//!
//! Addresses in slot `k`, with `a = 198.51.100.(32k)` and `b = 203.0.113.(32k)`:
//! `a+1/30` the root side of the veth, `a+2/30` its namespace side, `a+4` the DNS server (UDP and
//! TCP 53), `a+5 ..= a+30` the hosts in [`Range::TestNet2`], `b+1 ..= b+30` those in
//! [`Range::TestNet3`]. The hosts' addresses are on `lo` in the namespace.
//!
//! Every HTTP and HTTPS server answers any request with [`Internet::body`], but the path
//! `/bytes/N` with N zero bytes (`content-length: N`, streamed): a download of any size for a
//! benchmark ([`Internet::bytes_path`]).

use std::fs::{File, TryLockError};
use std::io::{self, BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};

use crate::pki::Ca;

/// How many internets can run at once on this machine (one per slot).
pub const SLOTS: u8 = 8;
/// Where the slots' locks and state (logs, certificates) are.
pub const STATE_DIR: &str = "/run/sandboxd-test-internet";
/// The first line `test-internet` prints on stdout once every server listens.
pub const READY: &str = "test-internet ready";
/// How long [`Internet::start`] waits for the servers to answer from the root namespace.
const READY_DEADLINE: Duration = Duration::from_secs(15);

/// The documentation range a host of the test internet is in: a test can allow one and deny
/// the other by CIDR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Range {
    /// 198.51.100.0/24 (TEST-NET-2); the DNS server is in it too.
    TestNet2,
    /// 203.0.113.0/24 (TEST-NET-3).
    TestNet3,
}

/// A host of the test internet: its name (under `.test`), its range and other names for it.
#[derive(Clone, Debug)]
pub struct Host {
    /// Its name, which the DNS server resolves to its address; also its servers' label.
    pub name: String,
    /// The range its address is taken from.
    pub range: Range,
    /// More names resolving to the same address.
    pub aliases: Vec<String>,
}

/// What an [`Internet`] serves.
#[derive(Clone, Debug)]
pub struct Spec {
    /// The hosts: each answers HTTP on [`Spec::http_port`], HTTPS on [`Spec::https_port`], TCP
    /// echo on each of [`Spec::echo_ports`] and logs UDP on each of [`Spec::udp_ports`].
    pub hosts: Vec<Host>,
    /// TXT records (name, text); every host name without one answers TXT `test internet: <name>`.
    pub txt: Vec<(String, String)>,
    /// The HTTP port of every host (`None`: no HTTP). Default 80.
    pub http_port: Option<u16>,
    /// The HTTPS port of every host (`None`: no HTTPS), with a certificate of the internet's CA
    /// for every host name and address. Default 443.
    pub https_port: Option<u16>,
    /// TCP ports where every host echoes what it receives.
    pub echo_ports: Vec<u16>,
    /// UDP ports where every host logs the datagrams it receives ([`Internet::udp_received`]).
    pub udp_ports: Vec<u16>,
    /// The `test-internet` binary; by default the one next to the running test's target folder
    /// ([`crate::process::bin`]).
    pub binary: Option<PathBuf>,
    /// Hosts whose HTTP and HTTPS servers demand a header: (host, header, file of its value).
    pub auth: Vec<(String, String, PathBuf)>,
}

impl Default for Spec {
    fn default() -> Self {
        Self {
            hosts: vec![],
            txt: vec![],
            http_port: Some(80),
            https_port: Some(443),
            echo_ports: vec![],
            udp_ports: vec![],
            binary: None,
            auth: vec![],
        }
    }
}

impl Spec {
    /// An internet with no host yet: HTTP on 80, HTTPS on 443, no echo, no UDP.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds host `name` (under `.test`) with an address in `range`.
    pub fn host(mut self, name: &str, range: Range) -> Self {
        self.hosts.push(Host {
            name: name.to_owned(),
            range,
            aliases: vec![],
        });
        self
    }

    /// Makes `alias` resolve to host `of`'s address. Panics when there is no host `of` yet.
    pub fn alias(mut self, alias: &str, of: &str) -> Self {
        let host = self
            .hosts
            .iter_mut()
            .find(|h| h.name == of)
            .unwrap_or_else(|| panic!("no host {of} to alias {alias} to"));
        host.aliases.push(alias.to_owned());
        self
    }

    /// Adds a TXT record `text` for `name`.
    pub fn txt(mut self, name: &str, text: &str) -> Self {
        self.txt.push((name.to_owned(), text.to_owned()));
        self
    }

    /// Adds a TCP echo port on every host.
    pub fn echo(mut self, port: u16) -> Self {
        self.echo_ports.push(port);
        self
    }

    /// Adds a UDP port on every host, logging what arrives.
    pub fn udp(mut self, port: u16) -> Self {
        self.udp_ports.push(port);
        self
    }

    /// Makes host `name`'s HTTP and HTTPS servers answer 200 only to a request that carries
    /// `header` exactly once, equal to the content of `file` (read at each request, a trailing
    /// newline trimmed); any other request gets `401` and `credential missing or wrong`.
    pub fn auth(mut self, name: &str, header: &str, file: impl Into<PathBuf>) -> Self {
        self.auth
            .push((name.to_owned(), header.to_owned(), file.into()));
        self
    }

    /// Runs `binary` as `test-internet`.
    pub fn binary(mut self, binary: impl Into<PathBuf>) -> Self {
        self.binary = Some(binary.into());
        self
    }
}

/// A DNS query the server received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsQuery {
    /// `udp` or `tcp`.
    pub transport: String,
    /// Who asked.
    pub from: SocketAddr,
    /// The name, lowercase, without the trailing dot.
    pub name: String,
    /// The record type (`A`, `AAAA`, `TXT`…).
    pub record_type: String,
}

/// A UDP datagram a host received on one of [`Spec::udp_ports`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Datagram {
    /// The host's address and port it arrived at.
    pub to: SocketAddr,
    /// Its sender.
    pub from: SocketAddr,
    /// Its length in bytes.
    pub len: usize,
}

/// A TCP connection a host accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connection {
    /// `http`, `https` or `echo`.
    pub service: String,
    /// The host's address and port.
    pub to: SocketAddr,
    /// The client.
    pub from: SocketAddr,
}

/// An HTTP request a host answered (over HTTP or HTTPS).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// `http` or `https`.
    pub scheme: String,
    /// The host's address and port.
    pub to: SocketAddr,
    /// The method.
    pub method: String,
    /// The Host header (empty when none).
    pub host: String,
    /// The path and query.
    pub path: String,
}

/// A running test internet: its namespace, veth, routes and `test-internet` process. Dropping
/// it removes them all (also when the test panics).
pub struct Internet {
    slot: Slot,
    dns: SocketAddr,
    /// Every name and its address.
    hosts: Vec<(String, Ipv4Addr)>,
    /// The hosts (their first names) and their addresses.
    servers: Vec<(String, Ipv4Addr)>,
    ca_pem: String,
    ca_file: PathBuf,
    http_port: Option<u16>,
    https_port: Option<u16>,
    child: Option<Child>,
    // Closed on drop, or by the kernel when the test dies: test-internet exits at its EOF.
    stdin: Option<ChildStdin>,
}

impl Internet {
    /// Takes a free slot, makes its namespace, veth, addresses and routes, starts
    /// `test-internet` in the namespace and waits until its DNS and HTTP servers answer from the
    /// root namespace. Needs root and `ip` (iproute2).
    pub fn start(spec: Spec) -> io::Result<Self> {
        check_names(&spec)?;
        let binary = match &spec.binary {
            Some(b) => b.clone(),
            None => crate::process::bin("test-internet")?,
        };
        let slot = Slot::take()?;
        let a = slot.base(Range::TestNet2);
        let dns = SocketAddr::V4(SocketAddrV4::new(add(a, 4), 53));
        let (mut next2, mut next3) = (5u8, 1u8);
        let mut hosts = vec![];
        let mut addrs = vec![];
        for host in &spec.hosts {
            let next = match host.range {
                Range::TestNet2 => &mut next2,
                Range::TestNet3 => &mut next3,
            };
            if *next > 30 {
                return Err(io::Error::other(format!(
                    "too many hosts in {:?}: {} does not fit",
                    host.range, host.name
                )));
            }
            let ip = add(slot.base(host.range), *next);
            *next += 1;
            addrs.push((host.name.clone(), ip));
            hosts.push((host.name.to_lowercase(), ip));
            hosts.extend(host.aliases.iter().map(|a| (a.to_lowercase(), ip)));
        }
        slot.plumb(
            &addrs
                .iter()
                .map(|(_, ip)| *ip)
                .chain([add(a, 4)])
                .collect::<Vec<_>>(),
        )?;

        let dir = &slot.dir;
        let ca = Ca::new("sandboxd test internet CA");
        let ca_file = dir.join("ca.crt");
        std::fs::write(&ca_file, &ca.pem)?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &slot.netns()])
            .arg(&binary)
            .arg("--dns")
            .arg(dns.to_string())
            .arg("--queries-log")
            .arg(dir.join("queries.log"))
            .arg("--udp-log")
            .arg(dir.join("udp.log"))
            .arg("--tcp-log")
            .arg(dir.join("tcp.log"))
            .arg("--http-log")
            .arg(dir.join("http.log"));
        for (name, ip) in &hosts {
            cmd.arg("--record").arg(format!("{name}={ip}"));
        }
        let mut txt: Vec<(String, String)> = spec
            .txt
            .iter()
            .map(|(n, t)| (n.to_lowercase(), t.clone()))
            .collect();
        for (name, _) in &hosts {
            if !txt.iter().any(|(n, _)| n == name) {
                txt.push((name.clone(), format!("test internet: {name}")));
            }
        }
        for (name, text) in &txt {
            cmd.arg("--txt").arg(format!("{name}={text}"));
        }
        if spec.https_port.is_some() {
            let mut sans: Vec<String> = hosts.iter().map(|(n, _)| n.clone()).collect();
            sans.extend(addrs.iter().map(|(_, ip)| ip.to_string()));
            let sans: Vec<&str> = sans.iter().map(String::as_str).collect();
            let leaf = ca.leaf(&sans, dir, "servers");
            cmd.arg("--cert")
                .arg(&leaf.cert)
                .arg("--key")
                .arg(&leaf.key);
        }
        for (name, header, file) in &spec.auth {
            cmd.arg("--auth")
                .arg(format!("{name}={header}={}", file.display()));
        }
        for (name, ip) in &addrs {
            if let Some(port) = spec.http_port {
                cmd.arg("--http").arg(format!("{ip}:{port}={name}"));
            }
            if let Some(port) = spec.https_port {
                cmd.arg("--https").arg(format!("{ip}:{port}={name}"));
            }
            for port in &spec.echo_ports {
                cmd.arg("--echo").arg(format!("{ip}:{port}"));
            }
            for port in &spec.udp_ports {
                cmd.arg("--udp").arg(format!("{ip}:{port}"));
            }
        }
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut child = cmd.spawn()?;
        let stdin = child.stdin.take();
        let mut internet = Self {
            slot,
            dns,
            hosts,
            servers: addrs.clone(),
            ca_pem: ca.pem.clone(),
            ca_file,
            http_port: spec.http_port,
            https_port: spec.https_port,
            child: Some(child),
            stdin,
        };
        internet.wait_ready(&addrs)?;
        Ok(internet)
    }

    /// Reads test-internet's first line, then asks its DNS server and connects to every HTTP
    /// server from the root namespace until they answer or [`READY_DEADLINE`] passes.
    fn wait_ready(&mut self, addrs: &[(String, Ipv4Addr)]) -> io::Result<()> {
        let out = self
            .child
            .as_mut()
            .and_then(|c| c.stdout.take())
            .ok_or_else(|| io::Error::other("test-internet has no stdout"))?;
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line)?;
        if line.trim() != READY {
            return Err(io::Error::other(format!(
                "test-internet did not start (its first line: {line:?}); see its standard error"
            )));
        }
        let end = Instant::now() + READY_DEADLINE;
        let mut last;
        loop {
            last = match self.answers(addrs) {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if Instant::now() >= end {
                return Err(io::Error::other(format!(
                    "the test internet did not answer from the root namespace within {READY_DEADLINE:?}: {last}"
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// One readiness check: the DNS server resolves the first host, every HTTP port accepts.
    fn answers(&self, addrs: &[(String, Ipv4Addr)]) -> io::Result<()> {
        if let Some((name, ip)) = addrs.first() {
            let got = resolve(self.dns, name, Duration::from_millis(500))?;
            if got != Some(*ip) {
                return Err(io::Error::other(format!("{name} resolved to {got:?}")));
            }
        }
        for (_, ip) in addrs {
            for port in [self.http_port, self.https_port].into_iter().flatten() {
                TcpStream::connect_timeout(&SocketAddr::from((*ip, port)), Duration::from_secs(1))?;
            }
        }
        Ok(())
    }

    /// The slot taken (0..[`SLOTS`]).
    pub fn slot(&self) -> u8 {
        self.slot.k
    }

    /// The network namespace's name (`sbxinet<k>`).
    pub fn netns(&self) -> String {
        self.slot.netns()
    }

    /// The root side of the veth (`sbxi<k>r`).
    pub fn link(&self) -> String {
        self.slot.root_link()
    }

    /// The root side's address of the veth (in the slot's TEST-NET-2 block): the source address
    /// of connections from the root namespace.
    pub fn root_addr(&self) -> Ipv4Addr {
        add(self.slot.base(Range::TestNet2), 1)
    }

    /// The slot's two blocks as CIDRs: `198.51.100.(32k)/27` and `203.0.113.(32k)/27`.
    pub fn blocks(&self) -> [String; 2] {
        [
            format!("{}/27", self.slot.base(Range::TestNet2)),
            format!("{}/27", self.slot.base(Range::TestNet3)),
        ]
    }

    /// The slot's block of `range` as a CIDR.
    pub fn block(&self, range: Range) -> String {
        format!("{}/27", self.slot.base(range))
    }

    /// The DNS server (UDP and TCP).
    pub fn dns(&self) -> SocketAddr {
        self.dns
    }

    /// The address `name` (a host or an alias, any case) resolves to.
    pub fn addr(&self, name: &str) -> Option<Ipv4Addr> {
        let name = name.trim_end_matches('.').to_lowercase();
        self.hosts
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, ip)| *ip)
    }

    /// Every name the DNS server knows and its address.
    pub fn names(&self) -> &[(String, Ipv4Addr)] {
        &self.hosts
    }

    /// `http://<address>:<port>/` of host `name`, when it and HTTP exist.
    pub fn http_url(&self, name: &str) -> Option<String> {
        Some(format!("http://{}:{}/", self.addr(name)?, self.http_port?))
    }

    /// The body every HTTP and HTTPS server of host `name` (or an alias of it) answers with:
    /// `hello from <host> (<address>)` and a newline (to any path but
    /// [`Internet::bytes_path`]'s).
    pub fn body(&self, name: &str) -> Option<String> {
        let ip = self.addr(name)?;
        let (host, _) = self.servers.iter().find(|(_, a)| *a == ip)?;
        Some(format!("hello from {host} ({ip})\n"))
    }

    /// The path whose GET every HTTP and HTTPS server answers with `n` zero bytes
    /// (`/bytes/<n>`, with `content-length: <n>`), streamed without holding them.
    pub fn bytes_path(n: u64) -> String {
        format!("/bytes/{n}")
    }

    /// The test CA that signed the HTTPS servers' certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The file of [`Internet::ca_pem`], for a client's or sandboxd's upstream trust.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// The DNS queries received so far, in order.
    pub fn queries(&self) -> Vec<DnsQuery> {
        self.log("queries.log", |f| {
            Some(DnsQuery {
                transport: f.first()?.to_string(),
                from: f.get(1)?.parse().ok()?,
                name: f.get(2)?.to_string(),
                record_type: f.get(3)?.to_string(),
            })
        })
    }

    /// Whether a query for `name` (any type) arrived.
    pub fn queried(&self, name: &str) -> bool {
        let name = name.trim_end_matches('.').to_lowercase();
        self.queries().iter().any(|q| q.name == name)
    }

    /// The UDP datagrams received so far on [`Spec::udp_ports`].
    pub fn udp_received(&self) -> Vec<Datagram> {
        self.log("udp.log", |f| {
            Some(Datagram {
                to: f.first()?.parse().ok()?,
                from: f.get(1)?.parse().ok()?,
                len: f.get(2)?.parse().ok()?,
            })
        })
    }

    /// The TCP connections the hosts accepted so far (HTTP, HTTPS, echo).
    pub fn connections(&self) -> Vec<Connection> {
        self.log("tcp.log", |f| {
            Some(Connection {
                service: f.first()?.to_string(),
                to: f.get(1)?.parse().ok()?,
                from: f.get(2)?.parse().ok()?,
            })
        })
    }

    /// The HTTP requests the hosts answered so far.
    pub fn requests(&self) -> Vec<Request> {
        self.log("http.log", |f| {
            Some(Request {
                scheme: f.first()?.to_string(),
                to: f.get(1)?.parse().ok()?,
                method: f.get(2)?.to_string(),
                host: f.get(3)?.to_string(),
                path: f.get(4)?.to_string(),
            })
        })
    }

    /// The lines of log `file` (tab-separated fields), parsed by `parse`; a line being written
    /// or unparsable is left out.
    fn log<T>(&self, file: &str, parse: impl Fn(&[&str]) -> Option<T>) -> Vec<T> {
        let text = std::fs::read_to_string(self.slot.dir.join(file)).unwrap_or_default();
        text.lines()
            .filter_map(|l| parse(&l.split('\t').collect::<Vec<_>>()))
            .collect()
    }

    /// The id of the `test-internet` process.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for Internet {
    fn drop(&mut self) {
        drop(self.stdin.take());
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // The slot's own drop removes the rest.
    }
}

/// Asks `dns` over UDP for the A record of `name`: its first address, `None` for NXDOMAIN or
/// no A record.
pub fn resolve(dns: SocketAddr, name: &str, timeout: Duration) -> io::Result<Option<Ipv4Addr>> {
    let answer = ask_udp(dns, name, RecordType::A, timeout)?;
    if answer.metadata.response_code == ResponseCode::NXDomain {
        return Ok(None);
    }
    Ok(answer.answers.iter().find_map(|r| match &r.data {
        RData::A(a) => Some(a.0),
        _ => None,
    }))
}

/// Sends one DNS query (`name`, `record_type`, recursion desired) to `dns` over UDP and returns
/// the answer with the query's id.
pub fn ask_udp(
    dns: SocketAddr,
    name: &str,
    record_type: RecordType,
    timeout: Duration,
) -> io::Result<Message> {
    let name = Name::from_ascii(name).map_err(io::Error::other)?;
    let mut query = Message::query();
    query.metadata.recursion_desired = true;
    query.add_query(Query::query(name, record_type));
    let bytes = query.to_vec().map_err(io::Error::other)?;
    let socket = UdpSocket::bind("0.0.0.0:0")?;
    socket.set_read_timeout(Some(timeout))?;
    socket.connect(dns)?;
    socket.send(&bytes)?;
    let mut buf = [0u8; 4096];
    loop {
        let n = socket.recv(&mut buf)?;
        let answer = Message::from_vec(&buf[..n]).map_err(io::Error::other)?;
        if answer.metadata.id == query.metadata.id {
            return Ok(answer);
        }
    }
}

/// The rules of names: under `.test`, at least one host.
fn check_names(spec: &Spec) -> io::Result<()> {
    let names = spec
        .hosts
        .iter()
        .flat_map(|h| std::iter::once(&h.name).chain(&h.aliases))
        .chain(spec.txt.iter().map(|(n, _)| n));
    for name in names {
        let lower = name.trim_end_matches('.').to_lowercase();
        if !(lower.ends_with(".test") || lower == "test") {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name}: the test internet's names are under .test"),
            ));
        }
    }
    Ok(())
}

/// `base` + `n` (no overflow in a slot's /27).
fn add(base: Ipv4Addr, n: u8) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(base) + u32::from(n))
}

/// Runs `ip ARGS`; an error with ip's own words when it fails.
fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("ip (iproute2): {e}")))?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// A slot held (its lock file locked) and what is made in it; dropping it removes them.
struct Slot {
    k: u8,
    /// The slot's state: logs, certificates.
    dir: PathBuf,
    _lock: File,
}

impl Slot {
    /// Locks the first free slot and removes what a dead holder left in it.
    fn take() -> io::Result<Self> {
        std::fs::create_dir_all(STATE_DIR)?;
        for k in 0..SLOTS {
            let lock = File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(Path::new(STATE_DIR).join(format!("slot{k}.lock")))?;
            match lock.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => continue,
                Err(TryLockError::Error(e)) => return Err(e),
            }
            let slot = Self {
                k,
                dir: Path::new(STATE_DIR).join(format!("slot{k}")),
                _lock: lock,
            };
            // A holder that died (kill -9) left its namespace, veth and process: gone now.
            slot.clear();
            std::fs::create_dir_all(&slot.dir)?;
            let mut pid = File::create(slot.dir.join("owner.pid"))?;
            writeln!(pid, "{}", std::process::id())?;
            return Ok(slot);
        }
        Err(io::Error::new(
            io::ErrorKind::ResourceBusy,
            format!("all {SLOTS} test internet slots are taken (locks in {STATE_DIR})"),
        ))
    }

    fn netns(&self) -> String {
        format!("sbxinet{}", self.k)
    }

    fn root_link(&self) -> String {
        format!("sbxi{}r", self.k)
    }

    fn ns_link(&self) -> String {
        format!("sbxi{}n", self.k)
    }

    /// The first address of the slot's block in `range`.
    fn base(&self, range: Range) -> Ipv4Addr {
        let [a, b, c] = match range {
            Range::TestNet2 => [198, 51, 100],
            Range::TestNet3 => [203, 0, 113],
        };
        Ipv4Addr::new(a, b, c, 32 * self.k)
    }

    /// Makes the namespace, the veth and its addresses, `servers` on the namespace's `lo`, its
    /// default route back through the veth (for answers), and the root namespace's routes to
    /// the slot's two blocks.
    fn plumb(&self, servers: &[Ipv4Addr]) -> io::Result<()> {
        let (ns, root, peer) = (self.netns(), self.root_link(), self.ns_link());
        let a = self.base(Range::TestNet2);
        let (root_ip, ns_ip) = (format!("{}/30", add(a, 1)), format!("{}/30", add(a, 2)));
        let gateway = add(a, 2).to_string();
        ip(&["netns", "add", &ns])?;
        ip(&[
            "link", "add", &root, "type", "veth", "peer", "name", &peer, "netns", &ns,
        ])?;
        ip(&["addr", "add", &root_ip, "dev", &root])?;
        ip(&["link", "set", &root, "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        ip(&["-n", &ns, "addr", "add", &ns_ip, "dev", &peer])?;
        ip(&["-n", &ns, "link", "set", &peer, "up"])?;
        ip(&[
            "-n",
            &ns,
            "route",
            "add",
            "default",
            "via",
            &add(a, 1).to_string(),
        ])?;
        for server in servers {
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{server}/32"),
                "dev",
                "lo",
            ])?;
        }
        for range in [Range::TestNet2, Range::TestNet3] {
            let block = format!("{}/27", self.base(range));
            ip(&["route", "add", &block, "via", &gateway, "dev", &root])?;
        }
        Ok(())
    }

    /// Removes what is in the slot, best effort: the processes in its namespace, the root
    /// routes, the veth, the namespace, the state folder.
    fn clear(&self) {
        let ns = self.netns();
        // Only processes in another network namespace than this one: a namespace file that
        // is not (or no longer) a namespace of its own never takes the test down with it.
        let own = std::fs::read_link("/proc/self/ns/net").ok();
        if let Ok(out) = Command::new("ip").args(["netns", "pids", &ns]).output() {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let Ok(pid) = pid.parse::<u32>() else {
                    continue;
                };
                let theirs = std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
                if theirs.is_some() && theirs != own && pid != std::process::id() {
                    let _ = crate::process::signal(pid, "KILL");
                    let deadline = Instant::now() + Duration::from_secs(2);
                    while !crate::process::is_dead(pid) && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            }
        }
        for range in [Range::TestNet2, Range::TestNet3] {
            let block = format!("{}/27", self.base(range));
            let _ = ip(&["route", "del", &block, "dev", &self.root_link()]);
        }
        let _ = ip(&["link", "del", &self.root_link()]);
        let _ = ip(&["netns", "del", &ns]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.clear();
        // The lock is released when the file closes, after this.
    }
}

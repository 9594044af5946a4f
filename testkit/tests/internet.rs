//! The test internet's own test: an [`Internet`] started in a namespace of its own answers DNS
//! (UDP and TCP), HTTP, HTTPS (verified against its CA), TCP echo and logs UDP, from the root
//! namespace; its logs show what arrived; dropping it removes its namespace, veth and routes.
//!
//! It needs root and `ip` (iproute2): without them it is skipped with a note, unless `CI=true`,
//! where it fails.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use sandboxd_testkit::internet::{Internet, Range, Spec};

const TIMEOUT: Duration = Duration::from_secs(5);

/// The tests of this file one at a time: the slot test counts on taking the slot it freed.
static SERIAL: Mutex<()> = Mutex::new(());

/// Whether this test can run here: root and `ip`. Fails under `CI=true` when it cannot.
fn runnable() -> bool {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|u| u.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false);
    let ip = Command::new("ip")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if root && ip {
        return true;
    }
    let why = format!("the test internet needs root ({root}) and ip from iproute2 ({ip})");
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
    eprintln!("skipped: {why}");
    false
}

fn spec() -> Spec {
    Spec::new()
        .binary(env!("CARGO_BIN_EXE_test-internet"))
        .host("allowed.test", Range::TestNet2)
        .alias("www.allowed.test", "allowed.test")
        .host("denied.test", Range::TestNet3)
        .txt("allowed.test", "v=allowed")
        .echo(7)
        .udp(443)
}

/// A DNS query for `name`/`record_type` built with hickory-proto, over UDP.
fn ask(dns: SocketAddr, name: &str, record_type: RecordType) -> Message {
    let mut query = Message::query();
    query.metadata.recursion_desired = true;
    query.add_query(Query::query(
        Name::from_ascii(name).expect("a name"),
        record_type,
    ));
    let socket = UdpSocket::bind("0.0.0.0:0").expect("a UDP socket");
    socket.set_read_timeout(Some(TIMEOUT)).expect("a timeout");
    socket
        .send_to(&query.to_vec().expect("a query"), dns)
        .expect("send the query");
    let mut buf = [0u8; 4096];
    let (n, _) = socket.recv_from(&mut buf).expect("an answer");
    let answer = Message::from_vec(&buf[..n]).expect("a DNS message");
    assert_eq!(answer.metadata.id, query.metadata.id);
    answer
}

/// The same over TCP (length-prefixed).
fn ask_tcp(dns: SocketAddr, name: &str, record_type: RecordType) -> Message {
    let mut query = Message::query();
    query.add_query(Query::query(
        Name::from_ascii(name).expect("a name"),
        record_type,
    ));
    let bytes = query.to_vec().expect("a query");
    let mut s = TcpStream::connect_timeout(&dns, TIMEOUT).expect("connect to DNS over TCP");
    s.set_read_timeout(Some(TIMEOUT)).expect("a timeout");
    let len = u16::try_from(bytes.len()).expect("a short query");
    s.write_all(&len.to_be_bytes()).expect("write");
    s.write_all(&bytes).expect("write");
    let mut len = [0u8; 2];
    s.read_exact(&mut len).expect("the answer's length");
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut buf).expect("the answer");
    Message::from_vec(&buf).expect("a DNS message")
}

/// The A addresses of an answer.
fn addresses(answer: &Message) -> Vec<std::net::Ipv4Addr> {
    answer
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect()
}

/// A GET of `/` with `Host: host` over `stream`: the response, whole.
fn get(mut stream: impl Read + Write, host: &str) -> String {
    write!(
        stream,
        "GET /hello HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .expect("send the request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("the response");
    response
}

/// The slot's plumbing as `ip` shows it in the root namespace: (netns listed, link exists,
/// routes through the link).
fn plumbing(internet_netns: &str, link: &str) -> (bool, bool, String) {
    let text = |args: &[&str]| {
        Command::new("ip")
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    let netns = text(&["netns", "list"])
        .lines()
        .any(|l| l.split_whitespace().next() == Some(internet_netns));
    let link_exists = Command::new("ip")
        .args(["link", "show", link])
        .output()
        .is_ok_and(|o| o.status.success());
    let routes = text(&["route", "show"])
        .lines()
        .filter(|l| l.contains(&format!("dev {link}")))
        .collect::<Vec<_>>()
        .join("\n");
    (netns, link_exists, routes)
}

#[test]
fn serves_dns_http_https_echo_and_udp_then_cleans_up() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !runnable() {
        return;
    }
    let internet = Internet::start(spec()).expect("start the test internet");
    let (netns, link) = (internet.netns(), internet.link());
    let allowed = internet
        .addr("allowed.test")
        .expect("allowed.test's address");
    let denied = internet.addr("denied.test").expect("denied.test's address");
    let [block2, block3] = internet.blocks();
    assert!(allowed.to_string().starts_with("198.51.100."), "{allowed}");
    assert!(denied.to_string().starts_with("203.0.113."), "{denied}");
    assert!(internet.dns().ip().to_string().starts_with("198.51.100."));
    assert!(internet.root_addr().to_string().starts_with("198.51.100."));
    let (ns_listed, link_exists, routes) = plumbing(&netns, &link);
    assert!(ns_listed && link_exists, "{netns} and {link} exist");
    assert!(
        routes.contains(&block2) && routes.contains(&block3),
        "routes to {block2} and {block3} via {link}: {routes}"
    );

    // DNS over UDP: A of a host and an alias, TXT, NXDOMAIN, no data.
    let a = ask(internet.dns(), "allowed.test.", RecordType::A);
    assert_eq!(a.metadata.response_code, ResponseCode::NoError);
    assert_eq!(addresses(&a), vec![allowed]);
    let alias = ask(internet.dns(), "WWW.Allowed.test.", RecordType::A);
    assert_eq!(addresses(&alias), vec![allowed]);
    let txt = ask(internet.dns(), "allowed.test.", RecordType::TXT);
    let texts: Vec<String> = txt
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::TXT(t) => Some(t.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(texts, vec!["v=allowed".to_owned()]);
    let unknown = ask(internet.dns(), "nowhere.test.", RecordType::A);
    assert_eq!(unknown.metadata.response_code, ResponseCode::NXDomain);
    let aaaa = ask(internet.dns(), "denied.test.", RecordType::AAAA);
    assert_eq!(aaaa.metadata.response_code, ResponseCode::NoError);
    assert!(aaaa.answers.is_empty());
    // And over TCP.
    let tcp = ask_tcp(internet.dns(), "denied.test.", RecordType::A);
    assert_eq!(addresses(&tcp), vec![denied]);

    // The queries log: each query, in order, with its type and transport.
    let queries = internet.queries();
    let seen: Vec<(&str, &str, &str)> = queries
        .iter()
        .map(|q| {
            (
                q.transport.as_str(),
                q.name.as_str(),
                q.record_type.as_str(),
            )
        })
        .collect();
    assert!(
        seen.contains(&("udp", "allowed.test", "A")),
        "queries: {seen:?}"
    );
    assert!(seen.contains(&("udp", "www.allowed.test", "A")));
    assert!(seen.contains(&("udp", "allowed.test", "TXT")));
    assert!(seen.contains(&("udp", "nowhere.test", "A")));
    assert!(seen.contains(&("tcp", "denied.test", "A")));
    assert!(internet.queried("nowhere.test"));
    assert!(!internet.queried("never-asked.test"));

    // HTTP from the root namespace.
    let http = TcpStream::connect_timeout(&(allowed, 80).into(), TIMEOUT).expect("connect :80");
    http.set_read_timeout(Some(TIMEOUT)).expect("a timeout");
    let response = get(http, "allowed.test");
    let body = internet.body("allowed.test").expect("a body");
    assert_eq!(body, format!("hello from allowed.test ({allowed})\n"));
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.ends_with(&body), "{response}");
    let response = get(
        TcpStream::connect_timeout(&(denied, 80).into(), TIMEOUT).expect("connect :80"),
        "denied.test",
    );
    assert!(
        response.ends_with(&format!("hello from denied.test ({denied})\n")),
        "{response}"
    );

    // /bytes/N: N zeros with their content-length, streamed (the benchmarks' downloads).
    let n: usize = 3 * 1024 * 1024 + 5;
    let mut zeros =
        TcpStream::connect_timeout(&(allowed, 80).into(), TIMEOUT).expect("connect :80");
    zeros.set_read_timeout(Some(TIMEOUT)).expect("a timeout");
    write!(
        zeros,
        "GET {} HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n",
        Internet::bytes_path(n as u64)
    )
    .expect("send the request");
    let mut response = Vec::new();
    zeros.read_to_end(&mut response).expect("the response");
    let end = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head");
    let head = String::from_utf8_lossy(&response[..end]).to_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains(&format!("content-length: {n}")), "{head}");
    let zeros = &response[end + 4..];
    assert_eq!(zeros.len(), n, "{head}");
    assert!(zeros.iter().all(|b| *b == 0));

    // HTTPS, verified against the internet's CA, for the name.
    let ca = CertificateDer::from_pem_slice(internet.ca_pem().as_bytes()).expect("the CA");
    let ca_file = std::fs::read_to_string(internet.ca_file()).expect("the CA file");
    assert_eq!(ca_file, internet.ca_pem());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca).expect("add the CA");
    let config = rustls::ClientConfig::builder_with_provider(
        rustls::crypto::ring::default_provider().into(),
    )
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tls = rustls::ClientConnection::new(
        Arc::new(config),
        ServerName::try_from("allowed.test").expect("a server name"),
    )
    .expect("a TLS client");
    let tcp = TcpStream::connect_timeout(&(allowed, 443).into(), TIMEOUT).expect("connect :443");
    tcp.set_read_timeout(Some(TIMEOUT)).expect("a timeout");
    let response = get(rustls::StreamOwned::new(tls, tcp), "allowed.test");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.ends_with(&body), "{response}");

    // The requests and connections logs.
    let requests = internet.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.scheme == "https" && r.host == "allowed.test" && r.path == "/hello"),
        "{requests:?}"
    );
    let connections = internet.connections();
    assert!(
        connections
            .iter()
            .any(|c| c.service == "https" && c.to == (allowed, 443).into()),
        "{connections:?}"
    );
    assert!(
        connections
            .iter()
            .all(|c| c.from.ip() == internet.root_addr()),
        "clients of the root namespace come from the veth's address: {connections:?}"
    );

    // TCP echo.
    let mut echo = TcpStream::connect_timeout(&(denied, 7).into(), TIMEOUT).expect("connect :7");
    echo.set_read_timeout(Some(TIMEOUT)).expect("a timeout");
    echo.write_all(b"ping").expect("write");
    let mut pong = [0u8; 4];
    echo.read_exact(&mut pong).expect("the echo");
    assert_eq!(&pong, b"ping");

    // UDP: logged where it arrived; nothing at the other host.
    assert!(internet.udp_received().is_empty());
    let udp = UdpSocket::bind("0.0.0.0:0").expect("a UDP socket");
    udp.send_to(b"quic?", (allowed, 443)).expect("send");
    let received = sandboxd_testkit::poll::poll::<Option<Vec<_>>>(
        TIMEOUT,
        Duration::from_millis(50),
        async || Some(internet.udp_received()).filter(|d| !d.is_empty()),
    );
    let received = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime")
        .block_on(received)
        .expect("the datagram logged");
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!(received[0].to, (allowed, 443).into());
    assert_eq!(received[0].len, 5);

    drop(internet);
    let (ns_listed, link_exists, routes) = plumbing(&netns, &link);
    assert!(!ns_listed, "{netns} is gone");
    assert!(!link_exists, "{link} is gone");
    assert!(routes.is_empty(), "no routes via {link}: {routes}");
}

#[test]
fn names_outside_test_are_refused() {
    let err = Internet::start(Spec::new().host("example.com", Range::TestNet2))
        .err()
        .expect("refused");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
}

#[test]
fn parallel_internets_take_other_slots_and_a_stale_slot_is_reclaimed() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !runnable() {
        return;
    }
    let one = Internet::start(spec()).expect("one");
    let two = Internet::start(spec()).expect("two");
    assert_ne!(one.slot(), two.slot());
    assert_ne!(one.addr("allowed.test"), two.addr("allowed.test"));
    assert_ne!(one.blocks(), two.blocks());
    // What a test killed with -9 leaves: its lock released by the kernel, but its namespace,
    // veth and a process in the namespace still there. Made by hand in `two`'s slot once free.
    let slot = two.slot();
    drop(two);
    let ns = format!("sbxinet{slot}");
    let link = format!("sbxi{slot}r");
    let ok = |args: &[&str]| {
        Command::new("ip")
            .args(args)
            .status()
            .is_ok_and(|s| s.success())
    };
    assert!(ok(&["netns", "add", &ns]));
    let peer = format!("sbxi{slot}n");
    assert!(ok(&[
        "link", "add", &link, "type", "veth", "peer", "name", &peer, "netns", &ns
    ]));
    let mut orphan = Command::new("ip")
        .args(["netns", "exec", &ns, "sleep", "600"])
        .spawn()
        .expect("a process in the stale namespace");
    // It is in the namespace once `ip netns pids` lists it (ip enters it, then runs sleep).
    let listed = std::time::Instant::now();
    while !Command::new("ip")
        .args(["netns", "pids", &ns])
        .output()
        .is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .any(|p| p == orphan.id().to_string())
        })
    {
        assert!(
            listed.elapsed() < Duration::from_secs(5),
            "the process entered the stale namespace"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let three = Internet::start(spec()).expect("a stale slot is taken again");
    assert_eq!(three.slot(), slot);
    let dns = three.dns();
    let answer = ask(dns, "allowed.test.", RecordType::A);
    assert_eq!(
        addresses(&answer),
        vec![three.addr("allowed.test").expect("an address")]
    );
    assert!(
        sandboxd_testkit::process::is_dead(orphan.id()),
        "the stale slot's process was killed"
    );
    let _ = orphan.kill();
    let _ = orphan.wait();
    drop(one);
}

#[test]
fn a_container_of_the_tools_image_reaches_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !runnable() {
        return;
    }
    let image = sandboxd_testkit::tools_image();
    let internet = Internet::start(spec()).expect("start the test internet");
    let dns = internet.dns().ip().to_string();
    let ca = format!("{}:/test-ca.crt:ro", internet.ca_file().display());
    // On dockerd's default bridge (masqueraded to the veth's address): dig, curl over HTTP and
    // HTTPS (the test CA), python's urllib.
    let script = "dig +short allowed.test A \
        && curl -fsS http://allowed.test/ \
        && curl -fsS --cacert /test-ca.crt https://allowed.test/ \
        && python3 -c 'import urllib.request; print(urllib.request.urlopen(\"http://denied.test/\").read().decode(), end=\"\")'";
    let out = Command::new("docker")
        .args([
            "run", "--rm", "--dns", &dns, "-v", &ca, &image, "sh", "-c", script,
        ])
        .output()
        .expect("docker run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let allowed = internet.addr("allowed.test").expect("an address");
    let expected = format!(
        "{allowed}\n{body}{body}{denied}",
        body = internet.body("allowed.test").expect("a body"),
        denied = internet.body("denied.test").expect("a body"),
    );
    assert_eq!(stdout, expected);
    assert!(internet.queried("allowed.test") && internet.queried("denied.test"));
}

//! Sandboxes with network, against the real dockerd and the node's real iptables: they get a
//! network of sandboxd's own, where they reach neither each other, nor sandboxd's port, nor
//! the node; a node that cannot fence the network in refuses to start or to open them.
//!
//! The tests dial only 127.0.0.1, this machine's side of the network sandboxd made, and the
//! test's own containers; nothing leaves the machine.

mod common;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use common::{Daemon, base_image};
use sandboxd_api::client::{Client, ClientError};

/// The port A's listener takes inside its sandbox.
const PORT: u16 = 7070;

/// Held by the tests that compare a sandboxd's whole rule set over time, and by the one that
/// gives the node an address (which every sandboxd's firewall then denies): they run one at
/// a time.
static NODE_RULES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A catalog with a runtime without network (`base`, the default) and one with (`net`).
fn runtimes() -> String {
    let image = base_image();
    format!(
        r#"[{{"alias": "base", "image": "{image}"}}, {{"alias": "net", "image": "{image}", "needs_network": true}}]"#
    )
}

/// A sandboxd listening on every address of the machine (so a sandbox that reached the node
/// would find it), dialled by the tests on 127.0.0.1.
fn daemon(extra: &[(&str, &str)]) -> Daemon {
    let runtimes = runtimes();
    let mut env = vec![
        ("SANDBOXD_RUNTIMES", runtimes.as_str()),
        ("SANDBOXD_HOST", "0.0.0.0"),
    ];
    env.extend_from_slice(extra);
    let mut d = Daemon::start(&env);
    d.base = d.base.replace("0.0.0.0", "127.0.0.1");
    d
}

fn network_name(d: &Daemon) -> String {
    format!("sandboxd-{}-net", d.instance)
}

fn docker_json(args: &[&str]) -> serde_json::Value {
    let out = Command::new("docker")
        .args(args)
        .output()
        .expect("docker runs");
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("docker prints JSON");
    v[0].clone()
}

fn iptables(args: &[&str]) -> String {
    let out = Command::new("iptables")
        .args(args)
        .output()
        .expect("iptables runs (the node must have it)");
    assert!(
        out.status.success(),
        "iptables {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn port_of(d: &Daemon) -> u16 {
    d.base
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port in the base URL")
}

async fn open(d: &Daemon, name: &str, tenant: &str, runtime: &str) -> Client {
    let opened = d
        .admin()
        .open(name, tenant, Some(runtime), None)
        .await
        .unwrap_or_else(|e| panic!("open {name}: {e}"));
    d.client(opened.token.as_deref().expect("a token on create"))
}

/// Dials `host:port` once from inside `session`, sending `message`, and asserts that the
/// connection fails (`what` says who must not be reached).
async fn cannot_reach(c: &Client, session: &str, host: &str, port: u16, message: &str, what: &str) {
    let out = c
        .run(session, &dial(host, port, message, 1), Some(30), None, None)
        .await
        .expect("the run");
    assert_eq!(out.exit_code, 1, "{what}: {out:?}");
    assert!(out.stdout.starts_with("failed: "), "{what}: {out:?}");
}

/// A shell command that connects to `host:port` (each try waits at most 3 s, `tries` tries
/// 200 ms apart), sends `message` and prints `connected: <answer>`, or prints
/// `failed: <error>` and exits 1.
fn dial(host: &str, port: u16, message: &str, tries: u32) -> String {
    format!(
        r#"perl -MIO::Socket::INET -e 'my ($h, $p, $m, $n) = @ARGV; my $err; for (1 .. $n) {{ my $c = IO::Socket::INET->new(PeerAddr => $h, PeerPort => $p, Proto => "tcp", Timeout => 3); if ($c) {{ print $c "$m\n"; my $r = <$c>; print "connected: ", ($r // "(nothing)\n"); exit 0 }} $err = $@ || "$!"; select(undef, undef, undef, 0.2) }} print "failed: $err\n"; exit 1' {host} {port} {message} {tries}"#
    )
}

/// A listener on every address of the sandbox: answers `pong` to each connection and ends
/// after one that says `quit`.
fn listener() -> String {
    format!(
        r#"perl -MIO::Socket::INET -e '$| = 1; my $s = IO::Socket::INET->new(LocalAddr => "0.0.0.0", LocalPort => {PORT}, Listen => 8, ReuseAddr => 1) or die "listen: $!\n"; while (my $c = $s->accept) {{ my $l = <$c> // ""; print $c "pong\n"; close $c; print "served $l"; last if $l =~ /quit/ }}'"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_with_network_reach_neither_each_other_nor_sandboxd_nor_the_node() {
    let _alone = NODE_RULES.lock().await;
    let d = daemon(&[]);
    let a = open(&d, "net-a", "org-a", "net").await;
    let b = open(&d, "net-b", "org-b", "net").await;
    let _offline = open(&d, "off-c", "org-a", "base").await;

    // The network is sandboxd's own: labelled as this instance's, inter-container traffic off,
    // both network sessions on it and nothing else.
    let name = network_name(&d);
    let net = docker_json(&["network", "inspect", &name]);
    assert_eq!(net["Driver"], "bridge");
    assert_eq!(net["Labels"]["sandboxd.dev/instance"], d.instance.as_str());
    assert_eq!(net["Labels"]["sandboxd.dev/managed-by"], "sandboxd");
    assert_eq!(
        net["Options"]["com.docker.network.bridge.enable_icc"],
        "false"
    );
    let bridge = net["Options"]["com.docker.network.bridge.name"]
        .as_str()
        .expect("a bridge name")
        .to_owned();
    let gateway = net["IPAM"]["Config"][0]["Gateway"]
        .as_str()
        .expect("a gateway")
        .to_owned();
    let attached: HashMap<String, String> = net["Containers"]
        .as_object()
        .expect("containers")
        .iter()
        .map(|(id, c)| {
            let ip = c["IPv4Address"].as_str().expect("an address");
            (
                id.clone(),
                ip.split('/').next().expect("an address").to_owned(),
            )
        })
        .collect();
    let containers = d.containers();
    let id_of = |session: &str| {
        let short = &containers
            .iter()
            .find(|(_, s, _)| s == session)
            .unwrap_or_else(|| panic!("a container of {session}"))
            .0;
        attached
            .keys()
            .find(|id| id.starts_with(short.as_str()))
            .cloned()
    };
    assert_eq!(
        attached.len(),
        2,
        "only the two network sessions: {attached:?}"
    );
    let ip_a = attached[&id_of("net-a").expect("net-a is on the network")].clone();
    let ip_b = attached[&id_of("net-b").expect("net-b is on the network")].clone();
    assert!(id_of("off-c").is_none());

    // A runtime without network keeps none.
    let off = docker_json(&["inspect", &format!("sandboxd-{}-off-c", d.instance)]);
    assert_eq!(off["HostConfig"]["NetworkMode"], "none");

    // The firewall: INPUT from the bridge goes to sandboxd's chain, which drops sandboxd's
    // port and everything else but answers; the forward chain drops link-local (the cloud
    // metadata address) and the private ranges.
    let port = port_of(&d);
    let rules = iptables(&["-w", "-S"]);
    let input_chain = rules
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!("-A INPUT -i {bridge} -j "))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| panic!("no INPUT jump for {bridge} in\n{rules}"));
    let forward_chain = rules
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!("-A DOCKER-USER -i {bridge} -j "))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| panic!("no DOCKER-USER jump for {bridge} in\n{rules}"));
    for rule in [
        format!("-A {input_chain} -p tcp -m tcp --dport {port} -j DROP"),
        format!("-A {input_chain} -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN"),
        format!("-A {input_chain} -j DROP"),
        format!("-A {forward_chain} -d 169.254.0.0/16 -j DROP"),
        format!("-A {forward_chain} -d 10.0.0.0/8 -j DROP"),
        format!("-A {forward_chain} -d 172.16.0.0/12 -j DROP"),
        format!("-A {forward_chain} -d 192.168.0.0/16 -j DROP"),
    ] {
        assert!(rules.lines().any(|l| l == rule), "no `{rule}` in\n{rules}");
    }

    // A listens; a connection from A itself, to its own address on the network, is answered:
    // the listener works.
    let listening = {
        let a = a.clone();
        tokio::spawn(async move { a.run("net-a", &listener(), Some(90), None, None).await })
    };
    let own = a
        .run(
            "net-a",
            &dial(&ip_a, PORT, "self", 50),
            Some(30),
            None,
            None,
        )
        .await
        .expect("run in A");
    assert_eq!(
        (own.exit_code, own.stdout.as_str()),
        (0, "connected: pong\n"),
        "A reaches its own listener: {own:?}"
    );

    // B, another tenant's sandbox on the same network, does not reach it.
    cannot_reach(&b, "net-b", &ip_a, PORT, "from-b", "B must not reach A").await;

    // Nor sandboxd's port on the node's side of the network, which answers the node itself.
    let gateway_addr: SocketAddr = format!("{gateway}:{port}").parse().expect("an address");
    TcpStream::connect_timeout(&gateway_addr, Duration::from_secs(3))
        .expect("sandboxd listens on the network's gateway address, seen from the node");
    cannot_reach(
        &b,
        "net-b",
        &gateway,
        port,
        "GET",
        "B must not reach sandboxd",
    )
    .await;
    // Nor any other service of the node: a listener of this test on every address, which the
    // node itself reaches on the network's gateway address.
    let node_service = std::net::TcpListener::bind("0.0.0.0:0").expect("a listener on the node");
    let node_port = node_service.local_addr().expect("its address").port();
    let node_addr: SocketAddr = format!("{gateway}:{node_port}")
        .parse()
        .expect("an address");
    TcpStream::connect_timeout(&node_addr, Duration::from_secs(3))
        .expect("the node reaches its own service on the gateway address");
    cannot_reach(
        &b,
        "net-b",
        &gateway,
        node_port,
        "hello",
        "B must not reach the node",
    )
    .await;

    // The listener is still there after all that, and B still answers: A ends it itself.
    let quit = a
        .run("net-a", &dial(&ip_a, PORT, "quit", 5), Some(30), None, None)
        .await
        .expect("run in A");
    assert_eq!(quit.stdout, "connected: pong\n", "{quit:?}");
    let served = listening
        .await
        .expect("the listener's task")
        .expect("the listener's run");
    assert_eq!(
        served.stdout, "served self\nserved quit\n",
        "A's listener saw A's two connections and none of B's: {served:?}"
    );
    assert_ne!(ip_a, ip_b);
    let alive = b
        .run("net-b", "echo still here", Some(10), None, None)
        .await
        .expect("B runs");
    assert_eq!(alive.stdout, "still here\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_installs_the_firewall_again_without_duplicates_and_remove_network_cleans_up() {
    let _alone = NODE_RULES.lock().await;
    let mut d = daemon(&[]);
    open(&d, "net-r", "org-r", "net").await;
    let name = network_name(&d);
    let bridge =
        docker_json(&["network", "inspect", &name])["Options"]["com.docker.network.bridge.name"]
            .as_str()
            .expect("a bridge name")
            .to_owned();
    // The bridge (sbx-<hash>) and the chains (SANDBOXD-IN-<hash>, SANDBOXD-FWD-<hash>) share
    // the instance's hash.
    let hash = bridge.trim_start_matches("sbx-").to_owned();
    let mine = |rules: &str| -> Vec<String> {
        rules
            .lines()
            .filter(|l| l.contains(&hash))
            .map(str::to_owned)
            .collect()
    };
    let before = mine(&iptables(&["-w", "-S"]));
    let old_port = port_of(&d);

    // A restart (a new port: 0 picks one) sets the network up again: the same rules, once
    // each, with the new port in place of the old one.
    d.process.kill9();
    d.spawn();
    d.base = d.base.replace("0.0.0.0", "127.0.0.1");
    let new_port = port_of(&d);
    let after = mine(&iptables(&["-w", "-S"]));
    let expected: Vec<String> = before
        .iter()
        .map(|l| {
            l.replace(
                &format!("--dport {old_port} "),
                &format!("--dport {new_port} "),
            )
        })
        .collect();
    assert_eq!(after, expected, "the same rules, none twice");
    let mut unique = after.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), after.len(), "{after:#?}");
    // The session runs on, and a new one joins the same network.
    let s = open(&d, "net-r2", "org-r", "net").await;
    let ran = s
        .run("net-r2", "grep -c eth /proc/net/dev", Some(10), None, None)
        .await
        .expect("run");
    assert_eq!(ran.stdout, "1\n");
    let net = docker_json(&["network", "inspect", &name]);
    assert_eq!(net["Containers"].as_object().map(|c| c.len()), Some(2));

    // The rules go (as on a node's reboot) and sandboxd comes back with an allowlist that has
    // no runtime with network: the network is there, its sandboxes may run, so the firewall is
    // installed again all the same.
    let input_jump = after
        .iter()
        .find(|l| l.starts_with("-A INPUT "))
        .expect("the INPUT jump")
        .replacen("-A ", "-D ", 1);
    iptables(&input_jump.split_whitespace().collect::<Vec<_>>());
    iptables(&["-w", "-F", &format!("SANDBOXD-IN-{hash}")]);
    assert_ne!(mine(&iptables(&["-w", "-S"])), after);
    d.process.kill9();
    for (k, v) in d.env.iter_mut() {
        if k == "SANDBOXD_RUNTIMES" {
            *v = format!("base={}", base_image());
        }
    }
    d.spawn();
    d.base = d.base.replace("0.0.0.0", "127.0.0.1");
    let port = port_of(&d);
    let again = mine(&iptables(&["-w", "-S"]));
    let expected: Vec<String> = after
        .iter()
        .map(|l| l.replace(&format!("--dport {new_port} "), &format!("--dport {port} ")))
        .collect();
    assert_eq!(again, expected, "the firewall is back, once");

    // remove-network refuses while sandboxes are on the network, naming why.
    let refused = d.remove_network();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains(&format!(
            "Docker network '{name}' still has 2 container(s) on it; destroy the sessions first"
        )),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    for id in ["net-r", "net-r2"] {
        d.admin().destroy(id).await.expect("destroy");
    }
    let removed = d.remove_network();
    assert!(
        removed.status.success(),
        "{}",
        String::from_utf8_lossy(&removed.stderr)
    );
    assert!(d.networks().is_empty(), "the network is gone");
    let left = mine(&iptables(&["-w", "-S"]));
    assert!(left.is_empty(), "rules left behind: {left:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_cannot_fence_the_network_in_refuses_to_start_or_to_open_it() {
    // At start, with a runtime of the allowlist that needs a network: sandboxd exits, naming
    // the command and what a node needs.
    let dir = tempfile::tempdir().expect("a temp dir");
    let instance = format!("tnofw{:08x}", rand::random::<u32>());
    let out = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .env("SANDBOXD_TOKEN", "admin-token-for-this-test")
        .env("SANDBOXD_PORT", "0")
        .env("SANDBOXD_RUNTIMES", runtimes())
        .env("SANDBOXD_INSTANCE", &instance)
        .env("SANDBOXD_IPTABLES", "/nonexistent/iptables")
        .env("SANDBOXD_WORKSPACE_ROOT", dir.path().join("workspaces"))
        .env("SANDBOXD_STATE_DIR", dir.path().join("state"))
        .env("RUST_LOG", "off")
        .output()
        .expect("sandboxd runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "it must not start: {stderr}");
    assert!(out.stdout.is_empty(), "it never listened");
    let bridge_hint =
        format!("cannot fence in the sandbox network 'sandboxd-{instance}-net' (bridge sbx-");
    assert!(
        stderr.contains("sandboxd: a runtime of the allowlist needs a network: "),
        "{stderr}"
    );
    assert!(stderr.contains(&bridge_hint), "{stderr}");
    assert!(
        stderr.contains("the command `/nonexistent/iptables-restore` is not installed. A node running sandboxes with network needs the iptables command (SANDBOXD_IPTABLES) and NET_ADMIN in the node's network namespace (in Kubernetes: hostNetwork and the NET_ADMIN and NET_RAW capabilities)"),
        "{stderr}"
    );
    // The network it made is removed as an uninstall would.
    let rm = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .arg("remove-network")
        .env("SANDBOXD_INSTANCE", &instance)
        .env("SANDBOXD_IPTABLES", "/nonexistent/iptables")
        .output()
        .expect("remove-network runs");
    assert!(
        rm.status.success(),
        "{}",
        String::from_utf8_lossy(&rm.stderr)
    );

    // Without such a runtime at start, it starts; a network runtime handed over later is
    // refused at open with 503, and nothing of the session is left.
    let d = Daemon::start(&[("SANDBOXD_IPTABLES", "/nonexistent/iptables")]);
    let mut entries = d.admin().runtimes().await.expect("runtimes");
    assert!(entries.runtimes.iter().all(|r| !r.needs_network));
    let catalog: Vec<sandboxd_catalog::CatalogEntry> =
        serde_json::from_str(&runtimes()).expect("a catalog");
    d.admin()
        .put_runtimes(&catalog)
        .await
        .expect("put runtimes");
    entries = d.admin().runtimes().await.expect("runtimes");
    assert!(entries.runtimes.iter().any(|r| r.needs_network));
    let refused = d
        .admin()
        .open("net-x", "org-x", Some("net"), None)
        .await
        .expect_err("no network without the firewall");
    match refused {
        ClientError::Api {
            status,
            code,
            message,
        } => {
            assert_eq!((status, code.as_str()), (503, "network_unavailable"));
            assert!(
                message.starts_with(&format!("Runtime 'net' needs a network, and this host cannot give it one safely: cannot fence in the sandbox network 'sandboxd-{}-net'", d.instance)),
                "{message}"
            );
        }
        other => panic!("expected 503 network_unavailable, got {other}"),
    }
    assert!(d.admin().list().await.expect("list").is_empty());
    assert!(d.containers().is_empty());
    assert!(!common::exists(&d.workspace("net-x")));
    // A session without network opens as ever.
    open(&d, "off-x", "org-x", "base").await;
}

/// Rules a test inserted into the node's chains, each marked with the test's own comment,
/// and the interfaces it made: removed when dropped, whatever the test did meanwhile.
struct NodeChanges {
    comment: String,
    inserted: Vec<(String, Vec<String>)>,
    links: Vec<String>,
}

impl NodeChanges {
    fn new() -> Self {
        Self {
            comment: format!("sandboxd-test-{:08x}", rand::random::<u32>()),
            inserted: Vec::new(),
            links: Vec::new(),
        }
    }

    /// `iptables -I <chain> 1 <rule…> -m comment --comment <this test's>`.
    fn insert_first(&mut self, chain: &str, rule: &[&str]) {
        let mut spec: Vec<String> = rule.iter().map(|s| (*s).to_owned()).collect();
        spec.extend(["-m", "comment", "--comment", &self.comment].map(str::to_owned));
        let mut args = vec![
            "-w".to_owned(),
            "-I".to_owned(),
            chain.to_owned(),
            "1".to_owned(),
        ];
        args.extend(spec.iter().cloned());
        iptables(&args.iter().map(String::as_str).collect::<Vec<_>>());
        self.inserted.push((chain.to_owned(), spec));
    }

    /// A pair of virtual interfaces of the test's own, one holding `addr`/32, both up: an
    /// address of the node's that no other test uses.
    fn address(&mut self, addr: &str) {
        let name = format!("sbxt{:08x}", rand::random::<u32>());
        let peer = format!("{name}p");
        let add = Command::new("ip")
            .args(["link", "add", &name, "type", "veth", "peer", "name", &peer])
            .output()
            .expect("ip runs");
        assert!(
            add.status.success(),
            "ip link add {name} type veth (the test needs root): {}",
            String::from_utf8_lossy(&add.stderr)
        );
        self.links.push(name.clone());
        for args in [
            vec!["addr", "add", &format!("{addr}/32"), "dev", name.as_str()],
            vec!["link", "set", name.as_str(), "up"],
            vec!["link", "set", peer.as_str(), "up"],
        ] {
            let out = Command::new("ip").args(&args).output().expect("ip runs");
            assert!(
                out.status.success(),
                "ip {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

impl Drop for NodeChanges {
    fn drop(&mut self) {
        for (chain, spec) in &self.inserted {
            let _ = Command::new("iptables")
                .args(["-w", "-D", chain])
                .args(spec)
                .output();
        }
        for link in &self.links {
            let _ = Command::new("ip").args(["link", "del", link]).output();
        }
    }
}

/// A folder of iptables commands that run the node's own, until a file `broken` appears in
/// it: then the commands that change rules (`iptables`, `iptables-restore` and their IPv6
/// twins) fail, as on a node whose iptables lock is held or whose module is gone; the ones
/// that print rules still work.
fn breakable_iptables(dir: &std::path::Path) -> String {
    for name in [
        "iptables",
        "iptables-restore",
        "iptables-save",
        "ip6tables",
        "ip6tables-restore",
        "ip6tables-save",
    ] {
        let real = Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
            .expect("sh runs");
        let real = String::from_utf8_lossy(&real.stdout).trim().to_owned();
        assert!(!real.is_empty(), "the node has no {name}");
        let refuse = if name.ends_with("-save") {
            String::new()
        } else {
            format!(
                "[ -e '{}/broken' ] && {{ echo 'iptables is broken by the test' >&2; exit 4; }}\n",
                dir.display()
            )
        };
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{refuse}exec {real} \"$@\"\n"))
            .expect("a wrapper");
        let mut perms = std::fs::metadata(&path)
            .expect("its metadata")
            .permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&path, perms).expect("executable");
    }
    dir.join("iptables").display().to_string()
}

async fn scrape(d: &Daemon) -> String {
    reqwest::get(format!("{}/metrics", d.base))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

fn metric(metrics: &str, name: &str) -> Option<i64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
}

/// `GET /healthz`: the status and the body.
async fn health(d: &Daemon) -> (u16, serde_json::Value) {
    common::raw(
        reqwest::Method::GET,
        &format!("{}/healthz", d.base),
        None,
        None,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_firewall_heals_within_its_period_and_closes_the_nodes_own_addresses() {
    const PERIOD: u64 = 2;
    let _alone = NODE_RULES.lock().await;
    let wrappers = tempfile::tempdir().expect("a temp dir");
    let iptables_cmd = breakable_iptables(wrappers.path());
    let mut node = NodeChanges::new();
    let d = daemon(&[
        ("SANDBOXD_IPTABLES", iptables_cmd.as_str()),
        ("SANDBOXD_FIREWALL_CHECK", "2"),
    ]);
    let a = open(&d, "heal-a", "org-a", "net").await;
    assert_eq!(health(&d).await.0, 200);
    let bridge = docker_json(&["network", "inspect", &network_name(&d)])["Options"]
        ["com.docker.network.bridge.name"]
        .as_str()
        .expect("a bridge name")
        .to_owned();
    let hash = bridge.trim_start_matches("sbx-").to_owned();
    let (input_chain, forward_chain) = (
        format!("SANDBOXD-IN-{hash}"),
        format!("SANDBOXD-FWD-{hash}"),
    );
    let comment = node.comment.clone();
    let mine = || -> Vec<String> {
        iptables(&["-w", "-S"])
            .lines()
            .filter(|l| l.contains(&hash) && !l.contains(&comment))
            .map(str::to_owned)
            .collect()
    };

    // An address the node takes after sandboxd started (outside every private range), with a
    // service of the node on it: within the period the forward chain drops connections
    // first addressed to it, and a sandbox does not reach it; the node does.
    let addr = format!(
        "198.18.{}.{}",
        rand::random::<u8>(),
        rand::random::<u8>().max(1)
    );
    node.address(&addr);
    let service = std::net::TcpListener::bind(format!("{addr}:0")).expect("a listener on it");
    let service_port = service.local_addr().expect("its address").port();
    let wanted = format!("-A {forward_chain} -m conntrack --ctorigdst {addr} -j DROP");
    common::until(
        "the forward chain drops the node's new address",
        Duration::from_secs(PERIOD * 2 + 3),
        async || {
            let now = mine();
            if now.contains(&wanted) {
                Ok(())
            } else {
                Err(format!("{now:#?}"))
            }
        },
    )
    .await;
    TcpStream::connect_timeout(
        &format!("{addr}:{service_port}")
            .parse()
            .expect("an address"),
        Duration::from_secs(3),
    )
    .expect("the node reaches its own service");
    cannot_reach(
        &a,
        "heal-a",
        &addr,
        service_port,
        "hello",
        "a sandbox must not reach the node's own address",
    )
    .await;
    let whole = mine();
    let repairs = |m: &str| metric(m, "sandboxd_firewall_repairs_total").unwrap_or(-1);
    assert_eq!(repairs(&scrape(&d).await), 0, "nothing was repaired yet");

    // The attack: an ACCEPT first in FORWARD and in INPUT (for this sandboxd's bridge only,
    // so other tests' sandboxes are not opened up meanwhile), and sandboxd's forward chain
    // flushed. Within the period every rule is back, each jump first again, and the repair
    // is counted.
    let attacked = std::time::Instant::now();
    node.insert_first("FORWARD", &["-i", &bridge, "-j", "ACCEPT"]);
    node.insert_first("INPUT", &["-i", &bridge, "-j", "ACCEPT"]);
    iptables(&["-w", "-F", &forward_chain]);
    assert_ne!(mine(), whole);
    common::poll::until_every(
        "the firewall back as installed, and the repair counted",
        Duration::from_secs(PERIOD + 2),
        Duration::from_millis(100),
        async || (repairs(&scrape(&d).await) >= 1 && mine() == whole).then_some(()),
    )
    .await;
    let took = attacked.elapsed();
    assert!(
        took <= Duration::from_secs(PERIOD + 1),
        "repaired after {took:?}, the period is {PERIOD} s"
    );
    // Each jump stands above the attack's ACCEPT again.
    for (chain, jump) in [
        ("INPUT", format!("-A INPUT -i {bridge} -j {input_chain}")),
        (
            "FORWARD",
            format!("-A FORWARD -i {bridge} -j {forward_chain}"),
        ),
    ] {
        let rules = iptables(&["-w", "-S", chain]);
        let at = |wanted: &dyn Fn(&str) -> bool| rules.lines().position(wanted);
        let accept = at(&|l: &str| l.contains(&comment)).expect("the attack's rule");
        let ours = at(&|l: &str| l == jump).expect("sandboxd's jump");
        assert!(ours < accept, "{chain}:\n{rules}");
    }
    let after = repairs(&scrape(&d).await);
    assert!(after >= 1, "the repair is counted: {after}");
    assert_eq!(health(&d).await.0, 200);
    cannot_reach(
        &a,
        "heal-a",
        &addr,
        service_port,
        "again",
        "after the repair",
    )
    .await;

    // While the rules cannot be installed again, sandboxd says it is not ready, and why.
    std::fs::write(wrappers.path().join("broken"), b"").expect("break iptables");
    iptables(&["-w", "-F", &input_chain]);
    // The first 503 may say what changed before the repair has failed: wait for the answer
    // that says both (health is cached for a second).
    let (status, body) = common::until(
        "/healthz answering 503, after the repair failed",
        Duration::from_secs(PERIOD + 3),
        async || {
            let (status, body) = health(&d).await;
            let failed = body["problems"][0]
                .as_str()
                .is_some_and(|p| p.contains("installing it again failed"));
            (status == 503 && failed).then_some((status, body))
        },
    )
    .await;
    assert_eq!(status, 503);
    assert_eq!(body["status"], "unavailable", "{body}");
    let problem = body["problems"][0].as_str().expect("a problem").to_owned();
    assert!(
        problem.starts_with(&format!(
            "the sandbox network's firewall is not whole, so no sandbox with network is safe: the chain {input_chain} was changed (0 rules, 3 installed); installing it again failed: cannot fence in the sandbox network '{}' (bridge {bridge}): ",
            network_name(&d)
        )),
        "{problem}"
    );
    assert!(
        problem.contains("iptables is broken by the test"),
        "{problem}"
    );
    assert_eq!(
        metric(&scrape(&d).await, "sandboxd_firewall_intact"),
        Some(0)
    );

    // Once iptables works again, the next look installs it: ready, counted, whole.
    std::fs::remove_file(wrappers.path().join("broken")).expect("mend iptables");
    common::until(
        "/healthz answering 200 again",
        Duration::from_secs(PERIOD + 3),
        async || (health(&d).await.0 == 200).then_some(()),
    )
    .await;
    assert_eq!(mine(), whole);
    let m = scrape(&d).await;
    assert!(repairs(&m) > after, "the second repair is counted: {m}");
    assert_eq!(metric(&m, "sandboxd_firewall_intact"), Some(1));
    drop(node);
}

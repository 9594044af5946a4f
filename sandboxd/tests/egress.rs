//! Egress by policy, from inside real sandboxes against a test internet of the test's own (a
//! network namespace with DNS, HTTP and HTTPS servers on the documentation ranges, names under
//! `.test`): a sandbox of an `allowlist` runtime reaches the names its policies allow and
//! nothing else, whatever it tries (a denied name, a direct address, an allowed SNI sent to a
//! denied address, a Host that names another server, UDP, IPv6, a TXT lookup), an edited
//! runtime counts within 5 s, a narrowed session reaches less, and every decision is counted
//! and logged. Nothing off the machine is dialled.

mod common;

use std::time::{Duration, Instant};

use common::Daemon;
use common::egress::{catalog, open, sh, within_5_s};
use sandboxd_api::client::Client;
use sandboxd_testkit::internet::{Internet, Range, Spec};

/// The policy of the `egress` runtime: allowed.test (80 and 443), everything under
/// wild.test, and nothing else.
const POLICY: &str =
    r#"{"mode": "allowlist", "allow": [{"domain": "allowed.test"}, {"domain": "*.wild.test"}]}"#;

/// The catalog of [`catalog`], as `PUT /v1/runtimes` takes it.
fn entries(egress: &str) -> Vec<sandboxd_catalog::CatalogEntry> {
    sandboxd_catalog::parse(&catalog(&sandboxd_testkit::tools_image(), egress))
        .expect("a valid catalog")
}

fn internet() -> Internet {
    Internet::start(
        Spec::new()
            .host("allowed.test", Range::TestNet2)
            .host("denied.test", Range::TestNet3)
            .host("a.wild.test", Range::TestNet2)
            .host("b.c.wild.test", Range::TestNet2)
            .host("wild.test", Range::TestNet2)
            .host("wild.test.evil.test", Range::TestNet3)
            .echo(7000)
            .udp(443),
    )
    .expect("the test internet starts (root and iproute2 are needed)")
}

fn daemon(net: &Internet) -> Daemon {
    daemon_with(net, POLICY, &[])
}

/// A sandboxd whose one runtime, `egress`, has the policy `egress`, resolving through the
/// test internet, with `extra` settings.
fn daemon_with(net: &Internet, egress: &str, extra: &[(&str, &str)]) -> Daemon {
    let runtimes = catalog(&sandboxd_testkit::tools_image(), egress);
    let resolver = net.dns().to_string();
    let mut env = vec![
        ("SANDBOXD_RUNTIMES", runtimes.as_str()),
        ("SANDBOXD_EGRESS_RESOLVER", resolver.as_str()),
    ];
    env.extend_from_slice(extra);
    Daemon::start(&env)
}

/// `curl` with the test CA (written into the workspace), failing within 5 s.
const CURL: &str = "curl -sS --max-time 5 --cacert /workspace/ca.pem";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_reaches_what_its_policy_allows_and_nothing_else() {
    let net = internet();
    let d = daemon(&net);
    let c = open(&d, "eg-1").await;
    c.write("eg-1", "ca.pem", net.ca_pem().as_bytes().to_vec())
        .await
        .expect("the CA into the workspace");
    let allowed = net.addr("allowed.test").expect("allowed.test");
    let denied = net.addr("denied.test").expect("denied.test");
    let body = |name: &str| net.body(name).expect("a body");

    // Allowed: HTTP and HTTPS, with curl and Python, by name and under the wildcard.
    assert_eq!(
        sh(&c, "eg-1", &format!("{CURL} http://allowed.test/")).await,
        (0, body("allowed.test"))
    );
    assert_eq!(
        sh(&c, "eg-1", &format!("{CURL} https://allowed.test/")).await,
        (0, body("allowed.test"))
    );
    let py = "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://allowed.test/', timeout=5).read().decode(), end='')\"";
    assert_eq!(sh(&c, "eg-1", py).await, (0, body("allowed.test")));
    assert_eq!(
        sh(&c, "eg-1", &format!("{CURL} https://a.wild.test/")).await,
        (0, body("a.wild.test"))
    );
    assert_eq!(
        sh(&c, "eg-1", &format!("{CURL} http://b.c.wild.test/")).await,
        (0, body("b.c.wild.test"))
    );

    // A denied name fails fast: the resolver refuses it, and the test's DNS never sees it.
    for name in ["denied.test", "wild.test", "wild.test.evil.test"] {
        let started = Instant::now();
        let (code, out) = sh(&c, "eg-1", &format!("{CURL} http://{name}/")).await;
        assert_eq!(code, 6, "{name}: curl cannot resolve it: {out}");
        assert!(out.contains("Could not resolve host"), "{name}: {out}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{name} failed fast"
        );
    }
    let (_, txt) = sh(&c, "eg-1", "dig +time=2 +tries=1 TXT denied.test").await;
    assert!(
        txt.contains("status: REFUSED"),
        "a TXT lookup of a denied name is refused: {txt}"
    );
    let (_, a) = sh(
        &c,
        "eg-1",
        &format!(
            "dig +time=2 +tries=1 @{} A allowed.test +short",
            net.dns().ip()
        ),
    )
    .await;
    assert_eq!(
        a.trim(),
        allowed.to_string(),
        "a query sent to any server is the resolver's"
    );

    // A direct address: no name, refused (HTTPS: an alert; HTTP: a 403 naming the policy).
    let (code, out) = sh(&c, "eg-1", &format!("{CURL} -k https://{denied}/")).await;
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("alert access denied"), "{out}");
    let (code, out) = sh(&c, "eg-1", &format!("{CURL} http://{allowed}/")).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with(&format!(
            "blocked by egress policy: {allowed}:80 is not allowed for session eg-1"
        )),
        "{out}"
    );

    // An allowed SNI sent to a denied address reaches the allowed name's server.
    let (code, out) = sh(
        &c,
        "eg-1",
        &format!("{CURL} --resolve allowed.test:443:{denied} https://allowed.test/"),
    )
    .await;
    assert_eq!((code, out), (0, body("allowed.test")));
    // A Host that names a denied server, and a port the policy does not list.
    let (_, out) = sh(
        &c,
        "eg-1",
        &format!("{CURL} -H 'Host: denied.test' http://allowed.test/"),
    )
    .await;
    assert!(
        out.starts_with("blocked by egress policy: denied.test:80"),
        "{out}"
    );
    assert!(
        out.contains("denied.test is not in the allow list"),
        "{out}"
    );
    let (_, out) = sh(&c, "eg-1", &format!("{CURL} http://allowed.test:7000/")).await;
    assert!(
        out.contains("port 7000 is not allowed for allowed.test"),
        "{out}"
    );

    // UDP (QUIC's 443) and IPv6 go nowhere.
    let udp = format!(
        "python3 -c \"import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); [s.sendto(b'x', ('{allowed}', 443)) for _ in range(5)]\""
    );
    assert_eq!(sh(&c, "eg-1", &udp).await.0, 0);
    let (code, out) = sh(&c, "eg-1", &format!("{CURL} -6 http://allowed.test/")).await;
    assert_ne!(code, 0, "IPv6: {out}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        net.udp_received().is_empty(),
        "UDP reached the internet: {:?}",
        net.udp_received()
    );
    for name in ["denied.test", "wild.test", "wild.test.evil.test"] {
        assert!(
            !net.queried(name),
            "the test's DNS was asked for {name}: {:?}",
            net.queries()
        );
    }

    // Counted by runtime and verdict, and logged per name and minute.
    let metrics = reqwest::get(format!("{}/metrics", d.base))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("a body");
    for line in [
        "sandboxd_egress_connections_total{runtime=\"egress\",verdict=\"allowed\"}",
        "sandboxd_egress_connections_total{runtime=\"egress\",verdict=\"denied\"}",
        "sandboxd_egress_dns_queries_total{runtime=\"egress\",verdict=\"denied\"}",
    ] {
        assert!(
            metrics.lines().any(|l| l.starts_with(line)),
            "{line} in\n{metrics}"
        );
    }
    // A connection's row is written when it closes and flushed every 2 s: waited for.
    let count = |log: &sandboxd_api::egress::EgressLog, name: &str, verdict: &str| {
        log.records
            .iter()
            .filter(|r| r.name == name && r.verdict == verdict)
            .map(|r| r.count)
            .sum::<u64>()
    };
    let log = common::until(
        "the egress log's four allowed connections",
        Duration::from_secs(10),
        async || {
            let log = c.egress("eg-1", 60).await.ok()?;
            (count(&log, "allowed.test", "allowed") >= 4).then_some(log)
        },
    )
    .await;
    let find = |name: &str, verdict: &str| {
        log.records
            .iter()
            .filter(|r| r.name == name && r.verdict == verdict)
            .map(|r| r.count)
            .sum::<u64>()
    };
    assert_eq!(
        find("allowed.test", "allowed"),
        4,
        "curl over HTTP and HTTPS, Python, the SNI to a denied address: {log:?}"
    );
    assert!(find("denied.test", "refused") >= 1, "{log:?}");
    assert!(find("denied.test", "denied") >= 1, "{log:?}");
    assert!(
        log.records
            .iter()
            .any(|r| r.name == "allowed.test" && r.bytes_in > 0),
        "{log:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_of_refusals_is_one_row_and_an_edited_runtime_counts_within_5_s() {
    let net = internet();
    let d = daemon(&net);
    let c = open(&d, "eg-2").await;
    let admin = d.admin();

    // 500 refused connections in a loop: one row (two if a minute turns) with their count.
    let (code, out) = sh(&c, "eg-2", "for i in $(seq 500); do curl -s -o /dev/null --max-time 5 -H 'Host: denied.test' http://allowed.test/; done; echo done").await;
    assert_eq!((code, out.trim()), (0, "done"));
    let log = c.egress("eg-2", 60).await.expect("the egress log");
    let rows: Vec<_> = log
        .records
        .iter()
        .filter(|r| r.name == "denied.test" && r.verdict == "denied")
        .collect();
    assert!((1..=2).contains(&rows.len()), "{rows:?}");
    assert_eq!(rows.iter().map(|r| r.count).sum::<u64>(), 500);
    assert!(log.records.len() <= 4, "the log stays bounded: {log:?}");

    // The runtime edited to none: the running sandbox reaches nothing within 5 s; back to
    // the allowlist: it reaches allowed.test again. Its container is never restarted.
    let container = common::container_of(&d, "eg-2");
    admin
        .put_runtimes(&entries(r#"{"mode": "none"}"#))
        .await
        .expect("runtime to none");
    let reach = format!("{CURL} -o /dev/null http://allowed.test/");
    within_5_s(
        &c,
        "eg-2",
        &reach,
        |code| code != 0,
        "allowed.test refused after the runtime went to none",
    )
    .await;
    admin
        .put_runtimes(&entries(POLICY))
        .await
        .expect("runtime back to allowlist");
    within_5_s(
        &c,
        "eg-2",
        &reach,
        |code| code == 0,
        "allowed.test reached after the runtime went back",
    )
    .await;
    assert_eq!(
        common::container_of(&d, "eg-2"),
        container,
        "the same container"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_narrowed_at_open_reaches_less_and_keeps_it_across_a_restart() {
    let net = internet();
    let mut d = daemon(&net);
    let narrow: sandboxd_catalog::egress::Egress = serde_json::from_str(
        r#"{"mode": "allowlist", "allow": [{"domain": "a.wild.test", "ports": [80]}]}"#,
    )
    .expect("a policy");
    let mut req = sandboxd_api::session::OpenRequest {
        name: "eg-3".into(),
        tenant: "org-a".into(),
        runtime: Some("egress".into()),
        limits: None,
        owner: None,
        egress: vec![narrow],
        from_snapshot: None,
    };
    let opened = d.admin().open_request(&req).await.expect("open narrowed");
    let token = opened.token.clone().expect("a token");
    let check = |c: Client| async move {
        assert_eq!(
            sh(&c, "eg-3", &format!("{CURL} http://a.wild.test/"))
                .await
                .0,
            0,
            "a.wild.test:80 is within both"
        );
        let (_, out) = sh(&c, "eg-3", &format!("{CURL} http://allowed.test/")).await;
        assert!(
            out.contains("Could not resolve host"),
            "allowed.test is outside the session's policy: {out}"
        );
        let (code, _) = sh(&c, "eg-3", &format!("{CURL} -k https://a.wild.test/")).await;
        assert_ne!(code, 0, "port 443 is outside the session's policy");
    };
    check(d.client(&token)).await;
    // A restarted sandboxd narrows it the same.
    d.terminate();
    d.spawn();
    check(d.client(&token)).await;
    // An open of the existing session without policies leaves them as they were.
    req.egress.clear();
    d.admin().open_request(&req).await.expect("found");
    check(d.client(&token)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_redirect_fails_closed_and_is_installed_again() {
    let net = internet();
    let d = daemon_with(&net, POLICY, &[("SANDBOXD_FIREWALL_CHECK", "3")]);
    let c = open(&d, "eg-4").await;
    let allowed = net.addr("allowed.test").expect("allowed.test");
    let plan = sandboxd::container::network::Plan::egress(
        &d.instance,
        "iptables",
        sandboxd::container::network::DEFAULT_DENY,
    )
    .expect("the plan");
    let nat = plan.nat_chain.expect("a nat chain");
    let before = net.connections().len();
    let rules = |chain: &str| {
        let out = std::process::Command::new("iptables")
            .args(["-w", "-t", "nat", "-S", chain])
            .output()
            .expect("iptables runs");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("-A "))
            .count()
    };
    // Without its redirects a sandbox's connection is forwarded, and the forward chain drops
    // it. sandboxd is stopped (SIGSTOP) meanwhile, so its guard cannot put the chain back
    // under the try; the try goes in through Docker, as the sandbox's own user.
    let cid = common::container_of(&d, "eg-4");
    d.process.signal("STOP").expect("kill -STOP sandboxd");
    let flush = std::process::Command::new("iptables")
        .args(["-w", "-t", "nat", "-F", &nat])
        .status()
        .expect("iptables runs");
    let tried = std::process::Command::new("docker")
        .args([
            "exec",
            "-u",
            "10001",
            &cid,
            "curl",
            "-sS",
            "--max-time",
            "2",
            "--resolve",
        ])
        .arg(format!("denied.test:80:{allowed}"))
        .arg("http://denied.test/")
        .output()
        .expect("docker exec runs");
    let left = rules(&nat);
    d.process.signal("CONT").expect("kill -CONT sandboxd");
    assert!(flush.success());
    assert_eq!(left, 0, "the chain stayed empty while sandboxd was stopped");
    assert!(
        !tried.status.success(),
        "a connection without the redirect went through: {}",
        String::from_utf8_lossy(&tried.stdout)
    );
    assert_eq!(
        net.connections().len(),
        before,
        "the test internet saw a connection: {:?}",
        net.connections()
    );
    // The guard puts the redirects back within its period: a new connection goes through the
    // proxy again. (Given its address: a DNS flow the kernel tracked while the chain was empty
    // stays unredirected, and dropped, until it is idle for conntrack's UDP timeout.)
    let resumed = Instant::now();
    loop {
        let (code, out) = sh(
            &c,
            "eg-4",
            &format!("{CURL} --resolve allowed.test:80:{allowed} http://allowed.test/"),
        )
        .await;
        if code == 0 {
            assert_eq!(out, net.body("allowed.test").expect("a body"));
            break;
        }
        assert!(
            resumed.elapsed() < Duration::from_secs(20),
            "the redirect did not come back: {out}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The repair is counted once the guard is done with it (its other chains come after nat).
    let mut metrics = String::new();
    for _ in 0..50 {
        metrics = reqwest::get(format!("{}/metrics", d.base))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("a body");
        if metrics
            .lines()
            .any(|l| l.starts_with("sandboxd_firewall_repairs_total ") && !l.ends_with(" 0"))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the repair is counted: {metrics}");
}

/// Polls `command` in `session` until its exit code is `want` is true of it, for at most 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_sandbox_follows_its_runtime_from_open_to_allowlist_to_none_and_back() {
    let net = internet();
    let d = daemon_with(&net, r#"{"mode": "open"}"#, &[]);
    let c = open(&d, "eg-5").await;
    let container = common::container_of(&d, "eg-5");
    let denied = net.addr("denied.test").expect("denied.test");
    // Open: any address (curl resolves itself here: the open network's DNS is Docker's).
    let direct =
        format!("curl -fsS --max-time 2 --resolve denied.test:80:{denied} http://denied.test/");
    assert_eq!(
        sh(&c, "eg-5", &direct).await,
        (0, net.body("denied.test").expect("a body"))
    );
    let admin = d.admin();

    // To allowlist: the same sandbox now reaches allowed.test only.
    admin
        .put_runtimes(&entries(POLICY))
        .await
        .expect("to allowlist");
    within_5_s(&c, "eg-5", &direct, |code| code != 0, "denied.test refused").await;
    within_5_s(
        &c,
        "eg-5",
        "curl -sS --max-time 2 http://allowed.test/",
        |code| code == 0,
        "allowed.test reached",
    )
    .await;
    // To none: nothing.
    admin
        .put_runtimes(&entries(r#"{"mode": "none"}"#))
        .await
        .expect("to none");
    within_5_s(
        &c,
        "eg-5",
        "curl -sS --max-time 2 http://allowed.test/",
        |code| code != 0,
        "allowed.test refused",
    )
    .await;
    let (_, links) = sh(&c, "eg-5", "cat /proc/net/dev").await;
    assert!(
        !links.contains("eth0"),
        "no interface but loopback: {links}"
    );
    // Back to open.
    admin
        .put_runtimes(&entries(r#"{"mode": "open"}"#))
        .await
        .expect("to open");
    within_5_s(
        &c,
        "eg-5",
        &direct,
        |code| code == 0,
        "denied.test reached again",
    )
    .await;
    assert_eq!(
        common::container_of(&d, "eg-5"),
        container,
        "the same container throughout"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_holding_connections_open_takes_only_its_own_share_of_the_proxy() {
    let net = internet();
    let d = daemon_with(&net, POLICY, &[("SANDBOXD_EGRESS_MAX_CONNECTIONS", "50")]);
    let hog = open(&d, "eg-hog").await;
    let other = open(&d, "eg-other").await;
    let allowed = net.addr("allowed.test").expect("allowed.test");
    // 120 connections opened and held silent (the proxy waits for their first bytes): the
    // 50 it holds wait, the other 70 are closed at once.
    let script = format!(
        "python3 - <<'EOF'\nimport socket, time\nheld = []\nfor _ in range(120):\n    s = socket.create_connection(('{allowed}', 80), timeout=5)\n    held.append(s)\ntime.sleep(1)\nclosed = 0\nfor s in held:\n    s.setblocking(False)\n    try:\n        if s.recv(1) == b'':\n            closed += 1\n    except BlockingIOError:\n        pass\n    except OSError:\n        closed += 1\nprint(closed)\nEOF"
    );
    let hogging = tokio::spawn(async move { sh(&hog, "eg-hog", &script).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Meanwhile the other session is served as before.
    assert_eq!(
        sh(&other, "eg-other", &format!("{CURL} http://allowed.test/")).await,
        (0, net.body("allowed.test").expect("a body"))
    );
    let (code, closed) = hogging.await.expect("the hog's run");
    assert_eq!(
        (code, closed.trim()),
        (0, "70"),
        "the connections past the cap are closed"
    );
    let log = d
        .admin()
        .egress("eg-hog", 60)
        .await
        .expect("the egress log");
    // Every one was refused in the end (the 50 held named no server before they closed): one
    // row, with the last reason of the minute.
    let refused: u64 = log
        .records
        .iter()
        .filter(|r| r.verdict == "denied" && r.name == allowed.to_string())
        .map(|r| r.count)
        .sum();
    assert_eq!(refused, 120, "{log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_of_an_open_runtime_that_narrows_is_put_where_its_policy_holds() {
    let net = internet();
    let d = daemon_with(&net, r#"{"mode": "open"}"#, &[]);
    let narrow: sandboxd_catalog::egress::Egress = serde_json::from_str(POLICY).expect("a policy");
    let mut req = sandboxd_api::session::OpenRequest {
        name: "eg-6".into(),
        tenant: "org-a".into(),
        runtime: Some("egress".into()),
        limits: None,
        owner: None,
        egress: vec![narrow],
        from_snapshot: None,
    };
    let opened = d.admin().open_request(&req).await.expect("open narrowed");
    let c = d.client(&opened.token.expect("a token"));
    let denied = net.addr("denied.test").expect("denied.test");
    let direct =
        format!("curl -fsS --max-time 2 --resolve denied.test:80:{denied} http://denied.test/");
    // On the egress network: its own policy holds, not its runtime's open one.
    assert_eq!(
        sh(&c, "eg-6", "curl -sS --max-time 2 http://allowed.test/").await,
        (0, net.body("allowed.test").expect("a body"))
    );
    let (code, out) = sh(&c, "eg-6", &direct).await;
    assert_ne!(
        code, 0,
        "denied.test through an open runtime narrowed to an allowlist: {out}"
    );
    // The narrowing dropped (the operator sends `open`): back on the open network.
    req.egress = vec![serde_json::from_str(r#"{"mode": "open"}"#).expect("a policy")];
    d.admin()
        .open_request(&req)
        .await
        .expect("found, widened back to its runtime");
    within_5_s(
        &c,
        "eg-6",
        &direct,
        |code| code == 0,
        "denied.test reached again",
    )
    .await;
}

/// A gVisor sandbox resolves names on both networks: gVisor's network stack does not reach
/// Docker's embedded resolver, so sandboxd gives it a resolv.conf naming one it reaches (the
/// egress network's bridge, redirected to the egress resolver; on the open network, the
/// upstream). The allowlist holds under gVisor as under runc.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gvisor_sandbox_resolves_names_on_the_egress_and_the_open_network() {
    let net = internet();
    let image = sandboxd_testkit::tools_image();
    let runtimes = format!(
        r#"[{{"alias": "egress", "image": "{image}", "isolation": "gvisor", "egress": {POLICY}}},
            {{"alias": "open", "image": "{image}", "isolation": "gvisor", "egress": {{"mode": "open"}}}}]"#
    );
    let resolver = net.dns().to_string();
    let d = Daemon::start(&[
        ("SANDBOXD_RUNTIMES", runtimes.as_str()),
        ("SANDBOXD_EGRESS_RESOLVER", resolver.as_str()),
    ]);
    let g = open(&d, "gv-allow").await;
    let (code, kernel) = sh(&g, "gv-allow", "dmesg | head -n 1").await;
    assert!(
        code == 0 && kernel.contains("gVisor"),
        "on gVisor: {kernel}"
    );
    let allowed = net.addr("allowed.test").expect("allowed.test");
    let (code, out) = sh(&g, "gv-allow", "getent hosts allowed.test").await;
    assert_eq!(
        (code, out.split_whitespace().collect::<Vec<_>>()),
        (0, vec![allowed.to_string().as_str(), "allowed.test"]),
        "the name resolves through the egress resolver: {out}"
    );
    assert_eq!(
        sh(&g, "gv-allow", "curl -sS --max-time 5 http://allowed.test/").await,
        (0, net.body("allowed.test").expect("a body"))
    );
    let (code, out) = sh(&g, "gv-allow", "getent hosts denied.test").await;
    assert_ne!(code, 0, "a name the policy denies does not resolve: {out}");
    let denied = net.addr("denied.test").expect("denied.test");
    let (code, out) = sh(
        &g,
        "gv-allow",
        &format!("curl -fsS --max-time 2 --resolve denied.test:80:{denied} http://denied.test/"),
    )
    .await;
    assert_ne!(code, 0, "an address the policy denies is refused: {out}");

    let opened = d
        .admin()
        .open("gv-open", "org-a", Some("open"), None)
        .await
        .expect("open");
    let o = d.client(opened.token.as_deref().expect("a token"));
    assert_eq!(
        sh(&o, "gv-open", "curl -sS --max-time 5 http://denied.test/").await,
        (0, net.body("denied.test").expect("a body")),
        "on the open network, any name resolves and answers"
    );
}

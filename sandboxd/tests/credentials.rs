//! Egress credentials (#30), from inside real sandboxes against a test internet whose
//! `api.test` answers only a request carrying the right `Authorization` exactly once: the
//! admin API stands in for the operator and hands sandboxd the key; the sandbox (of an
//! `allowlist` runtime, the tools image) reaches `api.test` with curl, Python requests and
//! httpx without ever holding the key, and nothing sandboxd keeps or says holds it either. A
//! rotated key is used within 5 s, also on a connection kept alive; a missing one is a 502 in
//! words; a host the policy does not allow is refused; a host without a credential is not
//! intercepted; the set's version is shown until sandboxd restarts; each use is counted; a
//! sandbox of a `none` runtime is given nothing of the egress CA.

mod common;

use std::path::Path;
use std::time::Duration;

use common::egress::{catalog, open, sh, within_5_s};
use common::{Daemon, metrics};
use rand::Rng;
use sandboxd_api::client::ClientError;
use sandboxd_api::egress::{CredentialSet, CredentialValue};
use sandboxd_testkit::internet::{Internet, Range, Spec};

/// The policy of the `egress` runtime: api.test, other.test and nothing else.
const POLICY: &str =
    r#"{"mode": "allowlist", "allow": [{"domain": "api.test"}, {"domain": "other.test"}]}"#;

/// Where the key comes from, in words.
const SOURCE: &str = "Secret agents/model-key, key token";

/// A key nobody could guess: any of its bytes found anywhere is a leak.
fn new_key() -> String {
    format!("sk-test-{:032x}", rand::rng().random::<u128>())
}

/// A regular expression matching `key` that does not hold it as a string (each character in
/// brackets): what a command in the sandbox greps for without bringing the key in itself.
fn pattern(key: &str) -> String {
    key.chars().map(|c| format!("[{c}]")).collect()
}

/// The set of one credential for api.test: `Authorization: Bearer <key>`, or `missing`.
fn set(version: &str, key: Option<&str>, missing: Option<&str>) -> CredentialSet {
    CredentialSet {
        version: version.to_owned(),
        credentials: vec![CredentialValue {
            host: "api.test".into(),
            ports: vec![],
            header: "Authorization".into(),
            source: SOURCE.into(),
            value: key.map(|k| format!("Bearer {k}")),
            missing: missing.map(str::to_owned),
        }],
    }
}

/// The test internet: api.test demands `Authorization` equal to `expected`'s content.
fn internet(expected: &Path) -> Internet {
    Internet::start(
        Spec::new()
            .host("api.test", Range::TestNet2)
            .host("other.test", Range::TestNet2)
            .host("denied.test", Range::TestNet3)
            .auth("api.test", "Authorization", expected),
    )
    .expect("the test internet starts (root and iproute2 are needed)")
}

/// A sandboxd whose runtime `egress` has [`POLICY`], resolving through the test internet and
/// trusting its CA upstream, logging (sandboxd's own crate at debug) to its log file.
fn daemon(net: &Internet) -> Daemon {
    // Beside it, `closed` (mode none) of the same image: a sandbox that gets no egress CA.
    let image = sandboxd_testkit::tools_image();
    let egress = catalog(&image, POLICY);
    let runtimes = format!(
        r#"{}, {{"alias": "closed", "image": "{image}", "egress": {{"mode": "none"}}}}]"#,
        egress.trim_end().trim_end_matches(']')
    );
    let resolver = net.dns().to_string();
    let upstream = net.ca_file().display().to_string();
    Daemon::start_logged(&[
        ("SANDBOXD_RUNTIMES", runtimes.as_str()),
        ("SANDBOXD_EGRESS_RESOLVER", resolver.as_str()),
        ("SANDBOXD_EGRESS_UPSTREAM_CA", upstream.as_str()),
        ("RUST_LOG", "info,sandboxd=debug"),
    ])
}

/// Every file under `dir`, its bytes (a missing or unreadable one skipped).
fn files_under(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = vec![];
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => todo.push(path),
                Ok(t) if t.is_file() => {
                    if let Ok(bytes) = std::fs::read(&path) {
                        out.push((path, bytes));
                    }
                }
                _ => {}
            }
        }
    }
    out
}

fn holds(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// `curl` trusting only what the sandbox was given (no `-k`, no CA of the test's).
const CURL: &str = "curl -sS --max-time 5";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_is_added_at_the_proxy_and_the_sandbox_never_holds_it() {
    let scratch = tempfile::tempdir().expect("a temp dir");
    let expected = scratch.path().join("expected");
    let key = new_key();
    std::fs::write(&expected, format!("Bearer {key}\n")).expect("the server's key");
    let net = internet(&expected);
    let d = daemon(&net);
    let admin = d.admin();
    let c = open(&d, "cr-1").await;
    let body = net.body("api.test").expect("a body");

    // The sandbox was given the node's CA and the bundle, read-only, and the variables.
    let ca_file = d.state_dir().join("egress-ca").join("ca.crt");
    let ca_pem = std::fs::read_to_string(&ca_file).expect("the egress CA in the state folder");
    let mode = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).expect("a file").permissions().mode() & 0o777
    };
    assert_eq!(mode(&ca_file), 0o644);
    assert_eq!(mode(&d.state_dir().join("egress-ca").join("ca.key")), 0o600);
    let (code, out) = sh(&c, "cr-1", "cat /etc/sandboxd/egress-ca.crt").await;
    assert_eq!((code, out), (0, ca_pem.clone()));
    let (code, out) = sh(
        &c,
        "cr-1",
        "grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt; echo x >> /etc/ssl/certs/ca-certificates.crt && echo written",
    )
    .await;
    assert!(!out.contains("written"), "the bundle is read-only: {out}");
    assert!(code != 0 || !out.contains("written"), "{out}");
    let (_, out) = sh(&c, "cr-1", "env | sort").await;
    for line in [
        "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
        "REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt",
        "CURL_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt",
        "NODE_EXTRA_CA_CERTS=/etc/sandboxd/egress-ca.crt",
    ] {
        assert!(out.lines().any(|l| l == line), "{line} in\n{out}");
    }

    // Without a credential, api.test answers 401 (passed through: the test CA is its issuer).
    c.write("cr-1", "test-ca.pem", net.ca_pem().as_bytes().to_vec())
        .await
        .expect("the test CA into the workspace");
    let (code, out) = sh(
        &c,
        "cr-1",
        &format!("{CURL} --cacert /workspace/test-ca.pem https://api.test/"),
    )
    .await;
    assert_eq!((code, out.as_str()), (0, "credential missing or wrong\n"));

    // Handed over: the version shows.
    let view = admin
        .put_credentials("cr-1", &set("v1", Some(&key), None))
        .await
        .expect("the credentials are taken");
    assert_eq!(view.credentials_version.as_deref(), Some("v1"));
    let shown = admin.get("cr-1").await.expect("the session");
    assert_eq!(shown.credentials_version.as_deref(), Some("v1"));

    // api.test is intercepted (the test CA alone does not verify it); other.test is not.
    let (code, out) = sh(
        &c,
        "cr-1",
        &format!("{CURL} --cacert /workspace/test-ca.pem https://api.test/"),
    )
    .await;
    assert_eq!(code, 60, "api.test is served with the node's CA: {out}");
    assert_eq!(
        sh(
            &c,
            "cr-1",
            &format!("{CURL} --cacert /workspace/test-ca.pem https://other.test/")
        )
        .await,
        (0, net.body("other.test").expect("a body")),
        "other.test holds its own certificate"
    );

    // curl, requests and httpx reach api.test, no key inside, no -k.
    assert_eq!(
        sh(&c, "cr-1", &format!("{CURL} https://api.test/")).await,
        (0, body.clone())
    );
    assert_eq!(
        sh(
            &c,
            "cr-1",
            &format!("{CURL} -H 'Authorization: Bearer mine' https://api.test/")
        )
        .await,
        (0, body.clone()),
        "the sandbox's own header is replaced, not doubled"
    );
    let py = |lib: &str| {
        format!(
            "python3 -c \"import {lib}; r = {lib}.get('https://api.test/', timeout=5); print(r.status_code, r.text, end='')\""
        )
    };
    assert_eq!(
        sh(&c, "cr-1", &py("requests")).await,
        (0, format!("200 {body}"))
    );
    assert_eq!(
        sh(&c, "cr-1", &py("httpx")).await,
        (0, format!("200 {body}"))
    );

    // The key is nowhere the sandbox can look.
    let grep = pattern(&key);
    let (code, out) = sh(&c, "cr-1", &format!("env | grep -c '{grep}'")).await;
    assert_eq!((code, out.trim()), (1, "0"), "env");
    let (_, out) = sh(
        &c,
        "cr-1",
        &format!("cat /proc/*/environ 2>/dev/null | grep -ac '{grep}'"),
    )
    .await;
    assert_eq!(out.trim(), "0", "/proc/*/environ");
    // The same search finds a canary planted where the sandbox writes (it does look).
    let canary = new_key();
    c.write("cr-1", "canary", canary.as_bytes().to_vec())
        .await
        .expect("the canary");
    let (_, found) = sh(
        &c,
        "cr-1",
        &format!(
            "grep -rlsE -D skip --exclude-dir=proc --exclude-dir=sys '{}' /",
            pattern(&canary)
        ),
    )
    .await;
    assert!(found.contains("/workspace/canary"), "{found}");
    let out = c
        .run(
            "cr-1",
            &format!(
                "grep -rlsE -D skip --exclude-dir=proc --exclude-dir=sys '{grep}' / ; echo \"exit=$?\""
            ),
            Some(300),
            None,
            None,
        )
        .await
        .expect("the grep over / runs");
    // No file listed; grep exits 1 (nothing found) or 2 (some files it may not read either).
    assert!(
        ["exit=1", "exit=2"].contains(&out.stdout.trim()),
        "no file the sandbox reads holds the key: {}{}",
        out.stdout,
        out.stderr
    );

    // Counted, audited and logged without the key.
    let m = metrics(&d).await;
    let line = format!(
        "sandboxd_egress_credentials_added_total{{runtime=\"egress\",source=\"{SOURCE}\"}} "
    );
    let count: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix(&line))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{line} in\n{m}"));
    assert!(count >= 4, "curl twice, requests, httpx: {count}");
    let ops = admin
        .operations(&sandboxd_api::audit::OperationQuery {
            session: Some("cr-1".into()),
            op: Some(sandboxd_api::audit::Op::Credentials),
            ..Default::default()
        })
        .await
        .expect("the audit log");
    let row = ops.operations.first().expect("an audit row of the PUT");
    assert!(
        row.target.contains("api.test:443 Authorization")
            && row.target.contains(SOURCE)
            && row.target.contains("v1"),
        "{row:?}"
    );
    assert!(
        !serde_json::to_string(&ops).expect("json").contains(&key),
        "the audit rows hold no key"
    );
    let log = common::until(
        "the egress log's credential row",
        Duration::from_secs(30),
        async || {
            let log = c.egress("cr-1", 60).await.ok()?;
            log.records
                .iter()
                .any(|r| {
                    r.name == "api.test"
                        && r.reason == format!("credential added: {SOURCE}")
                        && r.bytes_out > 0
                        && r.bytes_in > 0
                })
                .then_some(log)
        },
    )
    .await;
    assert!(!format!("{log:?}").contains(&key), "{log:?}");

    // Rotation: the server wants a new key, the operator hands it over; within 5 s.
    let key2 = new_key();
    std::fs::write(&expected, format!("Bearer {key2}\n")).expect("the server's new key");
    let (code, out) = sh(&c, "cr-1", &format!("{CURL} https://api.test/")).await;
    assert_eq!((code, out.as_str()), (0, "credential missing or wrong\n"));
    admin
        .put_credentials("cr-1", &set("v2", Some(&key2), None))
        .await
        .expect("the rotated set");
    within_5_s(
        &c,
        "cr-1",
        &format!("{CURL} -f https://api.test/"),
        |code| code == 0,
        "the rotated key used",
    )
    .await;

    // On a connection kept alive: one request, the rotation, a second on the same connection.
    let key3 = new_key();
    let script = r#"
import os, time, requests
s = requests.Session()
a = s.get('https://api.test/', timeout=5).status_code
open('/workspace/first', 'w').write(str(a))
end = time.time() + 30
while not os.path.exists('/workspace/go') and time.time() < end:
    time.sleep(0.05)
b = s.get('https://api.test/', timeout=5).status_code
print(a, b)
"#;
    c.write("cr-1", "keepalive.py", script.as_bytes().to_vec())
        .await
        .expect("the script");
    let connections = || {
        net.connections()
            .iter()
            .filter(|x| {
                x.service == "https" && Some(x.to.ip()) == net.addr("api.test").map(Into::into)
            })
            .count()
    };
    let before = connections();
    let runner = c.clone();
    let run = tokio::spawn(async move {
        runner
            .run(
                "cr-1",
                "python3 /workspace/keepalive.py",
                Some(60),
                None,
                None,
            )
            .await
    });
    let first = d.workspace("cr-1").join("first");
    common::until("the first request", Duration::from_secs(30), async || {
        std::fs::read_to_string(&first).ok()
    })
    .await;
    std::fs::write(&expected, format!("Bearer {key3}\n")).expect("the server's third key");
    admin
        .put_credentials("cr-1", &set("v3", Some(&key3), None))
        .await
        .expect("the third set");
    std::fs::write(d.workspace("cr-1").join("go"), "").expect("go");
    let out = run.await.expect("the run task").expect("the run");
    assert_eq!(out.stdout.trim(), "200 200", "{}", out.stderr);
    assert_eq!(
        connections() - before,
        1,
        "both requests on one kept-alive connection"
    );

    // Missing: a 502 in the sender's words, never a key.
    admin
        .put_credentials(
            "cr-1",
            &set("v4", None, Some("Secret agents/model-key has no key token")),
        )
        .await
        .expect("the set with a missing credential");
    let (code, out) = sh(&c, "cr-1", &format!("{CURL} -i https://api.test/")).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("HTTP/1.1 502"), "{out}");
    assert!(
        out.contains("x-sandboxd-egress: credential-missing"),
        "{out}"
    );
    assert!(
        out.contains(
            "sandboxd egress: no credential for api.test:443: Secret agents/model-key has no key token"
        ),
        "{out}"
    );

    // Nothing sandboxd said or kept holds any of the keys.
    let said = std::fs::read(d.log_file()).expect("sandboxd's log");
    assert!(!said.is_empty(), "sandboxd logged something");
    for (path, bytes) in files_under(&d.state_dir()) {
        for k in [&key, &key2, &key3] {
            assert!(!holds(&bytes, k), "{} holds a key", path.display());
        }
    }
    for k in [&key, &key2, &key3] {
        assert!(!holds(&said, k), "sandboxd's log holds a key");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_outside_the_policy_is_refused_and_a_restart_forgets_them() {
    let scratch = tempfile::tempdir().expect("a temp dir");
    let expected = scratch.path().join("expected");
    std::fs::write(&expected, "Bearer nothing\n").expect("the server's key");
    let net = internet(&expected);
    let mut d = daemon(&net);
    let admin = d.admin();
    open(&d, "cr-2").await;
    let refused = |r: Result<sandboxd_api::session::SessionView, ClientError>| match r {
        Err(ClientError::Api {
            status, message, ..
        }) => (status, message),
        other => panic!("refused, not {other:?}"),
    };
    let key = new_key();
    let mut outside = set("v1", Some(&key), None);
    outside.credentials[0].host = "denied.test".into();
    let (status, message) = refused(admin.put_credentials("cr-2", &outside).await);
    assert_eq!(status, 400);
    assert_eq!(
        message,
        "credential 0: denied.test:443 is not allowed by the egress policy of session cr-2 (runtime egress): a credential's host must be on the allow list"
    );
    let mut port = set("v1", Some(&key), None);
    port.credentials[0].ports = vec![8443];
    let (_, message) = refused(admin.put_credentials("cr-2", &port).await);
    assert!(
        message.contains("api.test:8443 is not allowed"),
        "{message}"
    );
    let mut wild = set("v1", Some(&key), None);
    wild.credentials[0].host = "*.api.test".into();
    let (_, message) = refused(admin.put_credentials("cr-2", &wild).await);
    assert!(message.contains("not a wildcard"), "{message}");
    let mut framing = set("v1", Some(&key), None);
    framing.credentials[0].header = "Content-Length".into();
    let (_, message) = refused(admin.put_credentials("cr-2", &framing).await);
    assert!(message.contains("may not set it"), "{message}");
    let mut newline = set("v1", None, None);
    newline.credentials[0].value = Some(format!("Bearer {key}\r\nX-Evil: 1"));
    let (_, message) = refused(admin.put_credentials("cr-2", &newline).await);
    assert!(message.contains("not a valid header value"), "{message}");
    assert!(!message.contains(&key), "{message}");
    assert!(
        matches!(
            admin
                .put_credentials("nobody", &set("v1", Some(&key), None))
                .await,
            Err(ClientError::NoSuchSession(_))
        ),
        "a session that does not exist: 404"
    );
    let session = d.client("not-admin");
    assert!(
        session
            .put_credentials("cr-2", &set("v1", Some(&key), None))
            .await
            .is_err(),
        "the admin token only"
    );
    assert_eq!(
        admin
            .get("cr-2")
            .await
            .expect("the session")
            .credentials_version,
        None,
        "nothing refused was kept"
    );

    // Held, then forgotten by a restart; the CA is the same after it.
    let ca = std::fs::read(d.state_dir().join("egress-ca").join("ca.crt")).expect("the CA");
    admin
        .put_credentials("cr-2", &set("v9", Some(&key), None))
        .await
        .expect("taken");
    assert_eq!(
        admin
            .get("cr-2")
            .await
            .expect("the session")
            .credentials_version
            .as_deref(),
        Some("v9")
    );
    d.process.kill9();
    d.spawn();
    let admin = d.admin();
    assert_eq!(
        admin
            .get("cr-2")
            .await
            .expect("the session")
            .credentials_version,
        None,
        "a restarted sandboxd holds none"
    );
    assert_eq!(
        std::fs::read(d.state_dir().join("egress-ca").join("ca.crt")).expect("the CA"),
        ca,
        "the CA is reused"
    );

    // A sandbox whose traffic never meets the proxy is given nothing of it: its image's own
    // roots, no CA, no variables.
    let opened = admin
        .open("cr-closed", "org-a", Some("closed"), None)
        .await
        .expect("open a session of the none runtime");
    let c = d.client(opened.token.as_deref().expect("a token on create"));
    let (code, out) = sh(
        &c,
        "cr-closed",
        "test -e /etc/sandboxd/egress-ca.crt && echo mounted; grep -c 'sandboxd node egress CA' /etc/ssl/certs/ca-certificates.crt; env | grep -E '^(SSL_CERT_FILE|REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE|NODE_EXTRA_CA_CERTS)='",
    )
    .await;
    assert_eq!((code, out.as_str()), (1, "0\n"), "nothing of the egress CA");
}

//! HTTPS on sandboxd's port: a real sandboxd with a certificate for 127.0.0.1 made by a CA of
//! the test. A client with the CA runs a command; plain HTTP, a client without the CA and a
//! connection that never says hello are refused or cut; a new certificate is served after
//! SIGHUP, and after a change of its files alone; a pair that does not fit stops the start-up
//! with a message naming the files.

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::pki::Ca;
use common::{Daemon, until};
use sandboxd_api::client::{Client, Trust};

fn trusting(ca: &Ca) -> Trust {
    Trust::ca(Some(ca.pem.as_bytes()), "the test CA").expect("the test CA is usable")
}

#[tokio::test(flavor = "multi_thread")]
async fn sandboxd_serves_https_only_to_clients_that_trust_its_ca() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let ca = Ca::new("sandboxd test CA");
    let leaf = ca.leaf(&["127.0.0.1"], dir.path(), "tls");
    let (cert, key) = (
        leaf.cert.display().to_string(),
        leaf.key.display().to_string(),
    );
    let mut d = Daemon::start(&[
        ("SANDBOXD_TLS_CERT_FILE", &cert),
        ("SANDBOXD_TLS_KEY_FILE", &key),
        ("SANDBOXD_TLS_HANDSHAKE_TIMEOUT", "2"),
    ]);
    assert!(
        d.base.starts_with("https://127.0.0.1:"),
        "sandboxd says it listens on {}",
        d.base
    );

    // With the CA: a session opened, a command run, the sessions listed.
    let admin = Client::with_trust(&d.base, &d.token, &trusting(&ca));
    let opened = admin
        .open("tls-1", "org", None, None)
        .await
        .expect("open over https");
    let token = opened.token.expect("a session token");
    let session = admin.with_token(&token);
    let ran = session
        .run(&opened.session.id, "echo over-tls", None, None, None)
        .await
        .expect("run over https");
    assert_eq!((ran.exit_code, ran.stdout.trim()), (0, "over-tls"));
    let listed = admin.list().await.expect("GET /v1/sessions over https");
    assert_eq!(listed.len(), 1);

    // Plain HTTP to the TLS port: no answer, the connection is closed.
    let plain = d.base.replacen("https://", "http://", 1);
    let err = reqwest::get(format!("{plain}/healthz"))
        .await
        .expect_err("plain HTTP gets no answer from the TLS port");
    assert!(err.is_request() || err.is_connect(), "{err:?}");

    // Without the CA (the system's roots only): the certificate is not trusted, and the
    // error says so rather than "error sending request".
    let err = Client::new(&d.base, &d.token)
        .list()
        .await
        .expect_err("an unknown issuer is refused");
    assert!(err.is_untrusted(), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "sandboxd at {} could not be reached: its TLS certificate is not trusted (invalid peer certificate: UnknownIssuer); this client trusts the system's CA roots",
            d.base
        )
    );
    // Another CA: refused the same way.
    let other = Ca::new("another CA");
    let err = Client::with_trust(&d.base, &d.token, &trusting(&other))
        .list()
        .await
        .expect_err("a certificate of another CA is refused");
    assert!(err.is_untrusted(), "{err:?}");
    assert!(
        err.to_string()
            .ends_with("this client trusts only the CA it was given"),
        "{err}"
    );

    // The name is verified: a certificate for another address is refused.
    let wrong = ca.leaf(&["10.9.9.9"], dir.path(), "wrong");
    std::fs::copy(&wrong.cert, &leaf.cert).expect("swap the certificate");
    std::fs::copy(&wrong.key, &leaf.key).expect("swap the key");
    hup(&d);
    // The new pair is served once reloaded; a fresh client makes a fresh connection.
    let err = until(
        "the certificate for 10.9.9.9 served after SIGHUP",
        Duration::from_secs(15),
        || async {
            Client::with_trust(&d.base, &d.token, &trusting(&ca))
                .list()
                .await
                .err()
        },
    )
    .await;
    assert!(err.is_untrusted(), "{err:?}");
    assert!(
        err.to_string()
            .contains("certificate not valid for name \"127.0.0.1\""),
        "{err}"
    );

    // Rotated in place to a certificate of a new CA (as cert-manager does), without a signal:
    // served once sandboxd sees the files change (it looks every 10 s).
    let rotated_ca = Ca::new("rotated CA");
    let rotated = rotated_ca.leaf(&["127.0.0.1"], dir.path(), "rotated");
    std::fs::copy(&rotated.cert, &leaf.cert).expect("rotate the certificate");
    std::fs::copy(&rotated.key, &leaf.key).expect("rotate the key");
    let sessions = until(
        "the rotated certificate served without a signal",
        Duration::from_secs(25),
        || async {
            match Client::with_trust(&d.base, &d.token, &trusting(&rotated_ca))
                .list()
                .await
            {
                Ok(sessions) => Some(sessions),
                Err(e) if e.is_untrusted() => None,
                Err(e) => panic!("the rotated certificate: {e}"),
            }
        },
    )
    .await;
    assert_eq!(sessions.len(), 1);

    // A TCP connection that never says hello is closed after the handshake timeout (2 s).
    let addr = d.base.trim_start_matches("https://").to_owned();
    let mut idle = TcpStream::connect(&addr).expect("connect");
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let connected = Instant::now();
    let mut buf = [0u8; 16];
    let read = idle.read(&mut buf);
    let waited = connected.elapsed();
    assert!(
        matches!(read, Ok(0))
            || matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "the silent connection was not closed: {read:?} after {waited:?}"
    );
    assert!(
        waited >= Duration::from_millis(1500) && waited < Duration::from_secs(8),
        "the silent connection was closed after {waited:?}, not the 2 s of SANDBOXD_TLS_HANDSHAKE_TIMEOUT"
    );

    assert!(d.terminate().success());
}

/// SIGHUP: sandboxd reads its certificate files again.
fn hup(d: &Daemon) {
    d.process.signal("HUP").expect("kill -HUP");
}

/// The start-up refuses a half or broken TLS configuration, naming the variable and file.
#[test]
fn a_broken_certificate_or_key_stops_the_start_with_a_clear_message() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let ca = Ca::new("sandboxd test CA");
    let a = ca.leaf(&["127.0.0.1"], dir.path(), "a");
    let b = ca.leaf(&["127.0.0.1"], dir.path(), "b");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "-----BEGIN PRIVATE KEY-----\nnot base64\n").expect("write");
    let missing = dir.path().join("missing.crt");
    let start = |env: &[(&str, &std::path::Path)]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandboxd"));
        cmd.env_clear()
            .env("RUST_LOG", "off")
            .env("SANDBOXD_TOKEN", "admin")
            .env("SANDBOXD_PORT", "0")
            .env("SANDBOXD_RUNTIMES", "base=never-pulled:1")
            .env("SANDBOXD_STATE_DIR", dir.path().join("state"))
            .env("SANDBOXD_WORKSPACE_ROOT", dir.path().join("ws"));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("sandboxd runs");
        assert!(!out.status.success(), "sandboxd started with {env:?}");
        String::from_utf8_lossy(&out.stderr).trim().to_owned()
    };
    assert_eq!(
        start(&[("SANDBOXD_TLS_CERT_FILE", &a.cert)]),
        "sandboxd: SANDBOXD_TLS_CERT_FILE is set but SANDBOXD_TLS_KEY_FILE is not: TLS needs both the certificate and its key (or neither, for plain HTTP)"
    );
    let err = start(&[
        ("SANDBOXD_TLS_CERT_FILE", &missing),
        ("SANDBOXD_TLS_KEY_FILE", &a.key),
    ]);
    assert_eq!(
        err,
        format!(
            "sandboxd: SANDBOXD_TLS_CERT_FILE {} cannot be read: No such file or directory (os error 2)",
            missing.display()
        )
    );
    let err = start(&[
        ("SANDBOXD_TLS_CERT_FILE", &a.cert),
        ("SANDBOXD_TLS_KEY_FILE", &garbage),
    ]);
    assert!(
        err.starts_with(&format!(
            "sandboxd: SANDBOXD_TLS_KEY_FILE {} holds no PEM private key",
            garbage.display()
        )),
        "{err}"
    );
    let err = start(&[
        ("SANDBOXD_TLS_CERT_FILE", &a.cert),
        ("SANDBOXD_TLS_KEY_FILE", &b.key),
    ]);
    assert!(
        err.starts_with(&format!(
            "sandboxd: the key in SANDBOXD_TLS_KEY_FILE {} does not fit the certificate in SANDBOXD_TLS_CERT_FILE {}: ",
            b.key.display(),
            a.cert.display()
        )),
        "{err}"
    );
}

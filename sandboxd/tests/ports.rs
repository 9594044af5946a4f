//! Ports against the real dockerd: a `python3 -m http.server` in a sandbox with no network is
//! reached through sandboxd, once its port is opened; an unopened port, another session's port,
//! a port nothing answers on and one that accepts and never answers are each refused in words,
//! while sandboxd serves other sessions; the session token never reaches the port.

mod common;

use std::time::Duration;

use common::{Backend, Daemon, counter, metrics, raw, until};
use reqwest::Method;
use sandboxd_api::audit::{Op, OperationQuery};
use sandboxd_api::client::Client;
use serde_json::Value;

async fn session(d: &Daemon, name: &str) -> (Client, String) {
    let opened = d
        .admin()
        .open(name, "org-ports", None, None)
        .await
        .expect("open");
    let token = opened.token.expect("a token on create");
    (d.client(&token), token)
}

fn tools() -> Daemon {
    let tools = std::env::var("SANDBOXD_TOOLS_IMAGE")
        .expect("SANDBOXD_TOOLS_IMAGE is not set: run `make up` and `eval \"$(make -s env)\"`");
    Daemon::start_on(
        Backend::Agent,
        &[
            ("SANDBOXD_RUNTIMES", &format!("tools={tools}")),
            ("SANDBOXD_PORT_ANSWER_TIMEOUT", "2"),
        ],
    )
}

/// Posts each bad body to `url` with `token` and checks it is refused 400 with its words.
async fn refused_400(url: &str, token: &str, cases: &[(&str, &str)]) {
    for (bad, why) in cases {
        let (status, body) = raw(Method::POST, url, Some(token), Some(bad)).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(
            body["message"].as_str().unwrap_or_default().contains(why),
            "{bad}: {body}"
        );
    }
}

/// Starts `python3 -m http.server` on `port` of the sandbox's loopback, serving `/workspace/site`.
async fn serve(s: &Client, id: &str, port: u16) {
    let started = s
        .run(
            id,
            &format!(
                "mkdir -p site && echo hello-from-{id} > site/hello.txt && cd site && \
                 (nohup python3 -m http.server {port} --bind 127.0.0.1 >/tmp/http.log 2>&1 &)"
            ),
            None,
            None,
            None,
        )
        .await
        .expect("the server starts");
    assert_eq!(started.exit_code, 0, "{started:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_in_a_sandbox_without_network_is_reached_once_its_port_is_open() {
    let d = tools();
    let (s, token) = session(&d, "web").await;
    let (_, other_token) = session(&d, "other").await;
    // No network at all: the sandbox has only its loopback.
    // (/proc/net/dev, not /sys/class/net: gVisor has no sysfs network folder.)
    let ifaces = s
        .run(
            "web",
            "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
            None,
            None,
            None,
        )
        .await
        .expect("run");
    assert_eq!(ifaces.stdout.trim(), "lo", "{ifaces:?}");
    serve(&s, "web", 3000).await;
    let url = |path: &str| format!("{}/v1/sessions/web/ports/3000/{path}", d.base);

    // Not opened: refused, with the way to open it.
    let (status, body) = raw(Method::GET, &url("hello.txt"), Some(&token), None).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["code"], "port_not_open");
    assert_eq!(
        body["message"],
        "Port 3000 of session 'web' is not open: open it with POST /v1/sessions/web/ports {\"port\": 3000} (or the SandboxSession's spec.ports)"
    );

    let opened = s.open_port("web", 3000).await.expect("open the port");
    assert_eq!(opened, vec![3000]);
    assert_eq!(s.ports("web").await.expect("list"), vec![3000]);
    let fetched = until("the server answers", Duration::from_secs(15), async || {
        let (status, body) = raw(Method::GET, &url("hello.txt"), Some(&token), None).await;
        (status == 200).then_some(body)
    })
    .await;
    assert_eq!(fetched, Value::String("hello-from-web\n".to_owned()));
    // The root, a listing, and a query string passed on.
    let (status, listing) = raw(Method::GET, &url("?x=1"), Some(&token), None).await;
    assert_eq!(status, 200);
    assert!(
        listing.as_str().unwrap_or_default().contains("hello.txt"),
        "{listing}"
    );
    // A method the server has no handler for is its answer, passed back as it is.
    let (status, _) = raw(Method::DELETE, &url("hello.txt"), Some(&token), Some("{}")).await;
    assert_eq!(status, 501);

    // The session token never reaches the port: a server that prints its request's headers.
    let echo = "import http.server\n\
class H(http.server.BaseHTTPRequestHandler):\n\
\x20   def do_GET(self):\n\
\x20       body = str(self.headers).encode()\n\
\x20       self.send_response(200)\n\
\x20       self.send_header('Content-Length', str(len(body)))\n\
\x20       self.end_headers()\n\
\x20       self.wfile.write(body)\n\
http.server.HTTPServer(('127.0.0.1', 3001), H).serve_forever()\n";
    s.write("web", "echo.py", echo)
        .await
        .expect("the echo server's file");
    s.run(
        "web",
        "(nohup python3 echo.py >/tmp/echo.log 2>&1 &)",
        None,
        None,
        None,
    )
    .await
    .expect("the echo server starts");
    s.open_port("web", 3001).await.expect("open");
    let headers = until(
        "the echo server answers",
        Duration::from_secs(15),
        async || {
            let (status, body) = raw(
                Method::GET,
                &format!("{}/v1/sessions/web/ports/3001/x", d.base),
                Some(&token),
                None,
            )
            .await;
            (status == 200).then_some(body)
        },
    )
    .await;
    let headers = headers.as_str().unwrap_or_default().to_ascii_lowercase();
    assert!(!headers.contains("authorization"), "{headers}");
    assert!(!headers.contains(&token), "{headers}");
    assert!(headers.contains("host: localhost:3001"), "{headers}");
    assert!(
        headers.contains("x-forwarded-prefix: /v1/sessions/web/ports/3001"),
        "{headers}"
    );

    // Another session's token reaches none of it.
    let (status, _) = raw(Method::GET, &url("hello.txt"), Some(&other_token), None).await;
    assert_eq!(status, 403);

    // Open, but nothing answers there.
    s.open_port("web", 3999).await.expect("open");
    let (status, body) = raw(
        Method::GET,
        &format!("{}/v1/sessions/web/ports/3999/", d.base),
        Some(&token),
        None,
    )
    .await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["code"], "port_closed");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("nothing in the sandbox answers on port 3999 ("),
        "{body}"
    );

    // A port that takes the connection and never answers: cut at SANDBOXD_PORT_ANSWER_TIMEOUT,
    // and sandboxd serves the session meanwhile.
    s.run(
        "web",
        "(nohup python3 -c 'import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((\"127.0.0.1\", 3002)); s.listen(64); c=[]\nwhile True: c.append(s.accept())' >/dev/null 2>&1 &); sleep 0.5",
        None,
        None,
        None,
    )
    .await
    .expect("the silent server starts");
    s.open_port("web", 3002).await.expect("open");
    let silent = {
        let (url, token) = (
            format!("{}/v1/sessions/web/ports/3002/", d.base),
            token.clone(),
        );
        tokio::spawn(async move { raw(Method::GET, &url, Some(&token), None).await })
    };
    let served = s
        .run("web", "echo served", None, None, None)
        .await
        .expect("served");
    assert_eq!(served.stdout, "served\n");
    let (status, body) = silent.await.expect("the silent request");
    assert_eq!((status, &body["code"]), (504, &Value::from("port_timeout")));
    assert_eq!(
        body["message"],
        "Port 3002 of session 'web' took the connection but sent no answer within 2 s"
    );

    // A raw stream, half-closed: a server that answers once its input ended gets to answer.
    s.run(
        "web",
        "(nohup python3 -c 'import socket\ns=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((\"127.0.0.1\", 3003)); s.listen(8)\nwhile True:\n    c,_=s.accept(); d=b\"\"\n    while True:\n        b=c.recv(65536)\n        if not b: break\n        d+=b\n    c.sendall(d.upper()); c.close()' >/tmp/upper.log 2>&1 &); sleep 0.5",
        None,
        None,
        None,
    )
    .await
    .expect("the upper-casing server starts");
    s.open_port("web", 3003).await.expect("open");
    let mut stream = s.connect_port("web", 3003).await.expect("a stream");
    stream
        .send(b"through the sandbox's loopback")
        .await
        .expect("send");
    stream.finish().await.expect("the end of the input");
    let mut answer = Vec::new();
    while let Some(bytes) = stream.recv().await {
        answer.extend(bytes.expect("bytes"));
    }
    assert_eq!(answer, b"THROUGH THE SANDBOX'S LOOPBACK");

    // Closed: refused again; the list says so.
    assert_eq!(
        s.close_port("web", 3000).await.expect("close"),
        vec![3001, 3002, 3003, 3999]
    );
    let (status, _) = raw(Method::GET, &url("hello.txt"), Some(&token), None).await;
    assert_eq!(status, 404);

    // Every connection is counted by its outcome, and is in the audit log.
    let m = metrics(&d).await;
    for (outcome, at_least) in [("connected", 4), ("not_open", 2), ("closed", 1)] {
        let series = format!("sandboxd_port_connections_total{{outcome=\"{outcome}\"}}");
        assert!(counter(&m, &series) >= at_least, "{series}: {m}");
    }
    let page = d
        .admin()
        .operations(&OperationQuery {
            session: Some("web".to_owned()),
            op: Some(Op::Port),
            ..OperationQuery::default()
        })
        .await
        .expect("operations");
    let targets: Vec<&str> = page.operations.iter().map(|o| o.target.as_str()).collect();
    assert!(targets.contains(&"3000 GET /hello.txt"), "{targets:?}");
    assert!(
        page.operations
            .iter()
            .any(|o| o.target == "3999 GET /" && !o.ok),
        "{targets:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ports_are_bounded_and_checked() {
    let d = tools();
    let (s, token) = session(&d, "many").await;
    for port in 1..=16 {
        s.open_port("many", port).await.expect("open");
    }
    let (status, body) = raw(
        Method::POST,
        &format!("{}/v1/sessions/many/ports", d.base),
        Some(&token),
        Some("{\"port\": 17}"),
    )
    .await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["code"], "port_limit");
    assert_eq!(
        body["message"],
        "Session 'many' already has 16 ports open, the most a session may have: close one (DELETE /v1/sessions/many/ports/{port})"
    );
    refused_400(
        &format!("{}/v1/sessions/many/ports", d.base),
        &token,
        &[
            ("{\"port\": 0}", "port must be 1 to 65535, not 0"),
            ("{\"port\": 70000}", "invalid port request"),
            ("{\"prot\": 1}", "invalid port request"),
        ],
    )
    .await;
    // The list survives a restart of sandboxd (a kill -9: nothing written at exit).
    let mut d = d;
    d.process.kill9();
    d.spawn();
    let s = d.client(&token);
    assert_eq!(
        s.ports("many").await.expect("list").len(),
        16,
        "the open ports are kept with the session"
    );
}

/// A signed preview link: a browser reaches the port with no token, the link is bound to its
/// session and port, and it stops working when it expires, when the session's token is
/// rotated and when the port closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_link_reaches_its_port_without_the_token_until_it_expires() {
    let d = tools();
    let (s, token) = session(&d, "shown").await;
    let (o, other_token) = session(&d, "private").await;
    serve(&s, "shown", 3000).await;
    serve(&o, "private", 3000).await;

    // Only an open port gets a link.
    let (status, body) = raw(
        Method::POST,
        &format!("{}/v1/sessions/shown/previews", d.base),
        Some(&token),
        Some("{\"port\": 3000}"),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("port_not_open"))
    );
    s.open_port("shown", 3000).await.expect("open");
    o.open_port("private", 3000).await.expect("open");
    let link = s.preview("shown", 3000, None).await.expect("a link");
    assert_eq!(link.port, 3000);
    assert_eq!(link.path, format!("/preview/{}/", link.token));
    let expires = chrono::DateTime::parse_from_rfc3339(&link.expires_at).expect("RFC 3339");
    let left = expires.timestamp() - chrono::Utc::now().timestamp();
    assert!(
        (3590..=3600).contains(&left),
        "an hour by default: {left} s"
    );

    // No token: the link is the credential.
    let url = |path: &str| format!("{}{}", d.base, path);
    let page = until("the server answers", Duration::from_secs(15), async || {
        let (status, body) = raw(
            Method::GET,
            &url(&format!("{}hello.txt", link.path)),
            None,
            None,
        )
        .await;
        (status == 200).then_some(body)
    })
    .await;
    assert_eq!(page, Value::String("hello-from-shown\n".to_owned()));
    // The bare link goes to its root with a slash (followed: the server's listing).
    let (status, listing) = raw(
        Method::GET,
        &url(&format!("/preview/{}", link.token)),
        None,
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        listing.as_str().unwrap_or_default().contains("hello.txt"),
        "{listing}"
    );

    // Bound to its session and port: another session, another port or a forged expiry is
    // refused, as is a token of another session asking for this one's link.
    let (head, sig) = link.token.rsplit_once('.').expect("a signature");
    let (id_part, rest) = head.split_once('.').expect("a session");
    let b64 = |s: &str| {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
    };
    let forged = [
        format!("{}.{rest}.{sig}", b64("private")),
        format!("{id_part}.{}.{sig}", rest.replacen("3000", "3001", 1)),
        format!("{id_part}.3000.99999999999.{sig}"),
        "not-a-link".to_owned(),
    ];
    for bad in &forged {
        let (status, body) = raw(
            Method::GET,
            &url(&format!("/preview/{bad}/hello.txt")),
            None,
            None,
        )
        .await;
        assert_eq!(status, 403, "{bad}: {body}");
        assert_eq!(body["code"], "preview_invalid", "{bad}");
        assert!(
            body["message"]
                .as_str()
                .unwrap_or_default()
                .starts_with("This preview link is not valid"),
            "{body}"
        );
    }
    let (status, body) = raw(
        Method::POST,
        &format!("{}/v1/sessions/shown/previews", d.base),
        Some(&other_token),
        Some("{\"port\": 3000}"),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("forbidden")),
        "{body}"
    );
    refused_400(
        &format!("{}/v1/sessions/shown/previews", d.base),
        &token,
        &[
            (
                "{\"port\": 3000, \"expires_in_seconds\": 0}",
                "expires_in_seconds must be 1 to 604800 (7 days), not 0",
            ),
            (
                "{\"port\": 3000, \"expires_in_seconds\": 604801}",
                "expires_in_seconds must be 1 to 604800 (7 days), not 604801",
            ),
            ("{\"port\": 3000, \"expiry\": 5}", "invalid preview request"),
        ],
    )
    .await;

    // Expired: refused, saying when.
    let short = s
        .preview("shown", 3000, Some(1))
        .await
        .expect("a short link");
    let (status, _) = raw(
        Method::GET,
        &url(&format!("{}hello.txt", short.path)),
        None,
        None,
    )
    .await;
    assert_eq!(status, 200, "before it expires");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let (status, body) = raw(
        Method::GET,
        &url(&format!("{}hello.txt", short.path)),
        None,
        None,
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["code"], "preview_expired");
    assert_eq!(
        body["message"],
        format!(
            "This preview link expired at {}: ask for a new one (POST /v1/sessions/{{id}}/previews)",
            short.expires_at
        )
    );

    // A closed port is refused through its link; a rotated token ends every link.
    s.close_port("shown", 3000).await.expect("close");
    let (status, body) = raw(
        Method::GET,
        &url(&format!("{}hello.txt", link.path)),
        None,
        None,
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("port_not_open")),
        "{body}"
    );
    s.open_port("shown", 3000).await.expect("open again");
    let (status, _) = raw(
        Method::GET,
        &url(&format!("{}hello.txt", link.path)),
        None,
        None,
    )
    .await;
    assert_eq!(status, 200, "the link works again once the port is open");
    d.admin().rotate_token("shown").await.expect("rotate");
    let (status, body) = raw(
        Method::GET,
        &url(&format!("{}hello.txt", link.path)),
        None,
        None,
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("preview_invalid")),
        "{body}"
    );

    // The other session was served all along.
    let (status, _) = raw(
        Method::GET,
        &format!("{}/v1/sessions/private/ports/3000/hello.txt", d.base),
        Some(&other_token),
        None,
    )
    .await;
    assert_eq!(status, 200);
}

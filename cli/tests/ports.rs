//! `kubectl sandbox ports` and `kubectl sandbox port-forward` end to end: the real binary
//! against a real sandboxd on the project's dockerd, the real operator and the API server from
//! `make up`, as shell.rs sets them up, with a session of the tools image (python3) and no
//! network. A `python3 -m http.server` on the sandbox's loopback is reached from a local port
//! once its port is open, by plain TCP clients; a port not open is refused before listening,
//! naming the command that opens it; a connection to a port nothing answers on is refused in
//! sandboxd's words and the forward goes on; SIGTERM ends it with status 0.

mod common;

use std::io::{Read as _, Write as _};
use std::net::TcpStream;

use common::{Running, STEP, TestScope, ok_stdout, plugin, text};
use sandboxd_tests::host::Host;
use serde_json::json;

/// The local port of `Forwarding from 127.0.0.1:PORT -> remote` in `out`.
fn forwarded_port(out: &str, remote: u16) -> Option<u16> {
    let tail = format!(" -> {remote}");
    out.lines().find_map(|l| {
        l.strip_prefix("Forwarding from 127.0.0.1:")?
            .strip_suffix(&tail)?
            .parse()
            .ok()
    })
}

/// Sends `request` to 127.0.0.1:`port` and reads the answer until the connection closes.
fn exchange(port: u16, request: &str) -> String {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).expect("the local port takes it");
    conn.set_read_timeout(Some(STEP)).expect("a read timeout");
    conn.write_all(request.as_bytes()).expect("request sent");
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer)
        .expect("the answer, then the end of the connection");
    String::from_utf8_lossy(&answer).into_owned()
}

/// A GET of `path` from the server behind local `port` (HTTP/1.0: it closes when it answered).
fn get(port: u16, path: &str) -> String {
    exchange(
        port,
        &format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n"),
    )
}

/// The JSON body of an HTTP/1.1 POST of `body` to `url` (`http://127.0.0.1:PORT/path`) with
/// `authorization`.
fn post_json(url: &str, authorization: &str, body: &serde_json::Value) -> serde_json::Value {
    let rest = url.strip_prefix("http://").expect("a plain HTTP endpoint");
    let (authority, path) = rest.split_at(rest.find('/').expect("a path"));
    let body = body.to_string();
    let mut conn = TcpStream::connect(authority).expect("sandboxd takes the connection");
    conn.set_read_timeout(Some(STEP)).expect("a read timeout");
    write!(
        conn,
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nAuthorization: {authorization}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("request sent");
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).expect("the answer");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    let (_, json) = answer.split_once("\r\n\r\n").expect("a body");
    serde_json::from_str(json).expect("a JSON body")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_in_a_sandbox_without_network_is_reached_through_a_local_port() {
    let tools = std::env::var("SANDBOXD_TOOLS_IMAGE")
        .expect("SANDBOXD_TOOLS_IMAGE is not set: run `make up` and `eval \"$(hack/env.sh)\"`");
    let test = TestScope::new("ports", "ports").await;
    let (ns, scope) = (test.ns.clone(), test.scope.clone());
    let host_name = format!("ports-host-{scope}");

    // One sandboxd, registered as a SandboxHost with its admin token, a default Runtime of the
    // tools image without network and the operator; then the session.
    let sandboxd_host = Host::start(&host_name, &[]);
    test.register_host(&sandboxd_host).await;
    let tools_runtime = format!("tools-{scope}");
    test.create_runtime(
        &tools_runtime,
        json!({"description": "the tools image, no network", "image": tools, "default": true}),
    )
    .await;
    let operator = test.operator();
    test.open("s1");

    // No network at all, and a web server on the sandbox's loopback, started in the
    // background by one exec.
    assert_eq!(
        ok_stdout(&ns, &["exec", "s1", "--", "ls /sys/class/net"]),
        "lo\n"
    );
    ok_stdout(
        &ns,
        &[
            "exec",
            "s1",
            "--",
            "cd /workspace && mkdir -p site && echo hello > site/hello.txt && (cd site && nohup python3 -m http.server 3000 --bind 127.0.0.1 >/dev/null 2>&1 &) && sleep 1",
        ],
    );

    // Not open: refused before listening, naming the command that opens it.
    assert_eq!(
        ok_stdout(&ns, &["ports", "s1"]),
        "no port of session s1 is open\n"
    );
    let refused = plugin(&ns, &["port-forward", "s1", ":3000"]);
    let (out, err) = text(&refused);
    assert_eq!(refused.status.code(), Some(1), "{out:?} {err:?}");
    assert_eq!(out, "");
    assert_eq!(
        err,
        "kubectl sandbox: port 3000 of session s1 is not open: open it with `kubectl sandbox ports s1 --open 3000`\n"
    );

    // Opened (and 3999, where nothing answers), then forwarded from free local ports.
    assert_eq!(ok_stdout(&ns, &["ports", "s1", "--open", "3000"]), "3000\n");
    assert_eq!(
        ok_stdout(&ns, &["ports", "s1", "--open", "3999"]),
        "3000\n3999\n"
    );
    let forward = Running::plugin(&ns, &["port-forward", "s1", ":3000", ":3999"]);
    let (web, nothing) = forward.wait_for("two Forwarding lines", |out, _| {
        Some((forwarded_port(out, 3000)?, forwarded_port(out, 3999)?))
    });
    assert_ne!(web, 3000, "a free local port, not the remote one");

    // Two connections, each answered.
    for _ in 0..2 {
        let answer = get(web, "/hello.txt");
        assert!(answer.starts_with("HTTP/1.0 200 OK\r\n"), "{answer:?}");
        assert!(answer.ends_with("\r\n\r\nhello\n"), "{answer:?}");
    }
    let handled = format!("Handling connection for {web}\n");
    forward.wait_for("two connections handled", |out, _| {
        (out.matches(&handled).count() == 2).then_some(())
    });

    // Nothing answers on 3999: that connection (which sends nothing, so its close is a FIN,
    // not a reset) is closed, refused in sandboxd's words on stderr, and the forward goes on.
    assert_eq!(exchange(nothing, ""), "");
    let refusal = forward.wait_for("the refusal", |_, err| {
        err.lines()
            .find(|l| l.contains(&format!("connection for {nothing} to port 3999")))
            .map(str::to_owned)
    });
    assert!(
        refusal.starts_with(&format!(
            "kubectl sandbox: connection for {nothing} to port 3999 of session s1 refused: port_closed (502): nothing in the sandbox answers on port 3999"
        )),
        "{refusal}"
    );
    assert!(get(web, "/hello.txt").ends_with("\r\n\r\nhello\n"));

    // SIGTERM: the forward ends with status 0.
    let (code, out, err) = forward.terminate();
    assert_eq!(code, 0, "{out:?} {err:?}");
    assert_eq!(out.matches("Handling connection for").count(), 4, "{out}");

    // Closed: listed no more, and refused again before listening.
    assert_eq!(
        ok_stdout(&ns, &["ports", "s1", "--close", "3999"]),
        "3000\n"
    );
    let refused = plugin(&ns, &["port-forward", "s1", "8080:3999", "3000"]);
    let (_, err) = text(&refused);
    assert_eq!(refused.status.code(), Some(1), "{err:?}");
    assert!(
        err.contains("open it with `kubectl sandbox ports s1 --open 3999`"),
        "{err}"
    );

    // A preview link: its URL works with no token at all, from a plain client.
    let printed = ok_stdout(
        &ns,
        &["ports", "s1", "--preview", "3000", "--expires", "600"],
    );
    let mut lines = printed.lines();
    let link = lines.next().expect("the link").to_owned();
    assert!(
        lines
            .next()
            .is_some_and(|l| l.starts_with("reaches port 3000 of session s1 with no token until ")),
        "{printed}"
    );
    let rest = link.strip_prefix("http://").expect("a plain HTTP endpoint");
    let (authority, path) = rest.split_at(rest.find('/').expect("a path"));
    let mut conn = TcpStream::connect(authority).expect("sandboxd takes the connection");
    conn.set_read_timeout(Some(STEP)).expect("a read timeout");
    write!(
        conn,
        "GET {path}hello.txt HTTP/1.0\r\nHost: {authority}\r\n\r\n"
    )
    .expect("sent");
    let mut answer = String::new();
    conn.read_to_string(&mut answer).expect("the answer");
    assert!(answer.starts_with("HTTP/1.0 200 OK\r\n"), "{answer}");
    assert!(answer.ends_with("\r\n\r\nhello\n"), "{answer}");
    let alone = plugin(&ns, &["ports", "s1", "--preview", "3000", "--open", "3001"]);
    let (_, err) = text(&alone);
    assert_eq!(alone.status.code(), Some(1), "{err}");
    assert_eq!(
        err,
        "kubectl sandbox: --preview is given alone: open the port first (`--open PORT`), then ask for its link\n"
    );

    // The MCP server: its URL and a configuration that works as printed, through sandboxd into
    // this sandbox without network.
    let printed = ok_stdout(&ns, &["mcp", "s1", "--show-token"]);
    let config: serde_json::Value =
        serde_json::from_str(&printed[printed.find('{').expect("a configuration")..])
            .expect("the configuration is JSON");
    let server = &config["mcpServers"]["sandbox-s1"];
    let (url, bearer) = (
        server["url"].as_str().expect("a url"),
        server["headers"]["Authorization"]
            .as_str()
            .expect("a bearer"),
    );
    assert_eq!(server["type"], "http");
    assert!(url.ends_with("/mcp"), "{url}");
    assert!(
        printed.starts_with(&format!("MCP server of session s1: {url}\n")),
        "{printed}"
    );
    let called = post_json(
        url,
        bearer,
        &json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {"name": "read_file", "arguments": {"path": "site/hello.txt"}}}),
    );
    assert_eq!(
        called,
        json!({"jsonrpc": "2.0", "id": 7,
               "result": {"content": [{"type": "text", "text": "     1\thello"}], "isError": false}})
    );
    // Without --show-token the token stays out, and the Secret that holds it is named.
    let token = bearer.strip_prefix("Bearer ").expect("a bearer token");
    let hidden = ok_stdout(&ns, &["mcp", "s1"]);
    assert!(!hidden.contains(token), "{hidden}");
    assert!(
        hidden.contains("\"Authorization\": \"Bearer ${SANDBOX_TOKEN}\""),
        "{hidden}"
    );
    assert!(
        hidden.contains(&format!("kubectl get secret -n {ns} ")),
        "{hidden}"
    );

    // Clean up: the operator is stopped first, so drop finalizers.
    drop(operator);
    drop(sandboxd_host);
    test.clean_up(&[&host_name], &[&tools_runtime], &["s1"])
        .await;
}

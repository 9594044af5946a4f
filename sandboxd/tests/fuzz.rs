//! Schemathesis against a real sandboxd (real dockerd, the local base image), from the OpenAPI
//! documents the daemon serves: `GET /openapi.json` (the `/v1` API) and `GET /wire/openapi.json`
//! (the pydantic-ai-backend wire protocol): requests generated from every route's parameters
//! and bodies, with the admin token and with a session token, seeded and bounded. Each response
//! must be no 5xx the document does not list, have a status the route documents, and match the
//! documented schema. The session's workspace holds a symlink out of it and the folder next to
//! the workspaces a canary: the fuzzer must not change or reach either.
//! Schemathesis is installed at the pin of `hack/versions.env` by `hack/schemathesis-venv.sh`;
//! this test fails (never skips) when it cannot run.
//!
//! The run's length is a knob: `SANDBOXD_FUZZ_MAX_EXAMPLES` (examples per operation and phase,
//! 12 by default) and `SANDBOXD_FUZZ_MAX_TIME` (seconds per run, 30 by default); the long run
//! of `docs/reliability.md` sets both.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Daemon, hack_path, repo};

/// The run every `{run_id}` of `/v1` names: one that finished in the session.
const RUN: &str = "fuzz-run";
/// The run every `{run_id}` of the wire protocol names (its ids are 32 hex digits).
const WIRE_RUN: &str = "0123456789abcdef0123456789abcdef";

/// Examples per operation and phase: `SANDBOXD_FUZZ_MAX_EXAMPLES`, 12 by default.
fn max_examples() -> String {
    knob("SANDBOXD_FUZZ_MAX_EXAMPLES", 12)
}

/// Seconds each Schemathesis run may take: `SANDBOXD_FUZZ_MAX_TIME`, 30 by default.
fn max_time() -> String {
    knob("SANDBOXD_FUZZ_MAX_TIME", 30)
}

fn knob(name: &str, default: u64) -> String {
    match std::env::var(name) {
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(n) if n > 0 => n.to_string(),
            _ => panic!("{name}={v:?} is not a positive whole number"),
        },
        Err(_) => default.to_string(),
    }
}

/// One Schemathesis run against `d`: the document at `document`, the token in `header`, the
/// path parameters of `params` (TOML lines) and the CLI's filters in `filters`.
struct Run<'a> {
    label: &'a str,
    document: &'a str,
    header: String,
    params: String,
    filters: &'a [&'a str],
}

/// Runs `/v1`'s Schemathesis with `token` against `d`, the `{id}` of every route being `session`.
fn fuzz(st: &str, d: &Daemon, token: &str, session: &str, label: &str) {
    fuzz_run(
        st,
        d,
        &Run {
            label,
            document: "/openapi.json",
            header: format!("Authorization: Bearer {token}"),
            params: format!("\"path.id\" = \"{session}\"\n\"path.run_id\" = \"{RUN}\"\n"),
            // Replacing the allowlist builds images from whatever the fuzzer names (minutes of
            // builds and pulls); destroying the session leaves nothing for the other routes.
            // The audit stream follows the log for as long as its client reads, so no answer
            // of it ever ends: its bad input and its cursor are `audit.rs`'s tests. HTTP passed
            // to a sandbox's port answers what the port answers (a 502 when nothing listens
            // there, a 500 of the port's own), so it is no server error of sandboxd's: its
            // refusals are `ports.rs`'s tests. A file watch streams until its client leaves. The
            // MCP route answers JSON-RPC (its errors are JSON-RPC's, not `{"code"}`): the SDK's
            // `test_mcp.py` drives it with the official client. A preview link's routes pass
            // what they get to a port like `to_port`: their refusals are `ports.rs`'s tests.
            filters: &[
                "--exclude-operation-id",
                "put_runtimes",
                "--exclude-operation-id",
                "destroy",
                "--exclude-operation-id",
                "operations_stream",
                "--exclude-operation-id",
                "to_port",
                "--exclude-operation-id",
                "to_port_root",
                "--exclude-operation-id",
                "watch",
                "--exclude-operation-id",
                "mcp",
                "--exclude-operation-id",
                "to_preview",
                "--exclude-operation-id",
                "to_preview_root",
                "--exclude-operation-id",
                "preview_bare",
            ],
        },
    );
}

fn fuzz_run(st: &str, d: &Daemon, run: &Run) {
    let label = run.label;
    let config = d.dir.path().join(format!("schemathesis-{label}.toml"));
    std::fs::write(&config, format!("[parameters]\n{}", run.params)).expect("the config file");
    let started = std::time::Instant::now();
    let out = Command::new(st)
        .arg("--config-file")
        .arg(&config)
        .arg("run")
        .arg(format!("{}{}", d.base, run.document))
        .args(["--url", &d.base])
        .args(["--header", &run.header])
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,response_schema_conformance",
        ])
        .args(["--phases", "examples,fuzzing"])
        .args(["--max-examples", &max_examples()])
        .args(["--workers", "1", "--request-timeout", "30"])
        .args(["--max-time", &max_time()])
        // The same requests every time, so a failure reproduces.
        .arg("--generation-deterministic")
        .arg("--no-color")
        .args(run.filters)
        .current_dir(d.dir.path())
        .output()
        .expect("schemathesis runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "schemathesis with the {label} token found failures ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // A token that stopped working would leave routes at 401, which the document lists (403
    // from the admin routes is what a session token gets).
    assert!(
        !stdout.contains("401 Unauthorized ("),
        "schemathesis with the {label} token got only 401 from some routes:\n{stdout}"
    );
    eprintln!(
        "schemathesis with the {label} token ({} s, {} {}):\n{stdout}",
        started.elapsed().as_secs(),
        run.document,
        d.base
    );
}

/// Every file below `dir`, with its content (a symlink: its target).
/// A canary folder next to the workspaces, with a file, and a symlink to it from inside the
/// workspace of session `fuzz`: the folder and what it holds before the fuzzer runs.
fn canary(d: &Daemon) -> (PathBuf, Vec<(PathBuf, Vec<u8>)>) {
    let outside = d
        .workspace_root()
        .parent()
        .expect("a parent")
        .join("outside");
    std::fs::create_dir_all(&outside).expect("the canary folder");
    std::fs::write(outside.join("secret.txt"), "untouched").expect("the canary");
    std::os::unix::fs::symlink(&outside, d.workspace("fuzz").join("link")).expect("a symlink");
    let before = snapshot(&outside);
    (outside, before)
}

/// The OpenAPI document sandboxd serves at `route`.
async fn served_document(d: &Daemon, route: &str) -> serde_json::Value {
    reqwest::get(format!("{}{route}", d.base))
        .await
        .unwrap_or_else(|e| panic!("GET {route}: {e}"))
        .json()
        .await
        .expect("the document is JSON")
}

fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let Ok(meta) = p.symlink_metadata() else {
                continue;
            };
            if meta.is_dir() {
                todo.push(p.clone());
                out.push((p, Vec::new()));
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&p).unwrap_or_default();
                out.push((p, target.into_os_string().into_encoded_bytes()));
            } else {
                out.push((p.clone(), std::fs::read(&p).unwrap_or_default()));
            }
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn schemathesis_finds_no_undocumented_answer_and_no_escape() {
    let st = hack_path("schemathesis-venv.sh");
    let d = Daemon::start(&[("SANDBOXD_EXECUTE_TIMEOUT", "5")]);
    let admin = d.admin();
    let opened = admin
        .open("fuzz", "org-fuzz", None, None)
        .await
        .expect("open");
    let token = opened.token.expect("a new session has a token");
    let session = d.client(&token);
    session
        .write("fuzz", "inside/notes.txt", "kept")
        .await
        .expect("write");

    let ran = session
        .run("fuzz", "echo fuzz", None, None, Some(RUN))
        .await
        .expect("a run");
    assert_eq!(ran.exit_code, 0);

    // Outside the workspace: a canary folder next to the workspaces, and a symlink to it from
    // inside the session's workspace.
    let (outside, before) = canary(&d);

    // What the fuzzer found before, answered as the document says.
    let doc = served_document(&d, "/openapi.json").await;
    for (method, path, query, body, status, code) in [
        // An empty owner is not an owner: 400, which the document did not list.
        (
            "post",
            "/v1/sessions/{id}/token",
            "?owner=",
            None,
            400,
            "bad_request",
        ),
        // A NUL in the command: the agent could not start the run (502); now refused, 400.
        (
            "post",
            "/v1/sessions/{id}/runs",
            "",
            Some(r#"{"command": "echo a\u0000b"}"#),
            400,
            "bad_request",
        ),
    ] {
        let url = format!("{}{}{query}", d.base, path.replace("{id}", "fuzz"));
        let (got, body) = common::raw(
            method.to_uppercase().parse().expect("a method"),
            &url,
            Some(&d.token),
            body,
        )
        .await;
        assert_eq!(
            (got, body["code"].as_str()),
            (status, Some(code)),
            "{method} {url}"
        );
        let documented = &doc["paths"][path][method]["responses"][status.to_string()];
        assert!(
            documented["description"]
                .as_str()
                .is_some_and(|d| d.contains(&format!("`{code}`"))),
            "{method} {path} documents {status} {code}"
        );
    }

    fuzz(&st, &d, &d.token, "fuzz", "admin");
    // The admin run rotated the session's token (`POST /v1/sessions/{id}/token`): a fresh one.
    let token = admin.rotate_token("fuzz").await.expect("a new token");
    fuzz(&st, &d, &token, "fuzz", "session");

    assert_eq!(
        snapshot(&outside),
        before,
        "the folder outside the workspace changed"
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("secret.txt")).expect("the canary"),
        "untouched"
    );
    // sandboxd still serves, and the session is still there.
    let view = admin.get("fuzz").await.expect("the session");
    assert_eq!(view.id, "fuzz");
}

/// The document is served without a token and is the committed one; every route it describes
/// is one the daemon serves: without a token, the public ones answer 200 and every other one
/// 401 `unauthorized` (never 404 `route_not_found` or 405).
#[tokio::test(flavor = "multi_thread")]
async fn the_served_document_describes_the_served_routes() {
    let d = Daemon::start(&[]);
    let resp = reqwest::get(format!("{}/openapi.json", d.base))
        .await
        .expect("GET /openapi.json");
    assert_eq!(resp.status().as_u16(), 200);
    let text = resp.text().await.expect("a body");
    let committed =
        std::fs::read_to_string(repo().join("docs/openapi.json")).expect("docs/openapi.json");
    assert_eq!(
        text, committed,
        "GET /openapi.json serves docs/openapi.json"
    );
    let doc: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let paths = doc["paths"].as_object().expect("paths");
    let mut checked = 0;
    for (path, item) in paths {
        let url = format!(
            "{}{}",
            d.base,
            path.replace("{id}", "nobody")
                .replace("{run_id}", "r1")
                .replace("{path}", "a/b.txt")
        );
        for method in ["get", "put", "post", "delete", "patch"] {
            let Some(op) = item.get(method) else { continue };
            let public = op["security"] == serde_json::json!([{}]);
            let (status, body) = common::raw(
                method.to_uppercase().parse().expect("a method"),
                &url,
                None,
                None,
            )
            .await;
            if path.starts_with(sandboxd_api::routes::PREVIEW_PREFIX) {
                // A preview link is its own credential: one this host never signed is refused.
                assert!(public, "{method} {path} takes no bearer");
                assert_eq!(
                    (status, body["code"].as_str()),
                    (403, Some("preview_invalid")),
                    "{method} {path} with a link never signed"
                );
            } else if public {
                assert_eq!(status, 200, "{method} {path} without a token");
            } else {
                assert_eq!(
                    (status, body["code"].as_str()),
                    (401, Some("unauthorized")),
                    "{method} {path} without a token"
                );
            }
            checked += 1;
        }
    }
    assert_eq!(checked, sandboxd::http::v1::ROUTES.len());
}

/// A wire request with `token` in `X-Sandbox-Token`: the status and the body (JSON, or the
/// text as a string).
async fn wire(
    method: reqwest::Method,
    url: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, serde_json::Value) {
    let mut req = reqwest::Client::new().request(method, url);
    if let Some(t) = token {
        req = req.header("X-Sandbox-Token", t);
    }
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_owned());
    }
    let resp = req.send().await.expect("sandboxd answers");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

/// The same on the wire surface, from `GET /wire/openapi.json`, with the service token and a
/// session's token in `X-Sandbox-Token`. The session run covers the routes a session token
/// reaches (its own session's); the service-only ones answer it 401, as documented.
#[tokio::test(flavor = "multi_thread")]
async fn schemathesis_on_the_wire_finds_no_undocumented_answer_and_no_escape() {
    let st = hack_path("schemathesis-venv.sh");
    let d = Daemon::start(&[("SANDBOXD_EXECUTE_TIMEOUT", "5")]);
    let admin = d.admin();
    let opened = admin
        .open("fuzz", "org-fuzz", None, None)
        .await
        .expect("open");
    let token = opened.token.expect("a new session has a token");
    d.client(&token)
        .write("fuzz", "inside/notes.txt", "kept")
        .await
        .expect("write");

    let (outside, before) = canary(&d);

    // What the fuzzer found before, answered as the document says.
    let doc = served_document(&d, "/wire/openapi.json").await;
    let nul_argv = format!(r#"{{"argv": ["echo", "a\u0000b"], "run_id": "{WIRE_RUN}"}}"#);
    for (method, path, body, status, detail) in [
        // A NUL in an argument: the agent could not start the run (502); now refused, 400.
        (
            "post",
            "/sessions/{session_id}/run",
            nul_argv.as_str(),
            400,
            serde_json::json!("command must not hold a NUL byte"),
        ),
    ] {
        let url = format!("{}{}", d.base, path.replace("{session_id}", "fuzz"));
        let (got, answer) = wire(
            method.to_uppercase().parse().expect("a method"),
            &url,
            Some(&d.token),
            Some(body),
        )
        .await;
        assert_eq!(
            (got, &answer["detail"]),
            (status, &detail),
            "{method} {url}"
        );
        assert!(
            doc["paths"][path][method]["responses"][status.to_string()].is_object(),
            "{method} {path} documents {status}"
        );
    }

    // The session routes (the native files, runs) take the service token too; `DELETE`
    // would close the session the other routes need.
    let params = format!("\"path.session_id\" = \"fuzz\"\n\"path.run_id\" = \"{WIRE_RUN}\"\n");
    fuzz_run(
        &st,
        &d,
        &Run {
            label: "wire-admin",
            document: "/wire/openapi.json",
            header: format!("X-Sandbox-Token: {}", d.token),
            params: params.clone(),
            filters: &["--exclude-operation-id", "delete_session"],
        },
    );
    let token = admin.rotate_token("fuzz").await.expect("a new token");
    fuzz_run(
        &st,
        &d,
        &Run {
            label: "wire-session",
            document: "/wire/openapi.json",
            header: format!("X-Sandbox-Token: {token}"),
            params,
            filters: &[
                "--include-path-regex",
                "^/sessions/\\{session_id\\}",
                "--exclude-operation-id",
                "delete_session",
            ],
        },
    );

    assert_eq!(
        snapshot(&outside),
        before,
        "the folder outside the workspace changed"
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("secret.txt")).expect("the canary"),
        "untouched"
    );
    // sandboxd still serves the wire surface, and the session is still there.
    let (status, body) = wire(
        reqwest::Method::GET,
        &format!("{}/sessions/fuzz", d.base),
        Some(&d.token),
        None,
    )
    .await;
    assert_eq!((status, body["session_id"].as_str()), (200, Some("fuzz")));
}

/// The wire document is served without a token and is the committed one; every route it
/// describes is one the daemon serves: without a token, the document answers 200 and every
/// other route 401 in the protocol's shape (never 404 or 405).
#[tokio::test(flavor = "multi_thread")]
async fn the_served_wire_document_describes_the_served_routes() {
    let d = Daemon::start(&[]);
    let (status, _) = wire(
        reqwest::Method::GET,
        &format!("{}/wire/openapi.json", d.base),
        None,
        None,
    )
    .await;
    assert_eq!(status, 200);
    let text = reqwest::get(format!("{}/wire/openapi.json", d.base))
        .await
        .expect("GET /wire/openapi.json")
        .text()
        .await
        .expect("a body");
    let committed = std::fs::read_to_string(repo().join("docs/openapi-wire.json"))
        .expect("docs/openapi-wire.json");
    assert_eq!(
        text, committed,
        "GET /wire/openapi.json serves docs/openapi-wire.json"
    );
    let doc: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let paths = doc["paths"].as_object().expect("paths");
    let mut checked = 0;
    for (path, item) in paths {
        let url = format!(
            "{}{}",
            d.base,
            path.replace("{session_id}", "nobody")
                .replace("{run_id}", WIRE_RUN)
        );
        for method in ["get", "put", "post", "delete"] {
            let Some(op) = item.get(method) else { continue };
            let public = op["security"] == serde_json::json!([{}]);
            let (status, body) = wire(
                method.to_uppercase().parse().expect("a method"),
                &url,
                None,
                None,
            )
            .await;
            if public {
                assert_eq!(status, 200, "{method} {path} without a token");
            } else {
                assert_eq!(
                    (status, &body),
                    (
                        401,
                        &serde_json::json!({"detail": "Invalid or missing sandbox token"})
                    ),
                    "{method} {path} without a token"
                );
            }
            checked += 1;
        }
    }
    assert_eq!(checked, sandboxd::http::wire::ROUTES.len());
    // The index points at it.
    let (_, index) = wire(reqwest::Method::GET, &format!("{}/", d.base), None, None).await;
    assert_eq!(index["openapi_url"], "/wire/openapi.json");
}

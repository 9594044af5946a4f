//! The routers checked against the route lists that the index shows and the operator's version
//! check trusts ([`crate::http::v1::ROUTES`], which is `sandboxd_api::routes::ROUTES`, and
//! [`crate::http::wire::ROUTES`]): every method of every path the routers are built from
//! ([`crate::http::v1::paths`], [`crate::http::wire::paths`]) is sent through the real router,
//! and what it serves must be exactly what is listed.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use clap::Parser as _;
use tower::ServiceExt as _;

use crate::config::Config;
use crate::container::Engine;
use crate::http::v1;
use crate::http::wire;
use crate::http::{AppState, router};
use crate::metrics::Metrics;
use crate::run::ExecRunner;
use crate::runtimes::Runtimes;
use crate::service::{Core, Settings};
use crate::storage::audit::Audit;
use crate::storage::store::Store;

/// The admin token of the router under test.
const ADMIN: &str = "admin";

/// The methods every path is tried with (`HEAD` is served wherever `GET` is).
const METHODS: [Method; 5] = [
    Method::GET,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::PATCH,
];

/// What the handlers share, over a core on the no-op engine (containers are records, nothing
/// runs) with its state and workspaces in `dir`.
async fn state(dir: &std::path::Path) -> AppState {
    let path = |p: &str| dir.join(p).display().to_string();
    let config = Config::try_parse_from([
        "sandboxd",
        "--token",
        ADMIN,
        "--runtimes",
        "base=never-pulled:1",
        "--instance",
        "routes-test",
        "--workspace-root",
        &path("workspaces"),
        "--state-dir",
        &path("state"),
        "--workspace-quota",
        "off",
    ])
    .expect("a config");
    let (admin, allowlist) = config.validate().expect("a valid config");
    let engine = Engine::noop("routes-test");
    let runtimes = Runtimes::start(
        engine.clone(),
        config.build_settings().expect("build settings"),
        std::time::Duration::from_secs(1),
        allowlist,
    )
    .await;
    let metrics = Arc::new(Metrics::default());
    let core = Core::new(
        Settings::from_config(&config),
        Store::open(&dir.join("state"))
            .await
            .expect("the state store"),
        engine.clone(),
        Arc::new(ExecRunner::new(engine)),
        runtimes,
        Audit::start(None),
        metrics.clone(),
    );
    AppState {
        core: Arc::new(core),
        admin,
        metrics,
    }
}

/// `path` with each parameter given a value of its route's pattern.
fn concrete(path: &str) -> String {
    path.replace("{id}", "s1")
        .replace("{session_id}", "s1")
        .replace("{run_id}", "0123456789abcdef0123456789abcdef")
        .replace("{terminal_id}", "term-0123456789ab")
        .replace("{port}", "3000")
        .replace("{*path}", "a.txt")
        .replace("{path}", "a.txt")
}

/// Whether `router` serves `method` on `path` (its parameters given values): anything but 405
/// (the path has routes, not this method) and 404 `route_not_found` (it has none). The request
/// carries the admin token in both surfaces' headers, since without one the token check
/// answers 401 before the router looks at the method; with it a route's handler answers, with
/// an error of its own at worst (no body, no such session).
async fn serves(router: &Router, method: &Method, path: &str) -> bool {
    let request = Request::builder()
        .method(method)
        .uri(concrete(path))
        .header(header::AUTHORIZATION, format!("Bearer {ADMIN}"))
        .header(wire::TOKEN_HEADER, ADMIN)
        .body(Body::empty())
        .expect("a request");
    let response = router.clone().oneshot(request).await.expect("an answer");
    match response.status() {
        StatusCode::METHOD_NOT_ALLOWED => false,
        StatusCode::NOT_FOUND => {
            let body = axum::body::to_bytes(response.into_body(), 64 * 1024)
                .await
                .expect("the body");
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            body["code"] != "route_not_found"
        }
        _ => true,
    }
}

/// "METHOD /path" of every method `router` serves on each path of `paths`, as the route lists
/// spell them (`{path}` for the wildcard `{*path}`).
async fn served<S>(router: &Router, paths: Vec<(&str, S)>) -> BTreeSet<String> {
    let mut served = BTreeSet::new();
    for (path, _) in paths {
        for method in &METHODS {
            if serves(router, method, path).await {
                served.insert(format!("{method} {}", path.replace("{*path}", "{path}")));
            }
        }
    }
    served
}

/// The routes of a route list, as a set.
pub(crate) fn listed(routes: &[&str]) -> BTreeSet<String> {
    routes.iter().map(|r| (*r).to_owned()).collect()
}

/// Fails naming what the routes `a` (named `a_name`) and `b` (named `b_name`) do not share.
pub(crate) fn same(a: &BTreeSet<String>, a_name: &str, b: &BTreeSet<String>, b_name: &str) {
    let only_a: Vec<&String> = a.difference(b).collect();
    let only_b: Vec<&String> = b.difference(a).collect();
    assert!(
        only_a.is_empty() && only_b.is_empty(),
        "in {a_name} and not in {b_name}: {only_a:?}; in {b_name} and not in {a_name}: {only_b:?}"
    );
}

#[tokio::test]
async fn the_routers_serve_exactly_the_listed_routes() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let router = router(state(dir.path()).await);
    same(
        &served(&router, v1::paths()).await,
        "what the /v1 router serves",
        &listed(v1::ROUTES),
        "sandboxd_api::routes::ROUTES",
    );
    same(
        &served(&router, wire::paths()).await,
        "what the wire protocol's router serves",
        &listed(wire::ROUTES),
        "wire::ROUTES",
    );
    // Each listed route, as the list spells it, is served by the router itself.
    for route in v1::ROUTES.iter().chain(wire::ROUTES) {
        let (method, path) = route.split_once(' ').expect("METHOD /path");
        let method = Method::from_bytes(method.as_bytes()).expect("a method");
        assert!(
            serves(&router, &method, path).await,
            "{route} is not served"
        );
    }
    // What the probe tells apart: a path without routes, and a method its path has no route for.
    assert!(!serves(&router, &Method::GET, "/v1/nothing").await);
    assert!(!serves(&router, &Method::PATCH, "/v1/sessions/{id}").await);
    assert!(!serves(&router, &Method::GET, "/sessions/{session_id}/run").await);
}

//! Traces: one open through the operator, and one run, are one trace from the caller's
//! `traceparent` (the SDK's annotation and header) through the operator into sandboxd and the
//! sandbox's program. The spans go over OTLP/HTTP (JSON) to a receiver of the test's own on
//! 127.0.0.1, which keeps what it is sent.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::post;
use common::{Host, Scope, phase, token_of};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use sandboxd_crds::v1alpha1::SandboxSession;
use sandboxd_crds::v1alpha1::session::SessionPhase;
use serde_json::{Value, json};

/// A span as the receiver got it.
#[derive(Debug, Clone)]
struct Span {
    service: String,
    name: String,
    trace: String,
    id: String,
    parent: String,
}

/// What the receiver was sent: the spans, and a count of the batches that brought them, which
/// a wait watches.
struct Received {
    spans: Mutex<Vec<Span>>,
    batches: tokio::sync::watch::Sender<u64>,
}

/// An OTLP/HTTP receiver of the test's own: `POST /v1/traces` with a JSON body, kept.
async fn receiver() -> (String, Arc<Received>) {
    let spans = Arc::new(Received {
        spans: Mutex::default(),
        batches: tokio::sync::watch::Sender::new(0),
    });
    let kept = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        post(move |body: axum::body::Bytes| {
            let kept = kept.clone();
            async move {
                let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let mut got = Vec::new();
                for rs in v["resourceSpans"].as_array().into_iter().flatten() {
                    let service = rs["resource"]["attributes"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|a| a["key"] == "service.name")
                        .and_then(|a| a["value"]["stringValue"].as_str())
                        .unwrap_or_default()
                        .to_owned();
                    for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                        for s in ss["spans"].as_array().into_iter().flatten() {
                            let text = |k: &str| s[k].as_str().unwrap_or_default().to_owned();
                            got.push(Span {
                                service: service.clone(),
                                name: text("name"),
                                trace: text("traceId"),
                                id: text("spanId"),
                                parent: text("parentSpanId"),
                            });
                        }
                    }
                }
                kept.spans.lock().expect("the spans").extend(got);
                kept.batches.send_modify(|n| *n += 1);
                ([("content-type", "application/json")], "{}")
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port for the receiver");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), spans)
}

/// A random W3C `traceparent`: (the value, its trace id, its span id).
fn traceparent() -> (String, String, String) {
    let trace = format!("{:032x}", rand::random::<u128>() | 1);
    let span = format!("{:016x}", rand::random::<u64>() | 1);
    (format!("00-{trace}-{span}-01"), trace, span)
}

/// Waits (watching the batches as they arrive, 30 s at most) until the spans of `trace`
/// include every `(service, name)` of `wanted`, and every parent of them below `root` (the
/// caller's span) has arrived too: a span is exported when it ends, so a parent that outlives
/// its children comes in a later batch. Returns them.
async fn spans_of(
    received: &Received,
    trace: &str,
    root: &str,
    wanted: &[(&str, &str)],
) -> Vec<Span> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut batches = received.batches.subscribe();
    loop {
        // Marked seen before the look, so a batch that arrives during it wakes the wait.
        batches.borrow_and_update();
        let mine: Vec<Span> = received
            .spans
            .lock()
            .expect("the spans")
            .iter()
            .filter(|s| s.trace == trace)
            .cloned()
            .collect();
        let names: BTreeSet<(String, String)> = mine
            .iter()
            .map(|s| (s.service.clone(), s.name.clone()))
            .collect();
        let missing: Vec<&(&str, &str)> = wanted
            .iter()
            .filter(|(svc, n)| !names.contains(&((*svc).to_owned(), (*n).to_owned())))
            .collect();
        let ids: BTreeSet<&str> = mine.iter().map(|s| s.id.as_str()).collect();
        let parents_owed = mine
            .iter()
            .any(|s| s.parent != root && !ids.contains(s.parent.as_str()));
        if missing.is_empty() && !parents_owed {
            return mine;
        }
        let arrived = tokio::time::timeout_at(deadline, batches.changed()).await;
        assert!(
            matches!(arrived, Ok(Ok(()))),
            "no span {missing:?} of trace {trace}, or a parent of one, within 30 s; it has {mine:#?}"
        );
    }
}

/// Every span of `spans` descends from `root` (the caller's span id) through spans of the
/// same trace: one tree, nothing parented outside it.
fn one_tree(spans: &[Span], root: &str) {
    let by_id: HashMap<&str, &Span> = spans.iter().map(|s| (s.id.as_str(), s)).collect();
    for s in spans {
        let mut at = s;
        let mut hops = 0;
        while at.parent != root {
            at = by_id.get(at.parent.as_str()).unwrap_or_else(|| {
                panic!(
                    "span {} ({}) has a parent {} outside the trace: {spans:#?}",
                    s.name, s.service, at.parent
                )
            });
            hops += 1;
            assert!(hops < 64, "a loop of parents at {}", s.name);
        }
    }
}

/// The parent of the first span named `name`, by name.
fn parent_name<'a>(spans: &'a [Span], name: &str) -> &'a str {
    let s = spans
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no span {name}"));
    spans
        .iter()
        .find(|p| p.id == s.parent)
        .map_or("(the caller)", |p| p.name.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_open_through_the_operator_and_one_run_are_one_trace_each() {
    let (endpoint, spans) = receiver().await;
    let otel = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "200"),
    ];
    let mut scope = Scope::new("traces").await;
    // A workspace on a disk of its own, so the open makes one (the `disk` span).
    let mut host_env = otel.to_vec();
    host_env.push(("SANDBOXD_WORKSPACE_QUOTA", "loop"));
    host_env.push(("SANDBOXD_WORKSPACE_SIZE", "64m"));
    let host = Host::start(&format!("traces-host-{}", scope.scope), &host_env);
    scope.register(&host).await;
    scope.default_runtime().await;
    let kubeconfig = std::env::var("KUBECONFIG").expect("KUBECONFIG");
    scope.start_operator_env(&kubeconfig, &[], &otel);

    // The session, made as the SDK makes it: the caller's trace in an annotation.
    let (tp, trace, caller) = traceparent();
    let session: SandboxSession = serde_json::from_value(json!({
        "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSession",
        "metadata": {
            "name": "traced",
            "labels": scope.labels(),
            "annotations": {"sandboxd.dev/traceparent": tp},
        },
        "spec": {"scope": "conversation", "tenant": "org-1", "subject": "traced"},
    }))
    .expect("a session");
    scope
        .sessions()
        .create(&PostParams::default(), &session)
        .await
        .expect("session created");
    let running = scope
        .wait_session("traced", "Running", 120, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;

    // The operator's reconcile, its placement and its call to the host; sandboxd's request,
    // its claim of the slot, the launch, the disk and the container: one trace, under the caller's span.
    let open = spans_of(
        &spans,
        &trace,
        &caller,
        &[
            ("sandbox-operator", "reconcile"),
            ("sandbox-operator", "placement"),
            ("sandbox-operator", "host call"),
            ("sandboxd", "request"),
            ("sandboxd", "claim"),
            ("sandboxd", "launch"),
            ("sandboxd", "disk"),
            ("sandboxd", "container create"),
        ],
    )
    .await;
    one_tree(&open, &caller);
    assert_eq!(parent_name(&open, "placement"), "reconcile");
    assert_eq!(parent_name(&open, "host call"), "reconcile");
    assert_eq!(parent_name(&open, "request"), "host call");
    assert_eq!(parent_name(&open, "claim"), "request");
    // A new session's folder asks its runtime's warm pool first (this one keeps none), then
    // makes the disk and the container itself.
    assert_eq!(parent_name(&open, "launch"), "request");
    assert_eq!(parent_name(&open, "disk"), "launch");
    assert_eq!(parent_name(&open, "container create"), "launch");

    // One run with the session's token and another trace: sandboxd's request span is its
    // child, and the program sees the trace as TRACEPARENT (the run's span in it).
    let status = running.status.expect("a status");
    let secret = Api::<Secret>::namespaced(scope.client.clone(), &scope.ns)
        .get(&status.credentials_secret.expect("a token Secret"))
        .await
        .expect("the token Secret");
    let id = status.session_id.expect("a session id");
    let (run_tp, run_trace, run_caller) = traceparent();
    let client = sandboxd_api::client::Client::new(
        &status.endpoint.expect("an endpoint"),
        &token_of(&secret),
    )
    .with_traceparent(Some(run_tp));
    let out = client
        .run(&id, "echo \"$TRACEPARENT\"", Some(30), None, None)
        .await
        .expect("the run");
    let seen = out.stdout.trim().to_owned();
    let run = spans_of(&spans, &run_trace, &run_caller, &[("sandboxd", "request")]).await;
    one_tree(&run, &run_caller);
    let request = run
        .iter()
        .find(|s| s.name == "request")
        .expect("the request span");
    assert_eq!(
        seen,
        format!("00-{run_trace}-{}-01", request.id),
        "the program continues the run's trace"
    );
    // Nothing of the run went into the open's trace, and the other way round.
    assert!(
        spans
            .spans
            .lock()
            .expect("the spans")
            .iter()
            .filter(|s| s.trace == trace)
            .all(|s| s.parent != run_caller)
    );
    scope.delete().await;
}

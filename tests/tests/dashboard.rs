//! The chart's Grafana dashboard (charts/sandboxd/files/dashboard.json) and alerts
//! (templates/prometheusrule.yaml) against what the code exports: every metric a panel or an
//! alert queries is on the `/metrics` of a real sandboxd and a real operator, started from the
//! workspace's binaries. A renamed metric fails here, not on an on-call engineer's empty graph.

use std::collections::BTreeSet;
use std::process::Command;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, PostParams};
use rand::Rng;
use sandboxd_crds::v1alpha1::SandboxHost;
use sandboxd_tests::host::{Host, bin};
use sandboxd_tests::process::Operator;
use sandboxd_tests::{
    DEADLINE, TestNamespace, base_image, client, helm, install_crds, repo_root, until,
};
use serde_json::json;

/// The label that scopes the operator of this test to its own objects.
const SCOPE_LABEL: &str = "sandboxd.dev/test-scope";

/// Series that Prometheus makes itself.
const PROMETHEUS_OWN: [&str; 1] = ["up"];

/// The metric names in a PromQL expression: the identifiers of sandboxd's and the operator's
/// families (label values and label names left out).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut unquoted = String::new();
    let mut quoted = false;
    for c in expr.chars() {
        if c == '"' {
            quoted = !quoted;
            unquoted.push(' ');
        } else if !quoted {
            unquoted.push(c);
        }
    }
    for token in unquoted.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')) {
        if token.starts_with("sandboxd_") || token.starts_with("sandbox_operator_") {
            names.insert(token.to_owned());
        }
        if PROMETHEUS_OWN.contains(&token) {
            names.insert(token.to_owned());
        }
    }
    names
}

/// The sample names a text exposition offers: each family's, as its type names them (a
/// family none of whose label sets exists yet still has its `# TYPE` line).
fn exported(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            match kind {
                "counter" => {
                    names.insert(format!("{name}_total"));
                }
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.insert(format!("{name}{suffix}"));
                    }
                }
                _ => {
                    names.insert(name.to_owned());
                }
            }
        } else if !line.starts_with('#')
            && let Some(name) = line.split(['{', ' ']).next()
            && !name.is_empty()
        {
            names.insert(name.to_owned());
        }
    }
    names
}

async fn scrape(url: &str) -> String {
    let response = reqwest::get(url)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert!(
        response.status().is_success(),
        "GET {url}: {}",
        response.status()
    );
    response.text().await.expect("the metrics' text")
}

fn dashboard() -> serde_json::Value {
    let path = repo_root().join("charts/sandboxd/files/dashboard.json");
    let text = std::fs::read_to_string(&path).expect("charts/sandboxd/files/dashboard.json");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// (panel title, query) of every panel of the dashboard.
fn panel_queries(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        if panel["type"] == "row" {
            continue;
        }
        let title = panel["title"]
            .as_str()
            .expect("every panel has a title")
            .to_owned();
        assert!(
            panel["description"].as_str().is_some_and(|d| !d.is_empty()),
            "panel {title} says nothing of what it shows"
        );
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {title} has no query");
        for target in targets {
            let expr = target["expr"].as_str().expect("a PromQL query");
            out.push((title.clone(), expr.to_owned()));
        }
    }
    out
}

/// (alert, expression) of every alert of the chart's PrometheusRule.
fn alert_queries() -> Vec<(String, String)> {
    let out = Command::new(helm())
        .args(["template", "rel"])
        .arg(repo_root().join("charts/sandboxd"))
        .args(["--kube-version", "1.37.2"])
        .args([
            "--set",
            "adminToken.value=render-only-admin-token-0123456789abcdef",
        ])
        .args(["--set", "prometheusRule.enabled=true"])
        .args(["--show-only", "templates/prometheusrule.yaml"])
        .output()
        .expect("helm runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rule: serde_yaml::Value =
        serde_yaml::from_slice(&out.stdout).expect("the PrometheusRule is YAML");
    rule["spec"]["groups"]
        .as_sequence()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules"))
        .map(|r| {
            (
                r["alert"].as_str().unwrap_or("a recording rule").to_owned(),
                r["expr"].as_str().expect("expr").to_owned(),
            )
        })
        .collect()
}

#[test]
fn the_dashboard_ships_in_a_configmap_grafana_s_sidecar_loads_only_when_asked() {
    let render = |args: &[&str]| {
        let out = Command::new(helm())
            .args(["template", "rel"])
            .arg(repo_root().join("charts/sandboxd"))
            .args(["--kube-version", "1.37.2"])
            .args([
                "--set",
                "adminToken.value=render-only-admin-token-0123456789abcdef",
            ])
            .args(args)
            .output()
            .expect("helm runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_yaml::Deserializer::from_slice(&out.stdout)
            .map(|d| serde::Deserialize::deserialize(d).expect("YAML"))
            .filter(|d: &serde_yaml::Value| {
                d["kind"] == "ConfigMap" && d["metadata"]["name"] == "rel-sandboxd-dashboard"
            })
            .collect::<Vec<serde_yaml::Value>>()
    };
    assert!(
        render(&[]).is_empty(),
        "a dashboard rendered without dashboard.enabled"
    );
    let maps = render(&["--set", "dashboard.enabled=true"]);
    let map = maps
        .first()
        .expect("dashboard.enabled=true renders the dashboard's ConfigMap");
    assert_eq!(
        map["metadata"]["labels"]["grafana_dashboard"].as_str(),
        Some("1")
    );
    let json = map["data"]["sandboxd.json"]
        .as_str()
        .expect("sandboxd.json");
    let shipped: serde_json::Value =
        serde_json::from_str(json).expect("the shipped dashboard is JSON");
    assert_eq!(shipped, dashboard());
    assert_eq!(shipped["uid"].as_str(), Some("sandboxd-overview"));
}

/// Waits until `url` serves metrics holding `line`; returns them.
async fn scrape_until(url: &str, line: &str) -> String {
    until(&format!("{line} at {url}"), DEADLINE, async || {
        let text = scrape(url).await;
        if text.contains(line) {
            Ok(text)
        } else {
            Err(format!("no {line} yet in:\n{text}"))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_a_panel_or_an_alert_queries_is_exported() {
    let client = client().await;
    install_crds(&client).await;
    let namespace = TestNamespace::create(&client, "dashboard").await;
    let ns = namespace.name.clone();
    let scope = format!("dashboard-{:08x}", rand::rng().random::<u32>());
    let labels = json!({ SCOPE_LABEL: scope });

    // A sandboxd whose runtime keeps a warm pool (its series are per runtime), registered as a
    // SandboxHost of an operator (its series are per host).
    let runtimes = json!([{"alias": "base", "image": base_image(), "warm_pool": 1}]).to_string();
    let host = Host::start(&scope, &[("SANDBOXD_RUNTIMES", runtimes.as_str())]);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "host-admin", "labels": labels},
        "stringData": {"token": host.sandboxd.token},
    }))
    .expect("a Secret");
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("the admin-token Secret");
    let sandbox_host: SandboxHost = serde_json::from_value(json!({
        "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxHost",
        "metadata": {"name": scope, "labels": labels},
        "spec": {"endpoint": host.endpoint(), "node": host.node,
                 "adminTokenSecret": {"namespace": ns, "name": "host-admin"}},
    }))
    .expect("a SandboxHost");
    let hosts = Api::<SandboxHost>::all(client.clone());
    hosts
        .create(&PostParams::default(), &sandbox_host)
        .await
        .expect("the SandboxHost");
    let mut operator = Operator::new(
        bin("sandbox-operator"),
        &ns,
        &format!("{SCOPE_LABEL}={scope}"),
    );
    operator.launch().expect("the operator starts");

    // The operator has probed the host (so sandboxd has answered requests) once it is Ready.
    let operator_text = scrape_until(
        &format!("{}/metrics", operator.health),
        &format!("sandbox_operator_host_ready{{host=\"{scope}\"}} 1"),
    )
    .await;
    let sandboxd = scrape_until(
        &format!("{}/metrics", host.endpoint()),
        "sandboxd_warm_pool_size{runtime=\"base\"} 1",
    )
    .await;
    let mut offered = exported(&sandboxd);
    offered.extend(exported(&operator_text));
    offered.extend(PROMETHEUS_OWN.iter().map(|s| (*s).to_owned()));

    let dashboard = dashboard();
    let mut missing = Vec::new();
    let mut used = BTreeSet::new();
    for (title, expr) in panel_queries(&dashboard)
        .into_iter()
        .map(|(t, e)| (format!("panel {t:?}"), e))
        .chain(
            alert_queries()
                .into_iter()
                .map(|(a, e)| (format!("alert {a}"), e)),
        )
    {
        let names = metric_names(&expr);
        assert!(
            !names.is_empty(),
            "{title} queries no metric of sandboxd or the operator: {expr}"
        );
        for name in names {
            if !offered.contains(&name) {
                missing.push(format!("{title}: {name}"));
            }
            used.insert(name);
        }
    }
    assert!(
        missing.is_empty(),
        "queried but not exported by sandboxd or the operator:\n{}",
        missing.join("\n")
    );
    assert!(used.len() >= 25, "{used:?}");

    // The host goes while the operator runs, so its finalizer is released.
    hosts
        .delete(&scope, &DeleteParams::default())
        .await
        .expect("the SandboxHost deleted");
    until("the SandboxHost gone", DEADLINE, async || {
        match hosts.get_opt(&scope).await {
            Ok(None) => Ok(()),
            Ok(Some(_)) => Err("still there".to_owned()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
    drop(operator);
    drop(host);
    namespace.delete().await;
}

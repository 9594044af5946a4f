//! The chart's alerts (charts/sandboxd/templates/prometheusrule.yaml) as Prometheus reads them:
//! `promtool check rules` accepts the rendered rules, `promtool test rules` shows each alert
//! firing on a series of its trouble and silent on a healthy one (tests/alerts/), every alert
//! tells the person paged what happened, what to look at and where its runbook is, and the
//! runbook has a section for each. promtool is built by `hack/promtool.sh` from the Go module
//! proxy at the pin of hack/versions.env; a test that cannot build or run it fails.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use sandboxd_tests::{helm, ok, repo_root, run};

/// promtool, built (once) by the repository's own script; asked once per test binary, so the
/// tests, which run in parallel, never build it side by side.
fn promtool() -> PathBuf {
    static PROMTOOL: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PROMTOOL
        .get_or_init(|| {
            let path = ok(&mut Command::new(repo_root().join("hack/promtool.sh")));
            let path = PathBuf::from(path.trim());
            assert!(
                path.is_file(),
                "hack/promtool.sh printed {path:?}, which is no file"
            );
            path
        })
        .clone()
}

/// The chart rendered as release `rel` in namespace `default` with `args`.
fn template(args: &[&str]) -> Vec<serde_yaml::Value> {
    let rendered = ok(Command::new(helm())
        .arg("template")
        .arg("rel")
        .arg(repo_root().join("charts/sandboxd"))
        .args(["--namespace", "default", "--kube-version", "1.37.2"])
        .args([
            "--set",
            "adminToken.value=render-only-admin-token-0123456789abcdef",
        ])
        .args(args));
    serde_yaml::Deserializer::from_str(&rendered)
        .map(|d| serde::Deserialize::deserialize(d).expect("YAML"))
        .filter(|d: &serde_yaml::Value| !d.is_null())
        .collect()
}

/// The rule groups of the rendered PrometheusRule, as a Prometheus rule file.
fn rule_file() -> serde_yaml::Value {
    let docs = template(&[
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        "serviceMonitor.enabled=true",
    ]);
    let rule = docs
        .iter()
        .find(|d| d["kind"] == "PrometheusRule")
        .expect("prometheusRule.enabled=true renders a PrometheusRule");
    rule["spec"].clone()
}

/// Writes the rule file and the unit tests into a folder of their own.
fn rules_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let rules = serde_yaml::to_string(&rule_file()).expect("rules as YAML");
    std::fs::write(dir.path().join("rules.yaml"), rules).expect("rules.yaml written");
    std::fs::copy(
        repo_root().join("tests/alerts/sandboxd.test.yaml"),
        dir.path().join("sandboxd.test.yaml"),
    )
    .expect("tests/alerts/sandboxd.test.yaml copied");
    dir
}

/// Every alerting rule of the rule file.
fn alerts(rules: &serde_yaml::Value) -> Vec<&serde_yaml::Value> {
    rules["groups"]
        .as_sequence()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules"))
        .filter(|r| r["alert"].is_string())
        .collect()
}

fn check(dir: &Path, promtool: &Path, what: &str, file: &str) -> String {
    let out = run(Command::new(promtool)
        .current_dir(dir)
        .args([what, "rules", file]));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool {what} rules {file}:\n{text}"
    );
    text
}

#[test]
fn promtool_accepts_the_chart_s_rules() {
    let dir = rules_dir();
    let out = check(dir.path(), &promtool(), "check", "rules.yaml");
    let count = alerts(&rule_file()).len();
    assert!(
        out.contains(&format!("SUCCESS: {count} rules found")),
        "{out}"
    );
}

#[test]
fn every_alert_fires_on_its_trouble_and_stays_silent_on_a_healthy_host() {
    let dir = rules_dir();
    let out = check(dir.path(), &promtool(), "test", "sandboxd.test.yaml");
    assert!(out.contains("SUCCESS"), "{out}");

    // Each alert of the chart is shown firing somewhere in the unit tests.
    let tests: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo_root().join("tests/alerts/sandboxd.test.yaml"))
            .expect("tests/alerts/sandboxd.test.yaml"),
    )
    .expect("the unit tests are YAML");
    let fired: BTreeSet<&str> = tests["tests"]
        .as_sequence()
        .expect("tests")
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_sequence().expect("alert_rule_test"))
        .filter(|a| a["exp_alerts"].as_sequence().is_some_and(|e| !e.is_empty()))
        .filter_map(|a| a["alertname"].as_str())
        .collect();
    let rules = rule_file();
    let names: BTreeSet<&str> = alerts(&rules)
        .iter()
        .filter_map(|a| a["alert"].as_str())
        .collect();
    let untested: Vec<_> = names.difference(&fired).collect();
    assert!(
        untested.is_empty(),
        "tests/alerts/sandboxd.test.yaml shows no firing of {untested:?}"
    );
}

#[test]
fn every_alert_says_what_happened_what_to_look_at_and_where_its_runbook_is() {
    let rules = rule_file();
    let runbook =
        std::fs::read_to_string(repo_root().join("docs/runbook.md")).expect("docs/runbook.md");
    let alerts = alerts(&rules);
    assert!(alerts.len() >= 12, "{alerts:?}");
    for alert in alerts {
        let name = alert["alert"].as_str().expect("name");
        for key in ["summary", "description"] {
            let text = alert["annotations"][key].as_str().unwrap_or_default();
            assert!(text.len() > 20, "{name}: {key} is {text:?}");
        }
        assert!(
            matches!(
                alert["labels"]["severity"].as_str(),
                Some("warning" | "critical")
            ),
            "{name}: severity {:?}",
            alert["labels"]["severity"]
        );
        assert_eq!(
            alert["annotations"]["runbook_url"].as_str(),
            Some(
                format!(
                    "https://github.com/sandboxd-dev/sandboxd/blob/main/docs/runbook.md#{}",
                    name.to_lowercase()
                )
                .as_str()
            ),
            "{name}"
        );
        assert!(
            runbook.lines().any(|l| l == format!("## {name}")),
            "docs/runbook.md has no section `## {name}`"
        );
    }
}

#[test]
fn no_prometheus_rule_unless_asked() {
    let docs = template(&[]);
    assert!(
        !docs.iter().any(|d| d["kind"] == "PrometheusRule"),
        "a PrometheusRule rendered without prometheusRule.enabled"
    );
}

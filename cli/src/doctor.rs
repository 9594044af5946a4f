//! `doctor`: every SandboxHost probed from here — reachable, its version, the routes the
//! operator needs that it lacks, and on a mismatch the image that must run. Exit 1 when any
//! host is unhealthy.

use std::time::Duration;

use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use sandboxd_api::routes::version_mismatch_message;
use sandboxd_crds::v1alpha1::SandboxHost;
use sandboxd_crds::v1alpha1::condition::ConditionType;

use crate::error::Error;

/// What one host's check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Healthy or not.
    pub healthy: bool,
    /// One line about it.
    pub summary: String,
    /// What to do, when something is wrong.
    pub advice: Option<String>,
}

/// Judges a host from its index (or the error reaching it).
pub fn judge(
    endpoint: &str,
    index: Result<&sandboxd_api::routes::Index, String>,
    image: &str,
) -> Finding {
    match index {
        Err(e) => Finding {
            healthy: false,
            summary: format!("unreachable: {e}"),
            advice: Some(format!(
                "check that its sandboxd runs and that this machine reaches {endpoint} (from outside the cluster, through `kubectl port-forward`)"
            )),
        },
        Ok(index) => {
            let missing = index.missing_required();
            if missing.is_empty() {
                let note = if index.version == sandboxd_api::VERSION {
                    String::new()
                } else {
                    format!(" (this plugin is {})", sandboxd_api::VERSION)
                };
                Finding {
                    healthy: true,
                    summary: format!("sandboxd {}{note}, every route served", index.version),
                    advice: None,
                }
            } else {
                Finding {
                    healthy: false,
                    summary: format!(
                        "sandboxd {}, missing routes: {}",
                        index.version,
                        missing.join(", ")
                    ),
                    advice: Some(version_mismatch_message(&missing, image)),
                }
            }
        }
    }
}

/// Runs the checks and prints one block per host.
pub async fn doctor(
    client: &Client,
    selector: Option<&str>,
    image: &str,
    timeout: u64,
    ca_file: Option<&std::path::Path>,
) -> Result<(), Error> {
    let mut lp = ListParams::default();
    if let Some(s) = selector {
        lp = lp.labels(s);
    }
    let hosts = Api::<SandboxHost>::all(client.clone())
        .list(&lp)
        .await
        .map_err(|e| Error::kube("listing SandboxHosts", e))?
        .items;
    if hosts.is_empty() {
        return Err(Error::Usage(
            "no SandboxHost is registered: install the chart (its operator registers one per sandboxd pod) or create one by hand (see README.md, \"The custom resources\")".into(),
        ));
    }
    let mut unhealthy = 0;
    for host in &hosts {
        let endpoint = &host.spec.endpoint;
        // The CA: --ca-file, else the host's spec.caSecret (when this user may read it).
        let trusted = match ca_file {
            Some(_) => crate::session::trust(ca_file, None, ""),
            None => match sandboxd_crds::ca::from_secret(client, None, host).await {
                Ok(ca) => {
                    let origin = ca.as_ref().map(|c| c.origin.clone()).unwrap_or_default();
                    crate::session::trust(None, ca.as_ref().map(|c| c.pem.as_slice()), &origin)
                }
                Err(e) => Err(Error::Usage(e.to_string())),
            },
        };
        let answer = match trusted {
            Err(e) => Err(e.to_string()),
            Ok(trust) => {
                let probe = sandboxd_api::client::Client::with_trust(endpoint, "", &trust);
                match tokio::time::timeout(Duration::from_secs(timeout), probe.index()).await {
                    Ok(Ok(index)) => Ok(index),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err(format!("no answer from {endpoint} within {timeout} s")),
                }
            }
        };
        let finding = judge(endpoint, answer.as_ref().map_err(Clone::clone), image);
        let mark = if finding.healthy { "ok  " } else { "FAIL" };
        println!("{mark} {} {endpoint}: {}", host.name_any(), finding.summary);
        if host.spec.disabled {
            println!("     disabled: it takes no new sessions");
        }
        if let Some(ready) = host.status.as_ref().and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == ConditionType::Ready.as_str())
        }) {
            println!(
                "     operator: Ready={} ({}: {})",
                ready.status, ready.reason, ready.message
            );
        }
        if let Some(a) = &finding.advice {
            println!("     next: {a}");
        }
        if !finding.healthy {
            unhealthy += 1;
        }
    }
    if unhealthy > 0 {
        return Err(Error::Unhealthy(unhealthy, hosts.len()));
    }
    println!("{} SandboxHosts healthy", hosts.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_missing_routes_names_the_image_to_run() {
        let index = sandboxd_api::routes::Index {
            service: "sandboxd".into(),
            version: "0.0.1".into(),
            routes: vec!["GET /v1/sessions".into()],
        };
        let f = judge("http://h:8080", Ok(&index), "sandboxd");
        assert!(!f.healthy);
        assert!(
            f.summary
                .starts_with("sandboxd 0.0.1, missing routes: POST /v1/sessions,")
        );
        let advice = f.advice.expect("advice");
        assert!(
            advice.ends_with(&format!(
                "Run sandboxd:{v} and redeploy it",
                v = sandboxd_api::VERSION
            )),
            "{advice}"
        );
    }
}

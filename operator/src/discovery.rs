//! Host discovery in a cluster: one SandboxHost per node that runs a sandboxd DaemonSet pod,
//! named after the node (a restarted pod keeps its host, and sessions never move), with the
//! endpoint taken from the pod IP and `spec.node` from the pod's node (the operator then sends
//! that node's own admin token). Hosts outside the cluster are registered by hand.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use sandboxd_crds::v1alpha1::host::{CaSecretRef, SecretKeyRef};
use sandboxd_crds::v1alpha1::{SandboxHost, SandboxHostSpec};
use tracing::{info, warn};

use crate::context::{Context, Error, key};

/// Field manager of the hosts this controller keeps.
pub const MANAGER: &str = "sandbox-operator/discovery";
/// Label on hosts kept by discovery.
pub const DISCOVERED_LABEL: &str = "sandboxd.dev/discovered";

/// The host name of a node.
pub fn host_name(node: &str) -> String {
    format!("node-{node}")
}

/// The SandboxHost for a sandboxd pod, or None while it has no node or IP; its endpoint is
/// https:// when `tls` (sandboxd serves TLS, with the pod IP in its certificate), verified
/// against `ca` when given (the CA of the operator's signer).
pub fn host_for(
    pod: &Pod,
    port: u16,
    tls: bool,
    ca: Option<&CaSecretRef>,
    token: &SecretKeyRef,
    labels: &std::collections::BTreeMap<String, String>,
) -> Option<SandboxHost> {
    let node = pod.spec.as_ref()?.node_name.clone()?;
    let ip = pod
        .status
        .as_ref()?
        .pod_ip
        .clone()
        .filter(|ip| !ip.is_empty())?;
    let scheme = if tls { "https" } else { "http" };
    let endpoint = if ip.contains(':') {
        format!("{scheme}://[{ip}]:{port}")
    } else {
        format!("{scheme}://{ip}:{port}")
    };
    let mut labels = labels.clone();
    labels.insert(DISCOVERED_LABEL.into(), "true".into());
    Some(SandboxHost {
        metadata: ObjectMeta {
            name: Some(host_name(&node)),
            labels: Some(labels),
            ..Default::default()
        },
        spec: SandboxHostSpec {
            endpoint,
            admin_token_secret: token.clone(),
            node: Some(node),
            disabled: false,
            ca_secret: ca.cloned(),
        },
        status: None,
    })
}

/// Parses `namespace/name[/key]`.
pub fn parse_secret(s: &str) -> Option<SecretKeyRef> {
    let mut parts = s.split('/');
    let (namespace, name) = (parts.next()?.to_owned(), parts.next()?.to_owned());
    let key = parts.next().unwrap_or("token").to_owned();
    (!namespace.is_empty() && !name.is_empty()).then_some(SecretKeyRef {
        namespace,
        name,
        key,
    })
}

/// Runs the controller while a pod selector is configured.
pub async fn run(ctx: Arc<Context>) {
    let Some(selector) = ctx.config.host_pod_selector.clone() else {
        futures::future::pending::<()>().await;
        return;
    };
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), &ctx.config.host_pod_namespace);
    Controller::new(
        pods,
        kube::runtime::watcher::Config::default().labels(&selector),
    )
    .shutdown_on_signal()
    .run(reconcile, error_policy, ctx)
    .for_each(|_| futures::future::ready(()))
    .await;
}

fn error_policy(pod: Arc<Pod>, error: &Error, ctx: Arc<Context>) -> Action {
    warn!(pod = %pod.name_any(), error = %error, "host discovery failed");
    Action::requeue(ctx.failed("discovery", &key(pod.as_ref()), error))
}

async fn reconcile(pod: Arc<Pod>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let token = parse_secret(&ctx.config.host_token_secret).ok_or_else(|| Error::Token {
        host: pod.name_any(),
        why: format!(
            "--host-token-secret '{}' is not namespace/name[/key]",
            ctx.config.host_token_secret
        ),
    })?;
    // With the signer on, each sandboxd serves the certificate it got from it: trusted through
    // the signer's CA Secret (its tls.crt), read where the operator reads Secrets.
    let ca = match (&ctx.config.csr_ca_secret, ctx.config.own_namespace()) {
        (Some(name), Ok(namespace)) => Some(CaSecretRef {
            namespace: namespace.to_owned(),
            name: name.clone(),
            key: "tls.crt".to_owned(),
        }),
        _ => None,
    };
    if pod.metadata.deletion_timestamp.is_none()
        && let Some(host) = host_for(
            &pod,
            ctx.config.host_port,
            ctx.config.host_ca_file.is_some() || ca.is_some(),
            ca.as_ref(),
            &token,
            &ctx.labels,
        )
    {
        // Spec only: status, `disabled` set by a person, and the finalizer stay untouched
        // (server-side apply owns just these fields).
        let mut patch = serde_json::json!({
            "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxHost",
            "metadata": {"name": host.name_any(), "labels": host.labels()},
            "spec": {"endpoint": host.spec.endpoint, "adminTokenSecret": host.spec.admin_token_secret, "node": host.spec.node},
        });
        if let Some(ca) = &host.spec.ca_secret {
            patch["spec"]["caSecret"] = serde_json::json!(ca);
        }
        Api::<SandboxHost>::all(ctx.client.clone())
            .patch(
                &host.name_any(),
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await?;
        info!(pod = %pod.name_any(), host = %host.name_any(), endpoint = %host.spec.endpoint, "host kept for sandboxd pod");
    }
    ctx.observe("discovery", started);
    ctx.succeeded(&key(pod.as_ref()));
    Ok(Action::requeue(Duration::from_secs(300)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_with_node_and_ip_becomes_a_host_named_after_its_node() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "sandboxd-abc"},
            "spec": {"nodeName": "worker-1", "containers": []},
            "status": {"podIP": "10.1.2.3"},
        }))
        .expect("pod");
        let token = parse_secret("sandboxd-system/sandboxd-admin-token").expect("secret");
        let host = host_for(&pod, 8080, false, None, &token, &Default::default()).expect("a host");
        assert_eq!(host.name_any(), "node-worker-1");
        assert_eq!(host.spec.endpoint, "http://10.1.2.3:8080");
        assert_eq!(host.spec.admin_token_secret.key, "token");
        assert_eq!(host.spec.node.as_deref(), Some("worker-1"));
        let pending: Pod = serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": {"nodeName": "w", "containers": []}})).expect("pod");
        assert!(host_for(&pending, 8080, false, None, &token, &Default::default()).is_none());
        assert!(parse_secret("nonamespace").is_none());
    }

    #[test]
    fn with_tls_the_endpoint_is_https_on_the_pod_ip() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "sandboxd-abc"},
            "spec": {"nodeName": "worker-1", "containers": []},
            "status": {"podIP": "fd00::7"},
        }))
        .expect("pod");
        let token = parse_secret("sandboxd-system/sandboxd-admin-token").expect("secret");
        let host = host_for(&pod, 8443, true, None, &token, &Default::default()).expect("a host");
        assert_eq!(host.spec.endpoint, "https://[fd00::7]:8443");
    }
}

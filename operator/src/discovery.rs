//! Host discovery in a cluster: one SandboxHost per node that runs a sandboxd DaemonSet pod,
//! named after the node (a restarted pod keeps its host, and sessions never move), with the
//! endpoint taken from the pod IP and `spec.node` from the pod's node (the operator then sends
//! that node's own admin token). Hosts outside the cluster are registered by hand.
//!
//! The label alone makes no host: whoever may create a pod in the namespace can label it. A pod
//! becomes a host only when `--host-daemonset` controls it (its controller owner reference,
//! with that DaemonSet's uid) and it runs in the node's network, so its IP is its node's; any
//! other labelled pod is ignored, with a warning in the log and a Warning event `NotAHost` on
//! the pod saying why.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use sandboxd_crds::v1alpha1::host::{CaSecretRef, SecretKeyRef};
use sandboxd_crds::v1alpha1::{SandboxHost, SandboxHostSpec};
use tracing::{info, warn};

use crate::context::{Context, key};
use crate::error::Error;

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

/// The reason of the Warning event on a labelled pod that is not made a host.
pub const NOT_A_HOST: &str = "NotAHost";

/// Why the labelled `pod` is not a sandboxd pod of DaemonSet `daemonset` (name and uid, None
/// when it does not exist) in the node's network, or None when it is one.
pub fn not_a_host(pod: &Pod, daemonset: &str, uid: Option<&str>) -> Option<String> {
    let namespace = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let Some(uid) = uid else {
        return Some(format!(
            "pod {namespace}/{name} is not made a host: DaemonSet {namespace}/{daemonset} (--host-daemonset) does not exist"
        ));
    };
    let controller = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true));
    let owned = controller.is_some_and(|o| {
        o.api_version == "apps/v1" && o.kind == "DaemonSet" && o.name == daemonset && o.uid == uid
    });
    if !owned {
        let whose = match controller {
            Some(o) if o.kind == "DaemonSet" && o.name == daemonset => {
                format!(
                    "its controller is a DaemonSet of that name with uid {}, not {uid}",
                    o.uid
                )
            }
            Some(o) => format!("its controller is {} {}", o.kind, o.name),
            None => "it has no controller".to_owned(),
        };
        return Some(format!(
            "pod {namespace}/{name} carries the sandboxd pods' labels but is not a pod of DaemonSet {namespace}/{daemonset} ({whose}): it is not made a host"
        ));
    }
    if pod.spec.as_ref().and_then(|s| s.host_network) != Some(true) {
        return Some(format!(
            "pod {namespace}/{name} of DaemonSet {namespace}/{daemonset} does not run in the node's network (spec.hostNetwork is not true), so its IP is not its node's: it is not made a host"
        ));
    }
    None
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
    let token = ctx
        .config
        .host_token_secret_ref()
        .ok_or_else(|| Error::Token {
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
    let daemonset = ctx.config.host_daemonset.as_deref().unwrap_or("");
    let uid = if daemonset.is_empty() {
        None
    } else {
        Api::<DaemonSet>::namespaced(ctx.client.clone(), &ctx.config.host_pod_namespace)
            .get_opt(daemonset)
            .await?
            .and_then(|d| d.metadata.uid)
    };
    if let Some(why) = not_a_host(&pod, daemonset, uid.as_deref()) {
        let why = if daemonset.is_empty() {
            format!(
                "pod {}/{} is not made a host: the operator has no --host-daemonset (SANDBOX_OPERATOR_HOST_DAEMONSET), the DaemonSet whose pods alone become hosts",
                pod.namespace().unwrap_or_default(),
                pod.name_any()
            )
        } else {
            why
        };
        warn!(pod = %pod.name_any(), reason = %why, "labelled pod ignored by host discovery");
        ctx.event(
            pod.as_ref(),
            EventType::Warning,
            NOT_A_HOST,
            "Discover",
            why,
        )
        .await;
        ctx.observe("discovery", started);
        ctx.succeeded(&key(pod.as_ref()));
        // Looked at again when the pod changes.
        return Ok(Action::await_change());
    }
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
        let token =
            crate::config::parse_secret("sandboxd-system/sandboxd-admin-token").expect("secret");
        let host = host_for(&pod, 8080, false, None, &token, &Default::default()).expect("a host");
        assert_eq!(host.name_any(), "node-worker-1");
        assert_eq!(host.spec.endpoint, "http://10.1.2.3:8080");
        assert_eq!(host.spec.admin_token_secret.key, "token");
        assert_eq!(host.spec.node.as_deref(), Some("worker-1"));
        let pending: Pod = serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": {"nodeName": "w", "containers": []}})).expect("pod");
        assert!(host_for(&pending, 8080, false, None, &token, &Default::default()).is_none());
        assert!(crate::config::parse_secret("nonamespace").is_none());
    }

    #[test]
    fn only_the_daemonsets_pods_in_the_nodes_network_are_hosts() {
        let pod = |owner: serde_json::Value, host_network: bool| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "sbx", "ownerReferences": owner},
                "spec": {"nodeName": "w", "hostNetwork": host_network, "containers": []},
            }))
            .expect("pod")
        };
        let by = |kind: &str, name: &str, uid: &str| serde_json::json!([{"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": uid, "controller": true}]);
        let ours = by("DaemonSet", "sbx-sandboxd", "u1");
        assert_eq!(
            not_a_host(&pod(ours.clone(), true), "sbx-sandboxd", Some("u1")),
            None
        );
        assert_eq!(
            not_a_host(
                &pod(serde_json::json!([]), true),
                "sbx-sandboxd",
                Some("u1")
            )
            .as_deref(),
            Some(
                "pod sbx/p carries the sandboxd pods' labels but is not a pod of DaemonSet sbx/sbx-sandboxd (it has no controller): it is not made a host"
            )
        );
        assert_eq!(
            not_a_host(
                &pod(by("ReplicaSet", "web", "u2"), true),
                "sbx-sandboxd",
                Some("u1")
            )
            .as_deref(),
            Some(
                "pod sbx/p carries the sandboxd pods' labels but is not a pod of DaemonSet sbx/sbx-sandboxd (its controller is ReplicaSet web): it is not made a host"
            )
        );
        assert_eq!(
            not_a_host(
                &pod(by("DaemonSet", "sbx-sandboxd", "u9"), true),
                "sbx-sandboxd",
                Some("u1")
            )
            .as_deref(),
            Some(
                "pod sbx/p carries the sandboxd pods' labels but is not a pod of DaemonSet sbx/sbx-sandboxd (its controller is a DaemonSet of that name with uid u9, not u1): it is not made a host"
            )
        );
        assert_eq!(
            not_a_host(&pod(ours.clone(), false), "sbx-sandboxd", Some("u1")).as_deref(),
            Some(
                "pod sbx/p of DaemonSet sbx/sbx-sandboxd does not run in the node's network (spec.hostNetwork is not true), so its IP is not its node's: it is not made a host"
            )
        );
        assert_eq!(
            not_a_host(&pod(ours, true), "sbx-sandboxd", None).as_deref(),
            Some(
                "pod sbx/p is not made a host: DaemonSet sbx/sbx-sandboxd (--host-daemonset) does not exist"
            )
        );
    }

    #[test]
    fn with_tls_the_endpoint_is_https_on_the_pod_ip() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "sandboxd-abc"},
            "spec": {"nodeName": "worker-1", "containers": []},
            "status": {"podIP": "fd00::7"},
        }))
        .expect("pod");
        let token =
            crate::config::parse_secret("sandboxd-system/sandboxd-admin-token").expect("secret");
        let host = host_for(&pod, 8443, true, None, &token, &Default::default()).expect("a host");
        assert_eq!(host.spec.endpoint, "https://[fd00::7]:8443");
    }
}

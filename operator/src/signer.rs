//! The signer of sandboxd's serving certificates: CertificateSigningRequests of
//! `--csr-signer-name` (and no others) that sandboxd pods make with `sandboxd enrol`.
//!
//! A request is signed only when all of this holds, and denied with a message naming the first
//! that does not:
//! - its requester (`spec.username`, set by the API server) is `--csr-requester`, the sandboxd
//!   pods' ServiceAccount;
//! - it was made with a pod-bound token, so the API server recorded the pod's node in
//!   `spec.extra["authentication.kubernetes.io/node-name"]`;
//! - every DNS name it asks for is that node's name, every IP is one of that Node's
//!   `status.addresses`, and it asks for nothing else (no e-mail, URI or other name);
//! - its usages are exactly digital signature, key encipherment and server auth.
//!
//! A pod can thus get a certificate for its own node only: a compromised node cannot pose as
//! another. The certificate is short-lived (`--csr-certificate-days`), signed with the CA of
//! the kubernetes.io/tls Secret `--csr-ca-secret` in the operator's namespace, and written as
//! the certificate followed by that CA.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Patch, PatchParams};
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use rcgen::{CertificateSigningRequestParams, SanType};
use tracing::{info, warn};

use crate::context::{Context, Error};

/// The extra attribute in which the API server records the node of a pod-bound token.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// The reason of the Approved condition.
pub const APPROVED_REASON: &str = "SandboxdNodeCertificate";
/// The reason of the Denied condition.
pub const DENIED_REASON: &str = "NotThisNodesCertificate";
/// The reason of the Failed condition (approved by someone else, but not signable).
pub const FAILED_REASON: &str = "NotThisNodesCertificate";

/// What a request asks for, once its requester, usages and names are checked.
#[derive(Debug)]
pub struct Checked {
    /// The node the token was bound to (and the one DNS name asked for).
    pub node: String,
    /// The IPs asked for (each must be one of the node's addresses).
    pub ips: Vec<IpAddr>,
    /// The parsed request.
    pub params: CertificateSigningRequestParams,
}

/// Checks what can be checked without the Node: requester, bound node, usages and names. The
/// error is the denial's message.
pub fn check_request(
    spec: &CertificateSigningRequestSpec,
    requester: Option<&str>,
) -> Result<Checked, String> {
    let Some(requester) = requester else {
        return Err("the operator has no --csr-requester (SANDBOX_OPERATOR_CSR_REQUESTER): it signs for no one".to_owned());
    };
    let username = spec.username.as_deref().unwrap_or("");
    if username != requester {
        return Err(format!(
            "the requester {username:?} is not the sandboxd ServiceAccount {requester:?}"
        ));
    }
    let node = spec
        .extra
        .as_ref()
        .and_then(|e| e.get(NODE_NAME_EXTRA))
        .and_then(|v| match v.as_slice() {
            [one] if !one.is_empty() => Some(one.clone()),
            _ => None,
        })
        .ok_or_else(|| {
            format!(
                "the request was not made with a pod-bound ServiceAccount token (no {NODE_NAME_EXTRA} in spec.extra): the node it comes from is unknown"
            )
        })?;
    let usages: BTreeSet<&str> = spec.usages.iter().flatten().map(String::as_str).collect();
    let wanted: BTreeSet<&str> = sandboxd_api::enrol::USAGES.into_iter().collect();
    if usages != wanted {
        return Err(format!(
            "the usages {:?} are not exactly {:?}",
            spec.usages.clone().unwrap_or_default(),
            sandboxd_api::enrol::USAGES
        ));
    }
    let pem = std::str::from_utf8(&spec.request.0)
        .map_err(|_| "spec.request is not a PEM certificate request".to_owned())?;
    let params = CertificateSigningRequestParams::from_pem(pem)
        .map_err(|e| format!("spec.request cannot be used: {e}"))?;
    if params.params.subject_alt_names.is_empty() {
        return Err(format!(
            "the request names nothing: it must ask for the DNS name {node} (and the node's IP)"
        ));
    }
    let mut ips = Vec::new();
    for san in &params.params.subject_alt_names {
        match san {
            SanType::DnsName(dns) if dns.as_str() == node => {}
            SanType::DnsName(dns) => {
                return Err(format!(
                    "the DNS name {} is not the name of the requesting pod's node {node}",
                    dns.as_str()
                ));
            }
            SanType::IpAddress(ip) => ips.push(*ip),
            other => {
                return Err(format!(
                    "the request asks for {other:?}: only the node's DNS name and IPs are signed"
                ));
            }
        }
    }
    Ok(Checked { node, ips, params })
}

/// Checks the IPs asked for against the Node's `status.addresses`.
pub fn check_addresses(node_name: &str, ips: &[IpAddr], node: Option<&Node>) -> Result<(), String> {
    if ips.is_empty() {
        return Ok(());
    }
    let Some(node) = node else {
        return Err(format!(
            "Node {node_name} does not exist: the IPs asked for cannot be checked"
        ));
    };
    let addresses: Vec<IpAddr> = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|a| a.address.parse().ok())
        .collect();
    if addresses.is_empty() {
        return Err(format!(
            "Node {node_name} has no IP in status.addresses: the IPs asked for cannot be checked"
        ));
    }
    for ip in ips {
        if !addresses.contains(ip) {
            return Err(format!(
                "the IP {ip} is not an address of the requesting pod's node {node_name} ({})",
                addresses
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    Ok(())
}

/// The certificate for a checked request, valid for `days` (or the shorter
/// `spec.expirationSeconds`), followed by the CA: PEM.
pub fn sign(
    checked: &Checked,
    ca_cert_pem: &str,
    ca_key_pem: &str,
    days: u32,
    expiration_seconds: Option<i32>,
) -> Result<String, String> {
    let key = rcgen::KeyPair::from_pem(ca_key_pem)
        .map_err(|e| format!("its tls.key is not a usable PKCS#8 private key: {e}"))?;
    let issuer = rcgen::Issuer::from_ca_cert_pem(ca_cert_pem, key)
        .map_err(|e| format!("its tls.crt is not a usable certificate: {e}"))?;
    let mut request = CertificateSigningRequestParams {
        params: checked.params.params.clone(),
        public_key: checked.params.public_key.clone(),
    };
    let p = &mut request.params;
    let now = time::OffsetDateTime::now_utc();
    let mut life = time::Duration::days(i64::from(days));
    if let Some(s) = expiration_seconds.filter(|s| *s > 0) {
        life = life.min(time::Duration::seconds(i64::from(s)));
    }
    p.not_before = now - time::Duration::minutes(5);
    p.not_after = now + life;
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name
        .push(rcgen::DnType::CommonName, checked.node.as_str());
    p.is_ca = rcgen::IsCa::ExplicitNoCa;
    p.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    p.use_authority_key_identifier_extension = true;
    let serial: [u8; 16] = rand::random();
    p.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
    let cert = request
        .signed_by(&issuer)
        .map_err(|e| format!("signing failed: {e}"))?;
    let mut chain = cert.pem();
    if !chain.ends_with('\n') {
        chain.push('\n');
    }
    chain.push_str(ca_cert_pem);
    Ok(chain)
}

/// Runs the signer while `--csr-ca-secret` is set.
pub async fn run(ctx: Arc<Context>) {
    if ctx.config.csr_ca_secret.is_none() {
        futures::future::pending::<()>().await;
        return;
    }
    let csrs = Api::<CertificateSigningRequest>::all(ctx.client.clone());
    let fields = format!("spec.signerName={}", ctx.config.csr_signer_name);
    info!(signer = %ctx.config.csr_signer_name, "signing sandboxd serving certificates");
    Controller::new(
        csrs,
        kube::runtime::watcher::Config::default().fields(&fields),
    )
    .shutdown_on_signal()
    .run(reconcile, error_policy, ctx)
    .for_each(|_| futures::future::ready(()))
    .await;
}

fn error_policy(csr: Arc<CertificateSigningRequest>, error: &Error, ctx: Arc<Context>) -> Action {
    warn!(csr = %csr.name_any(), error = %error, "certificate request not handled");
    Action::requeue(ctx.failed("signer", &csr.name_any(), error))
}

fn has_condition(csr: &CertificateSigningRequest, type_: &str) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == type_))
}

async fn reconcile(
    csr: Arc<CertificateSigningRequest>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let started = Instant::now();
    let name = csr.name_any();
    // A field selector is a filter the API server applies; the check here keeps the promise
    // even if it were not.
    if csr.spec.signer_name != ctx.config.csr_signer_name {
        return Ok(Action::await_change());
    }
    let issued = csr
        .status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .is_some_and(|c| !c.0.is_empty());
    if issued || has_condition(&csr, "Denied") || has_condition(&csr, "Failed") {
        return Ok(Action::await_change());
    }
    let api = Api::<CertificateSigningRequest>::all(ctx.client.clone());
    let verdict = match check_request(&csr.spec, ctx.config.csr_requester.as_deref()) {
        Err(why) => Err(why),
        Ok(checked) => {
            let node = Api::<Node>::all(ctx.client.clone())
                .get_opt(&checked.node)
                .await?;
            check_addresses(&checked.node, &checked.ips, node.as_ref()).map(|()| checked)
        }
    };
    let checked = match verdict {
        Ok(checked) => checked,
        Err(why) => {
            warn!(csr = %name, requester = ?csr.spec.username, reason = %why, "certificate request refused");
            if has_condition(&csr, "Approved") {
                let patch = serde_json::json!({"status": {"conditions": with_condition(&csr, "Failed", FAILED_REASON, &why)}});
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            } else {
                let patch = serde_json::json!({"status": {"conditions": with_condition(&csr, "Denied", DENIED_REASON, &why)}});
                api.patch_approval(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
            ctx.observe("signer", started);
            return Ok(Action::await_change());
        }
    };
    let (ca_cert, ca_key) = ca(&ctx, &name).await?;
    let chain = sign(
        &checked,
        &ca_cert,
        &ca_key,
        ctx.config.csr_certificate_days,
        csr.spec.expiration_seconds,
    )
    .map_err(|why| Error::Signer {
        csr: name.clone(),
        why: format!(
            "the CA Secret {}: {why}",
            ctx.config.csr_ca_secret.as_deref().unwrap_or("")
        ),
    })?;
    if !has_condition(&csr, "Approved") {
        let message = format!(
            "the certificate of node {} for its sandboxd, asked by its pod",
            checked.node
        );
        let patch = serde_json::json!({"status": {"conditions": with_condition(&csr, "Approved", APPROVED_REASON, &message)}});
        api.patch_approval(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    let patch = serde_json::json!({"status": {"certificate": ByteString(chain.into_bytes())}});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    info!(csr = %name, node = %checked.node, ips = ?checked.ips, "serving certificate signed");
    ctx.observe("signer", started);
    ctx.succeeded(&name);
    Ok(Action::await_change())
}

/// The request's conditions with one more (a merge patch replaces the list whole).
fn with_condition(
    csr: &CertificateSigningRequest,
    type_: &str,
    reason: &str,
    message: &str,
) -> Vec<serde_json::Value> {
    let mut all: Vec<serde_json::Value> = csr
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| serde_json::to_value(c).ok())
        .collect();
    all.push(
        serde_json::json!({"type": type_, "status": "True", "reason": reason, "message": message}),
    );
    all
}

/// The CA's certificate and key (PEM) from `--csr-ca-secret` in the operator's namespace.
async fn ca(ctx: &Context, csr: &str) -> Result<(String, String), Error> {
    let fail = |why: String| Error::Signer {
        csr: csr.to_owned(),
        why,
    };
    let namespace = ctx
        .config
        .own_namespace()
        .map_err(|e| fail(e.to_string()))?;
    let name = ctx.config.csr_ca_secret.as_deref().unwrap_or("");
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), namespace)
        .get_opt(name)
        .await?
        .ok_or_else(|| fail(format!("the CA Secret {namespace}/{name} does not exist")))?;
    let field = |key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
            .ok_or_else(|| fail(format!("the CA Secret {namespace}/{name} has no {key}")))
    };
    Ok((field("tls.crt")?, field("tls.key")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(
        user: &str,
        node: Option<&str>,
        sans: &[&str],
        usages: &[&str],
    ) -> CertificateSigningRequestSpec {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params =
            rcgen::CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
                .expect("params");
        params.distinguished_name = rcgen::DistinguishedName::new();
        let pem = params
            .serialize_request(&key)
            .expect("csr")
            .pem()
            .expect("pem");
        CertificateSigningRequestSpec {
            request: ByteString(pem.into_bytes()),
            signer_name: sandboxd_api::enrol::SIGNER_NAME.to_owned(),
            username: Some(user.to_owned()),
            usages: Some(usages.iter().map(|u| (*u).to_owned()).collect()),
            extra: node.map(|n| [(NODE_NAME_EXTRA.to_owned(), vec![n.to_owned()])].into()),
            ..Default::default()
        }
    }

    const SA: &str = "system:serviceaccount:sandboxd-system:sandboxd-sandboxd";

    #[test]
    fn only_the_nodes_own_names_from_its_pods_pass() {
        let ok = check_request(
            &spec(
                SA,
                Some("a"),
                &["a", "10.0.0.1"],
                &sandboxd_api::enrol::USAGES,
            ),
            Some(SA),
        )
        .expect("signable");
        assert_eq!((ok.node.as_str(), ok.ips.len()), ("a", 1));
        let e = check_request(
            &spec(SA, Some("a"), &["b"], &sandboxd_api::enrol::USAGES),
            Some(SA),
        )
        .expect_err("another node's name");
        assert_eq!(
            e,
            "the DNS name b is not the name of the requesting pod's node a"
        );
        let e = check_request(
            &spec(SA, None, &["a"], &sandboxd_api::enrol::USAGES),
            Some(SA),
        )
        .expect_err("not pod-bound");
        assert!(
            e.starts_with("the request was not made with a pod-bound"),
            "{e}"
        );
        let e = check_request(
            &spec(SA, Some("a"), &["a"], &["digital signature", "client auth"]),
            Some(SA),
        )
        .expect_err("usages");
        assert!(e.starts_with("the usages"), "{e}");
        let e = check_request(
            &spec(
                "system:serviceaccount:x:y",
                Some("a"),
                &["a"],
                &sandboxd_api::enrol::USAGES,
            ),
            Some(SA),
        )
        .expect_err("requester");
        assert!(
            e.starts_with("the requester \"system:serviceaccount:x:y\""),
            "{e}"
        );
        assert!(
            check_request(
                &spec(SA, Some("a"), &["a"], &sandboxd_api::enrol::USAGES),
                None
            )
            .is_err()
        );
    }

    #[test]
    fn ips_must_be_the_nodes_addresses() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a"},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "a"}]},
        }))
        .expect("node");
        let one: IpAddr = "10.0.0.1".parse().expect("ip");
        let two: IpAddr = "10.0.0.2".parse().expect("ip");
        assert!(check_addresses("a", &[one], Some(&node)).is_ok());
        assert_eq!(
            check_addresses("a", &[two], Some(&node)).expect_err("not its IP"),
            "the IP 10.0.0.2 is not an address of the requesting pod's node a (10.0.0.1)"
        );
        let bare: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "a"}})).expect("node");
        assert!(
            check_addresses("a", &[one], Some(&bare))
                .expect_err("no addresses")
                .starts_with("Node a has no IP in status.addresses")
        );
        assert!(check_addresses("a", &[one], None).is_err());
    }
}

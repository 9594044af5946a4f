//! The signer of sandboxd's serving certificates: CertificateSigningRequests of
//! `--csr-signer-name` (and no others) that sandboxd pods make with `sandboxd enrol`.
//!
//! A request is signed only when all of this holds, and denied with a message naming the first
//! that does not:
//! - its requester (`spec.username`, set by the API server) is `--csr-requester`, the sandboxd
//!   pods' ServiceAccount;
//! - it was made with a pod-bound token, so the API server recorded the pod and its node in
//!   `spec.extra` (`authentication.kubernetes.io/pod-name`, `pod-uid` and `node-name`);
//! - every DNS name it asks for is that node's name, every IP is one the requesting pod's own
//!   `status.hostIP` (or `status.hostIPs`) shows, and it asks for nothing else (no e-mail, URI
//!   or other name). The Node's `status.addresses` are not read: a node's kubelet may list
//!   there any address, another node's included;
//! - its usages are exactly digital signature, key encipherment and server auth.
//!
//! A pod can thus get a certificate for its own node only: a compromised node cannot pose as
//! another. The certificate is short-lived (`--csr-certificate-days`), signed with the CA of
//! the kubernetes.io/tls Secret `--csr-ca-secret` in the operator's namespace, and written as
//! the certificate followed by that CA. With `--csr-ca-generate` (the chart's default) the
//! operator makes that Secret itself when it does not exist ([`ensure_ca`]): once, never
//! overwriting one that is there, whoever made it.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Patch, PatchParams};
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use rcgen::{CertificateSigningRequestParams, SanType};
use tracing::{info, warn};

use crate::context::Context;
use crate::error::Error;

/// The extra attribute in which the API server records the node of a pod-bound token.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
/// The extra attribute in which the API server records the pod of a pod-bound token.
pub const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
/// The extra attribute in which the API server records the uid of that pod.
pub const POD_UID_EXTRA: &str = "authentication.kubernetes.io/pod-uid";

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
    /// The pod the token was bound to: namespace (the ServiceAccount's), name and uid.
    pub pod: (String, String, Option<String>),
    /// The IPs asked for (each must be the pod's `status.hostIP`).
    pub ips: Vec<IpAddr>,
    /// The parsed request.
    pub params: CertificateSigningRequestParams,
}

/// Checks what can be checked without the pod: requester, bound pod and node, usages and names. The
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
    let extra = |key: &str| {
        spec.extra
            .as_ref()
            .and_then(|e| e.get(key))
            .and_then(|v| match v.as_slice() {
                [one] if !one.is_empty() => Some(one.clone()),
                _ => None,
            })
    };
    let not_bound = |key: &str| {
        format!(
            "the request was not made with a pod-bound ServiceAccount token (no {key} in spec.extra): the node it comes from is unknown"
        )
    };
    let node = extra(NODE_NAME_EXTRA).ok_or_else(|| not_bound(NODE_NAME_EXTRA))?;
    let pod_name = extra(POD_NAME_EXTRA).ok_or_else(|| not_bound(POD_NAME_EXTRA))?;
    // `system:serviceaccount:<namespace>:<name>`: the pod lives in its ServiceAccount's
    // namespace.
    let namespace = username
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
        .map(|(ns, _)| ns.to_owned())
        .filter(|ns| !ns.is_empty())
        .ok_or_else(|| {
            format!("the requester {username:?} is not a ServiceAccount: its pod is unknown")
        })?;
    let pod = (namespace, pod_name, extra(POD_UID_EXTRA));
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
    Ok(Checked {
        node,
        pod,
        ips,
        params,
    })
}

/// Checks the IPs asked for against the requesting pod's own `status.hostIP` and
/// `status.hostIPs`: the pod must be the one the token was bound to (same uid) and on the
/// token's node.
pub fn check_addresses(checked: &Checked, pod: Option<&Pod>) -> Result<(), String> {
    if checked.ips.is_empty() {
        return Ok(());
    }
    let (namespace, name, uid) = &checked.pod;
    let node = &checked.node;
    let Some(pod) = pod.filter(|p| uid.is_none() || p.metadata.uid == *uid) else {
        return Err(format!(
            "the requesting pod {namespace}/{name} is gone: the IPs asked for cannot be checked"
        ));
    };
    if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node.as_str()) {
        return Err(format!(
            "the requesting pod {namespace}/{name} is not on node {node}: the IPs asked for cannot be checked"
        ));
    }
    let status = pod.status.as_ref();
    let mut addresses: Vec<IpAddr> = status
        .and_then(|s| s.host_ips.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|a| a.ip.parse().ok())
        .collect();
    if let Some(ip) = status
        .and_then(|s| s.host_ip.as_deref())
        .and_then(|ip| ip.parse().ok())
        && !addresses.contains(&ip)
    {
        addresses.push(ip);
    }
    if addresses.is_empty() {
        return Err(format!(
            "the requesting pod {namespace}/{name} shows no status.hostIP yet: the IPs asked for cannot be checked"
        ));
    }
    for ip in &checked.ips {
        if !addresses.contains(ip) {
            return Err(format!(
                "the IP {ip} is not the address of node {node} that the requesting pod {namespace}/{name} shows in status.hostIP ({})",
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
        .map_err(|e| format!("its tls.key is not a usable PKCS#8 private key (an RSA key from Helm's genCA or openssl is PKCS#1: convert it with `openssl pkcs8 -topk8 -nocrypt`): {e}"))?;
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

/// The label on a CA Secret the operator made (`--csr-ca-generate`).
pub const MADE_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Its value.
pub const MADE_BY: &str = "sandbox-operator";
/// How long a CA the operator makes is valid, in days (ten years: it is never rotated in place).
pub const CA_DAYS: i64 = 3650;

/// A new self-signed CA for the nodes' serving certificates: the certificate and its PKCS#8
/// key (ECDSA P-256), both PEM.
pub fn new_ca(common_name: &str) -> Result<(String, String), rcgen::Error> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, common_name);
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(5);
    params.not_after = now + time::Duration::days(CA_DAYS);
    let serial: [u8; 16] = rand::random();
    params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Why [`ensure_ca`] has no CA Secret to give.
#[derive(Debug, thiserror::Error)]
pub enum CaSecretError {
    /// The API server failed.
    #[error("the Kubernetes API failed: {0}")]
    Kube(#[from] kube::Error),
    /// The CA could not be made.
    #[error("a new CA for Secret {secret} could not be made: {error}")]
    Make {
        /// `namespace/name`.
        secret: String,
        /// rcgen's error.
        error: rcgen::Error,
    },
    /// Another replica made it and it was deleted before this one could read it.
    #[error("the CA Secret {0} was made by another replica and is gone again")]
    Gone(String),
}

/// Whether [`ensure_ca`] made the Secret or found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaSecret {
    /// This call created it.
    Created,
    /// It was there already (made earlier, by another replica, or by someone else).
    Found,
}

/// The CA Secret `namespace/name`, made with a new CA if it does not exist. Create-if-absent:
/// an existing Secret is never changed, and of replicas racing to make it the API server lets
/// one create it and tells the others it exists (409), so all go on with the same CA.
pub async fn ensure_ca(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<(Secret, CaSecret), CaSecretError> {
    let api = Api::<Secret>::namespaced(client.clone(), namespace);
    if let Some(found) = api.get_opt(name).await? {
        return Ok((found, CaSecret::Found));
    }
    let (cert, key) =
        new_ca(&format!("sandboxd node CA ({namespace}/{name})")).map_err(|error| {
            CaSecretError::Make {
                secret: format!("{namespace}/{name}"),
                error,
            }
        })?;
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some([(MADE_BY_LABEL.to_owned(), MADE_BY.to_owned())].into()),
            annotations: Some(
                [(
                    "sandboxd.dev/description".to_owned(),
                    "The CA of sandboxd's per-node serving certificates, made once by the operator (--csr-ca-generate) and never overwritten. Deleting it makes a new CA: every sandboxd pod must then be restarted to be trusted again.".to_owned(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(
            [
                ("tls.crt".to_owned(), ByteString(cert.into_bytes())),
                ("tls.key".to_owned(), ByteString(key.into_bytes())),
            ]
            .into(),
        ),
        ..Default::default()
    };
    match api.create(&kube::api::PostParams::default(), &secret).await {
        Ok(created) => {
            info!(secret = %format!("{namespace}/{name}"), "made the CA of the nodes' serving certificates");
            Ok((created, CaSecret::Created))
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let found = api
                .get_opt(name)
                .await?
                .ok_or_else(|| CaSecretError::Gone(format!("{namespace}/{name}")))?;
            Ok((found, CaSecret::Found))
        }
        Err(e) => Err(e.into()),
    }
}

/// Runs the signer while `--csr-ca-secret` is set.
pub async fn run(ctx: Arc<Context>) {
    let Some(ca_secret) = ctx.config.csr_ca_secret.clone() else {
        futures::future::pending::<()>().await;
        return;
    };
    // Made before the first request comes, so discovered hosts' trust (spec.caSecret) finds
    // it; a failure here is tried again at each request.
    if ctx.config.csr_ca_generate {
        match ctx.config.own_namespace() {
            Ok(namespace) => {
                if let Err(e) = ensure_ca(&ctx.client, namespace, &ca_secret).await {
                    warn!(secret = %ca_secret, error = %e, "the CA Secret could not be made yet");
                }
            }
            Err(e) => warn!(secret = %ca_secret, error = %e, "the CA Secret cannot be made"),
        }
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
        Ok(checked) if checked.ips.is_empty() => Ok(checked),
        Ok(checked) => {
            let (namespace, name, _) = &checked.pod;
            let pod = Api::<Pod>::namespaced(ctx.client.clone(), namespace)
                .get_opt(name)
                .await?;
            check_addresses(&checked, pod.as_ref()).map(|()| checked)
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
    let secret = if ctx.config.csr_ca_generate {
        match ensure_ca(&ctx.client, namespace, name).await {
            Ok((secret, _)) => secret,
            Err(CaSecretError::Kube(e)) => return Err(e.into()),
            Err(e) => return Err(fail(e.to_string())),
        }
    } else {
        Api::<Secret>::namespaced(ctx.client.clone(), namespace)
            .get_opt(name)
            .await?
            .ok_or_else(|| fail(format!("the CA Secret {namespace}/{name} does not exist")))?
    };
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
            extra: node.map(|n| {
                [
                    (NODE_NAME_EXTRA.to_owned(), vec![n.to_owned()]),
                    (POD_NAME_EXTRA.to_owned(), vec![format!("sandboxd-on-{n}")]),
                    (POD_UID_EXTRA.to_owned(), vec!["uid-1".to_owned()]),
                ]
                .into()
            }),
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
    fn a_ca_the_operator_makes_signs_a_nodes_certificate() {
        let (ca_cert, ca_key) = new_ca("test CA").expect("a CA");
        assert!(
            ca_key.starts_with("-----BEGIN PRIVATE KEY-----"),
            "not PKCS#8"
        );
        let checked = check_request(
            &spec(SA, Some("a"), &["a"], &sandboxd_api::enrol::USAGES),
            Some(SA),
        )
        .expect("signable");
        let chain = sign(&checked, &ca_cert, &ca_key, 30, None).expect("signed");
        assert!(chain.ends_with(&ca_cert), "the chain ends with the CA");
        // A PKCS#1 RSA key (Helm's genCA) is refused naming the conversion.
        let rsa = "-----BEGIN RSA PRIVATE KEY-----\nMIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf9Cnzj4p4WGeKLs1Pt8Qu\n-----END RSA PRIVATE KEY-----\n";
        let e = sign(&checked, &ca_cert, rsa, 30, None).expect_err("PKCS#1");
        assert!(e.contains("openssl pkcs8 -topk8 -nocrypt"), "{e}");
    }

    #[test]
    fn ips_must_be_the_ones_the_requesting_pod_shows() {
        let checked = |ips: &[&str]| {
            check_request(
                &spec(
                    SA,
                    Some("a"),
                    &[&["a"][..], ips].concat(),
                    &sandboxd_api::enrol::USAGES,
                ),
                Some(SA),
            )
            .expect("signable")
        };
        let pod = |uid: &str, node: &str, status: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "sandboxd-on-a", "namespace": "sandboxd-system", "uid": uid},
                "spec": {"nodeName": node, "containers": []},
                "status": status,
            }))
            .expect("pod")
        };
        let shown = serde_json::json!({"hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]});
        let on_a = pod("uid-1", "a", shown.clone());
        assert_eq!(
            checked(&["10.0.0.1"]).pod,
            (
                "sandboxd-system".to_owned(),
                "sandboxd-on-a".to_owned(),
                Some("uid-1".to_owned())
            )
        );
        assert!(check_addresses(&checked(&["10.0.0.1", "fd00::1"]), Some(&on_a)).is_ok());
        assert!(check_addresses(&checked(&[]), None).is_ok());
        assert_eq!(
            check_addresses(&checked(&["10.0.0.2"]), Some(&on_a)).expect_err("not its IP"),
            "the IP 10.0.0.2 is not the address of node a that the requesting pod sandboxd-system/sandboxd-on-a shows in status.hostIP (10.0.0.1, fd00::1)"
        );
        assert_eq!(
            check_addresses(
                &checked(&["10.0.0.1"]),
                Some(&pod("uid-2", "a", shown.clone()))
            )
            .expect_err("another pod of the name"),
            "the requesting pod sandboxd-system/sandboxd-on-a is gone: the IPs asked for cannot be checked"
        );
        assert_eq!(
            check_addresses(&checked(&["10.0.0.1"]), Some(&pod("uid-1", "b", shown)))
                .expect_err("on another node"),
            "the requesting pod sandboxd-system/sandboxd-on-a is not on node a: the IPs asked for cannot be checked"
        );
        assert_eq!(
            check_addresses(
                &checked(&["10.0.0.1"]),
                Some(&pod("uid-1", "a", serde_json::json!({})))
            )
            .expect_err("no hostIP"),
            "the requesting pod sandboxd-system/sandboxd-on-a shows no status.hostIP yet: the IPs asked for cannot be checked"
        );
        assert!(check_addresses(&checked(&["10.0.0.1"]), None).is_err());
    }
}

//! The CA certificate a SandboxHost's `spec.caSecret` names: what the operator verifies the
//! host's https:// endpoint against (before its `--host-ca-file` and the system's roots), and
//! what `kubectl sandbox doctor` trusts when it probes the host itself.

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use crate::v1alpha1::SandboxHost;

/// A host's CA certificate (PEM) and where it came from, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostCa {
    /// The PEM bundle.
    pub pem: Vec<u8>,
    /// `Secret ns/name key k` or `--host-ca-file <path>`.
    pub origin: String,
}

/// Why a host's CA could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// The API server failed.
    #[error("the Kubernetes API failed: {0}")]
    Kube(#[from] kube::Error),
    /// The Secret, its key, or the file is missing.
    #[error("{0}")]
    Missing(String),
}

/// The CA in `host`'s `spec.caSecret`, or None when it names none. With `own_namespace` (the
/// operator's), a `spec.caSecret` elsewhere is refused unread, as the admin-token Secret is.
pub async fn from_secret(
    client: &Client,
    own_namespace: Option<&str>,
    host: &SandboxHost,
) -> Result<Option<HostCa>, CaError> {
    let Some(r) = &host.spec.ca_secret else {
        return Ok(None);
    };
    if let Some(own) = own_namespace
        && r.namespace != own
    {
        return Err(CaError::Missing(format!(
            "spec.caSecret {}/{} is not read: it must live in the operator's namespace {own}, the only namespace the operator reads Secrets in",
            r.namespace, r.name
        )));
    }
    let origin = format!("Secret {}/{} key {}", r.namespace, r.name, r.key);
    let secret = Api::<Secret>::namespaced(client.clone(), &r.namespace)
        .get_opt(&r.name)
        .await?
        .ok_or_else(|| {
            CaError::Missing(format!(
                "spec.caSecret: Secret {}/{} does not exist",
                r.namespace, r.name
            ))
        })?;
    let pem = secret
        .data
        .as_ref()
        .and_then(|d| d.get(&r.key))
        .map(|b| b.0.clone())
        .ok_or_else(|| {
            CaError::Missing(format!(
                "spec.caSecret: Secret {}/{} has no key {}",
                r.namespace, r.name, r.key
            ))
        })?;
    Ok(Some(HostCa { pem, origin }))
}

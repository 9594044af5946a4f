//! What the operator trusts for a host's https:// endpoint: the CA in the host's
//! `spec.caSecret`, else the operator's `--host-ca-file`, else the system's CA roots. The CA is
//! read again with the admin token (a rotated CA is picked up), and handed to the platform in
//! each session's token Secret (`ca.crt`).

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use sandboxd_crds::v1alpha1::SandboxHost;

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

/// The CA configured for `host`, or None (the system's roots). With `own_namespace` (the
/// operator's), a `spec.caSecret` elsewhere is refused unread, as the admin-token Secret is.
pub async fn host_ca(
    client: &Client,
    own_namespace: Option<&str>,
    host_ca_file: Option<&std::path::Path>,
    host: &SandboxHost,
) -> Result<Option<HostCa>, CaError> {
    if let Some(r) = &host.spec.ca_secret {
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
        return Ok(Some(HostCa { pem, origin }));
    }
    match host_ca_file {
        Some(path) => {
            let pem = tokio::fs::read(path).await.map_err(|e| {
                CaError::Missing(format!(
                    "--host-ca-file {} cannot be read: {e}",
                    path.display()
                ))
            })?;
            Ok(Some(HostCa {
                pem,
                origin: format!("--host-ca-file {}", path.display()),
            }))
        }
        None => Ok(None),
    }
}

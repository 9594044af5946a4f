//! What the operator trusts for a host's https:// endpoint: the CA in the host's
//! `spec.caSecret` (read by [`sandboxd_crds::ca`], which `kubectl sandbox doctor` uses too),
//! else the operator's `--host-ca-file`, else the system's CA roots. The CA is read again with
//! the admin token (a rotated CA is picked up), and handed to the platform in each session's
//! token Secret (`ca.crt`).

use kube::Client;
use sandboxd_crds::ca::{CaError, HostCa};
use sandboxd_crds::v1alpha1::SandboxHost;

/// The CA configured for `host`, or None (the system's roots). With `own_namespace` (the
/// operator's), a `spec.caSecret` elsewhere is refused unread, as the admin-token Secret is.
pub async fn host_ca(
    client: &Client,
    own_namespace: Option<&str>,
    host_ca_file: Option<&std::path::Path>,
    host: &SandboxHost,
) -> Result<Option<HostCa>, CaError> {
    if host.spec.ca_secret.is_some() {
        return sandboxd_crds::ca::from_secret(client, own_namespace, host).await;
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

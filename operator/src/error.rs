//! The error of a reconcile, with the stable label its metric and Warning event carry.

use sandboxd_api::client::ClientError;

/// A reconcile failure, with a stable label for metrics and event reasons.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or could not be reached.
    #[error("the Kubernetes API failed: {0}")]
    Kube(#[from] kube::Error),
    /// A host's sandboxd answered with an error or could not be reached.
    #[error("sandboxd on host {host}: {source}")]
    Host {
        /// The SandboxHost.
        host: String,
        /// What the client saw.
        #[source]
        source: ClientError,
    },
    /// A host's admin token could not be read.
    #[error("the admin token of host {host} could not be read: {why}")]
    Token {
        /// The SandboxHost.
        host: String,
        /// Why.
        why: String,
    },
    /// A host names no node: it is sent no token, so it cannot be asked anything.
    #[error(
        "spec.node is unset: the operator sends an admin token only to the sandboxd of a node (the token derived for spec.node, which opens no other node), so {endpoint} is sent no token, is not probed and takes no session. Set spec.node to the node name in its sandboxd's SANDBOXD_NODE_NAME"
    )]
    NodeUnset {
        /// The SandboxHost.
        host: String,
        /// Its endpoint.
        endpoint: String,
    },
    /// A host names an admin-token Secret outside the operator's namespace: it is not read.
    #[error(
        "the admin-token Secret {secret_namespace}/{secret_name} is not read: it must live in the operator's namespace {namespace}, the only namespace the operator reads Secrets in"
    )]
    TokenSecretRefused {
        /// The SandboxHost.
        host: String,
        /// Namespace of the Secret the host names.
        secret_namespace: String,
        /// Its name.
        secret_name: String,
        /// The operator's namespace, where it must live.
        namespace: String,
    },
    /// A host still owes destroys.
    #[error(
        "host {host} still has {count} tombstones; annotate it with sandboxd.dev/forget-tombstones=true to delete it anyway"
    )]
    TombstonesLeft {
        /// The SandboxHost.
        host: String,
        /// How many.
        count: usize,
    },
    /// The finalizer helper failed.
    #[error("finalizer: {0}")]
    Finalizer(String),
    /// The CA to trust for a host's certificate could not be read or used.
    #[error("the CA of host {host} could not be used: {why}")]
    Ca {
        /// The SandboxHost.
        host: String,
        /// Why.
        why: String,
    },
    /// The signer's CA could not be read or used, so a certificate request waits.
    #[error("certificate request {csr} cannot be signed yet: {why}")]
    Signer {
        /// The CertificateSigningRequest.
        csr: String,
        /// Why.
        why: String,
    },
}

impl Error {
    /// Every label [`Error::label`] gives.
    pub const LABELS: [&'static str; 9] = [
        "KubeError",
        "HostError",
        "TokenUnreadable",
        "NodeUnset",
        "TokenSecretRefused",
        "TombstonesLeft",
        "FinalizerError",
        "CaUnusable",
        "SignerCaUnusable",
    ];

    /// A stable PascalCase label: metric label and Warning event reason.
    pub fn label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "KubeError",
            Error::Host { .. } => "HostError",
            Error::Token { .. } => "TokenUnreadable",
            Error::NodeUnset { .. } => "NodeUnset",
            Error::TokenSecretRefused { .. } => "TokenSecretRefused",
            Error::TombstonesLeft { .. } => "TombstonesLeft",
            Error::Finalizer(_) => "FinalizerError",
            Error::Ca { .. } => "CaUnusable",
            Error::Signer { .. } => "SignerCaUnusable",
        }
    }
}

/// The error and its sources, for an event note.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

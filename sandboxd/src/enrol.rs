//! `sandboxd enrol`: a serving certificate for this node from the operator, through the
//! Kubernetes CertificateSigningRequest API (the kubelet's serving-certificate pattern).
//!
//! The key is made here and never leaves the node: only a certificate request naming the node
//! (DNS SAN) and its IP (IP SAN) goes to the API server, under the pod's own ServiceAccount
//! token. The API server adds who asked (the ServiceAccount) and, for a pod-bound token, from
//! which node (`authentication.kubernetes.io/node-name`); the operator signs only a request
//! whose names are that node's. The files written are what sandboxd serves with:
//! `tls.key`, `tls.crt` (the certificate) and `ca.crt` (the CA that signed it).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};

pub use sandboxd_api::enrol::{SIGNER_NAME, USAGES};

/// What to ask for and where to put the result.
#[derive(Debug, Clone)]
pub struct Request {
    /// The node's name: the certificate's DNS name.
    pub node: String,
    /// The node's IP: the certificate's IP address, if any.
    pub node_ip: Option<IpAddr>,
    /// The signer to ask.
    pub signer_name: String,
    /// The folder that gets tls.key, tls.crt and ca.crt.
    pub dir: PathBuf,
    /// The longest wait for the signer.
    pub wait: Duration,
}

/// Why no certificate was written.
#[derive(Debug, thiserror::Error)]
pub enum EnrolError {
    /// The key or the request could not be made.
    #[error("the key or the certificate request could not be made: {0}")]
    Key(#[from] rcgen::Error),
    /// No Kubernetes configuration, or the API server refused.
    #[error("the Kubernetes API failed: {0}")]
    Kube(#[from] kube::Error),
    /// No in-cluster or KUBECONFIG configuration.
    #[error(
        "no Kubernetes configuration (in a pod: the projected ServiceAccount token; outside: KUBECONFIG): {0}"
    )]
    Config(String),
    /// The signer said no.
    #[error("CertificateSigningRequest {name} was {kind} by the signer: {message}")]
    Refused {
        /// The request's name.
        name: String,
        /// `denied` or `failed`.
        kind: &'static str,
        /// The signer's reason and message.
        message: String,
    },
    /// Nothing came in time.
    #[error(
        "CertificateSigningRequest {name} (signer {signer}) got no certificate within {secs} s: is the operator running, with its signer on (the chart's default, tls.enabled=true)?"
    )]
    Timeout {
        /// The request's name.
        name: String,
        /// The signer asked.
        signer: String,
        /// How long it waited.
        secs: u64,
    },
    /// The certificate that came back is unusable.
    #[error("CertificateSigningRequest {name} holds no usable certificate: {why}")]
    Unusable {
        /// The request's name.
        name: String,
        /// Why.
        why: String,
    },
    /// A file could not be written.
    #[error("{path} cannot be written: {error}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
}

/// A new key and the PEM certificate request naming `node` and `ip`.
pub fn key_and_request(
    node: &str,
    ip: Option<IpAddr>,
) -> Result<(rcgen::KeyPair, String), rcgen::Error> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, node);
    params.subject_alt_names = vec![rcgen::SanType::DnsName(rcgen::string::Ia5String::try_from(
        node,
    )?)];
    if let Some(ip) = ip {
        params.subject_alt_names.push(rcgen::SanType::IpAddress(ip));
    }
    let csr = params.serialize_request(&key)?;
    Ok((key, csr.pem()?))
}

/// Makes the key, asks for its certificate, waits for it and writes the three files. Returns
/// the request's name.
pub async fn enrol(request: &Request) -> Result<String, EnrolError> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| EnrolError::Config(e.to_string()))?;
    let client = kube::Client::try_from(config)?;
    let (key, csr_pem) = key_and_request(&request.node, request.node_ip)?;
    let api = Api::<CertificateSigningRequest>::all(client);
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some(format!("sandboxd-{}-", request.node)),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem.into_bytes()),
            signer_name: request.signer_name.clone(),
            usages: Some(USAGES.iter().map(|u| (*u).to_owned()).collect()),
            ..Default::default()
        },
        status: None,
    };
    let created = api.create(&PostParams::default(), &csr).await?;
    let name = created.metadata.name.clone().unwrap_or_default();
    tracing::info!(csr = %name, node = %request.node, ip = ?request.node_ip, signer = %request.signer_name, "certificate requested");
    let deadline = Instant::now() + request.wait;
    // Polled by name: the ServiceAccount may create and get its requests, not list or watch.
    let certificate = loop {
        let now = api.get(&name).await?;
        if let Some(status) = &now.status {
            for c in status.conditions.iter().flatten() {
                let kind = match c.type_.as_str() {
                    "Denied" => "denied",
                    "Failed" => "failed",
                    _ => continue,
                };
                return Err(EnrolError::Refused {
                    name,
                    kind,
                    message: format!(
                        "{}: {}",
                        c.reason.as_deref().unwrap_or(""),
                        c.message.as_deref().unwrap_or("")
                    ),
                });
            }
            if let Some(cert) = status.certificate.as_ref().filter(|c| !c.0.is_empty()) {
                break cert.0.clone();
            }
        }
        if Instant::now() >= deadline {
            return Err(EnrolError::Timeout {
                name,
                signer: request.signer_name.clone(),
                secs: request.wait.as_secs(),
            });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let (leaf, ca) = split_chain(&certificate).map_err(|why| EnrolError::Unusable {
        name: name.clone(),
        why,
    })?;
    std::fs::create_dir_all(&request.dir).map_err(|error| EnrolError::Write {
        path: request.dir.clone(),
        error,
    })?;
    write(&request.dir.join("tls.key"), key.serialize_pem().as_bytes())?;
    write(&request.dir.join("ca.crt"), ca.as_bytes())?;
    write(&request.dir.join("tls.crt"), leaf.as_bytes())?;
    tracing::info!(csr = %name, dir = %request.dir.display(), "certificate written");
    Ok(name)
}

/// The leaf (first certificate) and the CA (the rest) of a PEM chain as the signer writes it.
pub fn split_chain(pem: &[u8]) -> Result<(String, String), String> {
    let certs = crate::tls::certificates(pem).map_err(|e| format!("no PEM certificate{e}"))?;
    if certs.len() < 2 {
        return Err(
            "the chain holds only one certificate; the sandboxd signer writes the certificate followed by its CA".to_owned(),
        );
    }
    let pem_of = |der: &[u8]| {
        let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, der);
        let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
        for line in b64.as_bytes().chunks(64) {
            out.push_str(&String::from_utf8_lossy(line));
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
        out
    };
    let leaf = pem_of(certs[0].as_ref());
    let ca = certs[1..].iter().map(|c| pem_of(c.as_ref())).collect();
    Ok((leaf, ca))
}

/// Writes `path` whole (a temporary file renamed over it), readable by its owner only.
fn write(path: &Path, data: &[u8]) -> Result<(), EnrolError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let err = |error| EnrolError::Write {
        path: path.to_owned(),
        error,
    };
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(err)?;
    f.write_all(data).map_err(err)?;
    f.sync_all().map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_names_the_node_and_its_ip() {
        let (_, pem) =
            key_and_request("worker-1", Some("10.0.0.7".parse().expect("ip"))).expect("request");
        assert!(
            pem.starts_with("-----BEGIN CERTIFICATE REQUEST-----"),
            "{pem}"
        );
    }

    fn self_signed(name: &str) -> String {
        let key = rcgen::KeyPair::generate().expect("key");
        rcgen::CertificateParams::new(vec![name.to_owned()])
            .expect("params")
            .self_signed(&key)
            .expect("certificate")
            .pem()
    }

    #[test]
    fn a_chain_splits_into_leaf_and_ca() {
        let (leaf, ca) = (self_signed("leaf"), self_signed("ca"));
        let (got_leaf, got_ca) = split_chain(format!("{leaf}{ca}").as_bytes()).expect("a chain");
        assert_eq!((got_leaf, got_ca), (leaf.clone(), ca));
        let err = split_chain(leaf.as_bytes()).expect_err("no CA");
        assert!(
            err.starts_with("the chain holds only one certificate"),
            "{err}"
        );
        let err = split_chain(b"nothing").expect_err("no PEM");
        assert!(err.starts_with("no PEM certificate"), "{err}");
    }
}

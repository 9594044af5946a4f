//! The node's egress CA: what the egress proxy signs its certificates with when it terminates
//! a sandbox's TLS to add a credential ([`super::proxy`]), and what every sandbox trusts.
//!
//! It is made by sandboxd at its first start (an ECDSA P-256 key, `ca.key` mode 0600 and
//! `ca.crt` 0644 in `<state>/egress-ca/`) and reused after a restart, or given by
//! `SANDBOXD_EGRESS_CA_CERT` and `SANDBOXD_EGRESS_CA_KEY`. Beside it sandboxd writes the trust
//! bundle a sandbox of an `allowlist` runtime gets at `/etc/ssl/certs/ca-certificates.crt`: the
//! node's system roots (`SANDBOXD_EGRESS_SYSTEM_ROOTS`) and the CA. Without system roots there is
//! no bundle (a sandbox keeps its image's roots and gets the CA alone, which only Node reads by
//! itself). The key never leaves sandboxd: only the certificate and the bundle are mounted.
//!
//! A leaf certificate for a name is made when a sandbox first asks for it and kept for a day.
//! The upstream side of an intercepted connection verifies the real server against the
//! system roots and `SANDBOXD_EGRESS_UPSTREAM_CA` (an extra PEM bundle), never against this CA.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

/// Where a sandbox finds the trust bundle (the system roots and the egress CA).
pub const BUNDLE_IN_SANDBOX: &str = "/etc/ssl/certs/ca-certificates.crt";
/// Where a sandbox finds the egress CA alone.
pub const CA_IN_SANDBOX: &str = "/etc/sandboxd/egress-ca.crt";
/// The system roots read by default, when the file exists.
pub const DEFAULT_SYSTEM_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";
/// How long a leaf certificate made for a name is reused.
const LEAF_REUSE: Duration = Duration::from_secs(24 * 3600);

/// Why the egress CA could not be loaded or made.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// A file could not be read or written.
    #[error("{what} {path}: {error}")]
    File {
        /// What the file is, with the variable that names it when one does.
        what: String,
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A certificate or key is not usable.
    #[error("{0}")]
    Invalid(String),
}

/// Where the CA comes from and what sandboxes and the upstream side trust.
#[derive(Debug, Clone, Default)]
pub struct CaSettings {
    /// sandboxd's state folder (the CA is made in `egress-ca/` in it).
    pub state_dir: PathBuf,
    /// `SANDBOXD_EGRESS_CA_CERT` and `SANDBOXD_EGRESS_CA_KEY`, when given.
    pub given: Option<(PathBuf, PathBuf)>,
    /// `SANDBOXD_EGRESS_SYSTEM_ROOTS`: the node's roots, when the file is there.
    pub system_roots: Option<PathBuf>,
    /// `SANDBOXD_EGRESS_UPSTREAM_CA`: more roots the upstream side trusts.
    pub upstream_ca: Option<PathBuf>,
}

/// The files a sandbox of an `allowlist` runtime is given: the bundle and the CA alone (host
/// paths).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trust {
    /// The system roots and the CA, PEM, mounted at [`BUNDLE_IN_SANDBOX`]; none when sandboxd
    /// has no system roots (a bundle of the CA alone would take the public roots away).
    pub bundle: Option<PathBuf>,
    /// The CA's certificate, PEM, mounted at [`CA_IN_SANDBOX`].
    pub ca: PathBuf,
}

impl Trust {
    /// The read-only binds (`host:container:ro`) of a sandbox.
    pub fn binds(&self) -> Vec<String> {
        let mut binds = vec![format!("{}:{CA_IN_SANDBOX}:ro", self.ca.display())];
        if let Some(bundle) = &self.bundle {
            binds.push(format!("{}:{BUNDLE_IN_SANDBOX}:ro", bundle.display()));
        }
        binds
    }

    /// The environment that points common clients (OpenSSL, Python requests, curl, Node) at
    /// the files: Node at the CA alone (it adds it to its own roots), the others at the bundle
    /// when there is one.
    pub fn env(&self) -> Vec<String> {
        let mut env = vec![format!("NODE_EXTRA_CA_CERTS={CA_IN_SANDBOX}")];
        if self.bundle.is_some() {
            for var in ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"] {
                env.push(format!("{var}={BUNDLE_IN_SANDBOX}"));
            }
        }
        env
    }
}

/// The node's egress CA, its leaves and the upstream side's trust.
pub struct EgressCa {
    signer: Arc<Signer>,
    trust: Trust,
    upstream: Arc<rustls::ClientConfig>,
    server: Arc<rustls::ServerConfig>,
}

/// What signs the leaves: the CA's key and certificate, and the leaves made.
struct Signer {
    issuer: Issuer<'static, KeyPair>,
    ca_der: CertificateDer<'static>,
    leaves: Mutex<HashMap<String, (Instant, Arc<CertifiedKey>)>>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for EgressCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressCa")
            .field("trust", &self.trust)
            .finish_non_exhaustive()
    }
}

fn read(what: &str, path: &Path) -> Result<String, CaError> {
    std::fs::read_to_string(path).map_err(|error| CaError::File {
        what: what.to_owned(),
        path: path.to_owned(),
        error,
    })
}

/// Writes `text` to `path` in place (a file already mounted into a container keeps its
/// inode, so a running sandbox sees the new content), with `mode`.
fn write(what: &str, path: &Path, text: &str, mode: u32) -> Result<(), CaError> {
    let err = |error| CaError::File {
        what: what.to_owned(),
        path: path.to_owned(),
        error,
    };
    if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(());
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)?;
    f.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(err)
}

/// The certificates of a PEM bundle (what is not a certificate is skipped).
fn certificates_of(pem: &str) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .filter_map(Result::ok)
        .collect()
}

impl EgressCa {
    /// Loads the CA given, or the one made before in the state folder, or makes one; writes
    /// the trust bundle beside it.
    pub fn load(settings: &CaSettings) -> Result<Self, CaError> {
        let dir = std::path::absolute(settings.state_dir.join("egress-ca")).map_err(|error| {
            CaError::File {
                what: "the egress CA folder".into(),
                path: settings.state_dir.join("egress-ca"),
                error,
            }
        })?;
        std::fs::create_dir_all(&dir).map_err(|error| CaError::File {
            what: "the egress CA folder".into(),
            path: dir.clone(),
            error,
        })?;
        let (cert_pem, key_pem, ca_file) = match &settings.given {
            Some((cert, key)) => {
                let cert_pem = read("SANDBOXD_EGRESS_CA_CERT", cert)?;
                let key_pem = read("SANDBOXD_EGRESS_CA_KEY", key)?;
                let cert = std::path::absolute(cert).unwrap_or_else(|_| cert.clone());
                (cert_pem, key_pem, cert)
            }
            None => {
                let (cert, key) = (dir.join("ca.crt"), dir.join("ca.key"));
                if cert.exists() && key.exists() {
                    (
                        read("the egress CA certificate", &cert)?,
                        read("the egress CA key", &key)?,
                        cert,
                    )
                } else {
                    let (cert_pem, key_pem) = Self::make()?;
                    write("the egress CA key", &key, &key_pem, 0o600)?;
                    write("the egress CA certificate", &cert, &cert_pem, 0o644)?;
                    (cert_pem, key_pem, cert)
                }
            }
        };
        let (cert_var, key_var) = if settings.given.is_some() {
            ("SANDBOXD_EGRESS_CA_CERT", "SANDBOXD_EGRESS_CA_KEY")
        } else {
            ("the egress CA certificate", "the egress CA key")
        };
        let key = KeyPair::from_pem(&key_pem).map_err(|e| {
            CaError::Invalid(format!("{key_var}: not a usable PEM private key: {e}"))
        })?;
        let ca_der = certificates_of(&cert_pem)
            .into_iter()
            .next()
            .ok_or_else(|| CaError::Invalid(format!("{cert_var}: holds no PEM certificate")))?;
        let issuer = Issuer::from_ca_cert_der(&ca_der, key).map_err(|e| {
            CaError::Invalid(format!(
                "{cert_var}: not a CA certificate rcgen can sign with: {e}"
            ))
        })?;
        if rcgen::PublicKeyData::der_bytes(issuer.key()) != public_key_of(&ca_der)?.as_slice() {
            return Err(CaError::Invalid(format!(
                "{key_var} is not the key of the certificate in {cert_var}"
            )));
        }
        let system = match &settings.system_roots {
            Some(path) => read("SANDBOXD_EGRESS_SYSTEM_ROOTS", path)?,
            None => String::new(),
        };
        let bundle = dir.join("bundle.crt");
        let bundle = if certificates_of(&system).is_empty() {
            let _ = std::fs::remove_file(&bundle);
            None
        } else {
            let mut bundle_text = system.clone();
            if !bundle_text.ends_with('\n') {
                bundle_text.push('\n');
            }
            bundle_text.push_str("# sandboxd node egress CA\n");
            bundle_text.push_str(&cert_pem);
            write("the egress trust bundle", &bundle, &bundle_text, 0o644)?;
            Some(bundle)
        };

        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(certificates_of(&system));
        if let Some(path) = &settings.upstream_ca {
            let extra = certificates_of(&read("SANDBOXD_EGRESS_UPSTREAM_CA", path)?);
            if extra.is_empty() {
                return Err(CaError::Invalid(format!(
                    "SANDBOXD_EGRESS_UPSTREAM_CA {}: holds no PEM certificate",
                    path.display()
                )));
            }
            roots.add_parsable_certificates(extra);
        }
        let mut upstream = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| CaError::Invalid(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        upstream.alpn_protocols = vec![b"http/1.1".to_vec()];
        let signer = Arc::new(Signer {
            issuer,
            ca_der,
            leaves: Mutex::default(),
        });
        let mut server = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| CaError::Invalid(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(signer.clone());
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            signer,
            trust: Trust {
                bundle,
                ca: ca_file,
            },
            upstream: Arc::new(upstream),
            server: Arc::new(server),
        })
    }

    /// A new CA: its certificate and key, PEM.
    fn make() -> Result<(String, String), CaError> {
        let key = KeyPair::generate().map_err(|e| CaError::Invalid(e.to_string()))?;
        let mut params = CertificateParams::new(Vec::<String>::new())
            .map_err(|e| CaError::Invalid(e.to_string()))?;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params
            .distinguished_name
            .push(DnType::CommonName, "sandboxd node egress CA");
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        valid(&mut params, -1, 10 * 365);
        let cert = params
            .self_signed(&key)
            .map_err(|e| CaError::Invalid(e.to_string()))?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// The files sandboxes are given.
    pub fn trust(&self) -> &Trust {
        &self.trust
    }

    /// The CA's certificate (DER).
    pub fn certificate(&self) -> &CertificateDer<'static> {
        &self.signer.ca_der
    }

    /// The TLS configuration of the sandbox side: a leaf for the SNI, made on demand, ALPN
    /// `http/1.1` only.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        self.server.clone()
    }

    /// The TLS configuration of the upstream side: the system roots and the upstream CA,
    /// ALPN `http/1.1`.
    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        self.upstream.clone()
    }

    /// The leaf of `name` (made now, or the one made within the last day).
    pub fn leaf(&self, name: &str) -> Result<Arc<CertifiedKey>, CaError> {
        self.signer.leaf(name)
    }
}

impl Signer {
    /// The leaf of `name` (made now, or the one made within the last day).
    fn leaf(&self, name: &str) -> Result<Arc<CertifiedKey>, CaError> {
        let mut leaves = self
            .leaves
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((at, key)) = leaves.get(name)
            && at.elapsed() < LEAF_REUSE
        {
            return Ok(key.clone());
        }
        let key = KeyPair::generate().map_err(|e| CaError::Invalid(e.to_string()))?;
        let mut params = CertificateParams::new(vec![name.to_owned()])
            .map_err(|e| CaError::Invalid(format!("{name}: {e}")))?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        valid(&mut params, -1, 7);
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| CaError::Invalid(format!("{name}: {e}")))?;
        let der_key = PrivateKeyDer::try_from(key.serialize_der())
            .map_err(|e| CaError::Invalid(format!("{name}: {e}")))?;
        let signing = crate::tls::provider()
            .key_provider
            .load_private_key(der_key)
            .map_err(|e| CaError::Invalid(format!("{name}: {e}")))?;
        let certified = Arc::new(CertifiedKey::new(
            vec![cert.der().clone(), self.ca_der.clone()],
            signing,
        ));
        if leaves.len() > 4096 {
            leaves.clear();
        }
        leaves.insert(name.to_owned(), (Instant::now(), certified.clone()));
        Ok(certified)
    }
}

impl rustls::server::ResolvesServerCert for Signer {
    fn resolve(&self, hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello.server_name()?.to_ascii_lowercase();
        self.leaf(&name).ok()
    }
}

/// The subjectPublicKeyInfo of a certificate, to check a key is its own.
fn public_key_of(der: &CertificateDer<'_>) -> Result<Vec<u8>, CaError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| CaError::Invalid(format!("the egress CA certificate: {e}")))?;
    Ok(cert.public_key().subject_public_key.data.to_vec())
}

/// Sets the validity of `params` from `from` days to `to` days around today.
fn valid(params: &mut CertificateParams, from: i64, to: i64) {
    use chrono::Datelike;
    let at = |days: i64| {
        let d = chrono::Utc::now() + chrono::Duration::days(days);
        rcgen::date_time_ymd(
            d.year(),
            u8::try_from(d.month()).unwrap_or(1),
            u8::try_from(d.day()).unwrap_or(1),
        )
    };
    params.not_before = at(from);
    params.not_after = at(to);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_system_roots_a_sandbox_keeps_its_own_bundle_and_gets_the_ca_alone() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let settings = CaSettings {
            state_dir: dir.path().to_owned(),
            ..CaSettings::default()
        };
        let ca = EgressCa::load(&settings).expect("made");
        assert_eq!(ca.trust().bundle, None);
        assert!(!dir.path().join("egress-ca/bundle.crt").exists());
        assert_eq!(
            ca.trust().binds(),
            vec![format!("{}:{CA_IN_SANDBOX}:ro", ca.trust().ca.display())]
        );
        assert_eq!(
            ca.trust().env(),
            vec![format!("NODE_EXTRA_CA_CERTS={CA_IN_SANDBOX}")]
        );
    }

    #[test]
    fn the_ca_is_made_once_kept_and_signs_leaves_a_client_of_the_bundle_trusts() {
        let dir = tempfile::tempdir().expect("a temp dir");
        // The node's roots: one certificate of another CA.
        let (public_root, _) = EgressCa::make().expect("a root");
        let system = dir.path().join("roots.crt");
        std::fs::write(&system, &public_root).expect("the roots");
        let settings = CaSettings {
            state_dir: dir.path().to_owned(),
            system_roots: Some(system),
            ..CaSettings::default()
        };
        let ca = EgressCa::load(&settings).expect("made");
        let key = dir.path().join("egress-ca/ca.key");
        let mode = |p: &Path| std::fs::metadata(p).expect("a file").permissions().mode() & 0o777;
        assert_eq!(mode(&key), 0o600);
        assert_eq!(mode(&ca.trust().ca), 0o644);
        let again = EgressCa::load(&settings).expect("loaded");
        assert_eq!(
            ca.certificate(),
            again.certificate(),
            "reused after a restart"
        );
        let bundle_file = ca
            .trust()
            .bundle
            .clone()
            .expect("a bundle with system roots");
        let bundle = std::fs::read_to_string(&bundle_file).expect("the bundle");
        assert!(
            !bundle.contains("PRIVATE KEY"),
            "the key is never in the bundle"
        );
        assert!(bundle.starts_with(&public_root), "the node's roots first");
        assert_eq!(certificates_of(&bundle).len(), 2, "the roots and the CA");
        assert_eq!(
            ca.trust().binds(),
            vec![
                format!("{}:{CA_IN_SANDBOX}:ro", ca.trust().ca.display()),
                format!("{}:{BUNDLE_IN_SANDBOX}:ro", bundle_file.display()),
            ]
        );
        assert_eq!(ca.trust().env().len(), 4);

        // A client trusting the bundle verifies a leaf for api.test.
        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(certificates_of(&bundle));
        let client = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut c =
            rustls::ClientConnection::new(Arc::new(client), "api.test".try_into().expect("a name"))
                .expect("a client");
        let mut s = rustls::ServerConnection::new(ca.server_config()).expect("a server");
        for _ in 0..10 {
            let mut buf = Vec::new();
            c.write_tls(&mut buf).expect("client writes");
            s.read_tls(&mut buf.as_slice()).expect("server reads");
            s.process_new_packets().expect("the server accepts");
            let mut buf = Vec::new();
            s.write_tls(&mut buf).expect("server writes");
            c.read_tls(&mut buf.as_slice()).expect("client reads");
            c.process_new_packets()
                .expect("the client verifies the leaf");
            if !c.is_handshaking() && !s.is_handshaking() {
                break;
            }
        }
        assert!(!c.is_handshaking(), "the handshake finished");
        assert_eq!(s.alpn_protocol(), None);

        // A key that is not the certificate's is refused, naming the variables.
        let other = tempfile::tempdir().expect("a temp dir");
        let made = EgressCa::load(&CaSettings {
            state_dir: other.path().to_owned(),
            ..CaSettings::default()
        })
        .expect("another CA");
        let e = EgressCa::load(&CaSettings {
            state_dir: dir.path().to_owned(),
            given: Some((made.trust().ca.clone(), key)),
            ..CaSettings::default()
        })
        .expect_err("a key of another CA");
        assert!(
            e.to_string().contains("SANDBOXD_EGRESS_CA_KEY is not the key of the certificate in SANDBOXD_EGRESS_CA_CERT"),
            "{e}"
        );
    }
}

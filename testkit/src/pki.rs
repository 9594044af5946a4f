//! A CA and leaf certificates made in the test, for sandboxd's TLS.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// A certificate authority of a test.
pub struct Ca {
    /// Its certificate, PEM.
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A leaf certificate and its key, written to files.
pub struct Leaf {
    /// The certificate file (PEM).
    pub cert: PathBuf,
    /// The key file (PEM).
    pub key: PathBuf,
}

impl Ca {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().expect("a CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).expect("a self-signed CA");
        Self {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A leaf for `sans` (IPs or DNS names), its PEM files written into `dir` as
    /// `<name>.crt` and `<name>.key`.
    pub fn leaf(&self, sans: &[&str], dir: &Path, name: &str) -> Leaf {
        let key = KeyPair::generate().expect("a leaf key");
        let mut params =
            CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
                .expect("leaf params");
        params
            .distinguished_name
            .push(DnType::CommonName, "sandboxd");
        let cert = params.signed_by(&key, &self.issuer).expect("a signed leaf");
        let leaf = Leaf {
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
        };
        std::fs::write(&leaf.cert, cert.pem()).expect("write the certificate");
        std::fs::write(&leaf.key, key.serialize_pem()).expect("write the key");
        leaf
    }
}

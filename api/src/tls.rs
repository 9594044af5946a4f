//! What a client of sandboxd needs of TLS: the process's crypto provider (ring, which kube
//! compiles in) and the certificates of a PEM bundle.

use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// Makes ring the process's default crypto provider, for clients built by libraries that look it up
/// (reqwest). Harmless when a default is installed already.
pub fn install_provider() {
    if CryptoProvider::get_default().is_none() {
        // Only fails when another thread installed one in between: that one serves.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The certificates of a PEM bundle, or why there are none.
pub fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!(": {e}"))?;
    if chain.is_empty() {
        return Err(" (no -----BEGIN CERTIFICATE----- block)".to_owned());
    }
    Ok(chain)
}

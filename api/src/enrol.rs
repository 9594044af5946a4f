//! What a node's certificate request and the operator's signer agree on: the signer name and
//! the key usages (`sandboxd enrol` asks with these; the operator signs only such requests).

/// The signer name of sandboxd's serving certificates (the operator signs only these).
pub const SIGNER_NAME: &str = "sandboxd.dev/host";

/// The key usages a request asks for, as the CertificateSigningRequest API spells them.
pub const USAGES: [&str; 3] = ["digital signature", "key encipherment", "server auth"];

//! TLS for sandboxd's port (`SANDBOXD_TLS_CERT_FILE` and `SANDBOXD_TLS_KEY_FILE`, PEM), and
//! the trust of its clients (a CA in PEM).
//!
//! The crypto provider is rustls' `ring`, the one kube already compiles in; nothing here pulls
//! in a second one.
//!
//! The certificate and key are read again when either file changes (looked at every
//! [`RELOAD_EVERY`], as cert-manager rotates them in place) and on SIGHUP. A new pair that
//! does not load (half-written, or a key that does not match) leaves the old one serving, and
//! says so in the log; connections already open keep the certificate they began with.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject;
pub use sandboxd_api::tls::{certificates, install_provider};
use tracing::{info, warn};

/// How often the certificate and key files are looked at for a change.
pub const RELOAD_EVERY: Duration = Duration::from_secs(10);

/// The crypto provider of every TLS connection sandboxd makes or accepts.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Why a certificate, key or CA could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Only one of the two files is configured.
    #[error(
        "{given} is set but {missing} is not: TLS needs both the certificate and its key (or neither, for plain HTTP)"
    )]
    Half {
        /// The variable that is set.
        given: &'static str,
        /// The variable that is missing.
        missing: &'static str,
    },
    /// A file could not be read.
    #[error("{var} {path} cannot be read: {error}")]
    Unreadable {
        /// The variable naming the file.
        var: &'static str,
        /// The file.
        path: PathBuf,
        /// Why (in the message, so it is said once).
        error: std::io::Error,
    },
    /// A file holds no usable PEM of the kind expected.
    #[error("{var} {path} holds no PEM {what}{why}")]
    Unparsable {
        /// The variable naming the file.
        var: &'static str,
        /// The file.
        path: PathBuf,
        /// What was looked for ("certificate", "private key").
        what: &'static str,
        /// What the parser said, with a leading ": ", or nothing.
        why: String,
    },
    /// The key is not the certificate's, or rustls refused the pair.
    #[error(
        "the key in SANDBOXD_TLS_KEY_FILE {key} does not fit the certificate in SANDBOXD_TLS_CERT_FILE {cert}: {why}"
    )]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What rustls said.
        why: String,
    },
}

/// The certificate and key files sandboxd serves TLS with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, leaf first (PEM).
    pub cert: PathBuf,
    /// The leaf's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

impl TlsFiles {
    /// Both files, neither (`None`: plain HTTP), or the error naming the one missing.
    pub fn from_options(
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<Option<TlsFiles>, TlsError> {
        match (cert, key) {
            (Some(cert), Some(key)) => Ok(Some(TlsFiles {
                cert: cert.to_owned(),
                key: key.to_owned(),
            })),
            (None, None) => Ok(None),
            (Some(_), None) => Err(TlsError::Half {
                given: "SANDBOXD_TLS_CERT_FILE",
                missing: "SANDBOXD_TLS_KEY_FILE",
            }),
            (None, Some(_)) => Err(TlsError::Half {
                given: "SANDBOXD_TLS_KEY_FILE",
                missing: "SANDBOXD_TLS_CERT_FILE",
            }),
        }
    }

    fn read(&self) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
        let read = |var, path: &Path| {
            std::fs::read(path).map_err(|error| TlsError::Unreadable {
                var,
                path: path.to_owned(),
                error,
            })
        };
        Ok((
            read("SANDBOXD_TLS_CERT_FILE", &self.cert)?,
            read("SANDBOXD_TLS_KEY_FILE", &self.key)?,
        ))
    }

    /// Reads and checks the pair: the server configuration, or what is wrong with it.
    pub fn load(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let (cert, key) = self.read()?;
        self.config(&cert, &key)
    }

    fn config(&self, cert: &[u8], key: &[u8]) -> Result<Arc<ServerConfig>, TlsError> {
        let chain = certificates(cert).map_err(|why| TlsError::Unparsable {
            var: "SANDBOXD_TLS_CERT_FILE",
            path: self.cert.clone(),
            what: "certificate",
            why,
        })?;
        let key_der = PrivateKeyDer::from_pem_slice(key).map_err(|e| TlsError::Unparsable {
            var: "SANDBOXD_TLS_KEY_FILE",
            path: self.key.clone(),
            what: "private key",
            why: format!(": {e}"),
        })?;
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Mismatch {
                cert: self.cert.clone(),
                key: self.key.clone(),
                why: e.to_string(),
            })?
            .with_no_client_auth()
            .with_single_cert(chain, key_der)
            .map_err(|e| TlsError::Mismatch {
                cert: self.cert.clone(),
                key: self.key.clone(),
                why: e.to_string(),
            })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// The server configuration in use, replaced when the files change or on SIGHUP.
#[derive(Clone)]
pub struct Reloading {
    files: TlsFiles,
    current: Arc<RwLock<Loaded>>,
}

struct Loaded {
    config: Arc<ServerConfig>,
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl Reloading {
    /// Loads the pair; fails at start-up with the error naming what is wrong.
    pub fn new(files: TlsFiles) -> Result<Self, TlsError> {
        let (cert, key) = files.read()?;
        let config = files.config(&cert, &key)?;
        Ok(Self {
            files,
            current: Arc::new(RwLock::new(Loaded { config, cert, key })),
        })
    }

    /// The configuration new connections get.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .config
            .clone()
    }

    /// Reads the files again; replaces the configuration when they changed and load. Returns
    /// whether it was replaced.
    pub fn reload(&self) -> bool {
        let (cert, key) = match self.files.read() {
            Ok(pair) => pair,
            Err(e) => {
                warn!(error = %e, "the TLS certificate was not reloaded; the previous one still serves");
                return false;
            }
        };
        {
            let now = self.current.read().unwrap_or_else(|p| p.into_inner());
            if now.cert == cert && now.key == key {
                return false;
            }
        }
        match self.files.config(&cert, &key) {
            Ok(config) => {
                *self.current.write().unwrap_or_else(|p| p.into_inner()) =
                    Loaded { config, cert, key };
                info!(cert = %self.files.cert.display(), "TLS certificate reloaded");
                true
            }
            Err(e) => {
                // cert-manager writes the two files one after the other: the next look sees
                // the pair complete.
                warn!(error = %e, "the TLS certificate was not reloaded; the previous one still serves");
                false
            }
        }
    }

    /// Reloads on a change of the files and on SIGHUP until the returned task is aborted.
    pub fn spawn_watcher(&self) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            #[cfg(unix)]
            let mut hup =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
            let mut tick = tokio::time::interval(RELOAD_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                #[cfg(unix)]
                {
                    let hup_recv = async {
                        match hup.as_mut() {
                            Some(h) => h.recv().await,
                            None => futures::future::pending().await,
                        }
                    };
                    tokio::select! {
                        _ = tick.tick() => {},
                        _ = hup_recv => info!("SIGHUP: reading the TLS certificate again"),
                    }
                }
                #[cfg(not(unix))]
                tick.tick().await;
                this.reload();
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_files_or_neither() {
        assert_eq!(TlsFiles::from_options(None, None).ok(), Some(None));
        let err = TlsFiles::from_options(Some(Path::new("/c.pem")), None).expect_err("half");
        assert_eq!(
            err.to_string(),
            "SANDBOXD_TLS_CERT_FILE is set but SANDBOXD_TLS_KEY_FILE is not: TLS needs both the certificate and its key (or neither, for plain HTTP)"
        );
        let err = TlsFiles::from_options(None, Some(Path::new("/k.pem"))).expect_err("half");
        assert!(
            err.to_string()
                .starts_with("SANDBOXD_TLS_KEY_FILE is set but SANDBOXD_TLS_CERT_FILE is not")
        );
    }

    #[test]
    fn a_file_without_pem_is_named() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let cert = dir.path().join("tls.crt");
        let key = dir.path().join("tls.key");
        std::fs::write(&cert, "not a certificate").expect("write");
        std::fs::write(&key, "not a key").expect("write");
        let files = TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
        };
        let err = files.load().expect_err("no PEM");
        assert_eq!(
            err.to_string(),
            format!(
                "SANDBOXD_TLS_CERT_FILE {} holds no PEM certificate (no -----BEGIN CERTIFICATE----- block)",
                cert.display()
            )
        );
        let missing = TlsFiles {
            cert: dir.path().join("none.crt"),
            key,
        };
        let err = missing.load().expect_err("missing");
        assert!(
            err.to_string().starts_with(&format!(
                "SANDBOXD_TLS_CERT_FILE {} cannot be read: ",
                dir.path().join("none.crt").display()
            )),
            "{err}"
        );
    }
}

//! Image builds: the generated Dockerfile and its tag, one build with its log tail, the
//! pruning of superseded images, and `sandboxd prepare`.

use super::*;
use std::collections::HashMap;
use std::time::Duration;

use bollard::query_parameters::{
    BuildImageOptionsBuilder, CreateImageOptionsBuilder, ListImagesOptionsBuilder,
    RemoveImageOptionsBuilder,
};
use futures::StreamExt;
use sandboxd_catalog::CatalogEntry;
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::container::Engine;
use crate::container::docker::DockerEngine;

pub(super) fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

pub(super) fn run_line(command: &str) -> String {
    // The exec form with an explicit POSIX shell: any command text, newlines included.
    let json = serde_json::to_string(&["/bin/sh", "-c", command]).unwrap_or_default();
    format!("RUN {json}\n")
}

pub(super) fn env_value(v: &str) -> String {
    let escaped = v
        .replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('$', r"\$")
        .replace('\n', r"\n");
    format!("\"{escaped}\"")
}

/// What every build on this host shares: the sandbox uid, and an optional CA bundle that
/// builds (and the built image) trust, for a network whose TLS is intercepted by a proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BuildSettings {
    /// The sandbox uid (`SANDBOXD_SANDBOX_UID`).
    pub uid: u32,
    /// PEM certificates (`SANDBOXD_BUILD_CA_FILE`), copied to [`CA_PATH`] in built images.
    pub ca: Option<Vec<u8>>,
}

impl BuildSettings {
    /// Builds for `uid`, with no extra CA.
    pub fn uid(uid: u32) -> Self {
        Self { uid, ca: None }
    }
}

/// Where the extra CA bundle goes in a built image; `PIP_CERT`, `SSL_CERT_FILE` and
/// `REQUESTS_CA_BUNDLE` point at it.
pub const CA_PATH: &str = "/etc/ssl/certs/sandboxd-build-ca.pem";

/// The Dockerfile of a `base_image` entry; `None` for an `image` entry.
pub fn dockerfile(entry: &CatalogEntry, b: &BuildSettings) -> Option<String> {
    let base = entry.base_image.as_deref()?;
    let uid = b.uid;
    let mut f = format!(
        "# sandboxd runtime '{}'\nFROM {base}\nUSER root\n",
        entry.alias
    );
    if b.ca.is_some() {
        f.push_str(&format!(
            "COPY build-ca.pem {CA_PATH}\nENV PIP_CERT={CA_PATH} SSL_CERT_FILE={CA_PATH} REQUESTS_CA_BUNDLE={CA_PATH}\n"
        ));
    }
    f.push_str(&run_line(&format!(
        "id -u sandbox >/dev/null 2>&1 || useradd --uid {uid} --user-group --create-home --home-dir {HOME} --shell /bin/sh sandbox"
    )));
    for command in &entry.setup_commands {
        f.push_str(&run_line(command));
    }
    if !entry.packages.is_empty() {
        let packages: Vec<String> = entry.packages.iter().map(|p| sh_quote(p)).collect();
        f.push_str(&run_line(&format!(
            "python3 -m venv {VENV} && {VENV}/bin/pip install --no-cache-dir --disable-pip-version-check {} && chown -R {uid}:{uid} {VENV}",
            packages.join(" ")
        )));
        f.push_str(&format!("ENV VIRTUAL_ENV={VENV} PATH={VENV}/bin:$PATH\n"));
    }
    f.push_str(&format!("ENV HOME={HOME}\n"));
    for (name, value) in &entry.env_vars {
        f.push_str(&format!("ENV {name}={}\n", env_value(value)));
    }
    f.push_str(&format!(
        "LABEL {LABEL_RUNTIME}={}\n",
        env_value(&entry.alias)
    ));
    Some(f)
}

/// The image sessions on `entry` run: its `image`, or `sandboxd-runtime/<alias>:<hash>` with 16
/// hex digits of the SHA-256 of its Dockerfile (and of the CA bundle it copies).
pub fn tag(entry: &CatalogEntry, b: &BuildSettings) -> String {
    match dockerfile(entry, b) {
        None => entry.image.clone().unwrap_or_default(),
        Some(f) => {
            let mut h = Sha256::new();
            h.update(f.as_bytes());
            if let Some(ca) = &b.ca {
                h.update(ca);
            }
            format!(
                "{REPOSITORY}/{}:{}",
                entry.alias,
                &hex::encode(h.finalize())[..16]
            )
        }
    }
}

/// A tar archive of `files`, the build context.
pub(super) fn tar(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, data) in files {
        out.extend(tar_entry(name, data));
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}

pub(super) fn tar_entry(name: &str, data: &[u8]) -> Vec<u8> {
    let mut header = [0u8; 512];
    header[..name.len()].copy_from_slice(name.as_bytes());
    let octal = |field: &mut [u8], value: u64| {
        let text = format!("{:0width$o}\0", value, width = field.len() - 1);
        field.copy_from_slice(text.as_bytes());
    };
    octal(&mut header[100..108], 0o644);
    octal(&mut header[108..116], 0);
    octal(&mut header[116..124], 0);
    octal(&mut header[124..136], data.len() as u64);
    octal(&mut header[136..148], 0);
    header[148..156].copy_from_slice(b"        ");
    header[156] = b'0';
    header[257..263].copy_from_slice(b"ustar\0");
    header[263..265].copy_from_slice(b"00");
    let sum: u32 = header.iter().map(|b| u32::from(*b)).sum();
    header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let mut out = header.to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

/// A failed build or pull.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BuildFailure {
    /// What failed.
    pub message: String,
    /// The last lines of the log.
    pub log_tail: String,
}

pub(super) fn tail(lines: &[String]) -> String {
    let start = lines.len().saturating_sub(LOG_TAIL_LINES);
    lines[start..].join("\n")
}

/// Builds (or pulls) the image of one entry, once. Builds reach the package registries over
/// Docker's bridge network, whatever the session network is.
pub async fn build_once(
    engine: &Engine,
    entry: &CatalogEntry,
    b: &BuildSettings,
) -> Result<(), BuildFailure> {
    let image = tag(entry, b);
    if engine.has_image(&image).await.unwrap_or(false) {
        return Ok(());
    }
    let docker = engine
        .docker()
        .map_err(|e| BuildFailure {
            message: format!("building {image} failed: {e}"),
            log_tail: String::new(),
        })?
        .client();
    let mut lines: Vec<String> = Vec::new();
    let mut push = |text: &str| {
        for l in text.lines().map(str::trim_end).filter(|l| !l.is_empty()) {
            lines.push(l.to_owned());
            if lines.len() > 4 * LOG_TAIL_LINES {
                lines.drain(..LOG_TAIL_LINES);
            }
        }
    };
    let Some(file) = dockerfile(entry, b) else {
        let options = CreateImageOptionsBuilder::default()
            .from_image(&image)
            .build();
        let mut stream = docker.create_image(Some(options), None, None);
        while let Some(item) = stream.next().await {
            match item {
                Ok(info) => {
                    if let Some(s) = info.status {
                        push(&s);
                    }
                    if let Some(m) = info.error_detail.and_then(|d| d.message) {
                        return Err(BuildFailure {
                            message: format!("pulling {image} failed: {m}"),
                            log_tail: tail(&lines),
                        });
                    }
                }
                Err(e) => {
                    return Err(BuildFailure {
                        message: format!("pulling {image} failed: {e}"),
                        log_tail: tail(&lines),
                    });
                }
            }
        }
        return Ok(());
    };
    let labels = HashMap::from([(LABEL_RUNTIME.to_owned(), entry.alias.clone())]);
    let options = BuildImageOptionsBuilder::default()
        .dockerfile("Dockerfile")
        .t(&image)
        .rm(true)
        .forcerm(true)
        .networkmode("bridge")
        .labels(&labels)
        .build();
    let mut files: Vec<(&str, &[u8])> = vec![("Dockerfile", file.as_bytes())];
    if let Some(ca) = &b.ca {
        files.push(("build-ca.pem", ca));
    }
    let context = tar(&files);
    let mut stream = docker.build_image(options, None, Some(bollard::body_full(context.into())));
    while let Some(item) = stream.next().await {
        match item {
            Ok(info) => {
                if let Some(s) = info.stream.as_deref() {
                    push(s);
                }
                if let Some(m) = info.error_detail.and_then(|d| d.message) {
                    push(&m);
                    return Err(BuildFailure {
                        message: format!("building {image} failed: {m}"),
                        log_tail: tail(&lines),
                    });
                }
            }
            Err(e) => {
                let m = match &e {
                    bollard::errors::Error::DockerStreamError { error } => error.clone(),
                    other => other.to_string(),
                };
                push(&m);
                return Err(BuildFailure {
                    message: format!("building {image} failed: {m}"),
                    log_tail: tail(&lines),
                });
            }
        }
    }
    if !engine.has_image(&image).await.unwrap_or(false) {
        return Err(BuildFailure {
            message: format!("building {image} ended without the image"),
            log_tail: tail(&lines),
        });
    }
    prune(engine, &entry.alias, &image).await;
    Ok(())
}

/// Removes the images built for `alias` other than `keep` that no container uses (Docker
/// refuses those, and that refusal is fine).
pub(super) async fn prune(engine: &Engine, alias: &str, keep: &str) {
    let filters = HashMap::from([("label".to_owned(), vec![format!("{LABEL_RUNTIME}={alias}")])]);
    let options = ListImagesOptionsBuilder::default()
        .filters(&filters)
        .build();
    let Ok(docker) = engine.docker().map(DockerEngine::client) else {
        return;
    };
    let Ok(images) = docker.list_images(Some(options)).await else {
        return;
    };
    for image in images {
        if image.repo_tags.iter().any(|t| t == keep) {
            continue;
        }
        let options = RemoveImageOptionsBuilder::default().force(false).build();
        match docker.remove_image(&image.id, Some(options), None).await {
            Ok(_) => info!(runtime = alias, image = %image.id, "superseded runtime image pruned"),
            Err(e) => {
                tracing::debug!(runtime = alias, image = %image.id, error = %e, "superseded runtime image kept")
            }
        }
    }
}

/// Builds every runtime of an allowlist, each up to `attempts` times with `backoff` (doubling)
/// between attempts. Returns the aliases that failed, with their last error.
pub async fn prepare(
    engine: &Engine,
    allowlist: &Allowlist,
    b: &BuildSettings,
    attempts: u32,
    backoff: Duration,
) -> Vec<(String, BuildFailure)> {
    let mut failed = Vec::new();
    for entry in &allowlist.entries {
        let mut last = None;
        for attempt in 1..=attempts {
            info!(runtime = %entry.alias, attempt, tag = %tag(entry, b), "preparing runtime");
            match build_once(engine, entry, b).await {
                Ok(()) => {
                    last = None;
                    break;
                }
                Err(e) => {
                    warn!(runtime = %entry.alias, attempt, error = %e.message, "runtime build failed");
                    last = Some(e);
                    if attempt < attempts {
                        tokio::time::sleep(backoff * 2u32.pow(attempt - 1)).await;
                    }
                }
            }
        }
        if let Some(e) = last {
            failed.push((entry.alias.clone(), e));
        }
    }
    failed
}

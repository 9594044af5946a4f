//! Runtimes: the allowlist in the catalog format, and the images behind it.
//!
//! An `image` entry is used as is (pulled when missing). A `base_image` entry is built from a
//! generated Dockerfile: the sandbox account (`useradd --uid <uid> --create-home`), the
//! `setup_commands`, then the `packages` with pip into a virtualenv the sandbox user owns
//! (`/opt/venv`, first on `PATH`), and `env_vars` as image `ENV`. The tag is derived from that
//! Dockerfile, so a changed definition builds anew and an unchanged one is reused; superseded
//! images of the alias are pruned after a build when no container uses them.
//!
//! Prewarm: at start every allowlisted runtime whose image is missing is built in the
//! background, one at a time, so the service answers at once; a failed build is tried
//! [`START_ATTEMPTS`] times with backoff, then left to be built on demand. Opening a session on
//! a runtime still building is refused with [`RuntimeError::Preparing`]; on a failed one, with
//! [`RuntimeError::Failed`], the build's error and the tail of its log.
//!
//! Over 600 lines with its tests; the catalog's code is under 500.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sandboxd_catalog::egress::{Egress, EgressMode};
use sandboxd_catalog::{CatalogEntry, briefing};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::container::Engine;
pub use sandboxd_api::runtimes::{RuntimeKind, RuntimeList, RuntimeStatus};

mod allowlist;
mod build;

pub use allowlist::*;
pub use build::*;

/// Why a runtime cannot be used, or an allowlist was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// The allowlist is empty: there is no default runtime.
    #[error("no runtime is allowlisted")]
    NoneAllowlisted,
    /// The runtime asked for is not allowlisted.
    #[error("Runtime '{alias}' is not allowed on this host; allowed: {}", .allowed.join(", "))]
    Unknown {
        /// The runtime asked for.
        alias: String,
        /// The allowlisted runtimes.
        allowed: Vec<String>,
    },
    /// An allowlisted runtime without a build state (never the case once it is allowlisted).
    #[error("runtime '{alias}' has no state")]
    NoState {
        /// The runtime.
        alias: String,
    },
    /// The runtime's image is still being built.
    #[error(
        "Runtime '{alias}' is being prepared (its image {tag} is being built, attempt {attempt}); try again shortly - a first build can take minutes"
    )]
    Preparing {
        /// The runtime.
        alias: String,
        /// The image being built.
        tag: String,
        /// The build attempt under way.
        attempt: u32,
    },
    /// Every build of the runtime's image failed (a new attempt may be queued).
    #[error(
        "Runtime '{alias}' could not be built after {attempts} attempts: {error}\nLast lines of the build log:\n{log_tail}"
    )]
    Failed {
        /// The runtime.
        alias: String,
        /// The attempts made.
        attempts: u32,
        /// The last build's error.
        error: String,
        /// The last lines of its log.
        log_tail: String,
    },
    /// The runtime asks for gVisor and this host's dockerd does not offer it.
    #[error(
        "Runtime '{alias}' has isolation gvisor, and this host's dockerd offers no OCI runtime '{oci_runtime}' (SANDBOXD_GVISOR_RUNTIME): give dockerd the runtime (its \"runtimes\" setting, runsc on the node) or open the session on a host that has it"
    )]
    IsolationUnavailable {
        /// The runtime.
        alias: String,
        /// The OCI runtime gVisor is in Docker's configuration.
        oci_runtime: String,
    },
    /// A catalog that is not valid, with every error.
    #[error(transparent)]
    InvalidCatalog(#[from] sandboxd_catalog::CatalogErrors),
}

/// Build attempts of a runtime at start (the first and two retries).
pub const START_ATTEMPTS: u32 = 3;
/// Build attempts of `sandboxd prepare`.
pub const PREPARE_ATTEMPTS: u32 = 3;
/// How long after a failed build an open may set off a new one (built on demand).
pub const ON_DEMAND_RETRY: Duration = Duration::from_secs(60);
/// Lines of a build log kept as its tail.
pub const LOG_TAIL_LINES: usize = 20;
/// The virtualenv of a built runtime, owned by the sandbox user.
pub const VENV: &str = "/opt/venv";
/// The home folder of the sandbox account in a built runtime.
pub const HOME: &str = "/home/sandbox";
/// Label on every image sandboxd builds: the alias it was built for.
pub const LABEL_RUNTIME: &str = "sandboxd.dev/runtime";
/// The repository of built runtime images; the tag is derived from the definition.
pub const REPOSITORY: &str = "sandboxd-runtime";

/// Where a runtime's image is.
/// The API shows it as [`sandboxd_api::BuildState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BuildState {
    /// Not there yet; a build (or pull) is queued or waits for its next attempt.
    Pending,
    /// Being built (or pulled) now.
    Building,
    /// The image is on this host; sessions open on it.
    Ready,
    /// Every attempt failed; opens answer with the build's error.
    Failed,
}

impl From<BuildState> for sandboxd_api::BuildState {
    fn from(state: BuildState) -> Self {
        match state {
            BuildState::Pending => Self::Pending,
            BuildState::Building => Self::Building,
            BuildState::Ready => Self::Ready,
            BuildState::Failed => Self::Failed,
        }
    }
}

#[derive(Debug, Clone)]
struct Status {
    tag: String,
    state: BuildState,
    attempts: u32,
    last_error: Option<String>,
    log_tail: Option<String>,
    failed_at: Option<Instant>,
}

impl Status {
    fn new(tag: String, ready: bool) -> Self {
        Self {
            tag,
            state: if ready {
                BuildState::Ready
            } else {
                BuildState::Pending
            },
            attempts: 0,
            last_error: None,
            log_tail: None,
            failed_at: None,
        }
    }
}

struct Inner {
    allowlist: Allowlist,
    status: HashMap<String, Status>,
    queued: HashSet<String>,
}

struct Job {
    alias: String,
    attempts: u32,
}

/// The allowlist of a running sandboxd and the state of each runtime's image.
pub struct Runtimes {
    engine: Engine,
    build: BuildSettings,
    backoff: Duration,
    inner: Mutex<Inner>,
    queue: mpsc::UnboundedSender<Job>,
}

impl std::fmt::Debug for Runtimes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtimes").finish_non_exhaustive()
    }
}

impl Runtimes {
    /// Takes the allowlist: runtimes whose image is here are ready at once; the others are
    /// queued for the background builder (prewarm), [`START_ATTEMPTS`] attempts each.
    pub async fn start(
        engine: Engine,
        build: BuildSettings,
        backoff: Duration,
        allowlist: Allowlist,
    ) -> Arc<Self> {
        let (tx, rx) = mpsc::unbounded_channel();
        let this = Arc::new(Self {
            engine,
            build,
            backoff,
            inner: Mutex::new(Inner {
                allowlist: Allowlist {
                    entries: vec![],
                    catalog: false,
                },
                status: HashMap::new(),
                queued: HashSet::new(),
            }),
            queue: tx,
        });
        this.replace(allowlist).await;
        tokio::spawn(Self::worker(Arc::downgrade(&this), rx));
        this
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Replaces the allowlist. A runtime whose definition (tag) is unchanged keeps its state;
    /// the others are ready when their image is here, else queued for a build.
    pub async fn replace(&self, allowlist: Allowlist) {
        let mut present = HashMap::new();
        for entry in &allowlist.entries {
            let t = tag(entry, &self.build);
            let here = self.engine.has_image(&t).await.unwrap_or(false);
            present.insert(entry.alias.clone(), (t, here));
        }
        let mut to_queue = Vec::new();
        {
            let mut inner = self.lock();
            let mut status = HashMap::new();
            for entry in &allowlist.entries {
                let (t, here) = present.remove(&entry.alias).unwrap_or_default();
                let s = match inner.status.remove(&entry.alias) {
                    Some(old) if old.tag == t && (old.state != BuildState::Ready || here) => old,
                    _ => Status::new(t, here),
                };
                if s.state == BuildState::Pending && !inner.queued.contains(&entry.alias) {
                    to_queue.push(entry.alias.clone());
                }
                status.insert(entry.alias.clone(), s);
            }
            inner.status = status;
            inner.allowlist = allowlist;
            for alias in &to_queue {
                inner.queued.insert(alias.clone());
            }
        }
        for alias in to_queue {
            let _ = self.queue.send(Job {
                alias,
                attempts: START_ATTEMPTS,
            });
        }
    }

    async fn worker(this: std::sync::Weak<Self>, mut rx: mpsc::UnboundedReceiver<Job>) {
        while let Some(job) = rx.recv().await {
            let Some(this) = this.upgrade() else { return };
            this.build_job(job).await;
        }
    }

    async fn build_job(&self, job: Job) {
        for attempt in 1..=job.attempts {
            let entry = {
                let mut inner = self.lock();
                let Some(entry) = inner
                    .allowlist
                    .entries
                    .iter()
                    .find(|e| e.alias == job.alias)
                    .cloned()
                else {
                    inner.queued.remove(&job.alias);
                    return;
                };
                let Some(s) = inner.status.get_mut(&job.alias) else {
                    inner.queued.remove(&job.alias);
                    return;
                };
                if s.state == BuildState::Ready {
                    inner.queued.remove(&job.alias);
                    return;
                }
                s.state = BuildState::Building;
                s.attempts += 1;
                entry
            };
            let wanted = tag(&entry, &self.build);
            info!(runtime = %entry.alias, attempt, tag = %wanted, "building runtime");
            let started = Instant::now();
            let result = build_once(&self.engine, &entry, &self.build).await;
            let last = attempt == job.attempts;
            {
                let mut inner = self.lock();
                let Some(s) = inner.status.get_mut(&job.alias).filter(|s| s.tag == wanted) else {
                    // The definition changed while it built; the new one has its own job.
                    inner.queued.remove(&job.alias);
                    return;
                };
                match &result {
                    Ok(()) => {
                        s.state = BuildState::Ready;
                        s.last_error = None;
                        s.log_tail = None;
                        s.failed_at = None;
                        info!(runtime = %job.alias, tag = %wanted, seconds = started.elapsed().as_secs_f64(), "runtime ready");
                    }
                    Err(e) => {
                        s.state = if last {
                            BuildState::Failed
                        } else {
                            BuildState::Pending
                        };
                        s.last_error = Some(e.message.clone());
                        s.log_tail = Some(e.log_tail.clone());
                        s.failed_at = Some(Instant::now());
                        warn!(runtime = %job.alias, attempt, error = %e.message, "runtime build failed");
                    }
                }
                if result.is_ok() || last {
                    inner.queued.remove(&job.alias);
                }
            }
            if result.is_ok() {
                return;
            }
            if !last {
                tokio::time::sleep(self.backoff * 2u32.pow(attempt - 1)).await;
            }
        }
    }

    /// The allowlist and each runtime's state.
    pub fn list(&self) -> RuntimeList {
        let inner = self.lock();
        let catalog = inner.allowlist.catalog;
        RuntimeList {
            isolation: Vec::new(),
            catalog,
            runtimes: inner
                .allowlist
                .entries
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    let s = inner
                        .status
                        .get(&e.alias)
                        .cloned()
                        .unwrap_or_else(|| Status::new(tag(e, &self.build), false));
                    RuntimeStatus {
                        alias: e.alias.clone(),
                        description: e.description.clone(),
                        default: i == 0,
                        kind: if e.base_image.is_some() {
                            RuntimeKind::Build
                        } else {
                            RuntimeKind::Image
                        },
                        source_image: e
                            .base_image
                            .clone()
                            .or_else(|| e.image.clone())
                            .unwrap_or_default(),
                        tag: s.tag,
                        state: s.state.into(),
                        attempts: s.attempts,
                        last_error: s.last_error,
                        log_tail: s.log_tail,
                        needs_network: e.needs_network,
                        egress: Some(Egress::effective(e.needs_network, e.egress.as_ref())),
                        isolation: e.isolation,
                        mem_limit: e.mem_limit.clone(),
                        warm_pool: sandboxd_api::runtimes::WarmPool {
                            size: e.warm_pool,
                            ready: 0,
                        },
                        briefing: catalog.then(|| briefing(e)),
                    }
                })
                .collect(),
        }
    }

    /// The aliases allowed, in order.
    pub fn aliases(&self) -> Vec<String> {
        self.lock()
            .allowlist
            .entries
            .iter()
            .map(|e| e.alias.clone())
            .collect()
    }

    fn image_of(&self, entry: &CatalogEntry, tag: String) -> RuntimeImage {
        let mut env = entry.env_vars.clone();
        if entry.base_image.is_some() {
            env.insert("HOME".to_owned(), HOME.to_owned());
        }
        let egress = Egress::effective(entry.needs_network, entry.egress.as_ref());
        RuntimeImage {
            alias: entry.alias.clone(),
            image: tag,
            needs_network: egress.mode == EgressMode::Open,
            egress,
            isolation: entry.isolation,
            mem_limit: entry.mem_limit.clone(),
            workspace_size: entry.workspace_size.clone(),
            env,
        }
    }

    /// Each runtime's warm pool size, with what its sessions run when its image is ready.
    pub fn warm_pools(&self) -> Vec<(String, u32, Option<RuntimeImage>)> {
        let inner = self.lock();
        inner
            .allowlist
            .entries
            .iter()
            .map(|e| {
                let image = inner
                    .status
                    .get(&e.alias)
                    .filter(|s| s.state == BuildState::Ready)
                    .map(|s| self.image_of(e, s.tag.clone()));
                (e.alias.clone(), e.warm_pool, image)
            })
            .collect()
    }

    /// The egress policy of runtime `alias` now (its `egress`, or what `needs_network` means);
    /// `None` when it is not allowlisted.
    pub fn egress_of(&self, alias: &str) -> Option<Egress> {
        let inner = self.lock();
        let entry = inner.allowlist.entries.iter().find(|e| e.alias == alias)?;
        Some(Egress::effective(
            entry.needs_network,
            entry.egress.as_ref(),
        ))
    }

    /// Whether any runtime allowlisted now has the mode `allowlist` (its sandboxes need the
    /// egress network).
    pub fn any_allowlist(&self) -> bool {
        self.lock().allowlist.entries.iter().any(|e| {
            Egress::effective(e.needs_network, e.egress.as_ref()).mode == EgressMode::Allowlist
        })
    }

    /// The image runtime `alias` names on this host now, whatever its build state; `None` when
    /// it is not allowlisted.
    pub fn current_image(&self, alias: &str) -> Option<String> {
        self.lock().status.get(alias).map(|s| s.tag.clone())
    }

    /// The runtime a ready session of `alias` runs, if it is allowlisted and ready.
    pub fn ready(&self, alias: &str) -> Option<RuntimeImage> {
        let inner = self.lock();
        let entry = inner.allowlist.entries.iter().find(|e| e.alias == alias)?;
        let s = inner.status.get(alias)?;
        (s.state == BuildState::Ready).then(|| self.image_of(entry, s.tag.clone()))
    }

    /// The runtime to open a session on: `alias`, or the default when absent.
    /// [`RuntimeError::Unknown`] when it is not allowed; [`RuntimeError::Preparing`] while its
    /// image is built; [`RuntimeError::Failed`] with the build's error after every attempt
    /// failed (and a new attempt queued, at most every [`ON_DEMAND_RETRY`]).
    pub fn resolve(&self, alias: Option<&str>) -> Result<RuntimeImage, RuntimeError> {
        let mut inner = self.lock();
        let entry = match alias.filter(|a| !a.is_empty()) {
            None => inner
                .allowlist
                .entries
                .first()
                .cloned()
                .ok_or(RuntimeError::NoneAllowlisted)?,
            Some(a) => match inner.allowlist.entries.iter().find(|e| e.alias == a) {
                Some(e) => e.clone(),
                None => {
                    return Err(RuntimeError::Unknown {
                        alias: a.to_owned(),
                        allowed: inner
                            .allowlist
                            .entries
                            .iter()
                            .map(|e| e.alias.clone())
                            .collect(),
                    });
                }
            },
        };
        let alias = entry.alias.clone();
        let Some(s) = inner.status.get(&alias).cloned() else {
            return Err(RuntimeError::NoState { alias });
        };
        match s.state {
            BuildState::Ready => Ok(self.image_of(&entry, s.tag)),
            BuildState::Pending | BuildState::Building => Err(RuntimeError::Preparing {
                alias,
                tag: s.tag,
                attempt: s.attempts.max(1),
            }),
            BuildState::Failed => {
                if s.failed_at.is_none_or(|t| t.elapsed() >= ON_DEMAND_RETRY)
                    && inner.queued.insert(alias.clone())
                {
                    if let Some(st) = inner.status.get_mut(&alias) {
                        st.failed_at = Some(Instant::now());
                    }
                    let _ = self.queue.send(Job {
                        alias: alias.clone(),
                        attempts: 1,
                    });
                }
                Err(RuntimeError::Failed {
                    alias,
                    attempts: s.attempts,
                    error: s.last_error.unwrap_or_default(),
                    log_tail: s.log_tail.unwrap_or_default(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtimes_compact_form() {
        let r = parse_runtimes("base=debian:12, py = python:3.12-slim").expect("valid");
        assert_eq!(
            r.iter()
                .map(|r| (r.alias.as_str(), r.image.as_str()))
                .collect::<Vec<_>>(),
            [("base", "debian:12"), ("py", "python:3.12-slim")]
        );
        for (bad, want) in [
            ("", "lists no runtime"),
            ("base", "'base' is not alias=image"),
            ("Base=x", "alias 'Base' must match"),
            ("a=", "alias 'a' names no image"),
            ("a=x,a=y", "alias 'a' is listed twice"),
        ] {
            let err = parse_runtimes(bad).expect_err(bad).to_string();
            assert!(err.contains(want), "{bad:?}: {err}");
        }
    }

    fn entry(json: &str) -> CatalogEntry {
        sandboxd_catalog::parse(&format!("[{json}]"))
            .expect("valid")
            .remove(0)
    }

    #[test]
    fn dockerfile_of_a_built_runtime() {
        let e = entry(
            r#"{"alias": "py", "base_image": "debian:12", "setup_commands": ["apt-get update"], "packages": ["six", "it's"], "env_vars": {"A": "x \"$y\""}}"#,
        );
        assert_eq!(
            dockerfile(&e, &BuildSettings::uid(10001)).expect("built"),
            r#"# sandboxd runtime 'py'
FROM debian:12
USER root
RUN ["/bin/sh","-c","id -u sandbox >/dev/null 2>&1 || useradd --uid 10001 --user-group --create-home --home-dir /home/sandbox --shell /bin/sh sandbox"]
RUN ["/bin/sh","-c","apt-get update"]
RUN ["/bin/sh","-c","python3 -m venv /opt/venv && /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check 'six' 'it'\\''s' && chown -R 10001:10001 /opt/venv"]
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH
ENV HOME=/home/sandbox
ENV A="x \"\$y\""
LABEL sandboxd.dev/runtime="py"
"#
        );
        assert_eq!(
            dockerfile(
                &entry(r#"{"alias": "i", "image": "busybox"}"#),
                &BuildSettings::uid(10001)
            ),
            None
        );
    }

    #[test]
    fn tag_follows_the_definition() {
        let a = entry(r#"{"alias": "py", "base_image": "debian:12", "packages": ["six"]}"#);
        let b =
            entry(r#"{"alias": "py", "base_image": "debian:12", "packages": ["six", "attrs"]}"#);
        let ta = tag(&a, &BuildSettings::uid(10001));
        assert!(
            ta.starts_with("sandboxd-runtime/py:") && ta.len() == "sandboxd-runtime/py:".len() + 16,
            "{ta}"
        );
        assert_eq!(
            ta,
            tag(&a.clone(), &BuildSettings::uid(10001)),
            "unchanged definition, same tag"
        );
        assert_ne!(
            ta,
            tag(&b, &BuildSettings::uid(10001)),
            "changed packages, new tag"
        );
        assert_ne!(
            ta,
            tag(&a, &BuildSettings::uid(10002)),
            "another uid, new tag"
        );
        let with_ca = BuildSettings {
            uid: 10001,
            ca: Some(b"PEM".to_vec()),
        };
        assert_ne!(ta, tag(&a, &with_ca), "a CA bundle, new tag");
        let f = dockerfile(&a, &with_ca).expect("built");
        assert!(f.contains("COPY build-ca.pem /etc/ssl/certs/sandboxd-build-ca.pem\nENV PIP_CERT=/etc/ssl/certs/sandboxd-build-ca.pem SSL_CERT_FILE=/etc/ssl/certs/sandboxd-build-ca.pem REQUESTS_CA_BUNDLE=/etc/ssl/certs/sandboxd-build-ca.pem\n"), "{f}");
        assert_eq!(
            tag(
                &entry(r#"{"alias": "i", "image": "busybox:1"}"#),
                &BuildSettings::uid(1)
            ),
            "busybox:1"
        );
    }

    #[test]
    fn allowlist_takes_both_forms() {
        let compact = Allowlist::parse("base=img:1, alt=img:2").expect("compact");
        assert!(!compact.catalog);
        assert_eq!(compact.entries[1].image.as_deref(), Some("img:2"));
        let json = Allowlist::parse(sandboxd_catalog::SHIPPED).expect("catalog");
        assert!(json.catalog);
        assert_eq!(json.entries[0].alias, "workbench");
        let err = Allowlist::parse(r#"[{"alias": "X", "image": "a", "packages": ["p"]}]"#)
            .expect_err("invalid");
        assert_eq!(
            err.to_string(),
            "the runtime catalog is invalid (2 errors):\n  - entry 1 (X): alias: 'X' must match [a-z][a-z0-9-]* (a lowercase letter, then lowercase letters, digits or '-')\n  - entry 1 (X): packages: is allowed only with base_image: an image entry installs nothing"
        );
    }

    #[test]
    fn tar_context_is_a_valid_archive() {
        let t = tar(&[("Dockerfile", b"FROM scratch\n")]);
        assert_eq!(t.len(), 512 + 512 + 1024);
        assert_eq!(&t[512..525], b"FROM scratch\n");
        let stored: u32 = u32::from_str_radix(std::str::from_utf8(&t[148..154]).expect("utf8"), 8)
            .expect("octal");
        let mut h = t[..512].to_vec();
        h[148..156].copy_from_slice(b"        ");
        assert_eq!(stored, h.iter().map(|b| u32::from(*b)).sum::<u32>());
    }
}

//! What every reconcile shares: the client, events, metrics, sandboxd clients,
//! per-object failure counts (kube-runtime has no per-object backoff), and the configuration.
//!
//! Over 600 lines: what every reconcile shares is one struct and its small accessors; split, each piece would be handed to every step anyway.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::events::v1::Event as KubeEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::{EventType, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client, Resource, ResourceExt};
use sandboxd_api::client::{Client as HostClient, ClientError, Trust};
use sandboxd_crds::v1alpha1::SandboxHost;
use sandboxd_crds::v1alpha1::host::SecretKeyRef;
use tracing::warn;

use crate::config::Config;
use crate::metrics::{ControllerLabel, FailureLabel, Metrics};
use crate::trust::HostCa;

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
    /// A stable PascalCase label: metric label and Warning event reason.
    pub fn label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "KubeError",
            Error::Host { .. } => "HostError",
            Error::Token { .. } => "TokenUnreadable",
            Error::TokenSecretRefused { .. } => "TokenSecretRefused",
            Error::TombstonesLeft { .. } => "TombstonesLeft",
            Error::Finalizer(_) => "FinalizerError",
            Error::Ca { .. } => "CaUnusable",
            Error::Signer { .. } => "SignerCaUnusable",
        }
    }
}

/// How long a reconcile waits for the watch to bring the status this replica wrote at an open.
pub const CACHE_CATCH_UP_LIMIT: Duration = Duration::from_secs(30);

/// What the reconcilers share.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// The configuration.
    pub config: Config,
    /// Who publishes the events (`reportingController`, `reportingInstance`).
    reporter: Reporter,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Label selector of the objects this operator handles.
    pub labels: BTreeMap<String, String>,
    /// The operator's own namespace: the only one it reads Secrets in.
    pub namespace: String,
    failures: Mutex<HashMap<String, u32>>,
    cpu: Mutex<HashMap<String, (u64, Instant)>>,
    token_seen: Mutex<HashMap<String, Instant>>,
    /// Refusals in a row of the open of a session (key -> count), until it opens.
    waits: Mutex<HashMap<String, u32>>,
    /// Sessions this replica opened and wrote the status of, until its cache shows that status:
    /// key -> the object's uid and when.
    opened_unseen: Mutex<HashMap<String, (String, Instant)>>,
    phases: Mutex<HashMap<String, String>>,
    pending_tombstones: Mutex<std::collections::HashSet<String>>,
    host_clients: Mutex<HashMap<String, CachedClient>>,
    /// One lock per host, held while its admin token is read for a missing or stale client.
    host_reads: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Hosts already warned about for a plain http:// endpoint.
    plain_http_warned: Mutex<std::collections::HashSet<String>>,
    /// The node token hashes written to the ConfigMap: node -> (hash, when).
    node_hashes: Mutex<HashMap<String, (String, Instant)>>,
    /// Caches of the watched kinds, filled by reflectors (reads cost no API request).
    pub caches: std::sync::OnceLock<Caches>,
    /// The session controller's own store (sessions are not cached twice).
    pub sessions: std::sync::OnceLock<
        kube::runtime::reflector::Store<sandboxd_crds::v1alpha1::SandboxSession>,
    >,
    /// The session controller's cache of namespaces (metadata only).
    pub namespaces: std::sync::OnceLock<crate::session::orphan::Namespaces>,
    /// The sessions the session cache shows placed on each host (set while the controller
    /// runs).
    pub placements: Mutex<crate::session::placements::Placements>,
}

/// A sandboxd client kept between reconciles: its connections are reused, and the admin
/// token is read again only after [`TOKEN_REFRESH`] or when the host's spec changes.
struct CachedClient {
    endpoint: String,
    secret: SecretKeyRef,
    node: Option<String>,
    token: String,
    client: HostClient,
    fetched: Instant,
    /// The CA the client trusts (None: the system's roots).
    ca: Option<HostCa>,
}

impl CachedClient {
    /// Whether it was made for the host's current endpoint, token Secret and node.
    fn serves(&self, host: &SandboxHost) -> bool {
        self.endpoint == host.spec.endpoint
            && self.secret == host.spec.admin_token_secret
            && self.node == host.spec.node
    }
}

/// How long an admin token read from its Secret is used before it is read again.
const TOKEN_REFRESH: Duration = Duration::from_secs(60);

/// Reflector stores of the kinds reconciles read often.
#[derive(Clone)]
pub struct Caches {
    /// SandboxHosts.
    pub hosts: kube::runtime::reflector::Store<SandboxHost>,
    /// Runtimes.
    pub runtimes: kube::runtime::reflector::Store<sandboxd_crds::v1alpha1::Runtime>,
    /// Tombstones: an open looks in them for a destroy still owed under its id.
    pub tombstones: kube::runtime::reflector::Store<sandboxd_crds::v1alpha1::Tombstone>,
}

/// Parses `k=v,k2=v2`.
pub fn parse_selector(s: &str) -> BTreeMap<String, String> {
    s.split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

impl Context {
    /// A context for `client` and `config`.
    pub fn new(client: Client, config: Config, metrics: Arc<Metrics>) -> Self {
        let reporter = Reporter {
            controller: "sandbox-operator".into(),
            instance: Some(config.identity()),
        };
        let labels = parse_selector(&config.selector);
        // `run` refuses to start without it; an empty one refuses every admin-token Secret.
        let namespace = config.own_namespace().unwrap_or_default().to_owned();
        Self {
            namespace,
            reporter,
            client,
            config,
            metrics,
            labels,
            failures: Mutex::default(),
            cpu: Mutex::default(),
            token_seen: Mutex::default(),
            waits: Mutex::default(),
            opened_unseen: Mutex::default(),
            phases: Mutex::default(),
            pending_tombstones: Mutex::default(),
            host_clients: Mutex::default(),
            host_reads: Mutex::default(),
            plain_http_warned: Mutex::default(),
            node_hashes: Mutex::default(),
            caches: std::sync::OnceLock::new(),
            sessions: std::sync::OnceLock::new(),
            placements: Mutex::default(),
            namespaces: std::sync::OnceLock::new(),
        }
    }

    /// The watcher configuration of every controller (the label selector, if any).
    pub fn watcher_config(&self) -> kube::runtime::watcher::Config {
        let mut c = kube::runtime::watcher::Config::default();
        if !self.config.selector.is_empty() {
            c = c.labels(&self.config.selector);
        }
        c
    }

    /// The controllers' settings: at most `concurrency` reconciles in flight.
    pub fn controller_config(&self) -> kube::runtime::controller::Config {
        kube::runtime::controller::Config::default().concurrency(self.config.concurrency)
    }

    /// List parameters with the selector.
    pub fn list_params(&self) -> kube::api::ListParams {
        let mut p = kube::api::ListParams::default();
        if !self.config.selector.is_empty() {
            p = p.labels(&self.config.selector);
        }
        p
    }

    /// A sandboxd client for `host`, with its admin token. Clients are kept per host, so a
    /// reconcile costs no Secret read and no new connection; the token is read again after
    /// [`TOKEN_REFRESH`], when the host's spec changes, and on every probe.
    ///
    /// The reconciles that find no kept client at the same time (the first ones after a start,
    /// up to `--concurrency` of them) wait for one read of the Secret and take its client.
    pub async fn host_client(&self, host: &SandboxHost) -> Result<HostClient, Error> {
        if let Some(c) = self.kept_host_client(host) {
            return Ok(c);
        }
        let lock = self
            .host_reads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(host.name_any())
            .or_default()
            .clone();
        let _one_read = lock.lock().await;
        match self.kept_host_client(host) {
            Some(c) => Ok(c),
            None => self.refresh_host_client(host).await,
        }
    }

    /// The kept client of `host`, if it serves the host's spec and its token is fresh.
    fn kept_host_client(&self, host: &SandboxHost) -> Option<HostClient> {
        self.host_clients
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&host.name_any())
            .filter(|c| c.serves(host) && c.fetched.elapsed() < TOKEN_REFRESH)
            .map(|c| c.client.clone())
    }

    /// Reads the admin token of `host` now: the master from its Secret, or, when the host names
    /// its node, the token derived for that node (which opens no other node). The kept client
    /// (and its connections) stays when the token did not change. A Secret outside the
    /// operator's namespace is refused before any read: whoever may write a SandboxHost must not
    /// make the operator read a Secret of their choosing and send it to an endpoint of their
    /// choosing.
    pub async fn refresh_host_client(&self, host: &SandboxHost) -> Result<HostClient, Error> {
        let r = &host.spec.admin_token_secret;
        let name = host.name_any();
        if r.namespace != self.namespace {
            self.forget_host_client(&name);
            return Err(Error::TokenSecretRefused {
                host: name,
                secret_namespace: r.namespace.clone(),
                secret_name: r.name.clone(),
                namespace: self.namespace.clone(),
            });
        }
        let secret = Api::<Secret>::namespaced(self.client.clone(), &r.namespace)
            .get_opt(&r.name)
            .await?
            .ok_or_else(|| Error::Token {
                host: name.clone(),
                why: format!("Secret {}/{} does not exist", r.namespace, r.name),
            })?;
        let token = secret
            .data
            .as_ref()
            .and_then(|d| d.get(&r.key))
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
            .ok_or_else(|| Error::Token {
                host: name.clone(),
                why: format!("Secret {}/{} has no key {}", r.namespace, r.name, r.key),
            })?;
        let token = match &host.spec.node {
            Some(node) => {
                let token = sandboxd_api::auth::node_token(token.trim(), node);
                self.keep_node_token_hash(host, node, &token).await;
                token
            }
            None => token.trim().to_owned(),
        };
        let token = token.as_str();
        let ca = crate::trust::host_ca(
            &self.client,
            Some(&self.namespace),
            self.config.host_ca_file.as_deref(),
            host,
        )
        .await
        .map_err(|e| Error::Ca {
            host: name.clone(),
            why: e.to_string(),
        })?;
        self.warn_plain_http(host);
        let mut clients = self.host_clients.lock().unwrap_or_else(|p| p.into_inner());
        let client = match clients.get(&name) {
            Some(c) if c.serves(host) && c.token == token && c.ca == ca => c.client.clone(),
            _ => {
                let trust = match &ca {
                    Some(ca) => Trust::ca(Some(&ca.pem), &ca.origin),
                    None => Ok(Trust::system()),
                }
                .map_err(|e| Error::Ca {
                    host: name.clone(),
                    why: e.to_string(),
                })?;
                HostClient::with_trust(&host.spec.endpoint, token, &trust)
                    .with_deadline(Duration::from_secs(self.config.host_request_seconds.max(1)))
            }
        };
        clients.insert(
            name,
            CachedClient {
                endpoint: host.spec.endpoint.clone(),
                secret: r.clone(),
                node: host.spec.node.clone(),
                token: token.to_owned(),
                client: client.clone(),
                fetched: Instant::now(),
                ca,
            },
        );
        Ok(client)
    }

    /// Writes the hash of `node`'s token into the node-token-hash ConfigMap, when one is
    /// configured and the host's token comes from the discovery master (--host-token-secret):
    /// then the value under a node's name is a function of the master and that name alone, so
    /// whoever may write a SandboxHost cannot put another value there. Written again after
    /// [`TOKEN_REFRESH`] (a ConfigMap edited or recreated is mended); a failure is logged and
    /// tried again at the next probe (the host then says TokenRefused if its sandboxd lacks it).
    async fn keep_node_token_hash(&self, host: &SandboxHost, node: &str, token: &str) {
        let Some(map) = self.config.node_token_hashes.as_deref() else {
            return;
        };
        let master = crate::discovery::parse_secret(&self.config.host_token_secret);
        if master.as_ref() != Some(&host.spec.admin_token_secret) {
            return;
        }
        let hash = sandboxd_api::auth::hash(token);
        let fresh = self
            .node_hashes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(node)
            .is_some_and(|(h, at)| *h == hash && at.elapsed() < TOKEN_REFRESH);
        if fresh {
            return;
        }
        match self.write_node_token_hash(map, node, &hash).await {
            Ok(()) => {
                self.node_hashes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(node.to_owned(), (hash, Instant::now()));
            }
            Err(e) => {
                warn!(host = %host.name_any(), node, configmap = %map, error = %e, "the hash of the node's admin token could not be written; its sandboxd refuses the token until it is");
            }
        }
    }

    /// Merges `node: hash` into ConfigMap `map` of the operator's namespace, creating it when
    /// it is missing (the chart renders it, and grants no create).
    async fn write_node_token_hash(
        &self,
        map: &str,
        node: &str,
        hash: &str,
    ) -> Result<(), kube::Error> {
        let api = Api::<ConfigMap>::namespaced(self.client.clone(), &self.namespace);
        let patch = serde_json::json!({"data": {node: hash}});
        match api
            .patch(map, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 404 => {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(map.to_owned()),
                        labels: Some(self.labels.clone()),
                        ..Default::default()
                    },
                    data: Some(BTreeMap::from([(node.to_owned(), hash.to_owned())])),
                    ..Default::default()
                };
                api.create(&PostParams::default(), &cm).await.map(|_| ())
            }
            other => other.map(|_| ()),
        }
    }

    /// The CA certificate (PEM) the client of host `name` trusts, if one is configured: what
    /// the platform needs to verify that host too.
    pub fn host_ca(&self, name: &str) -> Option<Vec<u8>> {
        self.host_clients
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .and_then(|c| c.ca.as_ref().map(|ca| ca.pem.clone()))
    }

    /// Warns once per host (and endpoint) whose sandboxd is reached over plain http://.
    fn warn_plain_http(&self, host: &SandboxHost) {
        if !host.spec.endpoint.starts_with("http://") {
            return;
        }
        let key = format!("{} {}", host.name_any(), host.spec.endpoint);
        let first = self
            .plain_http_warned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key);
        if first {
            warn!(host = %host.name_any(), endpoint = %host.spec.endpoint, "host is reached over plain HTTP: its admin token and the session tokens cross the network unencrypted; serve sandboxd with TLS (chart: tls.enabled=true) and give the operator its CA");
        }
    }

    /// Forgets the client of a deleted host.
    pub fn forget_host_client(&self, host: &str) {
        self.host_clients
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(host);
        self.host_reads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(host);
    }

    /// Counts a reconcile and its duration.
    pub fn observe(&self, controller: &str, started: Instant) {
        let label = ControllerLabel {
            controller: controller.to_owned(),
        };
        self.metrics.reconciles.get_or_create(&label).inc();
        self.metrics
            .duration
            .get_or_create(&label)
            .observe(started.elapsed().as_secs_f64());
    }

    /// Records a failure of `key` and returns the delay before its retry.
    pub fn failed(&self, controller: &str, key: &str, error: &Error) -> Duration {
        self.metrics
            .failures
            .get_or_create(&FailureLabel {
                controller: controller.to_owned(),
                error: error.label().to_owned(),
            })
            .inc();
        crate::backoff::failure_delay(bump(&self.failures, key))
    }

    /// Forgets the failures of `key` after a success.
    pub fn succeeded(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// Failures of `key` in a row.
    pub fn failures_of(&self, key: &str) -> u32 {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    /// CPU use of a session since its previous sample, in percent of one core; None on the
    /// first sample or a sample too close to the previous one.
    pub fn cpu_percent(&self, key: &str, cpu_ns: u64) -> Option<f64> {
        let now = Instant::now();
        let mut map = self.cpu.lock().unwrap_or_else(|p| p.into_inner());
        let previous = map.insert(key.to_owned(), (cpu_ns, now));
        let (ns, at) = previous?;
        let wall = now.duration_since(at).as_nanos() as f64;
        (wall >= 1e9).then(|| cpu_ns.saturating_sub(ns) as f64 / wall * 100.0)
    }

    /// Records the phase of a session (None when it is gone) and moves it between the gauge's
    /// phases: a constant cost per reconcile, however many sessions there are.
    pub fn set_phase(&self, key: &str, phase: Option<String>) {
        let mut phases = self.phases.lock().unwrap_or_else(|p| p.into_inner());
        let old = match &phase {
            Some(p) => phases.insert(key.to_owned(), p.clone()),
            None => phases.remove(key),
        };
        if old == phase {
            return;
        }
        if let Some(old) = old {
            self.metrics
                .sessions
                .get_or_create(&crate::metrics::PhaseLabel { phase: old })
                .dec();
        }
        if let Some(new) = phase {
            self.metrics
                .sessions
                .get_or_create(&crate::metrics::PhaseLabel { phase: new })
                .inc();
        }
    }

    /// Records whether a tombstone still waits for its destroy and refreshes the gauge.
    pub fn set_tombstone_pending(&self, key: &str, pending: bool) {
        let mut set = self
            .pending_tombstones
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if pending {
            set.insert(key.to_owned());
        } else {
            set.remove(key);
        }
        self.metrics
            .tombstones_pending
            .set(i64::try_from(set.len()).unwrap_or(i64::MAX));
    }

    /// Records that the token Secret of session `key` was found (or made) now.
    pub fn token_seen(&self, key: &str) {
        self.token_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_owned(), Instant::now());
    }

    /// Whether the token Secret of session `key` was found within `--token-check-seconds`.
    pub fn token_seen_recently(&self, key: &str) -> bool {
        let period = Duration::from_secs(self.config.token_check_seconds);
        self.token_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .is_some_and(|at| at.elapsed() < period)
    }

    /// Forgets when the token Secret of a session was found, and that it was opened.
    pub fn forget_token(&self, key: &str) {
        self.token_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
        self.opened_unseen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// The open of session `key` was refused once more (a cap, no host, a conflict): how long
    /// until it is tried again ([`crate::backoff::wait_delay`]).
    pub fn wait_again(&self, key: &str) -> Duration {
        crate::backoff::wait_delay(bump(&self.waits, key))
    }

    /// Forgets the refusals of session `key` (it opened, or is gone).
    pub fn forget_waits(&self, key: &str) {
        self.waits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// Records that this replica wrote the status of session `key` (object `uid`) as opened.
    pub fn opened(&self, key: &str, uid: &str) {
        self.opened_unseen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_owned(), (uid.to_owned(), Instant::now()));
    }

    /// Whether the copy of session `key` (object `uid`) a reconcile was handed is older than the
    /// status this replica wrote when it opened it: the watch has not brought that write yet.
    /// A copy that shows the session opened ends the wait, and so does [`CACHE_CATCH_UP_LIMIT`]
    /// (someone else may have rewritten the status meanwhile).
    pub fn behind_own_open(&self, key: &str, uid: &str, shows_opened: bool) -> bool {
        let mut unseen = self.opened_unseen.lock().unwrap_or_else(|p| p.into_inner());
        let waiting = !shows_opened
            && unseen
                .get(key)
                .is_some_and(|(u, at)| u == uid && at.elapsed() < CACHE_CATCH_UP_LIMIT);
        if !waiting {
            unseen.remove(key);
        }
        waiting
    }

    /// Forgets the CPU sample of a session.
    pub fn forget_cpu(&self, key: &str) {
        self.cpu
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// Publishes an event on `obj`; a failure to publish is logged, never fatal. Events mark
    /// transitions, so each is created once and nothing is kept: kube's recorder keeps every
    /// event for six minutes to count repeats, which for ten thousand sessions opening is tens
    /// of megabytes spent on repeats that do not happen.
    pub async fn event<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let reference = obj.object_ref(&());
        let now = Timestamp::now();
        let namespace = reference
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let controller = &self.reporter.controller;
        let event = KubeEvent {
            metadata: ObjectMeta {
                name: Some(format!(
                    "{}.{:x}",
                    reference.name.as_deref().unwrap_or(controller),
                    now.as_nanosecond()
                )),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            action: Some(action.to_owned()),
            reason: Some(reason.to_owned()),
            note: Some(truncate(note, 1000)),
            event_time: Some(MicroTime(now)),
            regarding: Some(reference),
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| controller.clone()),
            ),
            type_: Some(
                match type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_owned(),
            ),
            ..Default::default()
        };
        if let Err(e) = Api::<KubeEvent>::namespaced(self.client.clone(), &namespace)
            .create(&PostParams::default(), &event)
            .await
        {
            warn!(error = %e, reason, "could not publish event");
        }
    }
}

/// A key for per-object bookkeeping.
pub fn key<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    ObjectRef::from_obj(obj).to_string()
}

/// Cuts a note to `max` bytes on a character boundary.
pub fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
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

/// Counts one more for `key` in `counts` and returns the count.
fn bump(counts: &Mutex<HashMap<String, u32>>, key: &str) -> u32 {
    let mut c = counts.lock().unwrap_or_else(|p| p.into_inner());
    let n = c.entry(key.to_owned()).or_insert(0);
    *n = n.saturating_add(1);
    *n
}

/// A hash of all a reconcile of objects that write their own status reacts to: everything but
/// that status (the spec through the generation, the finalizers, the annotations, the
/// deletion). Filtering a controller's watch with it keeps each status write from bringing
/// another reconcile.
pub fn not_status<K: kube::Resource>(obj: &K) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let m = obj.meta();
    m.generation.hash(&mut h);
    m.finalizers.hash(&mut h);
    m.annotations.hash(&mut h);
    m.deletion_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .hash(&mut h);
    Some(h.finish())
}

/// Every object of `api` in a cache, and the stream of those whose [`not_status`] changed: the
/// input of a controller of objects that write their own status.
pub fn without_own_status<K>(
    api: kube::Api<K>,
    config: kube::runtime::watcher::Config,
) -> (
    kube::runtime::reflector::Store<K>,
    impl futures::Stream<Item = Result<K, kube::runtime::watcher::Error>>,
)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    use kube::runtime::{WatchStreamExt, reflector, watcher};
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher::watcher(api, config))
        .default_backoff()
        .touched_objects()
        .predicate_filter(not_status, kube::runtime::PredicateConfig::default());
    (store, stream)
}

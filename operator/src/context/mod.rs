//! What every reconcile shares: the client, the configuration, events, metrics and per-object
//! failure counts (kube-runtime has no per-object backoff). Beside it, in modules of their own,
//! the clients of the hosts ([`hosts`]) and the memory of each session between its reconciles
//! ([`sessions`]); the error of a reconcile is [`crate::error`]'s (stackable operator-rs: the
//! error type apart from the context).

mod hosts;
pub mod placements;
mod sessions;

use hosts::CachedClient;
pub use sessions::RollingSlot;

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
use sandboxd_api::client::{Client as HostClient, Trust};
use sandboxd_crds::ca::HostCa;
use sandboxd_crds::v1alpha1::SandboxHost;
use sandboxd_crds::v1alpha1::host::SecretKeyRef;
use tracing::warn;

use crate::config::Config;
use crate::error::Error;
use crate::metrics::{ControllerLabel, FailureLabel, Metrics};

/// How long a reconcile waits at most for the watch to bring a session this replica wrote.
pub const CACHE_CATCH_UP_LIMIT: Duration = Duration::from_secs(30);

/// The namespaces as the operator caches them (metadata only): filled by the session
/// controller's reflector, read when a session may be an orphan.
pub type NamespaceCache = kube::runtime::reflector::Store<
    kube::core::PartialObjectMeta<k8s_openapi::api::core::v1::Namespace>,
>;

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
    /// Sessions this replica wrote, until its cache shows that write: key -> the object's uid,
    /// the resourceVersion the write made, and when.
    written_unseen: Mutex<HashMap<String, (String, String, Instant)>>,
    phases: Mutex<HashMap<String, String>>,
    /// Sessions whose container runs an older image than their Runtime's: key -> runtime.
    outdated: Mutex<HashMap<String, String>>,
    /// The `spec.rebuildGeneration` whose rebuild this replica carried out last, per session:
    /// a reconcile handed a cached copy from before that status write must not rebuild again.
    rebuilt: Mutex<HashMap<String, i64>>,
    /// Rebuilds of running sessions under way per host (rebuildPolicy Rolling).
    rolling: Arc<Mutex<HashMap<String, usize>>>,
    /// The Tombstones waiting for their destroy, with their creation times (Unix seconds).
    pending_tombstones: Mutex<HashMap<String, i64>>,
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
    pub namespaces: std::sync::OnceLock<NamespaceCache>,
    /// The Secrets labelled [`crate::credentials::LABEL`]`=true`, cluster-wide: the only
    /// Secrets cached, and only with `--egress-credentials` (set while the controller runs).
    pub credential_secrets: std::sync::OnceLock<kube::runtime::reflector::Store<Secret>>,
    /// The sessions the session cache shows placed on each host (set while the controller
    /// runs).
    pub placements: Mutex<placements::Placements>,
}

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
            written_unseen: Mutex::default(),
            phases: Mutex::default(),
            outdated: Mutex::default(),
            rebuilt: Mutex::default(),
            rolling: Arc::default(),
            pending_tombstones: Mutex::default(),
            host_clients: Mutex::default(),
            host_reads: Mutex::default(),
            plain_http_warned: Mutex::default(),
            node_hashes: Mutex::default(),
            caches: std::sync::OnceLock::new(),
            sessions: std::sync::OnceLock::new(),
            placements: Mutex::default(),
            namespaces: std::sync::OnceLock::new(),
            credential_secrets: std::sync::OnceLock::new(),
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

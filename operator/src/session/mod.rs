//! The SandboxSession controller: places a session on a host, opens it there (idempotently),
//! keeps its token in a Secret it owns, and follows its life: Running until idle, Sleeping
//! (container stopped, files kept), Reclaimed after the container TTL, Lost when its workspace
//! vanished. Deleting a session writes a Tombstone before the finalizer is released.
//!
//! A reconcile runs the steps in order, each in its module, and stops at the first that has
//! nothing more to do now: [`place`] (the Runtime, a host, the claim), [`open`] (the open on the
//! host and the token Secret), [`egress`] (an open session's egress policies kept current on
//! its host), [`ports`] (its `spec.ports` kept open on its host), [`follow`] (the session's
//! life, decided by a pure function, and through [`credentials`] its egress credentials kept
//! current on its host);
//! [`cleanup`] runs when the object is deleted. Before them, [`orphan`] deletes a session its
//! namespace left behind.
//!
//! Over 600 lines with its tests; the controller's own code is under 480.

mod cleanup;
mod credentials;
mod egress;
pub mod follow;
mod open;
pub mod orphan;
mod place;
pub mod ports;
pub mod rebuild;
mod restore;
pub(crate) mod step;
mod token;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{PartialObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, ObjectRef, reflector};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::{Controller, WatchStreamExt};
use kube::{Api, ResourceExt};
use sandboxd_crds::key::host_session_id;
use sandboxd_crds::v1alpha1::session::SessionPhase;
use sandboxd_crds::v1alpha1::{Runtime, SandboxSession, SandboxSessionStatus};
use serde_json::json;
use tracing::{Instrument as _, info, warn};

use crate::conditions;
use crate::context::placements::{HOST_ANNOTATION, placed_host};
use crate::context::{Context, key};
use crate::error::Error;
#[cfg(test)]
use step::LOST_RECHECK;
pub use step::secret_name;
use step::{Flow, Step, backoff, json_patch, session_api, settle};

/// Field manager of this controller's writes.
pub const MANAGER: &str = "sandbox-operator/sandboxsession";
/// Finalizer that guarantees the destroy.
pub const FINALIZER: &str = "sandboxd.dev/session";
/// Annotation with the W3C trace context of whoever made the session (the SDK sets it): the
/// operator's spans of it, and sandboxd's through the host calls, join that trace.
pub const TRACEPARENT_ANNOTATION: &str = "sandboxd.dev/traceparent";

/// What a session naming a Runtime that does not exist says.
pub fn missing_runtime_message(runtime: &str) -> String {
    format!(
        "Runtime '{runtime}' does not exist: create it (`kubectl get runtimes` lists those there are) and this session opens by itself, or delete the session and name another"
    )
}

/// The sessions a change of Runtime `rt` may unblock: those not yet open that name it (or name
/// none, when it is a default).
fn waiting_on_runtime(
    rt: &Runtime,
    sessions: &[Arc<SandboxSession>],
) -> Vec<ObjectRef<SandboxSession>> {
    let name = rt.name_any();
    sessions
        .iter()
        .filter(|s| {
            s.status
                .as_ref()
                .and_then(|st| st.session_id.as_ref())
                .is_none()
        })
        .filter(|s| s.spec.runtime == name || (rt.spec.default && s.spec.runtime.is_empty()))
        .map(|s| ObjectRef::from_obj(s.as_ref()))
        .collect()
}

/// The open sessions of Runtime `rt` (by the alias they were opened with): a change of its
/// definition or of the image its hosts report may make them drift (`RebuildNeeded`) or due
/// for a rebuild.
fn open_on_runtime(
    rt: &Runtime,
    sessions: &[Arc<SandboxSession>],
) -> Vec<ObjectRef<SandboxSession>> {
    let name = rt.name_any();
    sessions
        .iter()
        .filter(|s| {
            s.status
                .as_ref()
                .is_some_and(|st| st.session_id.is_some() && st.runtime.as_deref() == Some(&name))
        })
        .map(|s| ObjectRef::from_obj(s.as_ref()))
        .collect()
}

/// Whether Runtime `rt`'s definition (its generation) or the images its hosts report changed
/// since it was last seen here; its status writes alone (build attempts, a warm pool) bring no
/// session to a reconcile.
fn definition_changed(
    rt: &Runtime,
    seen: &std::sync::Mutex<std::collections::HashMap<String, String>>,
) -> bool {
    let mut tags: Vec<String> = rt
        .status
        .as_ref()
        .map(|st| {
            st.hosts
                .iter()
                .map(|h| format!("{}={}", h.host, h.image_tag.clone().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    tags.sort();
    let now = format!("{:?} {}", rt.metadata.generation, tags.join(","));
    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
    seen.insert(rt.name_any(), now.clone())
        .is_some_and(|was| was != now)
}

/// Runs the controller until the stream ends.
///
/// Its cache keeps sessions without their managed fields. The only Secrets watched and cached
/// are those labelled `sandboxd.dev/egress-credential=true` (with `--egress-credentials`): a
/// change of one brings the open sessions whose credentials name it to a reconcile, which hands
/// their hosts the new set within seconds. Token Secrets are not watched: one deleted by someone
/// is noticed at its session's next reconcile once `--token-check-seconds` have passed since it
/// was last found ([`open`]).
pub async fn run(ctx: Arc<Context>) {
    let api = Api::<SandboxSession>::all(ctx.client.clone());
    let (sessions, writer) = reflector::store();
    let counted = ctx.clone();
    let session_stream = reflector(
        writer,
        watcher(api, ctx.watcher_config())
            .default_backoff()
            .modify(|s| s.managed_fields_mut().clear()),
    )
    .inspect_ok(move |event| {
        counted
            .placements
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(event);
    })
    .touched_objects();
    let _ = ctx.sessions.set(sessions.clone());
    let waiting = sessions.clone();
    let definitions = std::sync::Mutex::new(std::collections::HashMap::new());
    // Namespaces, metadata only and without the label selector of the sessions: a namespace
    // that goes (or comes again) brings its sessions to a reconcile ([`orphan`]).
    let (namespaces, ns_writer) = reflector::store();
    let ns_stream = reflector(
        ns_writer,
        watcher(
            Api::<PartialObjectMeta<Namespace>>::all(ctx.client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .modify(|n| n.managed_fields_mut().clear()),
    )
    .touched_objects();
    let _ = ctx.namespaces.set(namespaces);
    let in_namespace = sessions.clone();
    let naming_secret = sessions.clone();
    let mut controller = Controller::for_stream(session_stream, sessions)
        .with_config(ctx.controller_config())
        .watches(
            Api::<Runtime>::all(ctx.client.clone()),
            ctx.watcher_config(),
            move |rt| {
                let mut refs = waiting_on_runtime(&rt, &waiting.state());
                if definition_changed(&rt, &definitions) {
                    refs.extend(open_on_runtime(&rt, &waiting.state()));
                }
                refs
            },
        )
        .watches_stream(ns_stream, move |ns| {
            let name = ns.name_any();
            in_namespace
                .state()
                .iter()
                .filter(|s| s.namespace().as_deref() == Some(name.as_str()))
                .map(|s| ObjectRef::from_obj(s.as_ref()))
                .collect::<Vec<_>>()
        });
    if ctx.config.egress_credentials {
        // Egress credentials' Secrets, by their label only: no other Secret is cached. The
        // annotation kubectl apply leaves (a copy of the data) is dropped from the cache.
        let (secrets, secret_writer) = reflector::store();
        let secret_stream = reflector(
            secret_writer,
            watcher(
                Api::<Secret>::all(ctx.client.clone()),
                watcher::Config::default().labels(&crate::credentials::selector()),
            )
            .default_backoff()
            .modify(|s| {
                s.managed_fields_mut().clear();
                s.annotations_mut()
                    .remove("kubectl.kubernetes.io/last-applied-configuration");
            }),
        )
        .touched_objects();
        let _ = ctx.credential_secrets.set(secrets);
        let mapper_ctx = ctx.clone();
        controller = controller.watches_stream(secret_stream, move |secret: Secret| {
            let runtimes = mapper_ctx
                .caches
                .get()
                .map(|c| c.runtimes.state())
                .unwrap_or_default();
            crate::credentials::sessions_referencing(
                &secret.namespace().unwrap_or_default(),
                &secret.name_any(),
                &mapper_ctx.namespace,
                &naming_secret.state(),
                &runtimes,
            )
        });
    }
    controller
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

fn error_policy(s: Arc<SandboxSession>, error: &Error, ctx: Arc<Context>) -> Action {
    warn!(session = %s.name_any(), error = %error, "session reconcile failed");
    Action::requeue(ctx.failed("sandboxsession", &key(s.as_ref()), error))
}

/// One reconcile of a session, in a span of its own that joins the trace named by its
/// [`TRACEPARENT_ANNOTATION`] (set before the span is entered, which starts it).
async fn reconcile(s: Arc<SandboxSession>, ctx: Arc<Context>) -> Result<Action, Error> {
    let span = tracing::info_span!("reconcile", session = %s.name_any(), namespace = s.namespace().unwrap_or_default());
    if let Some(tp) = traceparent(&s) {
        sandboxd_telemetry::parent(&span, tp);
    }
    reconcile_in_span(s, ctx).instrument(span).await
}

/// The session's [`TRACEPARENT_ANNOTATION`], when it is a W3C `traceparent`.
pub(super) fn traceparent(s: &SandboxSession) -> Option<&str> {
    s.annotations()
        .get(TRACEPARENT_ANNOTATION)
        .map(String::as_str)
        .filter(|tp| sandboxd_telemetry::valid(tp))
}

async fn reconcile_in_span(s: Arc<SandboxSession>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = if s.metadata.deletion_timestamp.is_none() {
        match orphan::reap(&s, &ctx).await {
            // Deleted: its delete brings it back for the cleanup.
            Ok(true) => Ok(Action::await_change()),
            Ok(false) => apply(&s, &ctx).await,
            Err(e) => Err(e),
        }
    } else if has_finalizer(&s) {
        match cleanup::cleanup(&s, &ctx).await {
            Ok(action) => release(&s, &ctx).await.map(|()| action),
            Err(e) => Err(e),
        }
    } else {
        Ok(Action::await_change())
    };
    ctx.observe("sandboxsession", started);
    result
}

fn has_finalizer(s: &SandboxSession) -> bool {
    s.finalizers().iter().any(|f| f == FINALIZER)
}

/// Records the placement on `host` and adds the finalizer, in one write and before anything
/// happens on the host: a crash after the open still finds the same host, and a delete
/// still owes the destroy. The write is refused if the session changed since it was read, so
/// a stale copy never places it a second time.
async fn claim(s: &SandboxSession, host: &str, ctx: &Context) -> Result<(), Error> {
    let mut ops = vec![
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": s.resource_version()}),
    ];
    if s.metadata.finalizers.as_ref().is_none_or(|f| f.is_empty()) {
        ops.push(json!({"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}));
    } else if !has_finalizer(s) {
        ops.push(json!({"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}));
    }
    if s.metadata.annotations.is_none() {
        ops.push(
            json!({"op": "add", "path": "/metadata/annotations", "value": {HOST_ANNOTATION: host}}),
        );
    } else {
        ops.push(json!({"op": "add", "path": format!("/metadata/annotations/{}", HOST_ANNOTATION.replace('/', "~1")), "value": host}));
    }
    let claimed = session_api(s, ctx)
        .patch(
            &s.name_any(),
            &PatchParams::default(),
            &json_patch(serde_json::Value::Array(ops))?,
        )
        .await?;
    if let Some(rv) = claimed.resource_version() {
        ctx.wrote(&key(s), &s.uid().unwrap_or_default(), &rv);
    }
    Ok(())
}

/// Removes the finalizer once the destroy is owed by a Tombstone.
async fn release(s: &SandboxSession, ctx: &Context) -> Result<(), Error> {
    let Some(i) = s.finalizers().iter().position(|f| f == FINALIZER) else {
        return Ok(());
    };
    let path = format!("/metadata/finalizers/{i}");
    let patch = json_patch(json!([
        {"op": "test", "path": path, "value": FINALIZER},
        {"op": "remove", "path": path},
    ]))?;
    match session_api(s, ctx)
        .patch(&s.name_any(), &PatchParams::default(), &patch)
        .await
    {
        Ok(_) => Ok(()),
        // Already gone: the finalizer was the last thing holding it.
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// How soon a session whose cached copy is older than this replica's own last write of it is
/// looked at again.
const CACHE_CATCH_UP: Duration = Duration::from_millis(100);

async fn apply(s: &SandboxSession, ctx: &Context) -> Result<Action, Error> {
    let old = s.status.clone().unwrap_or_default();
    // A reconcile queued while a status was being written is handed the copy from before it:
    // acting on that copy would undo the write (open the session again and rotate the token a
    // client may just have read; write a status without the rebuild it records). It waits for
    // the watch to bring the write instead.
    let uid = s.uid().unwrap_or_default();
    if ctx.behind_own_write(&key(s), &uid, &s.resource_version().unwrap_or_default()) {
        return Ok(Action::requeue(CACHE_CATCH_UP));
    }
    let step = settle(
        advance(s, ctx, old.clone()).await?,
        Duration::from_secs(ctx.config.follow_seconds),
    );
    let mut status = step.status;
    status.observed_generation = s.metadata.generation;
    ctx.set_phase(&key(s), status.phase.map(|p| format!("{p:?}")));
    if status_changed(&old, &status) {
        write(s, &status, ctx).await?;
        if old.session_id.is_none() && status.session_id.is_some() {
            ctx.forget_waits(&key(s));
        }
        if old.phase != status.phase
            && let Some(phase) = status.phase
        {
            info!(session = %s.name_any(), ?phase, "session phase");
            let kind = if matches!(phase, SessionPhase::Lost | SessionPhase::Failed) {
                EventType::Warning
            } else {
                EventType::Normal
            };
            ctx.event(
                s,
                kind,
                &format!("{phase:?}"),
                "Reconcile",
                status.message.clone().unwrap_or_default(),
            )
            .await;
        }
    }
    ctx.succeeded(&key(s));
    Ok(Action::requeue(
        step.requeue.max(Duration::from_millis(200)),
    ))
}

fn status_changed(a: &SandboxSessionStatus, b: &SandboxSessionStatus) -> bool {
    let strip = |s: &SandboxSessionStatus| {
        let mut s = s.clone();
        s.conditions.clear();
        s
    };
    strip(a) != strip(b) || !conditions::same(&a.conditions, &b.conditions)
}

async fn write(
    s: &SandboxSession,
    status: &SandboxSessionStatus,
    ctx: &Context,
) -> Result<(), Error> {
    let patch =
        json!({"apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSession", "status": status});
    let written = session_api(s, ctx)
        .patch_status(
            &s.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    if let Some(rv) = written.resource_version() {
        ctx.wrote(&key(s), &s.uid().unwrap_or_default(), &rv);
    }
    Ok(())
}

async fn advance(
    s: &SandboxSession,
    ctx: &Context,
    mut status: SandboxSessionStatus,
) -> Result<Step, Error> {
    // Lost is final: a vanished workspace is reported, never replaced with an empty one; an
    // explicit restore (spec.restore) opens it again from a snapshot, elsewhere.
    if status.phase == Some(SessionPhase::Lost) {
        return restore::lost(s, ctx, status).await;
    }
    // The session's id on its host, and the owner the host binds it to: this object. An id
    // recorded before (a session opened under its bare name) is kept.
    let id = status
        .session_id
        .clone()
        .unwrap_or_else(|| host_session_id(&s.namespace().unwrap_or_default(), &s.name_any()));
    let uid = s.uid();
    // 1. Placement: once placed, a session never moves.
    let placed = match place::place(s, ctx, &mut status)
        .instrument(tracing::info_span!("placement"))
        .await?
    {
        Flow::Next(placed) => placed,
        Flow::Done(requeue) => return Ok(Step { status, requeue }),
    };
    // 2. Open (idempotent by name) until the session exists on the host with a token Secret.
    let opened = match open::open(s, ctx, &mut status, &placed, &id, uid.as_deref()).await? {
        Flow::Next(opened) => opened,
        Flow::Done(requeue) => return Ok(Step { status, requeue }),
    };
    // 2b. Its egress policies, sent again when its spec.egress or its namespace's ceiling
    // changed since its host was last sent them.
    egress::keep_current(s, ctx, &mut status, &placed, &id, uid.as_deref())
        .instrument(tracing::info_span!("egress"))
        .await?;
    // 2c. Its spec.ports, opened (and those dropped from it closed) on its host when they
    // differ from what was applied there.
    ports::keep_current(s, ctx, &mut status, &placed, &id)
        .instrument(tracing::info_span!("ports"))
        .await;
    // 3. Follow the session on the host (just opened: the open answered with it).
    follow::follow(
        s,
        ctx,
        status,
        &placed.client,
        &placed.name,
        placed.runtime.as_ref(),
        &id,
        uid.as_deref(),
        opened,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::follow::{reclaimed_message, sleeps_at};
    use super::open::{owed_destroy, tombstone_wait, waiting_for};
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use k8s_openapi::jiff::Timestamp;
    use sandboxd_crds::v1alpha1::TombstoneStatus;
    use sandboxd_crds::v1alpha1::tombstone::TombstoneSource;
    use sandboxd_crds::v1alpha1::{Tombstone, TombstoneSpec};

    fn step(phase: Option<SessionPhase>, sleeps: Option<Time>, requeue: Duration) -> Step {
        Step {
            status: SandboxSessionStatus {
                phase,
                sleeps_at: sleeps,
                ..Default::default()
            },
            requeue,
        }
    }

    fn tombstone(uid: &str, host: &str, id: &str, status: Option<TombstoneStatus>) -> Tombstone {
        Tombstone {
            metadata: ObjectMeta {
                name: Some(format!("sbx-{uid}")),
                ..Default::default()
            },
            spec: TombstoneSpec {
                host: host.to_owned(),
                session_id: id.to_owned(),
                tenant: "org-1".to_owned(),
                source: TombstoneSource {
                    namespace: "agents".to_owned(),
                    name: "s1".to_owned(),
                    uid: uid.to_owned(),
                },
            },
            status,
        }
    }

    #[test]
    fn sleeps_at_is_whole_seconds_rfc3339_or_absent() {
        let last: Timestamp = "2026-12-03T12:00:00.75Z".parse().expect("a time");
        let at = sleeps_at(last, Duration::from_secs(1800)).expect("a time");
        let text = serde_json::to_value(&at).expect("serializes");
        assert_eq!(text, json!("2026-12-03T12:30:00Z"));
        // What is written reads back as the same time.
        let back: Time = serde_json::from_value(text).expect("parses");
        assert_eq!(back, at);
        // Past what a time can hold: it never sleeps, and nothing is written.
        assert_eq!(sleeps_at(last, Duration::from_secs(u64::MAX)), None);
        assert_eq!(
            sleeps_at(last, Duration::from_secs(400 * 365 * 86400 * 25)),
            None
        );
        // Before 1970 (a host reporting an epoch of its own): absent, never a negative year.
        let ancient: Timestamp = "0001-01-01T00:00:00Z".parse().expect("a time");
        assert_eq!(sleeps_at(ancient, Duration::from_secs(60)), None);
    }

    #[test]
    fn settle_keeps_sleeps_at_only_while_running_and_looks_within_the_probe_period() {
        let at = sleeps_at(Timestamp::now(), Duration::from_secs(1800));
        let probe = Duration::from_secs(60);
        let running = settle(
            step(
                Some(SessionPhase::Running),
                at.clone(),
                Duration::from_secs(1800),
            ),
            probe,
        );
        assert_eq!(running.status.sleeps_at, at);
        assert_eq!(running.requeue, probe);
        for phase in [
            SessionPhase::Sleeping,
            SessionPhase::Reclaimed,
            SessionPhase::Pending,
            SessionPhase::Preparing,
            SessionPhase::Failed,
        ] {
            let s = settle(step(Some(phase), at.clone(), Duration::from_secs(5)), probe);
            assert_eq!(s.status.sleeps_at, None, "{phase:?}");
            assert_eq!(s.requeue, Duration::from_secs(5), "{phase:?}");
        }
        // Lost is final: no sleepsAt, and only the rare recheck.
        let lost = settle(
            step(Some(SessionPhase::Lost), at.clone(), LOST_RECHECK),
            probe,
        );
        assert_eq!(lost.status.sleeps_at, None);
        assert_eq!(lost.requeue, LOST_RECHECK);
        assert_eq!(
            settle(step(None, None, Duration::from_secs(300)), probe).requeue,
            probe
        );
    }

    #[test]
    fn only_another_objects_tombstone_on_the_same_host_and_id_is_waited_for() {
        let ts = vec![
            tombstone("old", "h2", "agents.s1", None),
            tombstone("mine", "h1", "agents.s1", None),
            tombstone("other", "h1", "agents.s2", None),
            tombstone("old", "h1", "agents.s1", None),
        ]
        .into_iter()
        .map(std::sync::Arc::new)
        .collect::<Vec<_>>();
        let found = owed_destroy(&ts, "h1", "agents.s1", Some("mine")).expect("owed");
        assert_eq!(
            (found.spec.host.as_str(), found.spec.source.uid.as_str()),
            ("h1", "old")
        );
        assert!(owed_destroy(&ts, "h3", "agents.s1", Some("mine")).is_none());
        assert!(owed_destroy(&ts[..3], "h1", "agents.s1", Some("mine")).is_none());
    }

    #[test]
    fn the_wait_names_the_tombstone_and_how_its_destroy_fares() {
        let fresh = tombstone("old", "h1", "agents.s1", None);
        assert_eq!(
            waiting_for(&fresh),
            "waiting for Tombstone sbx-old: the sandbox 'agents.s1' of the deleted SandboxSession agents/s1 is still to be destroyed on host h1 (its first attempt is under way); this session opens once it is, so it never gets the old workspace"
        );
        assert_eq!(
            tombstone_wait(&fresh, Duration::from_secs(60)),
            Duration::from_secs(1)
        );
        let next: Timestamp = "2099-01-01T00:00:00Z".parse().expect("a time");
        let failing = tombstone(
            "old",
            "h1",
            "agents.s1",
            Some(TombstoneStatus {
                attempts: 3,
                last_error: Some("connection refused".to_owned()),
                next_attempt_at: Some(Time(next)),
            }),
        );
        assert!(
            waiting_for(&failing).contains(
                "(attempt 3 failed: connection refused; next attempt at 2099-01-01T00:00:00Z)"
            ),
            "{}",
            waiting_for(&failing)
        );
        // Far off: looked at again within the probe period all the same.
        assert_eq!(
            tombstone_wait(&failing, Duration::from_secs(60)),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn a_container_gone_while_running_says_it_was_removed_on_the_host() {
        assert_eq!(
            reclaimed_message(Some(SessionPhase::Running), "h1"),
            "the container was removed on host h1 while the session ran; the workspace is kept, and the next workspace operation recreates the container"
        );
        assert_eq!(
            reclaimed_message(Some(SessionPhase::Sleeping), "h1"),
            "container removed, workspace kept; a workspace operation recreates it"
        );
    }
}

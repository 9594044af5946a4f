//! The SandboxSession controller: places a session on a host, opens it there (idempotently),
//! keeps its token in a Secret it owns, and follows its life: Running until idle, Sleeping
//! (container stopped, files kept), Reclaimed after the container TTL, Lost when its workspace
//! vanished. Deleting a session writes a Tombstone before the finalizer is released.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, ObjectRef, reflector};
use kube::runtime::watcher::watcher;
use kube::runtime::{Controller, WatchStreamExt};
use kube::{Api, Resource, ResourceExt};
use sandboxd_api::client::ClientError;
use sandboxd_api::{ErrorCode, SessionState as State};
use sandboxd_crds::key::host_session_id;
use sandboxd_crds::v1alpha1::condition::{ADMITTED, PLACED, READY, RUNTIME_READY};
use sandboxd_crds::v1alpha1::session::SessionPhase;
use sandboxd_crds::v1alpha1::tombstone::TombstoneSource;
use sandboxd_crds::v1alpha1::{
    Runtime, SandboxHost, SandboxSession, SandboxSessionStatus, Tombstone, TombstoneSpec,
};
use serde_json::json;
use tracing::{info, instrument, warn};

use crate::conditions;
use crate::context::{Context, Error, key};
use crate::placement::{Candidate, place};

/// Field manager of this controller's writes.
pub const MANAGER: &str = "sandbox-operator/sandboxsession";
/// Finalizer that guarantees the destroy.
pub const FINALIZER: &str = "sandboxd.dev/session";
/// Annotation with the host a session is placed on, written with the finalizer before the open.
pub const HOST_ANNOTATION: &str = "sandboxd.dev/host";
/// Condition: the host does not answer (the session is not lost).
pub const HOST_UNREACHABLE: &str = "HostUnreachable";
/// Condition: the workspace is gone.
pub const LOST: &str = "Lost";
/// Condition reason: the open waits for the destroy a deleted object of the same name owes.
pub const WAITING_FOR_TOMBSTONE: &str = "WaitingForTombstone";
/// How often a Lost session is looked at again.
const LOST_RECHECK: Duration = Duration::from_secs(3600);
/// Reason of the RuntimeReady condition of a session whose Runtime does not exist.
pub const RUNTIME_NOT_FOUND: &str = "RuntimeNotFound";

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

/// Runs the controller until the stream ends.
///
/// Its cache keeps sessions without their managed fields. No Secret is watched or cached: the
/// operator may not list or read Secrets outside its own namespace, so a token Secret deleted by
/// someone is noticed at its session's next reconcile once `--token-check-seconds` have passed
/// since it was last found ([`token_secret_exists`]).
pub async fn run(ctx: Arc<Context>) {
    let api = Api::<SandboxSession>::all(ctx.client.clone());
    let (sessions, writer) = reflector::store();
    let session_stream = reflector(
        writer,
        watcher(api, ctx.watcher_config())
            .default_backoff()
            .modify(|s| s.managed_fields_mut().clear()),
    )
    .touched_objects();
    let _ = ctx.sessions.set(sessions.clone());
    let waiting = sessions.clone();
    Controller::for_stream(session_stream, sessions)
        .with_config(ctx.controller_config())
        .watches(
            Api::<Runtime>::all(ctx.client.clone()),
            ctx.watcher_config(),
            move |rt| waiting_on_runtime(&rt, &waiting.state()),
        )
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

/// The label on every token Secret this operator makes.
const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Its value.
const OPERATOR: &str = "sandbox-operator";

fn error_policy(s: Arc<SandboxSession>, error: &Error, ctx: Arc<Context>) -> Action {
    warn!(session = %s.name_any(), error = %error, "session reconcile failed");
    Action::requeue(ctx.failed("sandboxsession", &key(s.as_ref()), error))
}

#[instrument(skip_all, fields(session = %s.name_any(), namespace = s.namespace().unwrap_or_default()))]
async fn reconcile(s: Arc<SandboxSession>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = if s.metadata.deletion_timestamp.is_none() {
        apply(&s, &ctx).await
    } else if has_finalizer(&s) {
        match cleanup(&s, &ctx).await {
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

/// The host a session is placed on: the status's, or the one recorded by [`claim`] before the
/// status says so.
fn placed_host(s: &SandboxSession) -> Option<&str> {
    s.status
        .as_ref()
        .and_then(|st| st.host.as_deref())
        .or_else(|| s.annotations().get(HOST_ANNOTATION).map(String::as_str))
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
    session_api(s, ctx)
        .patch(
            &s.name_any(),
            &PatchParams::default(),
            &json_patch(serde_json::Value::Array(ops))?,
        )
        .await?;
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

/// A JSON patch of the session's metadata from its operations.
fn json_patch(ops: serde_json::Value) -> Result<Patch<()>, Error> {
    let ops: json_patch::Patch =
        serde_json::from_value(ops).map_err(|e| Error::Finalizer(e.to_string()))?;
    Ok(Patch::Json(ops))
}

fn session_api(s: &SandboxSession, ctx: &Context) -> Api<SandboxSession> {
    Api::namespaced(ctx.client.clone(), &s.namespace().unwrap_or_default())
}

fn time(t: Timestamp) -> Time {
    Time(t)
}

fn parse_time(s: &str) -> Option<Timestamp> {
    s.parse().ok()
}

fn add(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_add(SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX))
        .unwrap_or(t)
}

/// How long until `t` (zero when past).
fn until(t: Timestamp) -> Duration {
    let d = t.duration_since(Timestamp::now());
    Duration::try_from(d).unwrap_or(Duration::ZERO)
}

/// The Secret name holding a session's token.
pub fn secret_name(session: &str) -> String {
    format!("{session}-token")
}

struct Step {
    status: SandboxSessionStatus,
    requeue: Duration,
}

async fn apply(s: &SandboxSession, ctx: &Context) -> Result<Action, Error> {
    let old = s.status.clone().unwrap_or_default();
    let step = settle(
        advance(s, ctx, old.clone()).await?,
        Duration::from_secs(ctx.config.follow_seconds),
    );
    let mut status = step.status;
    status.observed_generation = s.metadata.generation;
    ctx.set_phase(&key(s), status.phase.map(|p| format!("{p:?}")));
    if status_changed(&old, &status) {
        write(s, &status, ctx).await?;
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
    session_api(s, ctx)
        .patch_status(
            &s.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    Ok(())
}

fn set_phase(status: &mut SandboxSessionStatus, phase: SessionPhase, message: impl Into<String>) {
    status.phase = Some(phase);
    status.message = Some(message.into());
}

async fn hosts(ctx: &Context) -> Result<Vec<SandboxHost>, Error> {
    if let Some(c) = ctx.caches.get() {
        return Ok(c.hosts.state().iter().map(|h| (**h).clone()).collect());
    }
    Ok(Api::<SandboxHost>::all(ctx.client.clone())
        .list(&ctx.list_params())
        .await?
        .items)
}

/// The runtime alias a session opens with: its own, or the default Runtime's.
async fn resolve_runtime(s: &SandboxSession, ctx: &Context) -> Result<Option<Runtime>, Error> {
    let runtimes: Vec<Runtime> = match ctx.caches.get() {
        Some(c) => c.runtimes.state().iter().map(|r| (**r).clone()).collect(),
        None => {
            Api::<Runtime>::all(ctx.client.clone())
                .list(&ctx.list_params())
                .await?
                .items
        }
    };
    Ok(if s.spec.runtime.is_empty() {
        runtimes.into_iter().find(|r| r.spec.default)
    } else {
        runtimes
            .into_iter()
            .find(|r| r.name_any() == s.spec.runtime)
    })
}

fn runtime_entry(rt: &Runtime) -> sandboxd_catalog::CatalogEntry {
    crate::runtime::entry(rt)
}

async fn advance(
    s: &SandboxSession,
    ctx: &Context,
    mut status: SandboxSessionStatus,
) -> Result<Step, Error> {
    let generation = s.metadata.generation;
    let name = s.name_any();
    // The session's id on its host, and the owner the host binds it to: this object. An id
    // recorded before (a session opened under its bare name) is kept.
    let id = status
        .session_id
        .clone()
        .unwrap_or_else(|| host_session_id(&s.namespace().unwrap_or_default(), &name));
    let uid = s.uid();
    let cfg = &ctx.config;
    let backoff = || crate::backoff::failure_delay(ctx.failures_of(&key(s)).saturating_add(1));

    // Lost is final: a vanished workspace is reported, never replaced with an empty one.
    if status.phase == Some(SessionPhase::Lost) {
        return Ok(Step {
            status,
            requeue: LOST_RECHECK,
        });
    }

    // 1. Placement: once placed, a session never moves.
    let runtime = resolve_runtime(s, ctx).await?;
    // A session naming a Runtime that does not exist says so at once, before it takes a host;
    // it opens by itself when that Runtime is created (the controller watches Runtimes).
    if runtime.is_none() && status.session_id.is_none() && !s.spec.runtime.is_empty() {
        let m = missing_runtime_message(&s.spec.runtime);
        conditions::set(
            &mut status.conditions,
            RUNTIME_READY,
            false,
            RUNTIME_NOT_FOUND,
            &m,
            generation,
        );
        set_phase(&mut status, SessionPhase::Pending, m);
        return Ok(Step {
            status,
            requeue: Duration::from_secs(ctx.config.follow_seconds),
        });
    }
    if conditions::get(&status.conditions, RUNTIME_READY)
        .is_some_and(|c| c.reason == RUNTIME_NOT_FOUND)
    {
        conditions::clear(&mut status.conditions, RUNTIME_READY);
    }
    let alias = runtime
        .as_ref()
        .map(|r| r.name_any())
        .or_else(|| (!s.spec.runtime.is_empty()).then(|| s.spec.runtime.clone()));
    let all_hosts = hosts(ctx).await?;
    let host_name = match placed_host(s) {
        Some(h) => {
            if !has_finalizer(s) {
                claim(s, h, ctx).await?;
            }
            h.to_owned()
        }
        None => {
            // The load of a host is what it reports or what was placed on it since, whichever
            // is higher: placements in quick succession must not all see the same stale count.
            let placed: Vec<Arc<SandboxSession>> = match ctx.sessions.get() {
                Some(store) => store.state(),
                None => Api::<SandboxSession>::all(ctx.client.clone())
                    .list(&ctx.list_params())
                    .await?
                    .items
                    .into_iter()
                    .map(Arc::new)
                    .collect(),
            };
            // One pass, borrowing: placing is linear in the sessions, never quadratic.
            let mut placed_on: std::collections::HashMap<&str, usize> = Default::default();
            for h in placed.iter().filter_map(|p| placed_host(p)) {
                *placed_on.entry(h).or_default() += 1;
            }
            let placed_on = |host: &str| placed_on.get(host).copied().unwrap_or(0);
            let candidates: Vec<Candidate> = all_hosts
                .iter()
                .map(|h| {
                    let st = h.status.clone().unwrap_or_default();
                    let runtime_ready = match (
                        &alias,
                        runtime.as_ref().map(|r| r.spec.base_image.is_some()),
                    ) {
                        (Some(a), Some(true)) => Some(st.runtimes_ready.iter().any(|r| r == a)),
                        _ => None,
                    };
                    Candidate {
                        name: h.name_any(),
                        ready: conditions::is_true(&st.conditions, READY),
                        disabled: h.spec.disabled,
                        sessions: st
                            .sessions
                            .map_or(0, |n| u32::try_from(n).unwrap_or(0))
                            .max(u32::try_from(placed_on(&h.name_any())).unwrap_or(u32::MAX)),
                        max_sessions: st
                            .capacity
                            .map_or(0, |c| u32::try_from(c.max_sessions).unwrap_or(0)),
                        runtime_ready,
                    }
                })
                .collect();
            match place(&candidates, s.spec.host.as_deref()) {
                Ok(h) => {
                    claim(s, &h, ctx).await?;
                    h
                }
                Err(e) => {
                    conditions::set(
                        &mut status.conditions,
                        PLACED,
                        false,
                        "NoHost",
                        &e.to_string(),
                        generation,
                    );
                    set_phase(&mut status, SessionPhase::Pending, e.to_string());
                    return Ok(Step {
                        status,
                        requeue: backoff(),
                    });
                }
            }
        }
    };
    if status.host.is_none() {
        conditions::set(
            &mut status.conditions,
            PLACED,
            true,
            "Placed",
            &format!("placed on host {host_name}"),
            generation,
        );
        status.host = Some(host_name.clone());
    }
    let Some(host) = all_hosts.iter().find(|h| h.name_any() == host_name) else {
        conditions::set(
            &mut status.conditions,
            HOST_UNREACHABLE,
            true,
            "HostMissing",
            &format!("SandboxHost {host_name} does not exist"),
            generation,
        );
        return Ok(Step {
            status,
            requeue: backoff(),
        });
    };
    let client = ctx.host_client(host).await?;
    status.endpoint = Some(host.spec.endpoint.clone());
    if let Some(rt) = &runtime {
        status.briefing = Some(sandboxd_catalog::briefing(&runtime_entry(rt)));
    }

    let follow = Duration::from_secs(cfg.follow_seconds);
    // A deleted object of this name whose destroy on this host is still owed: an open now would
    // race it, so a session never opened waits until its Tombstone is done.
    if status.session_id.is_none() {
        let tombstones = Api::<Tombstone>::all(ctx.client.clone())
            .list(&ctx.list_params())
            .await?
            .items;
        if let Some(t) = owed_destroy(&tombstones, &host_name, &id, uid.as_deref()) {
            let m = waiting_for(t);
            conditions::set(
                &mut status.conditions,
                ADMITTED,
                false,
                WAITING_FOR_TOMBSTONE,
                &m,
                generation,
            );
            set_phase(&mut status, SessionPhase::Pending, m);
            return Ok(Step {
                status,
                requeue: tombstone_wait(t, follow),
            });
        }
    }

    // 2. Open (idempotent by name) until the session exists on the host with a token Secret.
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &s.namespace().unwrap_or_default());
    let secret = secret_name(&name);
    // Recorded, and still there (a token is rotated only when it is gone).
    let have_secret =
        status.credentials_secret.is_some() && token_secret_there(s, ctx, &secrets, &secret).await;
    let mut opened_view = None;
    if status.session_id.is_none() || !have_secret {
        let limits = s.spec.resources.as_ref().map(|r| sandboxd_api::Limits {
            cpus: r.milli_cpus.map(|m| m as f64 / 1000.0),
            mem_limit: r.mem_limit.clone(),
            pids_limit: r.pids_limit,
            workspace_size: r.workspace_size.clone(),
        });
        match client
            .with_deadline(Duration::from_secs(ctx.config.host_open_seconds.max(1)))
            .open_as(
                &id,
                &s.spec.tenant,
                uid.as_deref(),
                alias.as_deref(),
                limits.as_ref(),
            )
            .await
        {
            Ok(opened) => {
                let token = match opened.token {
                    Some(t) => t,
                    // Found, not created (a crash after the open, or the Secret was deleted):
                    // the host gives it a new token; the old one stops working.
                    None => client
                        .rotate_token_as(&id, uid.as_deref())
                        .await
                        .map_err(|e| host_err(&host_name, e))?,
                };
                store_token(
                    s,
                    &secrets,
                    &secret,
                    &token,
                    &host.spec.endpoint,
                    &opened.session.id,
                    ctx.host_ca(&host.name_any()).as_deref(),
                )
                .await?;
                ctx.token_seen(&key(s));
                status.session_id = Some(opened.session.id.clone());
                status.runtime = Some(opened.session.runtime.clone());
                opened_view = Some(opened.session);
                status.credentials_secret = Some(secret.clone());
                conditions::set(
                    &mut status.conditions,
                    ADMITTED,
                    true,
                    "Opened",
                    &format!("opened on host {host_name}"),
                    generation,
                );
                conditions::set(
                    &mut status.conditions,
                    RUNTIME_READY,
                    true,
                    "Ready",
                    "the runtime is built on the host",
                    generation,
                );
                conditions::clear(&mut status.conditions, HOST_UNREACHABLE);
            }
            Err(ClientError::Api {
                code: ErrorCode::RuntimePreparing,
                message,
                ..
            }) => {
                let since = conditions::get(&status.conditions, RUNTIME_READY)
                    .filter(|c| c.status == "False" && c.reason == "Preparing")
                    .map(|c| c.last_transition_time.0)
                    .unwrap_or_else(Timestamp::now);
                if until(add(since, Duration::from_secs(cfg.prepare_seconds))).is_zero() {
                    let m = format!(
                        "the runtime was still not built after {} s: {message}",
                        cfg.prepare_seconds
                    );
                    conditions::set(
                        &mut status.conditions,
                        RUNTIME_READY,
                        false,
                        "PrepareTimedOut",
                        &m,
                        generation,
                    );
                    set_phase(&mut status, SessionPhase::Failed, m);
                    return Ok(Step {
                        status,
                        requeue: Duration::from_secs(60),
                    });
                }
                let m = format!("preparing sandbox: {message}");
                conditions::set(
                    &mut status.conditions,
                    RUNTIME_READY,
                    false,
                    "Preparing",
                    &m,
                    generation,
                );
                set_phase(&mut status, SessionPhase::Preparing, m);
                return Ok(Step {
                    status,
                    requeue: Duration::from_secs(5),
                });
            }
            Err(ClientError::Api {
                status: 429,
                code,
                message,
            }) => {
                let reason = match code {
                    ErrorCode::TenantCap => "TenantCap",
                    _ => "HostCap",
                };
                conditions::set(
                    &mut status.conditions,
                    ADMITTED,
                    false,
                    reason,
                    &message,
                    generation,
                );
                set_phase(&mut status, SessionPhase::Pending, message);
                return Ok(Step {
                    status,
                    requeue: backoff(),
                });
            }
            Err(ClientError::Api {
                code: ErrorCode::OwnerMismatch,
                message,
                ..
            }) => {
                // The id is held for another object: a deleted session of this name whose
                // destroy is still owed (its Tombstone removes it, then this open succeeds).
                let m = format!(
                    "host {host_name} holds session '{id}' for another SandboxSession (one deleted whose destroy is still owed); waiting for it to be destroyed: {message}"
                );
                conditions::set(
                    &mut status.conditions,
                    ADMITTED,
                    false,
                    "OwnerConflict",
                    &m,
                    generation,
                );
                set_phase(&mut status, SessionPhase::Pending, m);
                return Ok(Step {
                    status,
                    requeue: backoff(),
                });
            }
            Err(ClientError::Api {
                code: ErrorCode::RuntimeFailed,
                message,
                ..
            }) => {
                conditions::set(
                    &mut status.conditions,
                    RUNTIME_READY,
                    false,
                    "BuildFailed",
                    &message,
                    generation,
                );
                set_phase(&mut status, SessionPhase::Failed, message);
                return Ok(Step {
                    status,
                    requeue: Duration::from_secs(60),
                });
            }
            Err(e @ (ClientError::Transport { .. } | ClientError::VersionMismatch { .. })) => {
                conditions::set(
                    &mut status.conditions,
                    HOST_UNREACHABLE,
                    true,
                    "Unreachable",
                    &e.to_string(),
                    generation,
                );
                if status.phase.is_none() {
                    set_phase(&mut status, SessionPhase::Pending, e.to_string());
                }
                return Ok(Step {
                    status,
                    requeue: backoff(),
                });
            }
            Err(e) => return Err(host_err(&host_name, e)),
        }
    }

    // 3. Follow the session on the host (just opened: the open answered with it).
    let fetched = match opened_view {
        Some(v) => Ok(v),
        None => client.get(&id).await,
    };
    let view = match fetched {
        Ok(v) => v,
        Err(ClientError::NoSuchSession(_)) => {
            let m = format!(
                "host {host_name} no longer has this session: it was destroyed there, workspace included, not through this object; it is not replaced with an empty one. {}",
                start_over(s)
            );
            return Ok(lost(status, "SessionGone", m, generation));
        }
        Err(e @ (ClientError::Transport { .. } | ClientError::VersionMismatch { .. })) => {
            conditions::set(
                &mut status.conditions,
                HOST_UNREACHABLE,
                true,
                "Unreachable",
                &e.to_string(),
                generation,
            );
            return Ok(Step {
                status,
                requeue: backoff(),
            });
        }
        Err(e) => return Err(host_err(&host_name, e)),
    };
    conditions::clear(&mut status.conditions, HOST_UNREACHABLE);
    // Whole seconds, as a Time is stored: a finer value would differ from the stored one on
    // every reconcile and write the status again for nothing.
    let last = parse_time(&view.last_activity_at).unwrap_or_else(Timestamp::now);
    let last = Timestamp::from_second(last.as_second()).unwrap_or(last);
    status.last_activity_at = Some(time(last));
    let idle = s
        .spec
        .idle_timeout_seconds
        .and_then(|v| u64::try_from(v).ok())
        .map_or(cfg.idle_timeout(), Duration::from_secs);

    if !view.workspace_exists || view.state == State::Lost {
        let m = format!(
            "the workspace of this session vanished on host {host_name}; it is not replaced with an empty one. {}",
            start_over(s)
        );
        conditions::set(&mut status.conditions, READY, false, "Lost", &m, generation);
        return Ok(lost(status, "WorkspaceVanished", m, generation));
    }

    match view.state {
        State::Running => {
            status.sleeps_at = sleeps_at(last, idle);
            // Never: an idle timeout past what a time can hold.
            let sleeps_at = status.sleeps_at.as_ref().map_or(Timestamp::MAX, |t| t.0);
            conditions::set(
                &mut status.conditions,
                READY,
                true,
                "Running",
                "the sandbox runs",
                generation,
            );
            set_phase(
                &mut status,
                SessionPhase::Running,
                format!("running on host {host_name}"),
            );
            if !until(sleeps_at).is_zero() || view.runs_in_flight > 0 {
                ctx.forget_cpu(&key(s));
                let wait = if view.runs_in_flight > 0 {
                    idle.min(follow)
                } else {
                    until(sleeps_at)
                };
                return Ok(Step {
                    status,
                    requeue: wait,
                });
            }
            // Idle by activity; idle by CPU too? Sample it over a window first.
            let window = Duration::from_secs(cfg.cpu_window_seconds);
            match view.cpu_ns.and_then(|ns| ctx.cpu_percent(&key(s), ns)) {
                None => {
                    return Ok(Step {
                        status,
                        requeue: window,
                    });
                }
                Some(p) if p >= cfg.idle_cpu_percent => {
                    // Busy without runs (a server it started): not idle; look again later.
                    ctx.forget_cpu(&key(s));
                    return Ok(Step {
                        status,
                        requeue: idle,
                    });
                }
                Some(_) => {}
            }
            ctx.forget_cpu(&key(s));
            client
                .stop(&id)
                .await
                .map_err(|e| host_err(&host_name, e))?;
            conditions::set(
                &mut status.conditions,
                READY,
                false,
                "Sleeping",
                "idle: the container is stopped, the files stay",
                generation,
            );
            set_phase(
                &mut status,
                SessionPhase::Sleeping,
                format!(
                    "idle for {} s: container stopped, files kept; a workspace operation wakes it",
                    idle.as_secs()
                ),
            );
            status.sleeps_at = None;
            Ok(Step {
                status,
                requeue: follow.min(Duration::from_secs(cfg.container_ttl_seconds)),
            })
        }
        State::Stopped => {
            status.sleeps_at = None;
            let since = conditions::get(&status.conditions, READY)
                .filter(|c| c.status == "False" && c.reason == "Sleeping")
                .map(|c| c.last_transition_time.0)
                .unwrap_or(last);
            conditions::set(
                &mut status.conditions,
                READY,
                false,
                "Sleeping",
                "idle: the container is stopped, the files stay",
                generation,
            );
            if status.phase != Some(SessionPhase::Sleeping) {
                set_phase(
                    &mut status,
                    SessionPhase::Sleeping,
                    "container stopped, files kept; a workspace operation wakes it".to_owned(),
                );
            }
            let reclaim_at = add(since, Duration::from_secs(cfg.container_ttl_seconds));
            if until(reclaim_at).is_zero() {
                client
                    .reclaim(&id)
                    .await
                    .map_err(|e| host_err(&host_name, e))?;
                conditions::set(
                    &mut status.conditions,
                    READY,
                    false,
                    "Reclaimed",
                    "the container was removed after its TTL; the workspace stays",
                    generation,
                );
                set_phase(
                    &mut status,
                    SessionPhase::Reclaimed,
                    format!(
                        "stopped for {} s: container removed, workspace kept",
                        cfg.container_ttl_seconds
                    ),
                );
                return Ok(Step {
                    status,
                    requeue: follow,
                });
            }
            Ok(Step {
                status,
                requeue: until(reclaim_at).min(follow),
            })
        }
        State::Reclaimed => {
            status.sleeps_at = None;
            conditions::set(
                &mut status.conditions,
                READY,
                false,
                "Reclaimed",
                "the container was removed; the workspace stays",
                generation,
            );
            if status.phase != Some(SessionPhase::Reclaimed) {
                let m = reclaimed_message(status.phase, &host_name);
                set_phase(&mut status, SessionPhase::Reclaimed, m);
            }
            if let Some(ttl) = cfg.workspace_ttl_seconds {
                let expires = add(last, Duration::from_secs(ttl));
                if until(expires).is_zero() {
                    client
                        .destroy_as(&id, uid.as_deref())
                        .await
                        .map_err(|e| host_err(&host_name, e))?;
                    let m = format!(
                        "no activity for {ttl} s: the workspace was removed (workspace TTL)"
                    );
                    return Ok(lost(status, "WorkspaceExpired", m, generation));
                }
                return Ok(Step {
                    status,
                    requeue: until(expires).min(follow),
                });
            }
            Ok(Step {
                status,
                requeue: follow,
            })
        }
        State::Opening => {
            set_phase(
                &mut status,
                SessionPhase::Pending,
                format!("opening on host {host_name}"),
            );
            Ok(Step {
                status,
                requeue: Duration::from_secs(1),
            })
        }
        // Handled above, with the workspace check.
        State::Lost => Ok(lost(
            status,
            "WorkspaceVanished",
            format!("host {host_name} reports the session lost"),
            generation,
        )),
        State::Destroying => Ok(Step {
            status,
            requeue: Duration::from_secs(2),
        }),
    }
}

/// The session's workspace is gone: phase Lost with a condition saying why; final, so it is
/// looked at again only rarely.
fn lost(
    mut status: SandboxSessionStatus,
    reason: &str,
    message: String,
    generation: Option<i64>,
) -> Step {
    conditions::set(
        &mut status.conditions,
        LOST,
        true,
        reason,
        &message,
        generation,
    );
    set_phase(&mut status, SessionPhase::Lost, message);
    status.sleeps_at = None;
    Step {
        status,
        requeue: LOST_RECHECK,
    }
}

/// A step as it is written and requeued: `sleepsAt` only while Running (absent in every other
/// phase), and a session that is not Lost looked at again within the probe period (`probe`),
/// so a sandbox destroyed, stopped or removed under it is reported then, not at its next
/// deadline. Lost is final and keeps its rare recheck.
fn settle(mut step: Step, probe: Duration) -> Step {
    if step.status.phase != Some(SessionPhase::Running) {
        step.status.sleeps_at = None;
    }
    if step.status.phase != Some(SessionPhase::Lost) {
        step.requeue = step.requeue.min(probe);
    }
    step
}

/// When a session running since `last` goes to sleep after `idle` without activity: a valid
/// RFC 3339 time in whole seconds (as a `Time` is stored, so an unchanged one is not written
/// again), or None when that is past what a time can hold (it never sleeps).
fn sleeps_at(last: Timestamp, idle: Duration) -> Option<Time> {
    let idle = SignedDuration::try_from(idle).ok()?;
    let at = last.checked_add(idle).ok()?;
    // Whole seconds, rounded down; a negative year would not be RFC 3339.
    Timestamp::from_second(at.as_second())
        .ok()
        .filter(|t| *t >= Timestamp::UNIX_EPOCH)
        .map(time)
}

/// What to do with a session whose workspace is gone: delete it and create it again.
fn start_over(s: &SandboxSession) -> String {
    format!(
        "Delete it (kubectl delete sbx {} -n {}) and create it again for a new, empty workspace",
        s.name_any(),
        s.namespace().unwrap_or_default()
    )
}

/// The message of a session whose host reports its container removed, from the phase it had.
/// The operator only ever removes a stopped container (Sleeping past the container TTL), so a
/// container that disappears while Running was removed on the host by someone else.
fn reclaimed_message(was: Option<SessionPhase>, host: &str) -> String {
    if was == Some(SessionPhase::Running) {
        format!(
            "the container was removed on host {host} while the session ran; the workspace is kept, and the next workspace operation recreates the container"
        )
    } else {
        "container removed, workspace kept; a workspace operation recreates it".to_owned()
    }
}

/// The Tombstone that still owes the destroy of another object's sandbox under `id` on `host`
/// (a deleted SandboxSession of the same name), if any.
fn owed_destroy<'a>(
    tombstones: &'a [Tombstone],
    host: &str,
    id: &str,
    uid: Option<&str>,
) -> Option<&'a Tombstone> {
    tombstones.iter().find(|t| {
        t.spec.host == host && t.spec.session_id == id && Some(t.spec.source.uid.as_str()) != uid
    })
}

/// Why a session waits for Tombstone `t`, in words: which one, for what, and how it fares.
fn waiting_for(t: &Tombstone) -> String {
    let st = t.status.clone().unwrap_or_default();
    let progress = match (st.attempts, st.last_error, st.next_attempt_at) {
        (0, _, _) => "its first attempt is under way".to_owned(),
        (n, why, next) => format!(
            "attempt {n} failed: {}; next attempt at {}",
            why.as_deref().unwrap_or("no reason given"),
            next.map_or_else(|| "once the host answers".to_owned(), |t| t.0.to_string())
        ),
    };
    format!(
        "waiting for Tombstone {}: the sandbox '{}' of the deleted SandboxSession {}/{} is still to be destroyed on host {} ({progress}); this session opens once it is, so it never gets the old workspace",
        t.name_any(),
        t.spec.session_id,
        t.spec.source.namespace,
        t.spec.source.name,
        t.spec.host,
    )
}

/// When to look again at a session waiting for Tombstone `t`: just after its next attempt, and
/// within the probe period.
fn tombstone_wait(t: &Tombstone, probe: Duration) -> Duration {
    t.status
        .as_ref()
        .and_then(|s| s.next_attempt_at.as_ref())
        .map_or(Duration::from_secs(1), |next| {
            until(next.0).saturating_add(Duration::from_secs(1))
        })
        .min(probe)
}

fn host_err(host: &str, source: ClientError) -> Error {
    Error::Host {
        host: host.to_owned(),
        source,
    }
}

async fn store_token(
    s: &SandboxSession,
    secrets: &Api<Secret>,
    name: &str,
    token: &str,
    endpoint: &str,
    session_id: &str,
    ca: Option<&[u8]>,
) -> Result<(), Error> {
    let mut data = BTreeMap::from([
        ("token".to_owned(), ByteString(token.as_bytes().to_vec())),
        (
            "endpoint".to_owned(),
            ByteString(endpoint.as_bytes().to_vec()),
        ),
        (
            "session".to_owned(),
            ByteString(session_id.as_bytes().to_vec()),
        ),
    ]);
    // The CA that signed the host's certificate, for a platform that talks to it over https.
    if let Some(ca) = ca {
        data.insert("ca.crt".to_owned(), ByteString(ca.to_vec()));
    }
    let secret = Secret {
        data: Some(data),
        ..token_secret(s, name)
    };
    // Created once, the common case: a plain create costs the API server far less than an
    // apply. One that exists already (a token rotated after a crash) is replaced whole: a
    // replace answers with what it wrote, where a patch would answer with the Secret it changed,
    // and the operator may not read Secrets outside its namespace.
    let create = PostParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    match secrets.create(&create, &secret).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            secrets.replace(name, &create, &secret).await?;
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// The token Secret `name` of session `s`, without its data: owned by the session, labelled like
/// it and as this operator's.
fn token_secret(s: &SandboxSession, name: &str) -> Secret {
    let owner = s.controller_owner_ref(&()).into_iter().collect::<Vec<_>>();
    let mut labels = s.labels().clone();
    labels.insert(MANAGED_BY.into(), OPERATOR.into());
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            owner_references: Some(owner),
            labels: Some(labels),
            ..Default::default()
        },
        type_: Some("sandboxd.dev/session-token".into()),
        ..Default::default()
    }
}

/// Whether the token Secret `name` of `s` is there: taken as there for
/// `--token-check-seconds` after it was last found, then asked again.
async fn token_secret_there(
    s: &SandboxSession,
    ctx: &Context,
    secrets: &Api<Secret>,
    name: &str,
) -> bool {
    if ctx.token_seen_recently(&key(s)) {
        return true;
    }
    let there = token_secret_exists(s, secrets, name).await;
    if there {
        ctx.token_seen(&key(s));
    }
    there
}

/// Whether the token Secret `name` exists, asked without reading any Secret: a server-side
/// dry-run create (of the Secret as it would be made, without its data, so admission judges
/// the same object) answers 409 AlreadyExists when it is there and succeeds, storing nothing,
/// when it is gone. Any other answer (a full Secret quota, an admission webhook, the API server
/// away) counts as there: a token is rotated only when its Secret is known to be gone.
async fn token_secret_exists(s: &SandboxSession, secrets: &Api<Secret>, name: &str) -> bool {
    let probe = token_secret(s, name);
    let dry_run = PostParams {
        dry_run: true,
        field_manager: Some(MANAGER.into()),
    };
    match secrets.create(&dry_run, &probe).await {
        Ok(_) => false,
        Err(kube::Error::Api(e)) if e.code == 409 => true,
        Err(e) => {
            warn!(secret = name, error = %e, "could not tell whether the token Secret exists; taking it as there");
            true
        }
    }
}

async fn cleanup(s: &SandboxSession, ctx: &Context) -> Result<Action, Error> {
    let status = s.status.clone().unwrap_or_default();
    ctx.forget_cpu(&key(s));
    ctx.forget_token(&key(s));
    ctx.set_phase(&key(s), None);
    let Some(host) = placed_host(s).map(str::to_owned) else {
        // Never placed: nothing lives outside Kubernetes.
        return Ok(Action::await_change());
    };
    let uid = s.uid().unwrap_or_default();
    let tombstone = Tombstone {
        metadata: ObjectMeta {
            name: Some(format!("sbx-{uid}")),
            labels: Some(ctx.labels.clone()),
            ..Default::default()
        },
        spec: TombstoneSpec {
            host: host.clone(),
            session_id: status.session_id.unwrap_or_else(|| {
                host_session_id(&s.namespace().unwrap_or_default(), &s.name_any())
            }),
            tenant: s.spec.tenant.clone(),
            source: TombstoneSource {
                namespace: s.namespace().unwrap_or_default(),
                name: s.name_any(),
                uid,
            },
        },
        status: None,
    };
    let api = Api::<Tombstone>::all(ctx.client.clone());
    match api
        .create(
            &PostParams {
                field_manager: Some(MANAGER.into()),
                ..Default::default()
            },
            &tombstone,
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    ctx.event(
        s,
        EventType::Normal,
        "TombstoneWritten",
        "Delete",
        format!(
            "the destroy on host {host} is owed by Tombstone {}",
            tombstone.name_any()
        ),
    )
    .await;
    let _ = s.meta();
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandboxd_crds::v1alpha1::TombstoneStatus;

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
        ];
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

//! Step 2, open: the session is opened on its host by name (idempotent), after any destroy a
//! deleted object of the same name still owes there, and its token is kept in a Secret the
//! session owns. No Secret is watched: a token Secret deleted by someone is noticed at the
//! session's next reconcile once `--token-check-seconds` have passed since it was last found
//! ([`token_secret_exists`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Resource, ResourceExt};
use sandboxd_api::ErrorCode;
use sandboxd_api::client::ClientError;
use sandboxd_api::session::SessionView;
use sandboxd_crds::v1alpha1::condition::{
    ADMITTED, HOST_UNREACHABLE, RUNTIME_READY, session_reason,
};
use sandboxd_crds::v1alpha1::session::SessionPhase;
use sandboxd_crds::v1alpha1::{SandboxSession, SandboxSessionStatus, Tombstone};
use tracing::{info, warn};

use super::place::Placed;
use super::{
    Flow, MANAGER, WAITING_FOR_TOMBSTONE, add, host_err, secret_name, set_phase, until, wait_again,
};
use crate::conditions;
use crate::context::{Context, Error, key};

/// The label on every token Secret this operator makes.
const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Its value.
const OPERATOR: &str = "sandbox-operator";

/// Opens the session on its host unless it is open with its token Secret there: goes on with
/// the session as the open answered it (None when it was open already).
pub(super) async fn open(
    s: &SandboxSession,
    ctx: &Context,
    status: &mut SandboxSessionStatus,
    placed: &Placed,
    id: &str,
    uid: Option<&str>,
) -> Result<Flow<Option<SessionView>>, Error> {
    let generation = s.metadata.generation;
    let cfg = &ctx.config;
    let name = s.name_any();
    let host_name = &placed.name;
    let host = &placed.host;
    let client = &placed.client;
    let alias = &placed.alias;
    let follow = Duration::from_secs(cfg.follow_seconds);
    // A deleted object of this name whose destroy on this host is still owed: an open now would
    // race it, so a session never opened waits until its Tombstone is done.
    if status.session_id.is_none() {
        let tombstones = tombstones(ctx).await?;
        if let Some(t) = owed_destroy(&tombstones, host_name, id, uid) {
            let m = waiting_for(t);
            not_opened(
                status,
                ADMITTED,
                WAITING_FOR_TOMBSTONE,
                SessionPhase::Pending,
                m,
                generation,
            );
            return Ok(Flow::Done(tombstone_wait(t, follow)));
        }
    }

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
            .open_as(id, &s.spec.tenant, uid, alias.as_deref(), limits.as_ref())
            .await
        {
            Ok(opened) => {
                let token = match opened.token {
                    Some(t) => t,
                    // Found, not created (a crash after the open, or the Secret was deleted):
                    // the host gives it a new token; the old one stops working.
                    None => {
                        info!(
                            session = %name,
                            host = %host_name,
                            "the session is open without its token Secret: its token is rotated"
                        );
                        client
                            .rotate_token_as(id, uid)
                            .await
                            .map_err(|e| host_err(host_name, e))?
                    }
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
                    session_reason::OPENED,
                    &format!("opened on host {host_name}"),
                    generation,
                );
                conditions::set(
                    &mut status.conditions,
                    RUNTIME_READY,
                    true,
                    session_reason::RUNTIME_READY,
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
                    .filter(|c| c.status == "False" && c.reason == session_reason::PREPARING)
                    .map(|c| c.last_transition_time.0)
                    .unwrap_or_else(Timestamp::now);
                if until(
                    add(since, Duration::from_secs(cfg.prepare_seconds)),
                    Timestamp::now(),
                )
                .is_zero()
                {
                    let m = format!(
                        "the runtime was still not built after {} s: {message}",
                        cfg.prepare_seconds
                    );
                    not_opened(
                        status,
                        RUNTIME_READY,
                        session_reason::PREPARE_TIMED_OUT,
                        SessionPhase::Failed,
                        m,
                        generation,
                    );
                    return Ok(Flow::Done(Duration::from_secs(60)));
                }
                let m = format!("preparing sandbox: {message}");
                not_opened(
                    status,
                    RUNTIME_READY,
                    session_reason::PREPARING,
                    SessionPhase::Preparing,
                    m,
                    generation,
                );
                return Ok(Flow::Done(Duration::from_secs(5)));
            }
            Err(ClientError::Api {
                status: 429,
                code,
                message,
            }) => {
                let reason = match code {
                    ErrorCode::TenantCap => session_reason::TENANT_CAP,
                    _ => session_reason::HOST_CAP,
                };
                not_opened(
                    status,
                    ADMITTED,
                    reason,
                    SessionPhase::Pending,
                    message,
                    generation,
                );
                return Ok(Flow::Done(wait_again(s, ctx)));
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
                not_opened(
                    status,
                    ADMITTED,
                    session_reason::OWNER_CONFLICT,
                    SessionPhase::Pending,
                    m,
                    generation,
                );
                return Ok(Flow::Done(wait_again(s, ctx)));
            }
            Err(ClientError::Api {
                code: ErrorCode::RuntimeFailed,
                message,
                ..
            }) => {
                not_opened(
                    status,
                    RUNTIME_READY,
                    session_reason::BUILD_FAILED,
                    SessionPhase::Failed,
                    message,
                    generation,
                );
                return Ok(Flow::Done(Duration::from_secs(60)));
            }
            Err(ClientError::Api {
                code: ErrorCode::BadRequest,
                message,
                ..
            }) => {
                // What the session asks is refused (an override over the host's ceilings): no
                // retry can help, and a change of the spec brings the session back at once.
                let m = format!(
                    "host {host_name} refused {}: {message}; change spec.resources and the session opens",
                    asked(s)
                );
                not_opened(
                    status,
                    ADMITTED,
                    session_reason::REFUSED,
                    SessionPhase::Failed,
                    m,
                    generation,
                );
                return Ok(Flow::Done(follow));
            }
            Err(ClientError::Api {
                code: ErrorCode::NameTaken,
                message,
                ..
            }) => {
                // Someone opened the id on the host for another tenant (directly, with the
                // host's admin token): nothing of it is handed out; the session waits.
                let m = format!(
                    "host {host_name} holds session '{id}' for another tenant; this session opens once that one is destroyed: {message}"
                );
                not_opened(
                    status,
                    ADMITTED,
                    session_reason::NAME_TAKEN,
                    SessionPhase::Pending,
                    m,
                    generation,
                );
                return Ok(Flow::Done(wait_again(s, ctx)));
            }
            Err(ClientError::Api {
                code: ErrorCode::UnknownRuntime,
                message,
                ..
            }) => {
                // The Runtime exists but has not reached the host's allowlist yet.
                let m = format!(
                    "the runtime is not on host {host_name} yet; this session opens once it is: {message}"
                );
                not_opened(
                    status,
                    RUNTIME_READY,
                    session_reason::NOT_ON_HOST,
                    SessionPhase::Pending,
                    m,
                    generation,
                );
                return Ok(Flow::Done(wait_again(s, ctx)));
            }
            Err(ClientError::Api {
                status: code @ 500..,
                message,
                ..
            }) => {
                // The host could not open it now (its disk is full, Docker failed): said, and
                // tried again with backoff.
                let m = format!(
                    "the open on host {host_name} failed ({code}); it is tried again: {message}"
                );
                not_opened(
                    status,
                    ADMITTED,
                    session_reason::OPEN_FAILED,
                    SessionPhase::Pending,
                    m,
                    generation,
                );
                warn!(session = %name, host = %host_name, error = %message, "the open failed on the host");
                return Ok(Flow::Done(wait_again(s, ctx)));
            }
            Err(e @ (ClientError::Transport { .. } | ClientError::VersionMismatch { .. })) => {
                conditions::set(
                    &mut status.conditions,
                    HOST_UNREACHABLE,
                    true,
                    session_reason::UNREACHABLE,
                    &e.to_string(),
                    generation,
                );
                if status.phase.is_none() {
                    set_phase(status, SessionPhase::Pending, e.to_string());
                }
                return Ok(Flow::Done(wait_again(s, ctx)));
            }
            Err(e) => return Err(host_err(host_name, e)),
        }
    }

    Ok(Flow::Next(opened_view))
}

/// Says in the status why the open did not happen: condition `type_` False with `reason`, and
/// `phase` with the same message.
fn not_opened(
    status: &mut SandboxSessionStatus,
    type_: &str,
    reason: &str,
    phase: SessionPhase,
    message: String,
    generation: Option<i64>,
) {
    conditions::set(
        &mut status.conditions,
        type_,
        false,
        reason,
        &message,
        generation,
    );
    set_phase(status, phase, message);
}

/// What the session asks of its host, for a refusal: `spec.resources (milliCpus 64000)`.
fn asked(s: &SandboxSession) -> String {
    let Some(r) = &s.spec.resources else {
        return "the open".to_owned();
    };
    let mut parts = Vec::new();
    if let Some(m) = r.milli_cpus {
        parts.push(format!("milliCpus {m}"));
    }
    if let Some(m) = &r.mem_limit {
        parts.push(format!("memLimit {m}"));
    }
    if let Some(p) = r.pids_limit {
        parts.push(format!("pidsLimit {p}"));
    }
    if let Some(w) = &r.workspace_size {
        parts.push(format!("workspaceSize {w}"));
    }
    if parts.is_empty() {
        "the open".to_owned()
    } else {
        format!("spec.resources ({})", parts.join(", "))
    }
}

/// Every Tombstone (of this operator's selector), from the operator's cache (from the API server
/// before the caches are filled).
///
/// The cache costs the open no request; a consistent list did, 60 to 75 ms of an open that
/// otherwise takes 30 (the API server serves it from its watch cache only once that has caught
/// up with etcd, and Tombstones are written too rarely for that to be quick). The cache may lag
/// a Tombstone written a moment before. What keeps a new session from a deleted one's
/// workspace then is the host: the operator opens every session with its uid as the owner, and
/// the host answers 409 `owner_mismatch` while the deleted object's sandbox is there, so the
/// session waits (reason `OwnerConflict`) until the Tombstone has destroyed it. The look here
/// gives the wait its reason and the Tombstone's progress, and keeps a session off a host
/// sandbox from before owners existed.
pub(super) async fn tombstones(ctx: &Context) -> Result<Vec<Arc<Tombstone>>, Error> {
    if let Some(c) = ctx.caches.get() {
        return Ok(c.tombstones.state());
    }
    Ok(Api::<Tombstone>::all(ctx.client.clone())
        .list(&ctx.list_params())
        .await?
        .items
        .into_iter()
        .map(Arc::new)
        .collect())
}

/// The Tombstone that still owes the destroy of another object's sandbox under `id` on `host`
/// (a deleted SandboxSession of the same name), if any.
pub(super) fn owed_destroy<'a>(
    tombstones: &'a [Arc<Tombstone>],
    host: &str,
    id: &str,
    uid: Option<&str>,
) -> Option<&'a Tombstone> {
    tombstones.iter().map(Arc::as_ref).find(|t| {
        t.spec.host == host && t.spec.session_id == id && Some(t.spec.source.uid.as_str()) != uid
    })
}

/// Why a session waits for Tombstone `t`, in words: which one, for what, and how it fares.
pub(super) fn waiting_for(t: &Tombstone) -> String {
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
pub(super) fn tombstone_wait(t: &Tombstone, probe: Duration) -> Duration {
    t.status
        .as_ref()
        .and_then(|s| s.next_attempt_at.as_ref())
        .map_or(Duration::from_secs(1), |next| {
            until(next.0, Timestamp::now()).saturating_add(Duration::from_secs(1))
        })
        .min(probe)
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

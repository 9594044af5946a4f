//! Step 2, open: the session is opened on its host by name (idempotent), after any destroy a
//! deleted object of the same name still owes there, and its token is kept in a Secret the
//! session owns. No token Secret is watched (the only Secrets watched are egress credentials',
//! by their label): a token Secret deleted by someone is noticed at the
//! session's next reconcile once `--token-check-seconds` have passed since it was last found
//! ([`token_secret_exists`](super::token)); an opened session then gets a new token, and is never opened
//! again (one destroyed on its host meanwhile is Lost, not made anew and empty).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::{Api, ResourceExt};
use sandboxd_api::ErrorCode;
use sandboxd_api::client::ClientError;
use sandboxd_api::session::{OpenRequest, SessionView};
use sandboxd_crds::v1alpha1::condition::{ConditionType, SessionReason};
use sandboxd_crds::v1alpha1::session::{SessionEgress, SessionPhase};
use sandboxd_crds::v1alpha1::{
    SandboxSession, SandboxSessionStatus, SandboxSnapshot, SnapshotPhase, Tombstone,
};
use tracing::{Instrument as _, info, warn};

use super::place::Placed;
use super::step::{
    Flow, add, host_err, host_unreachable, secret_name, set_phase, until, wait_again,
};
use super::token::{store_token, token_secret_there};
use crate::conditions;
use crate::context::{Context, key};
use crate::error::Error;

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
                ConditionType::Admitted,
                SessionReason::WaitingForTombstone,
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
    // Opened before, its token Secret gone: the session is given a new token, never opened
    // again. An open would make a session destroyed on its host meanwhile anew, empty; the
    // rotation finds it gone instead, and the follow below reports it Lost.
    if status.session_id.is_some() && !have_secret {
        return rotate_lost_token(s, ctx, status, placed, id, uid, &secrets, &secret).await;
    }
    if status.session_id.is_none() {
        // A session from a snapshot opens once that snapshot, of its own namespace, is Ready;
        // one restored after it was Lost, from the snapshot of its restore.
        let from = status
            .restored_from
            .as_ref()
            .map(|r| r.name.clone())
            .or_else(|| s.spec.from.as_ref().map(|f| f.snapshot.clone()));
        let from_snapshot = match from {
            None => None,
            Some(from) => match snapshot_key(s, ctx, &from).await? {
                Ok(key) => Some(key),
                Err((reason, phase, message, again)) => {
                    not_opened(
                        status,
                        ConditionType::Admitted,
                        reason,
                        phase,
                        message,
                        generation,
                    );
                    return Ok(Flow::Done(again));
                }
            },
        };
        let limits = super::rebuild::asked(s.spec.resources.as_ref());
        let call = tracing::info_span!("host call", host = %host_name, route = "POST /v1/sessions");
        let opening = async {
            // The host's spans join this one; with tracing off, the session's own trace.
            let traceparent = sandboxd_telemetry::traceparent()
                .or_else(|| super::traceparent(s).map(str::to_owned));
            client
                .with_deadline(Duration::from_secs(ctx.config.host_open_seconds.max(1)))
                .with_traceparent(traceparent)
                .open_request(&OpenRequest {
                    name: id.to_owned(),
                    tenant: s.spec.tenant.clone(),
                    runtime: alias.clone(),
                    limits: limits.clone(),
                    owner: uid.map(str::to_owned),
                    egress: placed.egress.clone(),
                    from_snapshot: from_snapshot.clone(),
                })
                .await
        };
        match opening.instrument(call).await {
            Ok(opened) => {
                let token = match opened.token {
                    Some(t) => t,
                    // Found, not created (a crash after the open, before its status was
                    // written): the host gives it a new token; the old one stops working.
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
                let stored = store_token(
                    s,
                    &secrets,
                    &secret,
                    &token,
                    &host.spec.endpoint,
                    &opened.session.id,
                    ctx.host_ca(&host.name_any()).as_deref(),
                )
                .await;
                if let Some(done) = not_written(s, ctx, status, &secret, stored)? {
                    return Ok(done);
                }
                ctx.token_seen(&key(s));
                status.session_id = Some(opened.session.id.clone());
                status.runtime = Some(opened.session.runtime.clone());
                // What the host enforces beyond the runtime's policy ([`super::egress`]).
                status.egress = Some(SessionEgress {
                    policies: placed.egress.iter().map(Into::into).collect(),
                    sent_at: Some(Time(Timestamp::now())),
                    observed_generation: generation,
                });
                opened_view = Some(opened.session);
                status.credentials_secret = Some(secret.clone());
                conditions::set(
                    &mut status.conditions,
                    ConditionType::Admitted,
                    true,
                    SessionReason::Opened,
                    &format!("opened on host {host_name}"),
                    generation,
                );
                conditions::set(
                    &mut status.conditions,
                    ConditionType::RuntimeReady,
                    true,
                    SessionReason::RuntimeReady,
                    "the runtime is built on the host",
                    generation,
                );
                conditions::clear(&mut status.conditions, ConditionType::HostUnreachable);
            }
            Err(e) => return refused(s, ctx, status, host_name, id, e),
        }
    }

    Ok(Flow::Next(opened_view))
}

/// Why a session from a snapshot does not open now: its reason, phase, words and when to look
/// again.
type NotYet = (SessionReason, SessionPhase, String, Duration);

/// The object-store key of SandboxSnapshot `name` in the session's namespace when it is Ready;
/// else why the session waits (Pending) or cannot open (Failed).
async fn snapshot_key(
    s: &SandboxSession,
    ctx: &Context,
    name: &str,
) -> Result<Result<String, NotYet>, Error> {
    let ns = s.namespace().unwrap_or_default();
    let follow = Duration::from_secs(ctx.config.follow_seconds);
    let snapshots = Api::<SandboxSnapshot>::namespaced(ctx.client.clone(), &ns);
    let Some(snapshot) = snapshots.get_opt(name).await? else {
        return Ok(Err((
            SessionReason::SnapshotUnusable,
            SessionPhase::Failed,
            format!(
                "spec.from.snapshot names SandboxSnapshot {name}, which does not exist in namespace {ns} (a session opens only from a snapshot of its own namespace)"
            ),
            follow,
        )));
    };
    let status = snapshot.status.unwrap_or_default();
    Ok(match (status.phase, status.key) {
        (Some(SnapshotPhase::Ready), Some(key)) => Ok(key),
        (Some(SnapshotPhase::Failed), _) => Err((
            SessionReason::SnapshotUnusable,
            SessionPhase::Failed,
            format!(
                "SandboxSnapshot {name} failed, so the session cannot open from it: {}",
                status.message.unwrap_or_default()
            ),
            follow,
        )),
        _ => Err((
            SessionReason::WaitingForSnapshot,
            SessionPhase::Pending,
            format!("waiting for SandboxSnapshot {name} to be Ready"),
            Duration::from_secs(2),
        )),
    })
}

/// A session opened before whose token Secret is gone: it is given a new token, never opened
/// again (an open would make a session destroyed on its host meanwhile anew, empty; the
/// rotation finds it gone instead, and the follow reports it Lost).
#[allow(clippy::too_many_arguments)]
async fn rotate_lost_token(
    s: &SandboxSession,
    ctx: &Context,
    status: &mut SandboxSessionStatus,
    placed: &Placed,
    id: &str,
    uid: Option<&str>,
    secrets: &Api<Secret>,
    secret: &str,
) -> Result<Flow<Option<SessionView>>, Error> {
    let (name, host_name, host, client) =
        (s.name_any(), &placed.name, &placed.host, &placed.client);
    let generation = s.metadata.generation;
    match client.rotate_token_as(id, uid).await {
        Ok(token) => {
            info!(
                session = %name,
                host = %host_name,
                "the session's token Secret is gone: its token is rotated"
            );
            let stored = store_token(
                s,
                secrets,
                secret,
                &token,
                &host.spec.endpoint,
                id,
                ctx.host_ca(&host.name_any()).as_deref(),
            )
            .await;
            if let Some(done) = not_written(s, ctx, status, secret, stored)? {
                return Ok(done);
            }
            ctx.token_seen(&key(s));
            status.credentials_secret = Some(secret.to_owned());
        }
        Err(ClientError::NoSuchSession(_)) => {
            info!(
                session = %name,
                host = %host_name,
                "the session's token Secret is gone and so is the session on its host: not opened again"
            );
        }
        Err(e @ (ClientError::Transport { .. } | ClientError::VersionMismatch { .. })) => {
            host_unreachable(status, &e.to_string(), generation);
            return Ok(Flow::Done(wait_again(s, ctx)));
        }
        Err(e) => return Err(host_err(host_name, e)),
    }
    Ok(Flow::Next(None))
}

/// Says in the status why the host did not open the session, as [`refusal`] decides, and
/// when to look again.
fn refused(
    s: &SandboxSession,
    ctx: &Context,
    status: &mut SandboxSessionStatus,
    host_name: &str,
    id: &str,
    e: ClientError,
) -> Result<Flow<Option<SessionView>>, Error> {
    let (name, generation, cfg) = (s.name_any(), s.metadata.generation, &ctx.config);
    let follow = Duration::from_secs(cfg.follow_seconds);
    let facts = OpenFacts {
        host: host_name,
        id,
        asked: asked(s),
        preparing_since: conditions::get(&status.conditions, ConditionType::RuntimeReady)
            .filter(|c| c.status == "False" && c.reason == SessionReason::Preparing.as_str())
            .map(|c| c.last_transition_time.0),
        now: Timestamp::now(),
        prepare_seconds: cfg.prepare_seconds,
        follow,
    };
    match refusal(e, &facts) {
        Refusal::NotOpened {
            condition,
            reason,
            phase,
            message,
            again,
        } => {
            if reason == SessionReason::OpenFailed {
                warn!(session = %name, host = %host_name, error = %message, "the open failed on the host");
            }
            not_opened(status, condition, reason, phase, message, generation);
            Ok(Flow::Done(match again {
                Again::After(d) => d,
                Again::Backoff => wait_again(s, ctx),
            }))
        }
        Refusal::Unreachable(m) => {
            host_unreachable(status, &m, generation);
            if status.phase.is_none() {
                set_phase(status, SessionPhase::Pending, m);
            }
            Ok(Flow::Done(wait_again(s, ctx)))
        }
        Refusal::Failed(e) => Err(host_err(host_name, e)),
    }
}

/// When a session its host did not open is looked at again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Again {
    /// After this long.
    After(Duration),
    /// With the session's backoff ([`wait_again`]).
    Backoff,
}

/// What an open its host refused means for the session, decided by [`refusal`].
#[derive(Debug)]
pub(super) enum Refusal {
    /// Not opened: condition `condition` False with `reason`, the session in `phase`, both
    /// saying `message`, looked at again `again`.
    NotOpened {
        condition: ConditionType,
        reason: SessionReason,
        phase: SessionPhase,
        message: String,
        again: Again,
    },
    /// The host cannot be reached (or speaks another version): `HostUnreachable` True with
    /// these words, the session Pending when it has no phase yet; tried again with backoff.
    Unreachable(String),
    /// Not an answer an open expects: the reconcile's error.
    Failed(ClientError),
}

/// What [`refusal`] decides on besides the host's answer.
pub(super) struct OpenFacts<'a> {
    /// The host's name.
    pub host: &'a str,
    /// The session's id on the host.
    pub id: &'a str,
    /// What the session asks of the host ([`asked`]).
    pub asked: String,
    /// Since when the runtime has been building on the host, as the status last said.
    pub preparing_since: Option<Timestamp>,
    /// Now.
    pub now: Timestamp,
    /// How long a runtime may take to build (`--prepare-seconds`).
    pub prepare_seconds: u64,
    /// How soon a refusal no retry can help is looked at again (`--follow-seconds`).
    pub follow: Duration,
}

/// The open step's decision on a refused open: pure, from the host's answer and the facts.
pub(super) fn refusal(e: ClientError, f: &OpenFacts<'_>) -> Refusal {
    let (host_name, id) = (f.host, f.id);
    let not_opened = |condition, reason, phase, message, again| Refusal::NotOpened {
        condition,
        reason,
        phase,
        message,
        again,
    };
    match e {
        ClientError::Api {
            code: ErrorCode::RuntimePreparing,
            message,
            ..
        } => {
            let since = f.preparing_since.unwrap_or(f.now);
            if until(add(since, Duration::from_secs(f.prepare_seconds)), f.now).is_zero() {
                let m = format!(
                    "the runtime was still not built after {} s: {message}",
                    f.prepare_seconds
                );
                return not_opened(
                    ConditionType::RuntimeReady,
                    SessionReason::PrepareTimedOut,
                    SessionPhase::Failed,
                    m,
                    Again::After(Duration::from_secs(60)),
                );
            }
            not_opened(
                ConditionType::RuntimeReady,
                SessionReason::Preparing,
                SessionPhase::Preparing,
                format!("preparing sandbox: {message}"),
                Again::After(Duration::from_secs(5)),
            )
        }
        ClientError::Api {
            status: 429,
            code,
            message,
        } => {
            let reason = match code {
                ErrorCode::TenantCap => SessionReason::TenantCap,
                _ => SessionReason::HostCap,
            };
            not_opened(
                ConditionType::Admitted,
                reason,
                SessionPhase::Pending,
                message,
                Again::Backoff,
            )
        }
        // The id is held for another object: a deleted session of this name whose destroy is
        // still owed (its Tombstone removes it, then this open succeeds).
        ClientError::Api {
            code: ErrorCode::OwnerMismatch,
            message,
            ..
        } => not_opened(
            ConditionType::Admitted,
            SessionReason::OwnerConflict,
            SessionPhase::Pending,
            format!(
                "host {host_name} holds session '{id}' for another SandboxSession (one deleted whose destroy is still owed); waiting for it to be destroyed: {message}"
            ),
            Again::Backoff,
        ),
        ClientError::Api {
            code: ErrorCode::RuntimeFailed,
            message,
            ..
        } => not_opened(
            ConditionType::RuntimeReady,
            SessionReason::BuildFailed,
            SessionPhase::Failed,
            message,
            Again::After(Duration::from_secs(60)),
        ),
        // Its snapshot cannot be restored (gone from the store, a chunk missing or corrupt):
        // no retry can help; the words name the file.
        ClientError::Api {
            code: code @ (ErrorCode::SnapshotNotFound | ErrorCode::SnapshotCorrupt),
            message,
            ..
        } => not_opened(
            ConditionType::Admitted,
            SessionReason::SnapshotUnusable,
            SessionPhase::Failed,
            format!(
                "host {host_name} cannot restore the session's snapshot ({}): {message}",
                code.as_str()
            ),
            Again::After(f.follow),
        ),
        // What the session asks is refused (an override over the host's ceilings): no retry
        // can help, and a change of the spec brings the session back at once.
        ClientError::Api {
            code: ErrorCode::BadRequest,
            message,
            ..
        } => not_opened(
            ConditionType::Admitted,
            SessionReason::Refused,
            SessionPhase::Failed,
            format!(
                "host {host_name} refused {}: {message}; change spec.resources and the session opens",
                f.asked
            ),
            Again::After(f.follow),
        ),
        // Someone opened the id on the host for another tenant (directly, with the host's admin
        // token): nothing of it is handed out; the session waits.
        ClientError::Api {
            code: ErrorCode::NameTaken,
            message,
            ..
        } => not_opened(
            ConditionType::Admitted,
            SessionReason::NameTaken,
            SessionPhase::Pending,
            format!(
                "host {host_name} holds session '{id}' for another tenant; this session opens once that one is destroyed: {message}"
            ),
            Again::Backoff,
        ),
        // The Runtime exists but has not reached the host's allowlist yet.
        ClientError::Api {
            code: ErrorCode::UnknownRuntime,
            message,
            ..
        } => not_opened(
            ConditionType::RuntimeReady,
            SessionReason::NotOnHost,
            SessionPhase::Pending,
            format!(
                "the runtime is not on host {host_name} yet; this session opens once it is: {message}"
            ),
            Again::Backoff,
        ),
        // The host could not open it now (its disk is full, Docker failed): said, and tried
        // again with backoff.
        ClientError::Api {
            status: code @ 500..,
            message,
            ..
        } => not_opened(
            ConditionType::Admitted,
            SessionReason::OpenFailed,
            SessionPhase::Pending,
            format!("the open on host {host_name} failed ({code}); it is tried again: {message}"),
            Again::Backoff,
        ),
        e @ (ClientError::Transport { .. } | ClientError::VersionMismatch { .. }) => {
            Refusal::Unreachable(e.to_string())
        }
        e => Refusal::Failed(e),
    }
}

/// A token Secret the API server refused to write (403: the chart's policy keeps a Secret of
/// that name that is not a session token Secret of this operator, or RBAC; 422: a Secret of
/// that name and another type, which no replace can change): said in the status, with the API
/// server's words, and tried again with backoff. Any other failure is the reconcile's.
fn not_written(
    s: &SandboxSession,
    ctx: &Context,
    status: &mut SandboxSessionStatus,
    secret: &str,
    stored: Result<(), Error>,
) -> Result<Option<Flow<Option<SessionView>>>, Error> {
    match stored {
        Ok(()) => Ok(None),
        Err(Error::Kube(kube::Error::Api(e))) if e.code == 403 || e.code == 422 => {
            let m = format!(
                "the token Secret {secret} could not be written, so the session's token is not handed out: {}",
                e.message
            );
            warn!(session = %s.name_any(), secret, error = %e.message, "the token Secret was refused");
            not_opened(
                status,
                ConditionType::Admitted,
                SessionReason::TokenSecretNotWritten,
                SessionPhase::Pending,
                m,
                s.metadata.generation,
            );
            Ok(Some(Flow::Done(wait_again(s, ctx))))
        }
        Err(e) => Err(e),
    }
}

/// Says in the status why the open did not happen: condition `type_` False with `reason`, and
/// `phase` with the same message.
fn not_opened(
    status: &mut SandboxSessionStatus,
    type_: ConditionType,
    reason: SessionReason,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-01-01T00:00:00Z.
    fn t0() -> Timestamp {
        Timestamp::from_second(1_767_225_600).expect("a time")
    }

    fn facts(preparing_since: Option<i64>) -> OpenFacts<'static> {
        OpenFacts {
            host: "h1",
            id: "agents.s1",
            asked: "spec.resources (milliCpus 64000)".to_owned(),
            preparing_since: preparing_since
                .map(|s| Timestamp::from_second(t0().as_second() + s).expect("a time")),
            now: t0(),
            prepare_seconds: 600,
            follow: Duration::from_secs(300),
        }
    }

    fn api(status: u16, code: ErrorCode, message: &str) -> ClientError {
        ClientError::Api {
            status,
            code,
            message: message.to_owned(),
        }
    }

    /// A host's answer, since when the runtime has been preparing, and what the session then
    /// says: condition, reason, phase, message, when it is looked at again.
    type Case = (
        ClientError,
        Option<i64>,
        ConditionType,
        SessionReason,
        SessionPhase,
        &'static str,
        Again,
    );

    /// Every answer the open expects from a host that does not open the session: what the
    /// session then says, and when it is looked at again.
    #[test]
    fn a_refused_open_says_why_and_when_it_is_tried_again() {
        let backoff = Again::Backoff;
        let minute = Again::After(Duration::from_secs(60));
        #[rustfmt::skip]
        let cases: Vec<Case> = vec![
            (api(503, ErrorCode::RuntimePreparing, "building python"), None,
             ConditionType::RuntimeReady, SessionReason::Preparing, SessionPhase::Preparing,
             "preparing sandbox: building python", Again::After(Duration::from_secs(5))),
            // Preparing since 599 s: still preparing; since 600 s: timed out, Failed.
            (api(503, ErrorCode::RuntimePreparing, "building python"), Some(-599),
             ConditionType::RuntimeReady, SessionReason::Preparing, SessionPhase::Preparing,
             "preparing sandbox: building python", Again::After(Duration::from_secs(5))),
            (api(503, ErrorCode::RuntimePreparing, "building python"), Some(-600),
             ConditionType::RuntimeReady, SessionReason::PrepareTimedOut, SessionPhase::Failed,
             "the runtime was still not built after 600 s: building python", minute),
            (api(429, ErrorCode::TenantCap, "Tenant 't' already holds 10 of 10 sessions."), None,
             ConditionType::Admitted, SessionReason::TenantCap, SessionPhase::Pending,
             "Tenant 't' already holds 10 of 10 sessions.", backoff),
            (api(429, ErrorCode::HostCap, "the host holds 50 of 50"), None,
             ConditionType::Admitted, SessionReason::HostCap, SessionPhase::Pending,
             "the host holds 50 of 50", backoff),
            (api(409, ErrorCode::OwnerMismatch, "owned"), None,
             ConditionType::Admitted, SessionReason::OwnerConflict, SessionPhase::Pending,
             "host h1 holds session 'agents.s1' for another SandboxSession (one deleted whose destroy is still owed); waiting for it to be destroyed: owned", backoff),
            (api(503, ErrorCode::RuntimeFailed, "apt-get failed"), None,
             ConditionType::RuntimeReady, SessionReason::BuildFailed, SessionPhase::Failed,
             "apt-get failed", minute),
            (api(400, ErrorCode::BadRequest, "cpus 64 is over the host's 8"), None,
             ConditionType::Admitted, SessionReason::Refused, SessionPhase::Failed,
             "host h1 refused spec.resources (milliCpus 64000): cpus 64 is over the host's 8; change spec.resources and the session opens",
             Again::After(Duration::from_secs(300))),
            (api(409, ErrorCode::NameTaken, "taken"), None,
             ConditionType::Admitted, SessionReason::NameTaken, SessionPhase::Pending,
             "host h1 holds session 'agents.s1' for another tenant; this session opens once that one is destroyed: taken", backoff),
            (api(400, ErrorCode::UnknownRuntime, "no runtime 'go'"), None,
             ConditionType::RuntimeReady, SessionReason::NotOnHost, SessionPhase::Pending,
             "the runtime is not on host h1 yet; this session opens once it is: no runtime 'go'", backoff),
            (api(507, ErrorCode::HostDiskFull, "no room"), None,
             ConditionType::Admitted, SessionReason::OpenFailed, SessionPhase::Pending,
             "the open on host h1 failed (507); it is tried again: no room", backoff),
        ];
        for (i, (e, since, condition, reason, phase, message, again)) in
            cases.into_iter().enumerate()
        {
            match refusal(e, &facts(since)) {
                Refusal::NotOpened {
                    condition: c,
                    reason: r,
                    phase: p,
                    message: m,
                    again: a,
                } => assert_eq!(
                    (c, r, p, m.as_str(), a),
                    (condition, reason, phase, message, again),
                    "case {i}"
                ),
                other => panic!("case {i}: {other:?}"),
            }
        }
    }

    #[test]
    fn an_unreachable_host_is_said_and_anything_else_is_the_reconciles_error() {
        let down = ClientError::Transport {
            base: "https://10.0.0.1:8080".to_owned(),
            message: "connection refused".to_owned(),
            untrusted: false,
        };
        let words = down.to_string();
        assert!(matches!(refusal(down, &facts(None)), Refusal::Unreachable(m) if m == words));
        assert!(matches!(
            refusal(api(404, ErrorCode::SessionNotFound, "gone"), &facts(None)),
            Refusal::Failed(ClientError::Api { status: 404, .. })
        ));
    }
}

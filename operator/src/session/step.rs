//! The helpers every step of a session's reconcile uses ([`super::place`], [`super::open`],
//! [`super::follow`], [`super::rebuild`], [`super::cleanup`]): what a step hands the next
//! ([`Flow`], [`Step`]), the phase and its words, the waits, the times, the host's errors. The
//! steps import these, never their parent, so they read as a pipeline (kube-rs controller-rs:
//! the reconcile in a few named steps).

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::Patch;
use kube::{Api, ResourceExt};
use sandboxd_api::client::ClientError;
use sandboxd_crds::v1alpha1::condition::{ConditionType, SessionReason};
use sandboxd_crds::v1alpha1::session::SessionPhase;
use sandboxd_crds::v1alpha1::{SandboxSession, SandboxSessionStatus};

use crate::conditions;
use crate::context::{Context, key};
use crate::error::Error;

/// How long a Lost session waits before it is looked at again (it is final).
pub(super) const LOST_RECHECK: Duration = Duration::from_secs(3600);

pub(super) fn parse_time(s: &str) -> Option<Timestamp> {
    s.parse().ok()
}

pub(super) fn add(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_add(SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX))
        .unwrap_or(t)
}

/// How long from `now` until `t` (zero when past).
pub(super) fn until(t: Timestamp, now: Timestamp) -> Duration {
    let d = t.duration_since(now);
    Duration::try_from(d).unwrap_or(Duration::ZERO)
}

/// The Secret name holding a session's token.
pub fn secret_name(session: &str) -> String {
    format!("{session}-token")
}

/// Where a reconcile leaves a session: its status and when to look again.
pub(super) struct Step {
    pub status: SandboxSessionStatus,
    pub requeue: Duration,
}

/// What a step tells the next: go on with what it found, or stop here and look again after a
/// while (the status says why).
pub(super) enum Flow<T> {
    Next(T),
    Done(Duration),
}

/// The wait before the next attempt after a failure of this session.
pub(super) fn backoff(s: &SandboxSession, ctx: &Context) -> Duration {
    crate::backoff::failure_delay(ctx.failures_of(&key(s)).saturating_add(1))
}

/// The wait before the next try of an open that was refused (a cap, no host, a conflict):
/// doubling from 1 s to 30 s while the refusals go on, and at most the probe period.
pub(super) fn wait_again(s: &SandboxSession, ctx: &Context) -> Duration {
    ctx.wait_again(&key(s))
}

/// Says in the status that the session's host does not answer (or speaks another version):
/// `HostUnreachable` True with `message`. The session is not lost for it.
pub(super) fn host_unreachable(
    status: &mut SandboxSessionStatus,
    message: &str,
    generation: Option<i64>,
) {
    conditions::set(
        &mut status.conditions,
        ConditionType::HostUnreachable,
        true,
        SessionReason::Unreachable,
        message,
        generation,
    );
}

pub(super) fn set_phase(
    status: &mut SandboxSessionStatus,
    phase: SessionPhase,
    message: impl Into<String>,
) {
    status.phase = Some(phase);
    status.message = Some(message.into());
}

/// The session's workspace is gone: phase Lost with a condition saying why; final, so it is
/// looked at again only rarely.
pub(super) fn lost_at(
    mut status: SandboxSessionStatus,
    reason: SessionReason,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) -> Step {
    conditions::set_at(
        &mut status.conditions,
        ConditionType::Lost,
        true,
        reason,
        &message,
        generation,
        now,
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
pub(super) fn settle(mut step: Step, probe: Duration) -> Step {
    if step.status.phase != Some(SessionPhase::Running) {
        step.status.sleeps_at = None;
    }
    if step.status.phase != Some(SessionPhase::Lost) {
        step.requeue = step.requeue.min(probe);
    }
    step
}

/// What to do with a session whose workspace is gone: delete it and create it again.
pub(super) fn start_over(s: &SandboxSession) -> String {
    format!(
        "Delete it (kubectl delete sbx {} -n {}) and create it again for a new, empty workspace",
        s.name_any(),
        s.namespace().unwrap_or_default()
    )
}

/// The error of a call to `host` that failed.
pub(super) fn host_err(host: &str, source: ClientError) -> Error {
    Error::Host {
        host: host.to_owned(),
        source,
    }
}

/// A JSON patch of the session's metadata from its operations.
pub(crate) fn json_patch(ops: serde_json::Value) -> Result<Patch<()>, Error> {
    let ops: json_patch::Patch =
        serde_json::from_value(ops).map_err(|e| Error::Finalizer(e.to_string()))?;
    Ok(Patch::Json(ops))
}

pub(super) fn session_api(s: &SandboxSession, ctx: &Context) -> Api<SandboxSession> {
    Api::namespaced(ctx.client.clone(), &s.namespace().unwrap_or_default())
}

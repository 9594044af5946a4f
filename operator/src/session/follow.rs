//! Step 3, follow: what the host reports of an open session decides its phase and conditions,
//! when it is looked at again, and at most one thing done on the host (stop an idle sandbox,
//! reclaim a stopped one past the container TTL, remove a workspace past its TTL).
//!
//! [`decide`] is a pure function of the status, the host's report, the time and the settings;
//! [`follow`] asks the host, calls it, and carries out the effect it returns.
//!
//! Over 600 lines with its table tests; the decision and its effects are under 470.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use sandboxd_api::SessionState;
use sandboxd_api::client::{Client as HostClient, ClientError};
use sandboxd_api::session::{MemoryNote, MemoryOp, SessionView};
use sandboxd_crds::v1alpha1::condition::{ConditionType, SessionReason};
use sandboxd_crds::v1alpha1::session::{Launch, SessionPhase};
use sandboxd_crds::v1alpha1::{Runtime, SandboxSession, SandboxSessionStatus};
use tracing::{Instrument as _, debug};

use super::rebuild;
use super::step::{Step, add, host_err, lost_at, parse_time, set_phase, start_over, until};
use crate::conditions;
use crate::context::{Context, key};
use crate::error::Error;

/// What the host reports of the session.
#[derive(Debug, Clone)]
pub enum Report {
    /// The session as the host shows it, with its CPU use in percent of one core over the
    /// sampling window when it was sampled (see [`wants_cpu_sample`]).
    Session {
        /// The session (boxed: a view is far larger than the other variants).
        view: Box<SessionView>,
        /// CPU use since the previous sample; None on a first sample.
        cpu_percent: Option<f64>,
    },
    /// The host no longer has the session.
    Gone,
    /// The host could not be asked (down, hanging, another version): why.
    Unreachable(String),
}

/// The settings the decision uses.
#[derive(Debug, Clone, PartialEq)]
pub struct FollowConfig {
    /// How often a session is looked at again at the latest.
    pub follow: Duration,
    /// How long without activity a session runs before it sleeps.
    pub idle: Duration,
    /// The window CPU use is sampled over before an idle session is stopped.
    pub cpu_window: Duration,
    /// CPU use (percent of one core) at or above which an idle session is busy.
    pub idle_cpu_percent: f64,
    /// How long a sleeping session keeps its container.
    pub container_ttl: Duration,
    /// How long a reclaimed workspace is kept without activity; None: for ever.
    pub workspace_ttl: Option<Duration>,
    /// The wait before the next attempt after a failure.
    pub backoff: Duration,
}

/// The session the decision is about: its host, its generation and what to tell a person
/// whose workspace is gone.
#[derive(Debug, Clone, PartialEq)]
pub struct Subject {
    /// The host's name.
    pub host: String,
    /// The object's generation, recorded in conditions.
    pub generation: Option<i64>,
    /// What to do when the workspace is gone ([`start_over`]).
    pub start_over: String,
}

/// What the host is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Nothing.
    None,
    /// Stop the idle sandbox (its files stay).
    Stop,
    /// Remove the stopped container (its workspace stays).
    Reclaim,
    /// Destroy the session, workspace included (its workspace TTL passed).
    Destroy,
}

/// The next status, when to look again, the one effect, and whether the CPU sample of the
/// session is dropped (kept only while an idle session's CPU use is being sampled).
#[derive(Debug, Clone)]
pub struct Decision {
    /// The next status.
    pub status: SandboxSessionStatus,
    /// When to look again.
    pub requeue: Duration,
    /// What the host is asked to do.
    pub effect: Effect,
    /// Whether the session's CPU sample is dropped.
    pub forget_cpu: bool,
}

impl Decision {
    fn wait(status: SandboxSessionStatus, requeue: Duration) -> Self {
        Self {
            status,
            requeue,
            effect: Effect::None,
            forget_cpu: false,
        }
    }
}

/// When the session last saw activity: the host's time in whole seconds, as a `Time` is stored
/// (a finer value would differ from the stored one on every reconcile and write the status
/// again for nothing); `now` when the host's cannot be read.
fn last_activity(view: &SessionView, now: Timestamp) -> Timestamp {
    let last = parse_time(&view.last_activity_at).unwrap_or(now);
    Timestamp::from_second(last.as_second()).unwrap_or(last)
}

/// When a session running since `last` goes to sleep after `idle` without activity: a valid
/// RFC 3339 time in whole seconds (as a `Time` is stored, so an unchanged one is not written
/// again), or None when that is past what a time can hold (it never sleeps).
pub(super) fn sleeps_at(last: Timestamp, idle: Duration) -> Option<Time> {
    let idle = SignedDuration::try_from(idle).ok()?;
    let at = last.checked_add(idle).ok()?;
    // Whole seconds, rounded down; a negative year would not be RFC 3339.
    Timestamp::from_second(at.as_second())
        .ok()
        .filter(|t| *t >= Timestamp::UNIX_EPOCH)
        .map(Time)
}

/// Whether the session is idle by activity, so its CPU use decides whether it sleeps: it runs,
/// runs nothing, and its `sleepsAt` has passed.
pub fn wants_cpu_sample(view: &SessionView, now: Timestamp, idle: Duration) -> bool {
    view.workspace_exists
        && view.state == SessionState::Running
        && view.runs_in_flight == 0
        && sleeps_at(last_activity(view, now), idle).is_some_and(|t| until(t.0, now).is_zero())
}

/// The message of a session whose host reports its container removed, from the phase it had.
/// The operator only ever removes a stopped container (Sleeping past the container TTL), so a
/// container that disappears while Running was removed on the host by someone else.
pub(super) fn reclaimed_message(was: Option<SessionPhase>, host: &str) -> String {
    if was == Some(SessionPhase::Running) {
        format!(
            "the container was removed on host {host} while the session ran; the workspace is kept, and the next workspace operation recreates the container"
        )
    } else {
        "container removed, workspace kept; a workspace operation recreates it".to_owned()
    }
}

/// The follow decision: from the status, what the host reports, the time and the settings,
/// the next status, when to look again and the one effect.
pub fn decide(
    mut status: SandboxSessionStatus,
    report: Report,
    now: Timestamp,
    cfg: &FollowConfig,
    subject: &Subject,
) -> Decision {
    let at = At {
        host: subject.host.as_str(),
        generation: subject.generation,
        now,
    };
    let host = at.host;
    let (view, cpu_percent) = match report {
        Report::Session { view, cpu_percent } => (*view, cpu_percent),
        Report::Gone => {
            let m = format!(
                "host {host} no longer has this session: it was destroyed there, workspace included, not through this object; it is not replaced with an empty one. {}",
                subject.start_over
            );
            return gone(status, SessionReason::SessionGone, m, at.generation, now);
        }
        Report::Unreachable(why) => {
            at.set(
                &mut status,
                ConditionType::HostUnreachable,
                true,
                SessionReason::Unreachable,
                &why,
            );
            return Decision::wait(status, cfg.backoff);
        }
    };
    conditions::clear(&mut status.conditions, ConditionType::HostUnreachable);
    if let Some(note) = &view.memory {
        memory(&mut status, note, &at);
    }
    let last = last_activity(&view, now);
    status.last_activity_at = Some(Time(last));
    status.launch = Some(match view.launch {
        sandboxd_api::Launch::Warm => Launch::Warm,
        sandboxd_api::Launch::Cold => Launch::Cold,
        sandboxd_api::Launch::Restored => Launch::Restored,
    });

    if !view.workspace_exists || view.state == SessionState::Lost {
        let m = format!(
            "the workspace of this session vanished on host {host}; it is not replaced with an empty one. {}",
            subject.start_over
        );
        at.set(
            &mut status,
            ConditionType::Ready,
            false,
            SessionReason::Lost,
            &m,
        );
        return gone(
            status,
            SessionReason::WorkspaceVanished,
            m,
            at.generation,
            now,
        );
    }

    match view.state {
        SessionState::Running => running(status, &view, cpu_percent, last, &at, cfg),
        SessionState::Stopped => stopped(status, last, &at, cfg),
        SessionState::Reclaimed => reclaimed(status, last, &at, cfg),
        SessionState::Opening => {
            set_phase(
                &mut status,
                SessionPhase::Pending,
                format!("opening on host {host}"),
            );
            Decision::wait(status, Duration::from_secs(1))
        }
        // Handled above, with the workspace check.
        SessionState::Lost => gone(
            status,
            SessionReason::WorkspaceVanished,
            format!("host {host} reports the session lost"),
            at.generation,
            now,
        ),
        SessionState::Destroying => Decision::wait(status, Duration::from_secs(2)),
    }
}

/// Where and when [`decide`] decides: the host, the object's generation, now.
struct At<'a> {
    host: &'a str,
    generation: Option<i64>,
    now: Timestamp,
}

impl At<'_> {
    /// Sets condition `type_` as of now, for this generation.
    fn set(
        &self,
        status: &mut SandboxSessionStatus,
        type_: ConditionType,
        ok: bool,
        reason: SessionReason,
        m: &str,
    ) {
        conditions::set_at(
            &mut status.conditions,
            type_,
            ok,
            reason,
            m,
            self.generation,
            self.now,
        );
    }
}

/// `MemoryKept` from the host's note of the session's last checkpoint or restore.
fn memory(status: &mut SandboxSessionStatus, note: &MemoryNote, at: &At<'_>) {
    let reason = match (note.op, note.kept) {
        (MemoryOp::Checkpoint, true) => SessionReason::Checkpointed,
        (MemoryOp::Restore, true) => SessionReason::Restored,
        (MemoryOp::Checkpoint, false) => SessionReason::CheckpointFailed,
        (MemoryOp::Restore, false) => SessionReason::RestoreFailed,
    };
    at.set(
        status,
        ConditionType::MemoryKept,
        note.kept,
        reason,
        &note.line(),
    );
}

/// A running session: Running until it has been idle (no activity, no run in flight, and the
/// CPU below the threshold over a window) for the idle timeout; then it is put to sleep.
fn running(
    mut status: SandboxSessionStatus,
    view: &SessionView,
    cpu_percent: Option<f64>,
    last: Timestamp,
    at: &At<'_>,
    cfg: &FollowConfig,
) -> Decision {
    let (follow, idle, now) = (cfg.follow, cfg.idle, at.now);
    status.sleeps_at = sleeps_at(last, idle);
    // Never: an idle timeout past what a time can hold.
    let sleeps_at = status.sleeps_at.as_ref().map_or(Timestamp::MAX, |t| t.0);
    at.set(
        &mut status,
        ConditionType::Ready,
        true,
        SessionReason::Running,
        "the sandbox runs",
    );
    set_phase(
        &mut status,
        SessionPhase::Running,
        format!("running on host {}", at.host),
    );
    if !until(sleeps_at, now).is_zero() || view.runs_in_flight > 0 {
        let wait = if view.runs_in_flight > 0 {
            idle.min(follow)
        } else {
            until(sleeps_at, now)
        };
        return Decision {
            forget_cpu: true,
            ..Decision::wait(status, wait)
        };
    }
    // Idle by activity; idle by CPU too? Sample it over a window first.
    match view.cpu_ns.and(cpu_percent) {
        None => return Decision::wait(status, cfg.cpu_window),
        // Busy without runs (a server it started): not idle; look again later.
        Some(p) if p >= cfg.idle_cpu_percent => {
            return Decision {
                forget_cpu: true,
                ..Decision::wait(status, idle)
            };
        }
        Some(_) => {}
    }
    at.set(
        &mut status,
        ConditionType::Ready,
        false,
        SessionReason::Sleeping,
        "idle: the container is stopped, the files stay",
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
    Decision {
        status,
        requeue: follow.min(cfg.container_ttl),
        effect: Effect::Stop,
        forget_cpu: true,
    }
}

/// A sleeping session: Sleeping until its container has been stopped for the container TTL;
/// then the container is removed (Reclaimed), the workspace kept.
fn stopped(
    mut status: SandboxSessionStatus,
    last: Timestamp,
    at: &At<'_>,
    cfg: &FollowConfig,
) -> Decision {
    let (follow, now) = (cfg.follow, at.now);
    status.sleeps_at = None;
    let since = conditions::get(&status.conditions, ConditionType::Ready)
        .filter(|c| c.status == "False" && c.reason == SessionReason::Sleeping.as_str())
        .map(|c| c.last_transition_time.0)
        .unwrap_or(last);
    at.set(
        &mut status,
        ConditionType::Ready,
        false,
        SessionReason::Sleeping,
        "idle: the container is stopped, the files stay",
    );
    if status.phase != Some(SessionPhase::Sleeping) {
        set_phase(
            &mut status,
            SessionPhase::Sleeping,
            "container stopped, files kept; a workspace operation wakes it".to_owned(),
        );
    }
    let reclaim_at = add(since, cfg.container_ttl);
    if !until(reclaim_at, now).is_zero() {
        return Decision::wait(status, until(reclaim_at, now).min(follow));
    }
    at.set(
        &mut status,
        ConditionType::Ready,
        false,
        SessionReason::Reclaimed,
        "the container was removed after its TTL; the workspace stays",
    );
    set_phase(
        &mut status,
        SessionPhase::Reclaimed,
        format!(
            "stopped for {} s: container removed, workspace kept",
            cfg.container_ttl.as_secs()
        ),
    );
    Decision {
        effect: Effect::Reclaim,
        ..Decision::wait(status, follow)
    }
}

/// A reclaimed session: Reclaimed, its workspace kept until it has had no activity for the
/// workspace TTL (when one is set); then the workspace is destroyed and the session is Lost.
fn reclaimed(
    mut status: SandboxSessionStatus,
    last: Timestamp,
    at: &At<'_>,
    cfg: &FollowConfig,
) -> Decision {
    let (follow, now) = (cfg.follow, at.now);
    status.sleeps_at = None;
    at.set(
        &mut status,
        ConditionType::Ready,
        false,
        SessionReason::Reclaimed,
        "the container was removed; the workspace stays",
    );
    if status.phase != Some(SessionPhase::Reclaimed) {
        let m = reclaimed_message(status.phase, at.host);
        set_phase(&mut status, SessionPhase::Reclaimed, m);
    }
    let Some(ttl) = cfg.workspace_ttl else {
        return Decision::wait(status, follow);
    };
    let expires = add(last, ttl);
    if !until(expires, now).is_zero() {
        return Decision::wait(status, until(expires, now).min(follow));
    }
    let m = format!(
        "no activity for {} s: the workspace was removed (workspace TTL)",
        ttl.as_secs()
    );
    Decision {
        effect: Effect::Destroy,
        ..gone(
            status,
            SessionReason::WorkspaceExpired,
            m,
            at.generation,
            now,
        )
    }
}

/// The session is Lost (final): [`lost_at`] as a decision.
fn gone(
    status: SandboxSessionStatus,
    reason: SessionReason,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) -> Decision {
    let step = lost_at(status, reason, message, generation, now);
    Decision::wait(step.status, step.requeue)
}

/// Follows the open session `id` on its host: asks the host (unless the open just answered
/// with it), decides, and carries out the effect.
#[allow(clippy::too_many_arguments)]
pub(super) async fn follow(
    s: &SandboxSession,
    ctx: &Context,
    mut status: SandboxSessionStatus,
    client: &HostClient,
    host: &str,
    runtime: Option<&Runtime>,
    id: &str,
    uid: Option<&str>,
    opened: Option<SessionView>,
) -> Result<Step, Error> {
    let cfg = &ctx.config;
    let now = Timestamp::now();
    let config = FollowConfig {
        follow: Duration::from_secs(cfg.follow_seconds),
        idle: s
            .spec
            .idle_timeout_seconds
            .and_then(|v| u64::try_from(v).ok())
            .map_or(cfg.idle_timeout(), Duration::from_secs),
        cpu_window: Duration::from_secs(cfg.cpu_window_seconds),
        idle_cpu_percent: cfg.idle_cpu_percent,
        container_ttl: Duration::from_secs(cfg.container_ttl_seconds),
        workspace_ttl: cfg.workspace_ttl_seconds.map(Duration::from_secs),
        backoff: super::backoff(s, ctx),
    };
    let fetched = match opened {
        Some(v) => Ok(v),
        None => client.get_without_usage(id).await,
    };
    let mut report = match fetched {
        Ok(view) => {
            let cpu_percent = if wants_cpu_sample(&view, now, config.idle) {
                view.cpu_ns.and_then(|ns| ctx.cpu_percent(&key(s), ns))
            } else {
                None
            };
            Report::Session {
                view: Box::new(view),
                cpu_percent,
            }
        }
        Err(ClientError::NoSuchSession(_)) => Report::Gone,
        Err(e @ (ClientError::Transport { .. } | ClientError::VersionMismatch { .. })) => {
            Report::Unreachable(e.to_string())
        }
        Err(e) => return Err(host_err(host, e)),
    };
    // A rebuild due now happens before the decision, which is made on what it left.
    let later =
        match rebuild_if_due(s, ctx, &mut status, client, host, runtime, id, &mut report).await? {
            Rebuilt::Decide(later) => later,
            Rebuilt::Requeue(wait) => {
                return Ok(Step {
                    status,
                    requeue: wait,
                });
            }
        };
    let shown = match &report {
        Report::Session { view, .. } => Some((**view).clone()),
        _ => None,
    };
    let subject = Subject {
        host: host.to_owned(),
        generation: s.metadata.generation,
        start_over: start_over(s),
    };
    let mut decision = decide(status, report, now, &config, &subject);
    if let Some(view) = &shown
        && decision.status.phase != Some(SessionPhase::Lost)
    {
        let drift = rebuild::drift(s.spec.resources.as_ref(), view);
        ctx.set_outdated(&key(s), drift.image.as_ref().map(|_| view.runtime.clone()));
        rebuild::mark(
            &mut decision.status,
            view,
            &drift,
            host,
            s.metadata.generation,
            now,
        );
    }
    // Its egress credentials, handed over again when the host holds another set (or none,
    // after a restart) than the one wanted now.
    if let Some(view) = &shown
        && decision.status.phase != Some(SessionPhase::Lost)
        && decision.status.session_id.is_some()
        && let Some(wait) = super::credentials::keep_current(
            s,
            ctx,
            &mut decision.status,
            client,
            host,
            runtime,
            id,
            view,
        )
        .instrument(tracing::info_span!("credentials"))
        .await
    {
        decision.requeue = decision.requeue.min(wait);
    }
    if let Some(wait) = later {
        decision.requeue = decision.requeue.min(wait);
    }
    if decision.forget_cpu {
        ctx.forget_cpu(&key(s));
    }
    let done = match decision.effect {
        Effect::None => Ok(()),
        Effect::Stop => client.stop(id).await.map(drop),
        Effect::Reclaim => client.reclaim(id).await.map(drop),
        Effect::Destroy => client.destroy_as(id, uid).await.map(drop),
    };
    done.map_err(|e| host_err(host, e))?;
    Ok(Step {
        status: decision.status,
        requeue: decision.requeue,
    })
}

/// What [`follow`] does after a rebuild that was due: decide on the report (looking again
/// within the wait, if the rebuild was put off), or look again after the wait without
/// deciding (the host did not answer the rebuild).
enum Rebuilt {
    Decide(Option<Duration>),
    Requeue(Duration),
}

/// Rebuilds the session when a rebuild is due ([`rebuild::due`]) and its Runtime's current
/// definition is on the host; `report` becomes what the host shows after it.
#[allow(clippy::too_many_arguments)]
async fn rebuild_if_due(
    s: &SandboxSession,
    ctx: &Context,
    status: &mut SandboxSessionStatus,
    client: &HostClient,
    host: &str,
    runtime: Option<&Runtime>,
    id: &str,
    report: &mut Report,
) -> Result<Rebuilt, Error> {
    let mut later = None;
    if let Report::Session { view, .. } = &*report {
        let drift = rebuild::drift(s.spec.resources.as_ref(), view);
        let policy = runtime
            .and_then(|r| r.spec.rebuild_policy)
            .unwrap_or_default();
        let max_unavailable = runtime
            .and_then(|r| r.spec.max_unavailable)
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(1);
        // The status may be a cached copy from before this replica's last rebuild was written.
        let done = status
            .rebuild_generation
            .max(ctx.rebuilt_generation(&key(s)));
        let why = rebuild::due(
            s.spec.rebuild_generation,
            done,
            &drift,
            policy,
            view,
            rebuild::failed(status),
        );
        let waits = why.and_then(|_| rebuild::waits_for_runtime(runtime, host, view));
        if let Some(reason) = waits {
            debug!(session = %s.name_any(), %reason, "rebuild put off");
            later = Some(Duration::from_secs(1));
        } else if let Some(why) = why {
            let view = view.clone();
            match rebuild::rebuild(
                s,
                ctx,
                status,
                client,
                host,
                id,
                why,
                &view,
                max_unavailable,
            )
            .await?
            {
                rebuild::Ran::Done(view) => {
                    *report = Report::Session {
                        view,
                        cpu_percent: None,
                    };
                }
                rebuild::Ran::Failed => {
                    *report = match client.get(id).await {
                        Ok(view) => Report::Session {
                            view: Box::new(view),
                            cpu_percent: None,
                        },
                        Err(ClientError::NoSuchSession(_)) => Report::Gone,
                        Err(e) => Report::Unreachable(e.to_string()),
                    };
                }
                rebuild::Ran::Later(wait) => later = Some(wait),
                rebuild::Ran::Unreachable(wait) => return Ok(Rebuilt::Requeue(wait)),
            }
        }
    }
    Ok(Rebuilt::Decide(later))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    /// 2026-01-01T00:00:00Z.
    fn t0() -> Timestamp {
        Timestamp::from_second(1_767_225_600).expect("a time")
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(t0().as_second() + seconds).expect("a time")
    }

    fn config() -> FollowConfig {
        FollowConfig {
            follow: Duration::from_secs(300),
            idle: Duration::from_secs(1800),
            cpu_window: Duration::from_secs(30),
            idle_cpu_percent: 5.0,
            container_ttl: Duration::from_secs(3600),
            workspace_ttl: Some(Duration::from_secs(86_400)),
            backoff: Duration::from_secs(7),
        }
    }

    fn subject() -> Subject {
        Subject {
            host: "h1".to_owned(),
            generation: Some(3),
            start_over: "Start over.".to_owned(),
        }
    }

    /// A session as the host shows it, last active at `t0`.
    fn view(state: SessionState) -> SessionView {
        SessionView {
            id: "agents.s1".to_owned(),
            tenant: "agents".to_owned(),
            runtime: "python".to_owned(),
            image: "sandboxd-runtime:python".to_owned(),
            state,
            created_at: t0().to_string(),
            last_activity_at: t0().to_string(),
            runs_in_flight: 0,
            cpu_ns: Some(1_000),
            workspace_exists: true,
            owner: None,
            launch: Default::default(),
            usage: None,
            credentials_version: None,
            runtime_image: None,
            limits: Default::default(),
            memory: None,
        }
    }

    fn report(view: SessionView, cpu_percent: Option<f64>) -> Report {
        Report::Session {
            view: Box::new(view),
            cpu_percent,
        }
    }

    fn phase(p: SessionPhase) -> SandboxSessionStatus {
        SandboxSessionStatus {
            phase: Some(p),
            ..Default::default()
        }
    }

    /// A status Sleeping since `since` (its Ready condition turned False then).
    fn sleeping_since(since: Timestamp) -> SandboxSessionStatus {
        let mut status = phase(SessionPhase::Sleeping);
        status.conditions.push(Condition {
            type_: ConditionType::Ready.as_str().to_owned(),
            status: "False".to_owned(),
            reason: SessionReason::Sleeping.as_str().to_owned(),
            message: String::new(),
            observed_generation: Some(3),
            last_transition_time: Time(since),
        });
        status
    }

    fn reason(status: &SandboxSessionStatus, type_: ConditionType) -> Option<(String, String)> {
        conditions::get(&status.conditions, type_).map(|c| (c.status.clone(), c.reason.clone()))
    }

    struct Case {
        name: &'static str,
        status: SandboxSessionStatus,
        report: Report,
        now: Timestamp,
        phase: Option<SessionPhase>,
        requeue: Duration,
        effect: Effect,
        forget_cpu: bool,
        /// A condition the decision sets: type, status, reason.
        condition: (ConditionType, &'static str, &'static str),
    }

    /// The host's note of the last checkpoint or restore becomes `MemoryKept`, a failed one
    /// with its reason and what the session was left with; a session without one has none.
    #[test]
    fn memory_kept_says_what_the_last_checkpoint_or_restore_did() {
        let note = |op, error: Option<&str>, outcome: &str| MemoryNote {
            op,
            kept: error.is_none(),
            outcome: outcome.to_owned(),
            error: error.map(str::to_owned),
            at: t0().to_string(),
        };
        let cases = [
            (
                note(MemoryOp::Checkpoint, None, "asleep with its memory"),
                SessionState::Stopped,
                ("True", "Checkpointed", "asleep with its memory"),
            ),
            (
                note(
                    MemoryOp::Checkpoint,
                    Some("Docker said no"),
                    "asleep without its memory",
                ),
                SessionState::Stopped,
                (
                    "False",
                    "CheckpointFailed",
                    "asleep without its memory: the checkpoint failed: Docker said no",
                ),
            ),
            (
                note(MemoryOp::Restore, None, "awake with its memory"),
                SessionState::Running,
                ("True", "Restored", "awake with its memory"),
            ),
            (
                note(
                    MemoryOp::Restore,
                    Some("checkpoint damaged"),
                    "awake fresh with its files",
                ),
                SessionState::Running,
                (
                    "False",
                    "RestoreFailed",
                    "awake fresh with its files: the restore failed: checkpoint damaged",
                ),
            ),
        ];
        for (note, state, (status, why, message)) in cases {
            let mut v = view(state);
            v.memory = Some(note);
            let d = decide(
                phase(SessionPhase::Running),
                report(v, None),
                at(10),
                &config(),
                &subject(),
            );
            let c = conditions::get(&d.status.conditions, ConditionType::MemoryKept)
                .expect("MemoryKept is set");
            assert_eq!(
                (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
                (status, why, message)
            );
        }
        let d = decide(
            phase(SessionPhase::Running),
            report(view(SessionState::Running), None),
            at(10),
            &config(),
            &subject(),
        );
        assert_eq!(reason(&d.status, ConditionType::MemoryKept), None);
    }

    /// Every case of the follow decision, one row each: over 150 lines because it is the table
    /// of cases, not logic.
    #[test]
    fn the_follow_decision_table() {
        let running = || phase(SessionPhase::Running);
        let mut busy = view(SessionState::Running);
        busy.runs_in_flight = 2;
        let mut vanished = view(SessionState::Running);
        vanished.workspace_exists = false;
        let cases = [
            Case {
                name: "active: runs until sleepsAt, looked at then",
                status: running(),
                report: report(view(SessionState::Running), None),
                now: at(600),
                phase: Some(SessionPhase::Running),
                requeue: Duration::from_secs(1200),
                effect: Effect::None,
                forget_cpu: true,
                condition: (
                    ConditionType::Ready,
                    "True",
                    SessionReason::Running.as_str(),
                ),
            },
            Case {
                name: "past sleepsAt with runs in flight: not idle",
                status: running(),
                report: report(busy, None),
                now: at(4000),
                phase: Some(SessionPhase::Running),
                requeue: Duration::from_secs(300),
                effect: Effect::None,
                forget_cpu: true,
                condition: (
                    ConditionType::Ready,
                    "True",
                    SessionReason::Running.as_str(),
                ),
            },
            Case {
                name: "idle by activity, first CPU sample: wait one window",
                status: running(),
                report: report(view(SessionState::Running), None),
                now: at(1800),
                phase: Some(SessionPhase::Running),
                requeue: Duration::from_secs(30),
                effect: Effect::None,
                forget_cpu: false,
                condition: (
                    ConditionType::Ready,
                    "True",
                    SessionReason::Running.as_str(),
                ),
            },
            Case {
                name: "idle by activity but busy on CPU: runs on",
                status: running(),
                report: report(view(SessionState::Running), Some(40.0)),
                now: at(1830),
                phase: Some(SessionPhase::Running),
                requeue: Duration::from_secs(1800),
                effect: Effect::None,
                forget_cpu: true,
                condition: (
                    ConditionType::Ready,
                    "True",
                    SessionReason::Running.as_str(),
                ),
            },
            Case {
                name: "idle by activity and CPU: stopped",
                status: running(),
                report: report(view(SessionState::Running), Some(0.5)),
                now: at(1830),
                phase: Some(SessionPhase::Sleeping),
                requeue: Duration::from_secs(300),
                effect: Effect::Stop,
                forget_cpu: true,
                condition: (
                    ConditionType::Ready,
                    "False",
                    SessionReason::Sleeping.as_str(),
                ),
            },
            Case {
                name: "sleeping within the container TTL",
                status: sleeping_since(at(2000)),
                report: report(view(SessionState::Stopped), None),
                now: at(5500),
                phase: Some(SessionPhase::Sleeping),
                requeue: Duration::from_secs(100),
                effect: Effect::None,
                forget_cpu: false,
                condition: (
                    ConditionType::Ready,
                    "False",
                    SessionReason::Sleeping.as_str(),
                ),
            },
            Case {
                name: "sleeping past the container TTL: reclaimed",
                status: sleeping_since(at(2000)),
                report: report(view(SessionState::Stopped), None),
                now: at(5600),
                phase: Some(SessionPhase::Reclaimed),
                requeue: Duration::from_secs(300),
                effect: Effect::Reclaim,
                forget_cpu: false,
                condition: (
                    ConditionType::Ready,
                    "False",
                    SessionReason::Reclaimed.as_str(),
                ),
            },
            Case {
                name: "reclaimed within the workspace TTL",
                status: phase(SessionPhase::Reclaimed),
                report: report(view(SessionState::Reclaimed), None),
                now: at(86_300),
                phase: Some(SessionPhase::Reclaimed),
                requeue: Duration::from_secs(100),
                effect: Effect::None,
                forget_cpu: false,
                condition: (
                    ConditionType::Ready,
                    "False",
                    SessionReason::Reclaimed.as_str(),
                ),
            },
            Case {
                name: "reclaimed past the workspace TTL: destroyed, Lost",
                status: phase(SessionPhase::Reclaimed),
                report: report(view(SessionState::Reclaimed), None),
                now: at(86_400),
                phase: Some(SessionPhase::Lost),
                requeue: crate::session::step::LOST_RECHECK,
                effect: Effect::Destroy,
                forget_cpu: false,
                condition: (
                    ConditionType::Lost,
                    "True",
                    SessionReason::WorkspaceExpired.as_str(),
                ),
            },
            Case {
                name: "the workspace vanished: Lost, never recreated",
                status: running(),
                report: report(vanished, None),
                now: at(10),
                phase: Some(SessionPhase::Lost),
                requeue: crate::session::step::LOST_RECHECK,
                effect: Effect::None,
                forget_cpu: false,
                condition: (
                    ConditionType::Lost,
                    "True",
                    SessionReason::WorkspaceVanished.as_str(),
                ),
            },
            Case {
                name: "the host no longer has it: Lost",
                status: running(),
                report: Report::Gone,
                now: at(10),
                phase: Some(SessionPhase::Lost),
                requeue: crate::session::step::LOST_RECHECK,
                effect: Effect::None,
                forget_cpu: false,
                condition: (
                    ConditionType::Lost,
                    "True",
                    SessionReason::SessionGone.as_str(),
                ),
            },
            Case {
                name: "the host does not answer: phase kept, retried after the backoff",
                status: running(),
                report: Report::Unreachable("connection refused".to_owned()),
                now: at(10),
                phase: Some(SessionPhase::Running),
                requeue: Duration::from_secs(7),
                effect: Effect::None,
                forget_cpu: false,
                condition: (
                    ConditionType::HostUnreachable,
                    "True",
                    SessionReason::Unreachable.as_str(),
                ),
            },
            Case {
                name: "still opening on the host",
                status: SandboxSessionStatus::default(),
                report: report(view(SessionState::Opening), None),
                now: at(1),
                phase: Some(SessionPhase::Pending),
                requeue: Duration::from_secs(1),
                effect: Effect::None,
                forget_cpu: false,
                condition: (ConditionType::HostUnreachable, "", ""),
            },
        ];
        for case in cases {
            let d = decide(case.status, case.report, case.now, &config(), &subject());
            let name = case.name;
            assert_eq!(d.status.phase, case.phase, "{name}: phase");
            assert_eq!(d.requeue, case.requeue, "{name}: requeue");
            assert_eq!(d.effect, case.effect, "{name}: effect");
            assert_eq!(d.forget_cpu, case.forget_cpu, "{name}: forget_cpu");
            let (type_, status, why) = case.condition;
            let expected = (!status.is_empty()).then(|| (status.to_owned(), why.to_owned()));
            assert_eq!(reason(&d.status, type_), expected, "{name}: {type_}");
        }
    }

    #[test]
    fn a_running_session_records_when_it_sleeps_and_a_sleeping_one_does_not() {
        let d = decide(
            phase(SessionPhase::Running),
            report(view(SessionState::Running), None),
            at(60),
            &config(),
            &subject(),
        );
        assert_eq!(d.status.sleeps_at, Some(Time(at(1800))));
        assert_eq!(d.status.last_activity_at, Some(Time(t0())));
        assert_eq!(
            d.status.message.as_deref(),
            Some("running on host h1"),
            "the message names the host"
        );
        let d = decide(
            sleeping_since(at(0)),
            report(view(SessionState::Stopped), None),
            at(60),
            &config(),
            &subject(),
        );
        assert_eq!(d.status.sleeps_at, None);
    }

    #[test]
    fn a_container_removed_while_running_says_so_and_lost_says_how_to_start_over() {
        let d = decide(
            phase(SessionPhase::Running),
            report(view(SessionState::Reclaimed), None),
            at(60),
            &config(),
            &subject(),
        );
        assert_eq!(
            d.status.message.as_deref(),
            Some(
                "the container was removed on host h1 while the session ran; the workspace is kept, and the next workspace operation recreates the container"
            )
        );
        let d = decide(
            phase(SessionPhase::Running),
            Report::Gone,
            at(60),
            &config(),
            &subject(),
        );
        assert_eq!(
            d.status.message.as_deref(),
            Some(
                "host h1 no longer has this session: it was destroyed there, workspace included, not through this object; it is not replaced with an empty one. Start over."
            )
        );
    }

    #[test]
    fn only_an_idle_running_session_is_sampled_for_cpu() {
        let idle = Duration::from_secs(1800);
        assert!(!wants_cpu_sample(
            &view(SessionState::Running),
            at(1799),
            idle
        ));
        assert!(wants_cpu_sample(
            &view(SessionState::Running),
            at(1800),
            idle
        ));
        assert!(!wants_cpu_sample(
            &view(SessionState::Stopped),
            at(9000),
            idle
        ));
        let mut busy = view(SessionState::Running);
        busy.runs_in_flight = 1;
        assert!(!wants_cpu_sample(&busy, at(9000), idle));
    }
}

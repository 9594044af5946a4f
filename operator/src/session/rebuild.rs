//! Rebuilds, inside step 3 (follow): what differs between a session's container and what it
//! should be ([`drift`]: its Runtime's image on the host now, the limits its spec asks), whether
//! a rebuild is due ([`due`]: asked by `spec.rebuildGeneration`, or by the Runtime's
//! `rebuildPolicy`), the call to the host ([`rebuild`]) and what the status shows of it
//! ([`mark`]: the `RebuildNeeded` condition, and `Failed` while the last rebuild failed).
//!
//! The decisions are pure functions; only [`rebuild`] talks to the host and the API server.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use sandboxd_api::client::{Client as HostClient, ClientError};
use sandboxd_api::session::{RebuildRequest, SessionView};
use sandboxd_api::{ErrorCode, Limits, SessionState};
use sandboxd_crds::v1alpha1::Runtime;
use sandboxd_crds::v1alpha1::condition::{ConditionType, SessionReason};
use sandboxd_crds::v1alpha1::runtime::RebuildPolicy;
use sandboxd_crds::v1alpha1::session::{SessionPhase, SessionResources};
use sandboxd_crds::v1alpha1::{SandboxSession, SandboxSessionStatus};
use tracing::{info, warn};

use super::step::{host_unreachable, set_phase};
use super::write;
use crate::conditions;
use crate::context::Context;
use crate::error::Error;

/// The limits a spec asks of its host, as the host takes them.
pub fn asked(resources: Option<&SessionResources>) -> Option<Limits> {
    resources.map(|r| Limits {
        cpus: r.milli_cpus.map(|m| m as f64 / 1000.0),
        mem_limit: r.mem_limit.clone(),
        pids_limit: r.pids_limit,
        workspace_size: r.workspace_size.clone(),
    })
}

/// What differs between a session's container and what it should be.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Drift {
    /// The image the container is made from and the one its Runtime names now.
    pub image: Option<(String, String)>,
    /// Each limit that differs, in words (`memLimit 256m → 512m`).
    pub resources: Vec<String>,
}

impl Drift {
    /// Whether anything differs.
    pub fn any(&self) -> bool {
        self.image.is_some() || !self.resources.is_empty()
    }

    /// The condition's reason and message.
    pub fn words(&self, host: &str) -> (SessionReason, String) {
        let mut parts = Vec::new();
        if let Some((old, new)) = &self.image {
            parts.push(format!(
                "the container runs image {old}; its Runtime is now {new} on host {host}"
            ));
        }
        if !self.resources.is_empty() {
            parts.push(format!(
                "spec.resources asks other limits than the container has: {}",
                self.resources.join(", ")
            ));
        }
        let reason = if self.image.is_some() {
            SessionReason::ImageChanged
        } else {
            SessionReason::ResourcesChanged
        };
        (
            reason,
            format!(
                "{}; a rebuild (kubectl sandbox rebuild) moves it, the workspace kept",
                parts.join("; ")
            ),
        )
    }
}

fn bytes(text: Option<&str>) -> Option<u64> {
    text.and_then(sandboxd_catalog::memory::parse)
}

/// What differs between the container the host reports and what the spec asks.
pub fn drift(resources: Option<&SessionResources>, view: &SessionView) -> Drift {
    let image = view
        .runtime_image
        .as_ref()
        .filter(|now| **now != view.image)
        .map(|now| (view.image.clone(), now.clone()));
    let mut words = Vec::new();
    let has = &view.limits;
    let wants = asked(resources).unwrap_or_default();
    let shown = |v: Option<String>| v.unwrap_or_else(|| "the default".to_owned());
    if wants.cpus != has.cpus {
        words.push(format!(
            "milliCpus {} → {}",
            shown(has.cpus.map(|c| ((c * 1000.0).round() as i64).to_string())),
            shown(resources.and_then(|r| r.milli_cpus).map(|m| m.to_string()))
        ));
    }
    if bytes(wants.mem_limit.as_deref()) != bytes(has.mem_limit.as_deref()) {
        words.push(format!(
            "memLimit {} → {}",
            shown(has.mem_limit.clone()),
            shown(wants.mem_limit.clone())
        ));
    }
    if wants.pids_limit != has.pids_limit {
        words.push(format!(
            "pidsLimit {} → {}",
            shown(has.pids_limit.map(|p| p.to_string())),
            shown(wants.pids_limit.map(|p| p.to_string()))
        ));
    }
    // An unset size keeps the workspace's.
    if let Some(w) = &wants.workspace_size
        && bytes(Some(w)) != bytes(has.workspace_size.as_deref())
    {
        words.push(format!(
            "workspaceSize {} → {w}",
            bytes(has.workspace_size.as_deref())
                .map_or_else(|| "unlimited".to_owned(), sandboxd_catalog_human)
        ));
    }
    Drift {
        image,
        resources: words,
    }
}

/// Sizes as people read them (`64 MiB`).
fn sandboxd_catalog_human(b: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
    for (unit, shift) in UNITS {
        if b >= 1 << shift && b.is_multiple_of(1 << shift) {
            return format!("{} {unit}", b >> shift);
        }
    }
    format!("{b} bytes")
}

/// Why a rebuild happens now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// `spec.rebuildGeneration` was raised to this.
    Asked(i64),
    /// The session sleeps (or was reclaimed) and has drifted: rebuilt before it wakes.
    OnWake,
    /// The session runs idle and has drifted, under rebuildPolicy Rolling.
    Rolling,
}

/// Whether a rebuild is due: asked for by a raised `spec.rebuildGeneration`, or, for a session
/// that drifted and whose last rebuild did not fail, by its Runtime's policy.
pub fn due(
    asked_generation: Option<i64>,
    done_generation: Option<i64>,
    drift: &Drift,
    policy: RebuildPolicy,
    view: &SessionView,
    failed: bool,
) -> Option<Why> {
    if let Some(g) = asked_generation
        && g > done_generation.unwrap_or(0)
    {
        return Some(Why::Asked(g));
    }
    if !drift.any() || failed || !view.workspace_exists {
        return None;
    }
    match (policy, view.state) {
        (RebuildPolicy::Manual, _) => None,
        (_, SessionState::Stopped | SessionState::Reclaimed) => Some(Why::OnWake),
        (RebuildPolicy::Rolling, SessionState::Running) if view.runs_in_flight == 0 => {
            Some(Why::Rolling)
        }
        _ => None,
    }
}

/// Why a rebuild waits for the session's Runtime, if it does: a rebuild lands on the image
/// the host has for the Runtime, so one asked right after the Runtime changed must wait until
/// the operator has handed the new definition to the hosts (`status.observedGeneration`) and
/// this host reports the image that hand-out left it (`status.hosts[].imageTag`).
pub fn waits_for_runtime(
    runtime: Option<&Runtime>,
    host: &str,
    view: &SessionView,
) -> Option<String> {
    let runtime = runtime?;
    let status = runtime.status.as_ref();
    let handed = status.and_then(|s| s.observed_generation);
    if let Some(generation) = runtime.metadata.generation
        && handed.is_none_or(|h| h < generation)
    {
        return Some(format!(
            "Runtime '{}' generation {generation} is not yet handed to the hosts",
            runtime.name_any()
        ));
    }
    let tag = status?
        .hosts
        .iter()
        .find(|h| h.host == host)
        .and_then(|h| h.image_tag.as_deref())?;
    (view.runtime_image.as_deref() != Some(tag)).then(|| {
        format!(
            "host {host} has not yet taken image {tag} of Runtime '{}'",
            runtime.name_any()
        )
    })
}

/// Whether the session's last rebuild failed (and nothing since made that moot).
pub fn failed(status: &SandboxSessionStatus) -> bool {
    conditions::get(&status.conditions, ConditionType::Rebuilt).is_some_and(|c| c.status == "False")
}

/// What the status shows of the container the host reports: its image, `RebuildNeeded` while
/// it drifted, and `Failed` with the words while its last rebuild failed (cleared once nothing
/// differs any more: a later rebuild or wake made it current).
pub fn mark(
    status: &mut SandboxSessionStatus,
    view: &SessionView,
    drift: &Drift,
    host: &str,
    generation: Option<i64>,
    now: Timestamp,
) {
    status.image = Some(view.image.clone());
    if drift.any() {
        let (reason, message) = drift.words(host);
        conditions::set_at(
            &mut status.conditions,
            ConditionType::RebuildNeeded,
            true,
            reason,
            &message,
            generation,
            now,
        );
    } else {
        conditions::clear(&mut status.conditions, ConditionType::RebuildNeeded);
        if failed(status) {
            conditions::clear(&mut status.conditions, ConditionType::Rebuilt);
        }
    }
    if let Some(c) =
        conditions::get(&status.conditions, ConditionType::Rebuilt).filter(|c| c.status == "False")
    {
        let m = c.message.clone();
        set_phase(status, SessionPhase::Failed, m);
        status.sleeps_at = None;
    }
}

/// What a rebuild call came to.
pub enum Ran {
    /// Rebuilt: the session as the host shows it now.
    Done(Box<SessionView>),
    /// Failed, with the status saying why; the host's view is to be asked again.
    Failed,
    /// Not now (a slot, the runtime's build, the host busy with the session): look again after
    /// this long, deciding on the view as it was.
    Later(Duration),
    /// The host did not answer: the status keeps `Rebuilding`; look again after this long.
    Unreachable(Duration),
}

/// Rebuilds the session on its host for `why`: `Rebuilding` is written first, then the host
/// asked; an asked-for rebuild ends with the session running.
#[allow(clippy::too_many_arguments)]
pub(super) async fn rebuild(
    s: &SandboxSession,
    ctx: &Context,
    status: &mut SandboxSessionStatus,
    client: &HostClient,
    host: &str,
    id: &str,
    why: Why,
    view: &SessionView,
    max_unavailable: usize,
) -> Result<Ran, Error> {
    let generation = s.metadata.generation;
    let target = view
        .runtime_image
        .clone()
        .unwrap_or_else(|| view.image.clone());
    // Rolling: at most `max_unavailable` at a time on one host.
    let _slot = match why {
        Why::Rolling => match ctx.rolling_slot(host, max_unavailable) {
            Some(slot) => Some(slot),
            None => return Ok(Ran::Later(Duration::from_secs(2))),
        },
        _ => None,
    };
    let was = (status.phase, status.message.clone());
    set_phase(
        status,
        SessionPhase::Rebuilding,
        format!(
            "rebuilding on host {host}: the container is recreated from image {target}, the workspace kept"
        ),
    );
    write(s, status, ctx).await?;
    info!(session = %s.name_any(), host, ?why, image = %target, "rebuilding");
    let req = RebuildRequest {
        image: None,
        limits: asked(s.spec.resources.as_ref()).or_else(|| Some(view.limits.clone())),
        idle_only: why == Why::Rolling,
    };
    let answer = match client.rebuild(id, &req).await {
        // Asked for by a person: it ends running, whatever it was.
        Ok(v) if matches!(why, Why::Asked(_)) && v.state != SessionState::Running => {
            client.start(id).await
        }
        other => other,
    };
    let asked_generation = match why {
        Why::Asked(g) => Some(g),
        _ => None,
    };
    // Carried out (or failed) for good: not asked again from a stale copy of the status.
    if let Some(g) = asked_generation
        && !matches!(
            &answer,
            Err(ClientError::Transport { .. } | ClientError::VersionMismatch { .. })
                | Err(ClientError::Api {
                    code: ErrorCode::RuntimePreparing
                        | ErrorCode::SessionRebuilding
                        | ErrorCode::SessionOpening
                        | ErrorCode::SessionChanged,
                    ..
                })
        )
    {
        ctx.rebuilt(&crate::context::key(s), g);
    }
    match answer {
        Ok(v) => {
            status.rebuilt_at = Some(Time(Timestamp::now()));
            if asked_generation.is_some() {
                status.rebuild_generation = asked_generation;
            }
            conditions::set(
                &mut status.conditions,
                ConditionType::Rebuilt,
                true,
                SessionReason::Rebuilt,
                &format!(
                    "rebuilt on host {host} from image {}, the workspace kept",
                    v.image
                ),
                generation,
            );
            conditions::clear(&mut status.conditions, ConditionType::HostUnreachable);
            Ok(Ran::Done(Box::new(v)))
        }
        Err(e @ (ClientError::Transport { .. } | ClientError::VersionMismatch { .. })) => {
            host_unreachable(status, &e.to_string(), generation);
            Ok(Ran::Unreachable(super::backoff(s, ctx)))
        }
        Err(ClientError::Api { code, message, .. })
            if matches!(
                code,
                ErrorCode::RuntimePreparing
                    | ErrorCode::SessionRebuilding
                    | ErrorCode::SessionOpening
                    | ErrorCode::SessionChanged
            ) || (why == Why::Rolling && code == ErrorCode::RebuildRefused) =>
        {
            // Not now; tried again, the phase as it was meanwhile.
            info!(session = %s.name_any(), host, %message, "rebuild put off");
            status.phase = was.0;
            status.message = was.1;
            Ok(Ran::Later(Duration::from_secs(5)))
        }
        Err(e) => {
            let (reason, words) = match &e {
                ClientError::Api {
                    code: ErrorCode::BadRequest,
                    message,
                    ..
                } => (SessionReason::RebuildRefused, message.clone()),
                ClientError::Api { message, .. } => (SessionReason::RebuildFailed, message.clone()),
                other => (SessionReason::RebuildFailed, other.to_string()),
            };
            warn!(session = %s.name_any(), host, error = %words, "rebuild failed");
            if asked_generation.is_some() {
                status.rebuild_generation = asked_generation;
            }
            let m = format!(
                "the rebuild on host {host} failed: {words}. The workspace is kept; try again with `kubectl sandbox rebuild {}` once that is fixed, or wake the session",
                s.name_any()
            );
            conditions::set(
                &mut status.conditions,
                ConditionType::Rebuilt,
                false,
                reason,
                &m,
                generation,
            );
            Ok(Ran::Failed)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(state: SessionState, image: &str, now: &str) -> SessionView {
        SessionView {
            id: "agents.s1".to_owned(),
            tenant: "agents".to_owned(),
            runtime: "base".to_owned(),
            image: image.to_owned(),
            state,
            created_at: String::new(),
            last_activity_at: String::new(),
            runs_in_flight: 0,
            cpu_ns: None,
            workspace_exists: true,
            owner: None,
            launch: Default::default(),
            runtime_image: Some(now.to_owned()),
            limits: Limits {
                mem_limit: Some("256m".to_owned()),
                workspace_size: Some((32u64 << 20).to_string()),
                ..Default::default()
            },
            usage: None,
            credentials_version: None,
            memory: None,
        }
    }

    /// What the views' containers were made with.
    fn made() -> SessionResources {
        SessionResources {
            mem_limit: Some("256m".to_owned()),
            ..Default::default()
        }
    }

    #[test]
    fn a_rebuild_waits_until_the_host_has_the_runtimes_new_definition() {
        use sandboxd_crds::v1alpha1::runtime::{BuildState, RuntimeHostStatus, RuntimeStatus};
        let runtime = |generation: i64, handed: Option<i64>, tag: Option<&str>| {
            let spec = serde_json::from_value(serde_json::json!({"image": "img:1"}))
                .expect("a Runtime spec");
            let mut r = Runtime::new("base", spec);
            r.metadata.generation = Some(generation);
            r.status = Some(RuntimeStatus {
                observed_generation: handed,
                hosts: vec![RuntimeHostStatus {
                    host: "n1".to_owned(),
                    state: BuildState::Ready,
                    image_tag: tag.map(str::to_owned),
                    attempts: 0,
                    last_error: None,
                    last_transition_time: None,
                }],
                ..Default::default()
            });
            r
        };
        let v = view(SessionState::Running, "img:1", "img:1");
        // Edited, not yet handed out: the host still names the old image.
        assert_eq!(
            waits_for_runtime(Some(&runtime(3, Some(2), Some("img:1"))), "n1", &v),
            Some("Runtime 'base' generation 3 is not yet handed to the hosts".to_owned())
        );
        assert!(waits_for_runtime(Some(&runtime(3, None, None)), "n1", &v).is_some());
        // Handed out, but the view was read before: wait for the host's new image.
        assert_eq!(
            waits_for_runtime(Some(&runtime(3, Some(3), Some("img:2"))), "n1", &v),
            Some("host n1 has not yet taken image img:2 of Runtime 'base'".to_owned())
        );
        // Current, or nothing known of this host: no wait.
        assert_eq!(
            waits_for_runtime(Some(&runtime(3, Some(3), Some("img:1"))), "n1", &v),
            None
        );
        assert_eq!(
            waits_for_runtime(Some(&runtime(3, Some(3), Some("img:2"))), "n2", &v),
            None
        );
        assert_eq!(waits_for_runtime(None, "n1", &v), None);
    }

    #[test]
    fn drift_names_old_and_new() {
        let v = view(SessionState::Running, "img:1", "img:2");
        let d = drift(Some(&made()), &v);
        assert_eq!(d.image, Some(("img:1".to_owned(), "img:2".to_owned())));
        assert_eq!(
            d.words("h1"),
            (
                SessionReason::ImageChanged,
                "the container runs image img:1; its Runtime is now img:2 on host h1; a rebuild (kubectl sandbox rebuild) moves it, the workspace kept".to_owned()
            )
        );
        // The spec's limits: memory by bytes (256m is 268435456), a workspace size only when set.
        let same = SessionResources {
            mem_limit: Some("268435456".to_owned()),
            ..Default::default()
        };
        let v = view(SessionState::Running, "img:2", "img:2");
        assert!(!drift(Some(&same), &v).any());
        let more = SessionResources {
            mem_limit: Some("512m".to_owned()),
            workspace_size: Some("64m".to_owned()),
            ..Default::default()
        };
        let d = drift(Some(&more), &v);
        assert_eq!(
            d.words("h1"),
            (
                SessionReason::ResourcesChanged,
                "spec.resources asks other limits than the container has: memLimit 256m → 512m, workspaceSize 32 MiB → 64m; a rebuild (kubectl sandbox rebuild) moves it, the workspace kept".to_owned()
            )
        );
    }

    #[test]
    fn a_rebuild_is_due_when_asked_or_by_the_policy() {
        let drifted = Drift {
            image: Some(("a".to_owned(), "b".to_owned())),
            resources: vec![],
        };
        let none = Drift::default();
        let running = view(SessionState::Running, "a", "b");
        let asleep = view(SessionState::Stopped, "a", "b");
        let mut busy = running.clone();
        busy.runs_in_flight = 1;
        use RebuildPolicy::*;
        // Asked: whatever the policy and the drift.
        assert_eq!(
            due(Some(2), Some(1), &none, Manual, &running, true),
            Some(Why::Asked(2))
        );
        assert_eq!(due(Some(1), Some(1), &none, Rolling, &running, false), None);
        // By the policy.
        assert_eq!(due(None, None, &drifted, Manual, &asleep, false), None);
        assert_eq!(
            due(None, None, &drifted, OnWake, &asleep, false),
            Some(Why::OnWake)
        );
        assert_eq!(due(None, None, &drifted, OnWake, &running, false), None);
        assert_eq!(
            due(None, None, &drifted, Rolling, &running, false),
            Some(Why::Rolling)
        );
        assert_eq!(due(None, None, &drifted, Rolling, &busy, false), None);
        // A failed rebuild is not retried by itself.
        assert_eq!(due(None, None, &drifted, Rolling, &running, true), None);
    }

    #[test]
    fn a_failed_rebuild_shows_failed_until_nothing_differs() {
        let mut status = SandboxSessionStatus::default();
        conditions::set(
            &mut status.conditions,
            ConditionType::Rebuilt,
            false,
            SessionReason::RebuildFailed,
            "the rebuild on host h1 failed: no image",
            None,
        );
        let v = view(SessionState::Running, "a", "b");
        let d = drift(Some(&made()), &v);
        mark(&mut status, &v, &d, "h1", None, Timestamp::now());
        assert_eq!(status.phase, Some(SessionPhase::Failed));
        assert_eq!(
            status.message.as_deref(),
            Some("the rebuild on host h1 failed: no image")
        );
        assert!(conditions::is_true(
            &status.conditions,
            ConditionType::RebuildNeeded
        ));
        let v = view(SessionState::Running, "b", "b");
        status.phase = Some(SessionPhase::Running);
        mark(
            &mut status,
            &v,
            &drift(Some(&made()), &v),
            "h1",
            None,
            Timestamp::now(),
        );
        assert_eq!(status.phase, Some(SessionPhase::Running));
        assert!(conditions::get(&status.conditions, ConditionType::RebuildNeeded).is_none());
        assert!(conditions::get(&status.conditions, ConditionType::Rebuilt).is_none());
    }
}

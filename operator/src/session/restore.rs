//! A Lost session: it says its newest snapshot, and `spec.restore` (`kubectl sandbox restore
//! NAME`) opens it again from a Ready SandboxSnapshot of its own, on another host than the one
//! that lost it. Never by itself: a vanished workspace is never silently replaced.
//!
//! The restore owes the old host the destroy of its copy (a Tombstone, as a delete does, kept
//! until that host answers), takes the placement back (status and annotation) and sends the
//! session through the usual placement and open, which excludes the lost host and opens with
//! the snapshot's files (`from_snapshot`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource as _, ResourceExt};
use sandboxd_crds::v1alpha1::session::{SessionPhase, SnapshotRef};
use sandboxd_crds::v1alpha1::{
    SandboxSession, SandboxSessionStatus, SandboxSnapshot, SnapshotPhase,
};
use serde_json::json;
use tracing::info;

use super::step::{LOST_RECHECK, Step, json_patch, session_api, set_phase};
use super::{HOST_ANNOTATION, placed_host};
use crate::context::Context;
use crate::error::Error;

/// How long ago `t` was, as people say it.
fn ago(t: &Time) -> String {
    let secs = Timestamp::now().duration_since(t.0).as_secs().max(0);
    match secs {
        0..120 => format!("{secs} s ago"),
        120..7200 => format!("{} min ago", secs / 60),
        7200..172_800 => format!("{} h ago", secs / 3600),
        _ => format!("{} days ago", secs / 86_400),
    }
}

/// A Lost session's step: its newest snapshot named, and a restore begun when spec.restore
/// asks for one it has not done.
pub(super) async fn lost(
    s: &SandboxSession,
    ctx: &Context,
    mut status: SandboxSessionStatus,
) -> Result<Step, Error> {
    let ns = s.namespace().unwrap_or_default();
    let snapshots = Api::<SandboxSnapshot>::namespaced(ctx.client.clone(), &ns);
    let mine: Vec<SandboxSnapshot> = snapshots
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|snap| snap.spec.session == s.name_any())
        .collect();
    let ready = |snap: &SandboxSnapshot| {
        snap.status
            .as_ref()
            .filter(|st| st.phase == Some(SnapshotPhase::Ready))
            .and_then(|st| st.taken_at.clone())
    };
    status.newest_snapshot = mine
        .iter()
        .filter_map(|snap| ready(snap).map(|t| (t, snap.name_any())))
        .max_by_key(|(t, _)| t.0)
        .map(|(t, name)| SnapshotRef {
            name,
            taken_at: Some(t),
            lost_host: None,
        });
    let asked = s.spec.restore.as_ref().map(|r| r.snapshot.as_str());
    let done = status.restored_from.as_ref().map(|r| r.name.as_str());
    let Some(asked) = asked.filter(|a| Some(*a) != done) else {
        if let Some(newest) = &status.newest_snapshot {
            let hint = format!(
                "its newest snapshot is {}, taken {}: kubectl sandbox restore {} opens it from that on another host",
                newest.name,
                newest.taken_at.as_ref().map_or_else(String::new, ago),
                s.name_any()
            );
            let message = status.message.clone().unwrap_or_default();
            if !message.contains("its newest snapshot is") {
                status.message = Some(format!("{message}; {hint}"));
            }
        }
        return Ok(Step {
            status,
            requeue: LOST_RECHECK,
        });
    };
    let Some(snap) = mine.iter().find(|snap| snap.name_any() == asked) else {
        status.message = Some(format!(
            "spec.restore names SandboxSnapshot {asked}, which is not a snapshot of this session in namespace {ns}: the session stays Lost"
        ));
        return Ok(Step {
            status,
            requeue: LOST_RECHECK,
        });
    };
    let Some(taken_at) = ready(snap) else {
        status.message = Some(format!(
            "spec.restore names SandboxSnapshot {asked}, which is not Ready: the session stays Lost until it is"
        ));
        return Ok(Step {
            status,
            requeue: LOST_RECHECK,
        });
    };
    let lost_host = placed_host(s).map(str::to_owned);
    if let Some(host) = &lost_host {
        // The copy on the host that lost it is destroyed whenever that host answers.
        let name = format!("sbx-{}-lost-{}", s.uid().unwrap_or_default(), short(host));
        super::cleanup::owe_destroy(s, ctx, &name, host, status.session_id.clone()).await?;
    }
    unplace(s, ctx).await?;
    let message = format!(
        "restoring from SandboxSnapshot {asked}, taken {}, on another host than {}",
        ago(&taken_at),
        lost_host.as_deref().unwrap_or("the one that lost it")
    );
    info!(session = %s.name_any(), snapshot = asked, "restoring a Lost session");
    ctx.event(
        s,
        EventType::Normal,
        "Restoring",
        "Restore",
        message.clone(),
    )
    .await;
    let restored = SnapshotRef {
        name: asked.to_owned(),
        taken_at: Some(taken_at),
        lost_host,
    };
    let status = SandboxSessionStatus {
        restored_from: Some(restored),
        credentials_secret: status.credentials_secret,
        ..Default::default()
    };
    let mut status = status;
    set_phase(&mut status, SessionPhase::Pending, message);
    Ok(Step {
        status,
        requeue: std::time::Duration::from_millis(100),
    })
}

/// Eight hex digits of `host`'s SHA-256: a Tombstone name of bounded length per host.
fn short(host: &str) -> String {
    sandboxd_crds::key::short_hash(host, 8)
}

/// Removes the host annotation of the placement, so the next placement chooses anew.
async fn unplace(s: &SandboxSession, ctx: &Context) -> Result<(), Error> {
    if !s.annotations().contains_key(HOST_ANNOTATION) {
        return Ok(());
    }
    let path = format!(
        "/metadata/annotations/{}",
        HOST_ANNOTATION.replace('/', "~1")
    );
    let patch = json_patch(json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": s.resource_version()},
        {"op": "remove", "path": path},
    ]))?;
    session_api(s, ctx)
        .patch(&s.name_any(), &PatchParams::default(), &patch)
        .await?;
    let _ = s.meta();
    Ok(())
}

//! The SandboxSnapshot controller: asks the host of a snapshot's session to write it to the
//! object store (`POST /v1/sessions/{id}/snapshots`, keyed `<namespace>/<name>`), and reports
//! it `Ready` with its size and chunks, or `Failed` in words; a session not open yet is waited
//! for (`Pending`). The snapshot is owned by its session (deleting the session deletes it), and
//! its finalizer deletes it from the store (through any Ready host's sandboxd, which collects
//! the chunks no other snapshot needs) before the object goes.
//!
//! The key's namespace is the snapshot's own: a session opens only from a SandboxSnapshot of
//! its namespace (see `session::open`), so no namespace reaches another's snapshots.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource as _, ResourceExt};
use sandboxd_api::client::ClientError;
use sandboxd_crds::v1alpha1::session::SessionPhase;
use sandboxd_crds::v1alpha1::snapshot::SNAPSHOT_FINALIZER;
use sandboxd_crds::v1alpha1::{
    SandboxHost, SandboxSession, SandboxSnapshot, SandboxSnapshotStatus, SnapshotPhase,
};
use serde_json::json;
use tracing::{info, instrument, warn};

use crate::context::{Context, key};
use crate::error::Error;
use crate::session::step::json_patch;

/// Field manager of this controller's status writes.
pub const MANAGER: &str = "sandbox-operator/snapshot";

/// How soon a snapshot waiting for its session is looked at again.
const WAIT: Duration = Duration::from_secs(2);
/// How soon a snapshot whose host failed is tried again.
const RETRY: Duration = Duration::from_secs(15);

/// Runs the controller until the stream ends.
pub async fn run(ctx: Arc<Context>) {
    let api = Api::<SandboxSnapshot>::all(ctx.client.clone());
    Controller::new(api, ctx.watcher_config())
        .with_config(ctx.controller_config())
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

fn error_policy(s: Arc<SandboxSnapshot>, error: &Error, ctx: Arc<Context>) -> Action {
    warn!(snapshot = %s.name_any(), error = %error, "snapshot reconcile failed");
    Action::requeue(ctx.failed("sandboxsnapshot", &key(s.as_ref()), error))
}

#[instrument(skip_all, fields(snapshot = %key(s.as_ref())))]
async fn reconcile(s: Arc<SandboxSnapshot>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = step(&s, &ctx).await;
    ctx.observe("sandboxsnapshot", started);
    if result.is_ok() {
        ctx.succeeded(&key(s.as_ref()));
    }
    result
}

/// Sizes as people read them: `512 B`, `38.1 MiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut unit = "B";
    for u in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = u;
    }
    format!("{value:.1} {unit}")
}

fn api(s: &SandboxSnapshot, ctx: &Context) -> Api<SandboxSnapshot> {
    Api::namespaced(ctx.client.clone(), &s.namespace().unwrap_or_default())
}

async fn step(s: &SandboxSnapshot, ctx: &Context) -> Result<Action, Error> {
    let (ns, name) = (s.namespace().unwrap_or_default(), s.name_any());
    let mine = s.finalizers().iter().position(|f| f == SNAPSHOT_FINALIZER);
    if s.metadata.deletion_timestamp.is_some() {
        let Some(i) = mine else {
            return Ok(Action::await_change());
        };
        let status = s.status.clone().unwrap_or_default();
        if status.key.is_some()
            && let Err(why) = forget(ctx, &status, &ns, &name).await
        {
            warn!(error = %why, "the snapshot could not be deleted from the object store; retrying");
            ctx.event(s, EventType::Warning, "DeleteFailed", "Delete", why)
                .await;
            return Ok(Action::requeue(RETRY));
        }
        let path = format!("/metadata/finalizers/{i}");
        let patch = json_patch(json!([
            {"op": "test", "path": path, "value": SNAPSHOT_FINALIZER},
            {"op": "remove", "path": path},
        ]))?;
        match api(s, ctx)
            .patch(&name, &PatchParams::default(), &patch)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        info!("snapshot deleted from the object store");
        return Ok(Action::await_change());
    }
    let status = s.status.clone().unwrap_or_default();
    if matches!(
        status.phase,
        Some(SnapshotPhase::Ready | SnapshotPhase::Failed)
    ) {
        return Ok(Action::await_change());
    }
    let sessions = Api::<SandboxSession>::namespaced(ctx.client.clone(), &ns);
    let Some(session) = sessions.get_opt(&s.spec.session).await? else {
        let m = format!(
            "SandboxSession {} does not exist in namespace {ns}: a snapshot is of a session of its own namespace",
            s.spec.session
        );
        return settle(s, ctx, failed(m)).await;
    };
    claim(s, &session, mine.is_none(), ctx).await?;
    let sst = session.status.clone().unwrap_or_default();
    if sst.phase == Some(SessionPhase::Lost) {
        let m = format!(
            "SandboxSession {} is Lost: its workspace is gone, so there is nothing to snapshot",
            s.spec.session
        );
        return settle(s, ctx, failed(m)).await;
    }
    let (Some(host_name), Some(id)) = (sst.host.clone(), sst.session_id.clone()) else {
        let m = format!(
            "waiting for SandboxSession {} to open on a host",
            s.spec.session
        );
        return pending(s, ctx, m, WAIT).await;
    };
    let host = match Api::<SandboxHost>::all(ctx.client.clone())
        .get_opt(&host_name)
        .await?
    {
        Some(h) => h,
        None => {
            let m = format!("SandboxHost {host_name} of the session does not exist");
            return pending(s, ctx, m, RETRY).await;
        }
    };
    let client = match ctx.host_client(&host).await {
        Ok(c) => c,
        Err(e) => return pending(s, ctx, e.to_string(), RETRY).await,
    };
    match client.take_snapshot(&id, &ns, &name).await {
        Ok(v) => {
            let m = format!(
                "taken on host {host_name}: {} in {} entries, {} chunks ({} sent), the sandbox paused {} ms",
                human(v.bytes),
                v.entries,
                v.chunk_count,
                v.chunks_sent,
                v.paused_ms
            );
            info!(host = %host_name, bytes = v.bytes, "snapshot taken");
            ctx.event(s, EventType::Normal, "Taken", "Snapshot", m.clone())
                .await;
            let to_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            let ready = SandboxSnapshotStatus {
                phase: Some(SnapshotPhase::Ready),
                message: Some(m),
                key: Some(v.key),
                host: Some(host_name),
                bytes: Some(to_i64(v.bytes)),
                size: Some(human(v.bytes)),
                entries: Some(to_i64(v.entries)),
                chunk_count: Some(to_i64(v.chunk_count)),
                chunks_sent: Some(to_i64(v.chunks_sent)),
                paused_milliseconds: Some(to_i64(v.paused_ms)),
                taken_at: Some(Time(Timestamp::now())),
            };
            settle(s, ctx, ready).await
        }
        // Opening, waking or being rebuilt: a moment later.
        Err(ClientError::Api {
            status: 409,
            message,
            ..
        }) => pending(s, ctx, message, WAIT).await,
        // What no retry mends: the words say what.
        Err(ClientError::Api {
            status: status @ 400..=499,
            message,
            ..
        }) => {
            let m = format!("host {host_name} refused the snapshot ({status}): {message}");
            ctx.event(s, EventType::Warning, "Failed", "Snapshot", m.clone())
                .await;
            settle(s, ctx, failed(m)).await
        }
        Err(e) => {
            let m = format!("the snapshot on host {host_name} failed; it is tried again: {e}");
            pending(s, ctx, m, RETRY).await
        }
    }
}

fn failed(message: String) -> SandboxSnapshotStatus {
    SandboxSnapshotStatus {
        phase: Some(SnapshotPhase::Failed),
        message: Some(message),
        ..Default::default()
    }
}

/// Adds the finalizer and the owner reference to `session` when they are missing, in one
/// write: the snapshot goes with its session, and from the store before it goes.
async fn claim(
    s: &SandboxSnapshot,
    session: &SandboxSession,
    add_finalizer: bool,
    ctx: &Context,
) -> Result<(), Error> {
    let uid = session.uid().unwrap_or_default();
    let owned = s.owner_references().iter().any(|o| o.uid == uid);
    if owned && !add_finalizer {
        return Ok(());
    }
    let mut ops = vec![
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": s.resource_version()}),
    ];
    if add_finalizer {
        if s.metadata.finalizers.as_ref().is_none_or(|f| f.is_empty()) {
            ops.push(
                json!({"op": "add", "path": "/metadata/finalizers", "value": [SNAPSHOT_FINALIZER]}),
            );
        } else {
            ops.push(
                json!({"op": "add", "path": "/metadata/finalizers/-", "value": SNAPSHOT_FINALIZER}),
            );
        }
    }
    if !owned {
        let reference = json!({
            "apiVersion": SandboxSession::api_version(&()),
            "kind": SandboxSession::kind(&()),
            "name": session.name_any(),
            "uid": uid,
        });
        if s.metadata
            .owner_references
            .as_ref()
            .is_none_or(|o| o.is_empty())
        {
            ops.push(
                json!({"op": "add", "path": "/metadata/ownerReferences", "value": [reference]}),
            );
        } else {
            ops.push(
                json!({"op": "add", "path": "/metadata/ownerReferences/-", "value": reference}),
            );
        }
    }
    api(s, ctx)
        .patch(
            &s.name_any(),
            &PatchParams::default(),
            &json_patch(serde_json::Value::Array(ops))?,
        )
        .await?;
    Ok(())
}

/// Writes `status` and looks again only on a change.
async fn settle(
    s: &SandboxSnapshot,
    ctx: &Context,
    status: SandboxSnapshotStatus,
) -> Result<Action, Error> {
    write_status(s, ctx, &status).await?;
    Ok(Action::await_change())
}

/// Says `message` in a Pending status and looks again after `again`.
async fn pending(
    s: &SandboxSnapshot,
    ctx: &Context,
    message: String,
    again: Duration,
) -> Result<Action, Error> {
    let status = SandboxSnapshotStatus {
        phase: Some(SnapshotPhase::Pending),
        message: Some(message),
        ..Default::default()
    };
    if s.status.as_ref() != Some(&status) {
        write_status(s, ctx, &status).await?;
    }
    Ok(Action::requeue(again))
}

async fn write_status(
    s: &SandboxSnapshot,
    ctx: &Context,
    status: &SandboxSnapshotStatus,
) -> Result<(), Error> {
    let patch = json!({
        "apiVersion": "sandboxd.dev/v1alpha1",
        "kind": "SandboxSnapshot",
        "status": status,
    });
    api(s, ctx)
        .patch_status(
            &s.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    Ok(())
}

/// Deletes the snapshot from the store through the host that took it, or any other host
/// that answers (every host of a cluster shares the store).
async fn forget(
    ctx: &Context,
    status: &SandboxSnapshotStatus,
    ns: &str,
    name: &str,
) -> Result<(), String> {
    let hosts = Api::<SandboxHost>::all(ctx.client.clone())
        .list(&Default::default())
        .await
        .map_err(|e| e.to_string())?;
    let mut hosts = hosts.items;
    // The host that took it first.
    hosts.sort_by_key(|h| Some(h.name_any()) != status.host);
    let mut why = String::from("no SandboxHost to delete it through");
    for host in hosts {
        let client = match ctx.host_client(&host).await {
            Ok(c) => c,
            Err(e) => {
                why = e.to_string();
                continue;
            }
        };
        match client.delete_snapshot(ns, name).await {
            Ok(()) => return Ok(()),
            Err(e) => why = format!("host {}: {e}", host.name_any()),
        }
    }
    Err(why)
}

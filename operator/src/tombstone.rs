//! The Tombstone controller: destroys a deleted session on its host and removes the Tombstone
//! only when the host confirms (already gone counts). On failure it backs off from 2 minutes,
//! doubling, to at most 6 hours. A disabled host still gets its destroys.
//!
//! A destroy names its owner (the deleted object's uid): when the host says the id now belongs
//! to another owner (a newer SandboxSession of the same name), the deleted one's sandbox is
//! already gone, so the Tombstone is done and the newer sandbox is left alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use sandboxd_api::ErrorCode;
use sandboxd_api::client::ClientError;
use sandboxd_api::session::Destroyed;
use sandboxd_crds::v1alpha1::{SandboxHost, Tombstone, TombstoneStatus};
use serde_json::json;
use tracing::{info, instrument, warn};

use crate::backoff::tombstone_delay;
use crate::context::{Context, key};
use crate::error::Error;

/// Field manager of this controller's status writes.
pub const MANAGER: &str = "sandbox-operator/tombstone";

/// Runs the controller until the stream ends.
pub async fn run(ctx: Arc<Context>) {
    let api = Api::<Tombstone>::all(ctx.client.clone());
    Controller::new(api, ctx.watcher_config())
        .with_config(ctx.controller_config())
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

/// When `t` was made, in Unix seconds (now when the API server did not say).
fn created_at(t: &Tombstone) -> i64 {
    t.metadata
        .creation_timestamp
        .as_ref()
        .map_or_else(Timestamp::now, |c| c.0)
        .as_second()
}

fn error_policy(t: Arc<Tombstone>, error: &Error, ctx: Arc<Context>) -> Action {
    warn!(tombstone = %t.name_any(), error = %error, "tombstone reconcile failed");
    Action::requeue(ctx.failed("tombstone", &key(t.as_ref()), error))
}

#[instrument(skip_all, fields(tombstone = %t.name_any(), host = %t.spec.host, session = %t.spec.session_id))]
async fn reconcile(t: Arc<Tombstone>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = destroy(&t, &ctx).await;
    ctx.observe("tombstone", started);
    result
}

async fn destroy(t: &Tombstone, ctx: &Context) -> Result<Action, Error> {
    let api = Api::<Tombstone>::all(ctx.client.clone());
    let status = t.status.clone().unwrap_or_default();
    // Owed until the host confirms the destroy, also while it waits for its next attempt.
    ctx.set_tombstone_pending(&key(t), Some(created_at(t)));
    if let Some(next) = &status.next_attempt_at {
        let wait = next.0.duration_since(Timestamp::now());
        if wait > SignedDuration::ZERO {
            return Ok(Action::requeue(
                Duration::try_from(wait).unwrap_or(Duration::from_secs(1)),
            ));
        }
    }
    let outcome = match Api::<SandboxHost>::all(ctx.client.clone())
        .get_opt(&t.spec.host)
        .await?
    {
        None => Err(format!("SandboxHost {} does not exist", t.spec.host)),
        Some(host) => match ctx.host_client(&host).await {
            Err(e) => Err(e.to_string()),
            Ok(client) => {
                let owner = Some(t.spec.source.uid.as_str()).filter(|u| !u.is_empty());
                match client.destroy_as(&t.spec.session_id, owner).await {
                    Err(ClientError::Api {
                        code: ErrorCode::OwnerMismatch,
                        message,
                        ..
                    }) => Ok(Destroyed {
                        id: t.spec.session_id.clone(),
                        destroyed: false,
                        message: format!(
                            "the session of {}/{} was already gone; host {} holds '{}' for a newer object, which was left alone ({message})",
                            t.spec.source.namespace,
                            t.spec.source.name,
                            t.spec.host,
                            t.spec.session_id
                        ),
                    }),
                    other => other.map_err(|e| e.to_string()),
                }
            }
        },
    };
    match outcome {
        Ok(done) => {
            info!(
                destroyed = done.destroyed,
                "destroy confirmed; tombstone removed"
            );
            ctx.event(t, EventType::Normal, "Destroyed", "Destroy", done.message)
                .await;
            match api.delete(&t.name_any(), &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
            ctx.succeeded(&key(t));
            ctx.set_tombstone_pending(&key(t), None);
            Ok(Action::await_change())
        }
        Err(why) => {
            let attempts = status.attempts.saturating_add(1);
            let delay = tombstone_delay(
                u32::try_from(attempts).unwrap_or(u32::MAX),
                Duration::from_secs(ctx.config.tombstone_backoff_seconds),
                Duration::from_secs(ctx.config.tombstone_backoff_cap_seconds),
            );
            let next = Timestamp::now()
                .checked_add(SignedDuration::try_from(delay).unwrap_or(SignedDuration::MAX))
                .unwrap_or_else(|_| Timestamp::now());
            let new = TombstoneStatus {
                attempts,
                last_error: Some(why.clone()),
                next_attempt_at: Some(Time(next)),
            };
            let patch =
                json!({"apiVersion": "sandboxd.dev/v1alpha1", "kind": "Tombstone", "status": new});
            api.patch_status(
                &t.name_any(),
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await?;
            warn!(attempts, retry_in = ?delay, error = %why, "destroy failed; will retry");
            ctx.event(
                t,
                EventType::Warning,
                "DestroyFailed",
                "Destroy",
                format!(
                    "attempt {attempts} failed: {why}; next attempt in {} s",
                    delay.as_secs()
                ),
            )
            .await;
            Ok(Action::requeue(delay))
        }
    }
}

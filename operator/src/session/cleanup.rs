//! When a session is deleted: a Tombstone owes the destroy of what lives on its host (the
//! container and the workspace) before the finalizer is released.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use sandboxd_crds::key::host_session_id;
use sandboxd_crds::v1alpha1::tombstone::TombstoneSource;
use sandboxd_crds::v1alpha1::{SandboxSession, Tombstone, TombstoneSpec};

use super::{MANAGER, placed_host};
use crate::context::{Context, key};
use crate::error::Error;

/// Writes the session's Tombstone (once; idempotent by name) and forgets what the operator
/// keeps of it. Works also for a session that was never placed or opened.
pub(super) async fn cleanup(s: &SandboxSession, ctx: &Context) -> Result<Action, Error> {
    let status = s.status.clone().unwrap_or_default();
    ctx.forget_cpu(&key(s));
    ctx.forget_waits(&key(s));
    ctx.forget_token(&key(s));
    ctx.set_phase(&key(s), None);
    ctx.set_outdated(&key(s), None);
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

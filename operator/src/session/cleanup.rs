//! When a session is deleted: a Tombstone owes the destroy of what lives on its host (the
//! container and the workspace) before the finalizer is released.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
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
    let name = format!("sbx-{uid}");
    owe_destroy(s, ctx, &name, &host, status.session_id).await?;
    ctx.event(
        s,
        EventType::Normal,
        "TombstoneWritten",
        "Delete",
        format!("the destroy on host {host} is owed by Tombstone {name}"),
    )
    .await;
    Ok(Action::await_change())
}

/// Writes Tombstone `name` (idempotent by name): the destroy of session `s`'s sandbox on
/// `host` (its id there `session_id`, else the one its name gives) is owed until that host
/// confirms it.
pub(super) async fn owe_destroy(
    s: &SandboxSession,
    ctx: &Context,
    name: &str,
    host: &str,
    session_id: Option<String>,
) -> Result<(), Error> {
    let tombstone = Tombstone {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(ctx.labels.clone()),
            ..Default::default()
        },
        spec: TombstoneSpec {
            host: host.to_owned(),
            session_id: session_id.unwrap_or_else(|| {
                host_session_id(&s.namespace().unwrap_or_default(), &s.name_any())
            }),
            tenant: s.spec.tenant.clone(),
            source: TombstoneSource {
                namespace: s.namespace().unwrap_or_default(),
                name: s.name_any(),
                uid: s.uid().unwrap_or_default(),
            },
        },
        status: None,
    };
    let params = PostParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    match Api::<Tombstone>::all(ctx.client.clone())
        .create(&params, &tombstone)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

//! The SandboxHost controller: probes each sandboxd's index, capacity and runtimes on a timer;
//! conditions Reachable, Ready and VersionMismatch (Ready=False `TokenRefused` when sandboxd
//! refuses the admin token, `NodeUnset` for a host that names no node: it is sent nothing). A host with tombstones left cannot be
//! deleted unless the deletion is confirmed by annotation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::{Api, ResourceExt};
use sandboxd_api::BuildState;
use sandboxd_api::routes::version_mismatch_message;
use sandboxd_crds::v1alpha1::condition::{ConditionType, HostReason};
use sandboxd_crds::v1alpha1::host::HostCapacity;
use sandboxd_crds::v1alpha1::{SandboxHost, SandboxHostStatus, Tombstone};
use serde_json::json;
use tracing::{info, instrument, warn};

use crate::conditions;
use crate::context::{Context, key};
use crate::error::Error;
use crate::error::chain;

/// Field manager of this controller's status writes.
pub const MANAGER: &str = "sandbox-operator/sandboxhost";
/// Finalizer that keeps a host while it owes destroys.
pub const FINALIZER: &str = "sandboxd.dev/host-tombstones";
/// Annotation that confirms deleting a host with tombstones left (they are forgotten).
pub const FORGET_ANNOTATION: &str = "sandboxd.dev/forget-tombstones";

/// The message of a host whose sandboxd refused the admin token the operator sent: which
/// token it was, and what has to match for it to be taken.
/// (A host without `spec.node` is sent no token at all: [`Error::NodeUnset`].)
pub fn token_refused_message(host: &SandboxHost) -> String {
    let r = &host.spec.admin_token_secret;
    let node = host.spec.node.as_deref().unwrap_or_default();
    format!(
        "sandboxd at {} refused the admin token (401): the operator sent the token derived for node '{node}' (spec.node) from the master in Secret {}/{} key {}. The node name in spec.node must match sandboxd's SANDBOXD_NODE_NAME, and the Secret must hold the master sandboxd was started with (SANDBOXD_TOKEN) or whose node token's hash it reads (SANDBOXD_NODE_TOKEN_HASHES, written by the operator with --node-token-hashes)",
        host.spec.endpoint, r.namespace, r.name, r.key
    )
}

/// Runs the controller until the stream ends.
///
/// A host is reconciled when it is created or what a person or the discovery sets on it
/// changes, and then on the probe timer; not on its own status writes. Each probe writes the
/// status (`lastProbeAt` at least), so reconciling on every write would probe each host about
/// once a second (a Secret read, two requests to sandboxd and a status write, per host, for
/// ever) instead of once per `--probe-seconds`.
pub async fn run(ctx: Arc<Context>) {
    let api = Api::<SandboxHost>::all(ctx.client.clone());
    let (hosts, stream) = crate::context::without_own_status(api, ctx.watcher_config());
    Controller::for_stream(stream, hosts)
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

fn error_policy(host: Arc<SandboxHost>, error: &Error, ctx: Arc<Context>) -> Action {
    warn!(host = %host.name_any(), error = %error, "host reconcile failed");
    Action::requeue(ctx.failed("sandboxhost", &key(host.as_ref()), error))
}

#[instrument(skip_all, fields(host = %host.name_any()))]
async fn reconcile(host: Arc<SandboxHost>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let api = Api::<SandboxHost>::all(ctx.client.clone());
    let result = finalizer(&api, FINALIZER, host, |event| async {
        match event {
            Finalizer::Apply(h) => probe(&h, &ctx).await,
            Finalizer::Cleanup(h) => cleanup(&h, &ctx).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        other => Error::Finalizer(other.to_string()),
    });
    ctx.observe("sandboxhost", started);
    result
}

async fn probe(host: &SandboxHost, ctx: &Context) -> Result<Action, Error> {
    let name = host.name_any();
    let generation = host.metadata.generation;
    let old = host.status.clone().unwrap_or_default();
    let mut status = old.clone();
    status.last_probe_at = Some(Time(Timestamp::now()));
    status.observed_generation = generation;
    let every = Duration::from_secs(ctx.config.probe_seconds);
    let client = match ctx.refresh_host_client(host).await {
        Ok(c) => c,
        Err(e) => {
            no_client(host, ctx, &old, &mut status, &e).await;
            write(host, &status, ctx).await?;
            return Ok(Action::requeue(every));
        }
    };
    match client.index().await {
        Err(e) => unreachable(host, ctx, &old, &mut status, &e).await,
        Ok(index) => answered(host, ctx, &client, &old, &mut status, &index).await,
    }
    if !conditions::is_true(&old.conditions, ConditionType::Ready)
        && conditions::is_true(&status.conditions, ConditionType::Ready)
    {
        info!(host = %name, "host ready");
    }
    write(host, &status, ctx).await?;
    ctx.succeeded(&key(host));
    Ok(Action::requeue(every))
}

/// No client for the host: a host without a node is sent nothing and a Secret in another
/// namespace is refused unread; any other failure is a token (or a CA) that could not be
/// read. Either way no session is placed here (not Ready).
async fn no_client(
    host: &SandboxHost,
    ctx: &Context,
    old: &SandboxHostStatus,
    status: &mut SandboxHostStatus,
    e: &Error,
) {
    let generation = host.metadata.generation;
    let reason = match e {
        Error::TokenSecretRefused { .. } => HostReason::TokenSecretRefused,
        Error::NodeUnset { .. } => HostReason::NodeUnset,
        Error::Ca { .. } => HostReason::CaUnusable,
        _ => HostReason::TokenUnreadable,
    };
    let refused = matches!(
        reason,
        HostReason::TokenSecretRefused | HostReason::NodeUnset
    );
    if refused && !conditions::has_reason(&old.conditions, ConditionType::Ready, reason) {
        probe_warning(ctx, host, reason, e.to_string()).await;
    }
    conditions::set(
        &mut status.conditions,
        ConditionType::Ready,
        false,
        reason,
        &e.to_string(),
        generation,
    );
}

/// The host did not answer its index: not Reachable, not Ready, with an event when it was.
async fn unreachable(
    host: &SandboxHost,
    ctx: &Context,
    old: &SandboxHostStatus,
    status: &mut SandboxHostStatus,
    e: &sandboxd_api::client::ClientError,
) {
    let generation = host.metadata.generation;
    // A certificate that fails verification says so, and what to give the operator.
    let (reason, ready) = if e.is_untrusted() {
        (
            HostReason::CertificateUntrusted,
            format!(
                "{e}. Put the CA that signed sandboxd's certificate in the host's spec.caSecret (or the operator's --host-ca-file); the certificate must name the endpoint's address"
            ),
        )
    } else {
        (
            HostReason::Unreachable,
            format!("sandboxd at {} does not answer", host.spec.endpoint),
        )
    };
    conditions::set(
        &mut status.conditions,
        ConditionType::Reachable,
        false,
        reason,
        &e.to_string(),
        generation,
    );
    conditions::set(
        &mut status.conditions,
        ConditionType::Ready,
        false,
        reason,
        &ready,
        generation,
    );
    if conditions::is_true(&old.conditions, ConditionType::Reachable) {
        probe_warning(ctx, host, reason, e.to_string()).await;
    }
}

/// The host answered its index: Reachable; Ready when it serves every route the operator
/// needs and its capacity could be read with the token.
async fn answered(
    host: &SandboxHost,
    ctx: &Context,
    client: &sandboxd_api::client::Client,
    old: &SandboxHostStatus,
    status: &mut SandboxHostStatus,
    index: &sandboxd_api::routes::Index,
) {
    let generation = host.metadata.generation;
    conditions::set(
        &mut status.conditions,
        ConditionType::Reachable,
        true,
        HostReason::Answered,
        &format!("sandboxd {} answered", index.version),
        generation,
    );
    status.version = Some(index.version.clone());
    status.routes = index.routes.clone();
    let missing = index.missing_required();
    if missing.is_empty() {
        conditions::set(
            &mut status.conditions,
            ConditionType::VersionMismatch,
            false,
            HostReason::RoutesPresent,
            "every route the operator needs is served",
            generation,
        );
        match observe(client, status).await {
            Ok(()) if host.spec.disabled => conditions::set(
                &mut status.conditions,
                ConditionType::Ready,
                true,
                HostReason::Disabled,
                "ready, but disabled: it takes no new sessions",
                generation,
            ),
            Ok(()) => conditions::set(
                &mut status.conditions,
                ConditionType::Ready,
                true,
                HostReason::Ready,
                "takes sessions",
                generation,
            ),
            Err(sandboxd_api::client::ClientError::Api { status: 401, .. }) => {
                let message = token_refused_message(host);
                let already = conditions::has_reason(
                    &old.conditions,
                    ConditionType::Ready,
                    HostReason::TokenRefused,
                );
                if !already {
                    probe_warning(ctx, host, HostReason::TokenRefused, message.clone()).await;
                }
                conditions::set(
                    &mut status.conditions,
                    ConditionType::Ready,
                    false,
                    HostReason::TokenRefused,
                    &message,
                    generation,
                );
            }
            Err(e) => conditions::set(
                &mut status.conditions,
                ConditionType::Ready,
                false,
                HostReason::ProbeFailed,
                &chain(&e),
                generation,
            ),
        }
    } else {
        let message = version_mismatch_message(&missing, &ctx.config.sandboxd_image);
        if !conditions::is_true(&old.conditions, ConditionType::VersionMismatch) {
            probe_warning(ctx, host, HostReason::VersionMismatch, message.clone()).await;
        }
        conditions::set(
            &mut status.conditions,
            ConditionType::VersionMismatch,
            true,
            HostReason::RoutesMissing,
            &message,
            generation,
        );
        conditions::set(
            &mut status.conditions,
            ConditionType::Ready,
            false,
            HostReason::VersionMismatch,
            &message,
            generation,
        );
    }
}

/// A Warning event of the probe on `host`, with the reason its condition gives.
async fn probe_warning(ctx: &Context, host: &SandboxHost, reason: HostReason, note: String) {
    ctx.event(host, EventType::Warning, reason.as_str(), "Probe", note)
        .await;
}

/// Reads capacity, load and ready runtimes.
async fn observe(
    client: &sandboxd_api::client::Client,
    status: &mut SandboxHostStatus,
) -> Result<(), sandboxd_api::client::ClientError> {
    let policy = client.policy().await?;
    let bytes = |b: u64| i64::try_from(b).unwrap_or(i64::MAX);
    status.capacity = Some(HostCapacity {
        max_sessions: i32::try_from(policy.policy.max_sessions).unwrap_or(i32::MAX),
        max_sessions_per_tenant: i32::try_from(policy.policy.max_sessions_per_tenant)
            .unwrap_or(i32::MAX),
        workspace_budget: policy.fixed.workspace_budget.map(bytes),
        workspace_size: policy.fixed.workspace_size.map(bytes),
    });
    let sessions = client.list().await?;
    // Every workspace not yet destroyed holds its size of the budget, as sandboxd counts it.
    status.workspace_bytes = policy
        .fixed
        .workspace_budget
        .and(policy.workspaces)
        .map(|w| bytes(w.bytes));
    let held = sessions
        .iter()
        .filter(|s| {
            matches!(
                s.state,
                sandboxd_api::SessionState::Opening
                    | sandboxd_api::SessionState::Running
                    | sandboxd_api::SessionState::Stopped
            )
        })
        .count();
    status.sessions = Some(i32::try_from(held).unwrap_or(i32::MAX));
    let runtimes = client.runtimes().await?;
    status.isolation = runtimes
        .isolation
        .iter()
        .map(|i| i.as_str().to_owned())
        .collect();
    status.runtimes_ready = runtimes
        .runtimes
        .into_iter()
        .filter(|r| r.state == BuildState::Ready)
        .map(|r| r.alias)
        .collect();
    Ok(())
}

/// Writes the status of `host` and sets its gauges from it (`sandbox_operator_host_*`).
async fn write(host: &SandboxHost, status: &SandboxHostStatus, ctx: &Context) -> Result<(), Error> {
    ctx.metrics.set_host(
        &host.name_any(),
        Some(crate::metrics::HostState {
            ready: conditions::is_true(&status.conditions, ConditionType::Ready),
            reachable: conditions::is_true(&status.conditions, ConditionType::Reachable),
            disabled: host.spec.disabled,
        }),
    );
    let api = Api::<SandboxHost>::all(ctx.client.clone());
    let patch =
        json!({"apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxHost", "status": status});
    api.patch_status(
        &host.name_any(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

async fn cleanup(host: &SandboxHost, ctx: &Context) -> Result<Action, Error> {
    let name = host.name_any();
    let tombstones = Api::<Tombstone>::all(ctx.client.clone());
    let owed: Vec<Tombstone> = tombstones
        .list(&ctx.list_params())
        .await?
        .items
        .into_iter()
        .filter(|t| t.spec.host == name)
        .collect();
    if owed.is_empty() {
        ctx.metrics.set_host(&name, None);
        ctx.forget_host_client(&name);
        return Ok(Action::await_change());
    }
    let confirmed = host
        .annotations()
        .get(FORGET_ANNOTATION)
        .is_some_and(|v| v == "true");
    if !confirmed {
        let e = Error::TombstonesLeft {
            host: name,
            count: owed.len(),
        };
        ctx.event(
            host,
            EventType::Warning,
            "TombstonesLeft",
            "Delete",
            e.to_string(),
        )
        .await;
        return Err(e);
    }
    for t in &owed {
        let _ = tombstones
            .delete(&t.name_any(), &DeleteParams::default())
            .await;
        ctx.set_tombstone_pending(&key(t), None);
    }
    let note = format!(
        "Host {name} was deleted with {} tombstones left, confirmed by {FORGET_ANNOTATION}: their sandboxes were forgotten ({})",
        owed.len(),
        owed.iter()
            .map(|t| t.spec.session_id.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    warn!(host = %name, count = owed.len(), "tombstones forgotten");
    ctx.metrics.set_host(&name, None);
    ctx.forget_host_client(&name);
    ctx.event(
        host,
        EventType::Warning,
        "TombstonesForgotten",
        "Delete",
        note,
    )
    .await;
    Ok(Action::await_change())
}
